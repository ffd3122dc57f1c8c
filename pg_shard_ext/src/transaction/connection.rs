//! A backend's connection to a worker node over libpq ([`super::libpq`]).
//!
//! Every wait for the node (connecting, sending, results) is a wait on the
//! backend's latch and the socket together, as postgres_fdw's is: a cancel,
//! `statement_timeout` or the postmaster's death ends it at once (the error
//! unwinds through here; dropping the connection sends the node a cancel
//! request for the query still running there and closes it). Results are
//! text, read by each type's input function.
//!
//! As in Citus, a node is reached in the database of the same name as the
//! current database, as the role the statement acts as, so several clusters
//! can live side by side in separate databases and workers check privileges
//! themselves.

use super::libpq::*;
pub(crate) use super::node_errors::is_sqlstate;
use super::node_errors::{connection_failure, connection_message, node_failure};
use super::result_rows::{command_rows, ResultGuard};
pub(crate) use super::result_rows::{Outcome, TextRow};
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use pgrx::pg_sys;
use std::ffi::{c_char, c_int, CStr, CString};
use std::time::{Duration, Instant};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Statements a connection keeps prepared on its node.
pub(crate) const PREPARED_LIMIT: usize = 64;

/// Settings of every node connection: generated SQL is fully qualified (an
/// empty path keeps the worker's own search_path from changing what it
/// means), and values travel as text that reads back exactly, whatever the
/// local session's DateStyle.
///
/// And a query whose connection closed stops within a second: an
/// interrupted statement cancels its remote query (PQcancel) and closes the
/// connection, but a node drops a cancel that reaches it while it handles
/// Parse or Bind (it discards cancels that arrive between the extended
/// protocol's messages), and would then run the query to its end.
const SESSION_OPTIONS: &str = "-c search_path=pg_catalog -c datestyle=ISO \
                               -c intervalstyle=postgres -c extra_float_digits=3 \
                               -c bytea_output=hex -c client_connection_check_interval=1000";

/// What a node's query made of many shard groups' branches (UNION ALL)
/// runs with. PostgreSQL judges JIT and parallel workers on the whole
/// query's cost while each branch reads one shard group, so every branch
/// compiled its expressions (at TPC-H scale factor 1, one second of q12's
/// two) and started workers of its own, on nodes whose cores the other
/// nodes' queries of the statement already use. And it plans each branch
/// as if a random page read cost four sequential ones (uncached data):
/// over one shard group's tables that made hash joins of whole shards win
/// over probing their indexes for a few thousand rows, three times slower
/// (TPC-H SF 1, one worker's statement: q4 1.4–1.6 s against 0.35–0.5 s,
/// q8 1.6 s against 0.5 s, q10 1.6 against 1.4; q18 2.1–2.6 against
/// 2.7–2.8, q3 and q9 within noise).
const BRANCH_SETTINGS: [(&str, &str); 3] = [
    ("jit", "off"),
    ("max_parallel_workers_per_gather", "0"),
    ("random_page_cost", "2"),
];

/// How a node plans the statements a session sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Planning {
    /// With the node's own settings.
    Own,
    /// Without parallel workers: the statement's other nodes are on the
    /// same host and run their parts at the same time, on the same cores
    /// (at TPC-H SF 1 on two cores, q6's two nodes each started two
    /// workers: six processes, 0.85 s against 0.5 s for a node's part
    /// alone).
    SharedCores,
    /// As a query of many branches: [`BRANCH_SETTINGS`].
    Branches,
}

impl Planning {
    /// The value this mode gives `setting` (one of [`BRANCH_SETTINGS`]);
    /// None for the node's own.
    fn value(self, setting: &(&str, &'static str)) -> Option<&'static str> {
        match self {
            Planning::Own => None,
            Planning::SharedCores => {
                (setting.0 == "max_parallel_workers_per_gather").then_some(setting.1)
            }
            Planning::Branches => Some(setting.1),
        }
    }
}

/// `command` (`SET` or `SET LOCAL`) statements taking the node from
/// planning as `from` to planning as `to`.
fn planning_settings(command: &str, from: Planning, to: Planning) -> Vec<String> {
    BRANCH_SETTINGS
        .iter()
        .filter(|setting| from.value(setting) != to.value(setting))
        .map(|setting| match to.value(setting) {
            Some(value) => format!("{command} {} = {value}", setting.0),
            None => format!("{command} {} TO DEFAULT", setting.0),
        })
        .collect()
}

pub(crate) struct NodeConnection {
    pub(super) conn: *mut PGconn,
    pub(super) node: Node,
    /// The map version this transaction declared to the node (`SET LOCAL
    /// pg_shard.map_version`).
    declared_version: Option<i64>,
    /// The map version declared for the session (`SET`), for autocommit
    /// statements.
    session_version: Option<i64>,
    /// Statements prepared on the node: their text and name, oldest first.
    prepared: Vec<(String, String)>,
    statements_prepared: u64,
    /// The TimeZone this session set on the node ("" for the node's own).
    timezone: String,
    /// How the session plans (`SET`, for autocommit statements) ...
    session_planning: Planning,
    /// ... and how this transaction does (`SET LOCAL`; None: as the
    /// session).
    local_planning: Option<Planning>,
    /// Made on the first wait once connected, freed on drop.
    pub(super) wait_set: std::cell::Cell<Option<super::node_wait::WaitSet>>,
    /// Whether a statement still running when the connection is dropped is
    /// cancelled first (a replication stream just goes: its walsender ends
    /// when the connection does).
    pub(super) cancel_on_drop: bool,
}

impl NodeConnection {
    /// Connect to `node`, in the current database, as the acting role.
    pub(crate) fn open(node: &Node) -> Result<NodeConnection> {
        Self::open_as(node, &[])
    }

    /// [`NodeConnection::open`] with more connection settings (a
    /// replication connection's `replication`).
    pub(super) fn open_as(node: &Node, more: &[(&str, &str)]) -> Result<NodeConnection> {
        let unreachable = |cause: String| ShardError::Unreachable {
            host: node.host.clone(),
            port: node.port,
            cause,
        };
        let database = crate::spi::query_value::<String>("SELECT current_database()::text")?
            .unwrap_or_else(|| "postgres".into());
        let user = crate::metadata::catalog::acting_user()?;
        let encoding = database_encoding();
        let settings = [
            ("host", node.host.clone()),
            ("port", node.port.to_string()),
            ("dbname", database),
            ("user", user),
            ("application_name", super::client::application_name()),
            ("client_encoding", encoding),
            ("options", SESSION_OPTIONS.to_string()),
            // Notice a worker that vanished instead of waiting forever.
            ("keepalives", "1".to_string()),
            ("keepalives_idle", "30".to_string()),
            ("tcp_user_timeout", "60000".to_string()),
        ];
        let more = more.iter().map(|(key, value)| (*key, value.to_string()));
        let mut owned = Vec::with_capacity(settings.len() * 2);
        for (key, value) in settings.into_iter().chain(more) {
            let value =
                CString::new(value).map_err(|_| unreachable("a setting contains a NUL".into()))?;
            owned.push((CString::new(key).unwrap_or_default(), value));
        }
        let mut keywords: Vec<*const c_char> = owned.iter().map(|(k, _)| k.as_ptr()).collect();
        let mut values: Vec<*const c_char> = owned.iter().map(|(_, v)| v.as_ptr()).collect();
        keywords.push(std::ptr::null());
        values.push(std::ptr::null());
        // SAFETY: NULL-terminated arrays of C strings that outlive the call.
        let conn = unsafe { PQconnectStartParams(keywords.as_ptr(), values.as_ptr(), 0) };
        if conn.is_null() {
            return Err(unreachable("out of memory".into()));
        }
        let connection = NodeConnection {
            conn,
            node: node.clone(),
            declared_version: None,
            session_version: None,
            prepared: Vec::new(),
            statements_prepared: 0,
            timezone: String::new(),
            session_planning: Planning::Own,
            local_planning: None,
            wait_set: std::cell::Cell::new(None),
            cancel_on_drop: true,
        };
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            // SAFETY: a connection being started.
            let state = unsafe { PQconnectPoll(conn) };
            match state {
                PGRES_POLLING_OK => break,
                PGRES_POLLING_FAILED => {
                    return Err(unreachable(connection_failure(&connection.error_message())))
                }
                PGRES_POLLING_READING | PGRES_POLLING_WRITING => {
                    let events = if state == PGRES_POLLING_READING {
                        pg_sys::WL_SOCKET_READABLE
                    } else {
                        pg_sys::WL_SOCKET_WRITEABLE
                    };
                    if !connection.wait(events, Some(deadline)) {
                        return Err(unreachable("timeout expired".into()));
                    }
                }
                _ => {}
            }
        }
        // SAFETY: a connected connection.
        unsafe {
            if PQstatus(conn) != CONNECTION_OK || PQsetnonblocking(conn, 1) != 0 {
                return Err(unreachable(connection.error_message()));
            }
            // Notices of the node's statements (an IF EXISTS that found
            // nothing) are the node's business; they would otherwise go to
            // the server log.
            PQsetNoticeReceiver(conn, Some(ignore_notice), std::ptr::null_mut());
        }
        Ok(connection)
    }

    pub(crate) fn node(&self) -> &Node {
        &self.node
    }

    /// The encoding of the node's database (`server_encoding`).
    pub(crate) fn server_encoding(&self) -> Option<String> {
        // SAFETY: a valid connection; the value (or NULL) is libpq's,
        // copied at once.
        unsafe {
            let value = PQparameterStatus(self.conn, c"server_encoding".as_ptr());
            (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
        }
    }

    /// Whether the node's session is outside any transaction (a failed
    /// connection is not).
    pub(crate) fn is_idle(&self) -> bool {
        // SAFETY: a valid connection.
        unsafe {
            PQstatus(self.conn) == CONNECTION_OK && PQtransactionStatus(self.conn) == PQTRANS_IDLE
        }
    }

    /// Whether a cached connection is still open: a node that restarted
    /// since closed it, which reading what arrived (without waiting) shows.
    pub(crate) fn still_open(&mut self) -> bool {
        unsafe extern "C" {
            fn recv(fd: c_int, buf: *mut std::ffi::c_void, len: usize, flags: c_int) -> isize;
        }
        const MSG_PEEK: c_int = 2;
        const MSG_DONTWAIT: c_int = 0x40;
        if !self.is_idle() {
            return false;
        }
        // An idle session gets nothing from its node: anything readable is
        // the end of the connection or the FATAL message before it.
        let mut byte = 0u8;
        // SAFETY: a peek of one byte into a local buffer; it never waits.
        let peeked = unsafe {
            recv(
                PQsocket(self.conn),
                &mut byte as *mut u8 as *mut std::ffi::c_void,
                1,
                MSG_PEEK | MSG_DONTWAIT,
            )
        };
        peeked < 0
    }

    /// Whether a statement is still running there.
    pub(crate) fn is_busy(&self) -> bool {
        // SAFETY: a valid connection.
        unsafe { PQtransactionStatus(self.conn) == PQTRANS_ACTIVE }
    }

    /// `COMMIT` of the open transaction; an aborted one (which COMMIT would
    /// quietly roll back) is an error.
    pub(crate) fn commit(&mut self) -> Result<()> {
        // SAFETY: a valid connection.
        if unsafe { PQtransactionStatus(self.conn) } != PQTRANS_INTRANS {
            return Err(self.failure("its transaction failed and was rolled back".into()));
        }
        self.execute("COMMIT").map(|_| ())
    }

    /// Start a transaction on the node with `begin`, declaring map
    /// `version` for it (`SET LOCAL`: a cached connection's next
    /// transaction declares its own), in one round trip.
    pub(crate) fn begin(&mut self, begin: &str, version: Option<i64>) -> Result<()> {
        // A version the session declared for autocommit statements is not
        // this transaction's (pg_shard's own changes declare none).
        let reset = if self.session_version.take().is_some() {
            "; RESET pg_shard.map_version"
        } else {
            ""
        };
        self.declared_version = None;
        self.local_planning = None;
        match version {
            Some(version) => {
                self.execute(&format!(
                    "{begin}{reset}; SET LOCAL pg_shard.map_version = {version}"
                ))?;
                self.declared_version = Some(version);
            }
            // (0, no version: a session-level one the RESET did not end —
            // it is undone when the transaction that ran it rolls back —
            // is not this transaction's either.)
            None => {
                self.execute(&format!(
                    "{begin}{reset}; SET LOCAL pg_shard.map_version = 0"
                ))?;
            }
        }
        Ok(())
    }

    /// Declare map `version`, `timezone` and how to plan (see [`Planning`])
    /// for the session's autocommit statements, where they differ from what
    /// it has (one round trip when any changed).
    pub(crate) fn declare_for_autocommit(
        &mut self,
        version: i64,
        timezone: &str,
        planning: Planning,
    ) -> Result<()> {
        let mut statements = Vec::new();
        if self.session_version != Some(version) {
            statements.push(format!("SET pg_shard.map_version = {version}"));
        }
        if !timezone.is_empty() && self.timezone != timezone {
            statements.push(format!(
                "SET TimeZone = {}",
                crate::quote::literal(timezone)
            ));
        }
        statements.extend(planning_settings("SET", self.session_planning, planning));
        if statements.is_empty() {
            return Ok(());
        }
        self.execute(&statements.join("; "))?;
        self.session_version = Some(version);
        self.timezone = timezone.to_string();
        self.session_planning = planning;
        Ok(())
    }

    /// Declare map `version` and how to plan (see [`Planning`]) for the
    /// open transaction, and give the session `timezone`, where they differ
    /// from what it has (one round trip when any changed).
    pub(crate) fn declare_session(
        &mut self,
        version: i64,
        timezone: &str,
        planning: Planning,
    ) -> Result<()> {
        let mut statements = Vec::new();
        if self.declared_version != Some(version) {
            statements.push(format!("SET LOCAL pg_shard.map_version = {version}"));
        }
        if !timezone.is_empty() && self.timezone != timezone {
            statements.push(format!(
                "SET TimeZone = {}",
                crate::quote::literal(timezone)
            ));
        }
        statements.extend(planning_settings(
            "SET LOCAL",
            self.local_planning.unwrap_or(self.session_planning),
            planning,
        ));
        if statements.is_empty() {
            return Ok(());
        }
        self.execute(&statements.join("; "))?;
        self.declared_version = Some(version);
        self.timezone = timezone.to_string();
        self.local_planning = Some(planning);
        Ok(())
    }

    /// Run `sql` (one statement or several) with the simple protocol.
    pub(crate) fn execute(&mut self, sql: &str) -> Result<Outcome> {
        let sql = self.c_string(sql)?;
        // SAFETY: a valid connection and a C string that outlives the call.
        let sent = unsafe { PQsendQuery(self.conn, sql.as_ptr()) };
        self.sent(sent)?;
        self.results(|_| Ok(()))
    }

    /// Run one statement with text parameters (None is NULL), for its effect.
    pub(crate) fn execute_with(&mut self, sql: &str, params: &[Option<&str>]) -> Result<Outcome> {
        self.for_each_row(sql, &[], params, |_| Ok(()))
    }

    /// Run one statement with text parameters (None is NULL; types of 0
    /// are left to the node to infer) and return its rows.
    pub(crate) fn query(
        &mut self,
        sql: &str,
        params: &[Option<&str>],
    ) -> Result<Vec<Vec<Option<String>>>> {
        let mut rows = Vec::new();
        self.for_each_row(sql, &[], params, |row| {
            rows.push((0..row.len()).map(|c| row.text(c)).collect());
            Ok(())
        })?;
        Ok(rows)
    }

    /// Run one statement with text parameters of the given types and hand
    /// each row to `each` as it arrives (single-row mode: nothing is held
    /// beyond the row).
    pub(crate) fn for_each_row(
        &mut self,
        sql: &str,
        types: &[pg_sys::Oid],
        params: &[Option<&str>],
        each: impl FnMut(&TextRow<'_>) -> Result<()>,
    ) -> Result<Outcome> {
        let sql = self.c_string(sql)?;
        let owned = self.c_params(params)?;
        let values = value_pointers(&owned);
        let types: Vec<u32> = (0..params.len())
            .map(|i| types.get(i).map_or(0, |t| t.to_u32()))
            .collect();
        // SAFETY: arrays of params.len() entries that outlive the call; text
        // format (no lengths or formats needed).
        let sent = unsafe {
            PQsendQueryParams(
                self.conn,
                sql.as_ptr(),
                params.len() as c_int,
                types.as_ptr(),
                values.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                0,
            )
        };
        self.sent(sent)?;
        self.single_rows(each)
    }

    /// [`NodeConnection::for_each_row`] of a statement this session
    /// prepares on the node the first time it runs it (up to
    /// [`PREPARED_LIMIT`] of them; the oldest is deallocated): later runs
    /// skip the node's parsing and planning.
    pub(crate) fn for_each_row_prepared(
        &mut self,
        sql: &str,
        types: &[pg_sys::Oid],
        params: &[Option<&str>],
        each: impl FnMut(&TextRow<'_>) -> Result<()>,
    ) -> Result<Outcome> {
        // (The same text with other parameter types is another statement.)
        let key = format!(
            "{sql}\0{}",
            types
                .iter()
                .map(|t| t.to_u32().to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let name = match self.prepared.iter().position(|(known, _)| *known == key) {
            Some(i) => {
                let entry = self.prepared.remove(i);
                let name = entry.1.clone();
                self.prepared.push(entry);
                name
            }
            None => {
                if self.prepared.len() >= PREPARED_LIMIT {
                    let (_, oldest) = self.prepared.remove(0);
                    self.execute(&format!("DEALLOCATE {oldest}"))?;
                }
                self.statements_prepared += 1;
                let name = format!("pg_shard_{}", self.statements_prepared);
                let c_name = self.c_string(&name)?;
                let c_sql = self.c_string(sql)?;
                let types: Vec<u32> = types.iter().map(|t| t.to_u32()).collect();
                // SAFETY: C strings and an array of types that outlive the call.
                let sent = unsafe {
                    PQsendPrepare(
                        self.conn,
                        c_name.as_ptr(),
                        c_sql.as_ptr(),
                        types.len() as c_int,
                        types.as_ptr(),
                    )
                };
                self.sent(sent)?;
                self.results(|_| Ok(()))?;
                self.prepared.push((key, name.clone()));
                name
            }
        };
        let c_name = self.c_string(&name)?;
        let owned = self.c_params(params)?;
        let values = value_pointers(&owned);
        // SAFETY: as in for_each_row.
        let sent = unsafe {
            PQsendQueryPrepared(
                self.conn,
                c_name.as_ptr(),
                params.len() as c_int,
                values.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                0,
            )
        };
        self.sent(sent)?;
        self.single_rows(each)
    }

    /// Send one statement without waiting for it: several nodes work at
    /// once, and [`NodeConnection::receive_rows`] reads each one's rows.
    pub(crate) fn send_query(&mut self, sql: &str) -> Result<()> {
        let sql = self.c_string(sql)?;
        // SAFETY: a valid connection and a C string that outlives the call;
        // no parameters.
        let sent = unsafe {
            PQsendQueryParams(
                self.conn,
                sql.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                0,
            )
        };
        self.sent(sent)?;
        // SAFETY: right after sending, before any result is read.
        unsafe { PQsetSingleRowMode(self.conn) };
        Ok(())
    }

    /// Send several statements (`;`-separated, simple protocol) without
    /// waiting for them; [`NodeConnection::receive_rows`] reads their rows,
    /// a whole result at a time.
    pub(crate) fn send_statements(&mut self, sql: &str) -> Result<()> {
        let sql = self.c_string(sql)?;
        // SAFETY: a valid connection and a C string that outlives the call.
        let sent = unsafe { PQsendQuery(self.conn, sql.as_ptr()) };
        self.sent(sent)
    }

    /// The rows of the statement [`NodeConnection::send_query`] sent, one
    /// at a time.
    pub(crate) fn receive_rows(
        &mut self,
        each: impl FnMut(&TextRow<'_>) -> Result<()>,
    ) -> Result<Outcome> {
        self.rows(each)
    }

    /// Read a sent statement's rows one at a time (libpq's single-row mode).
    fn single_rows(&mut self, each: impl FnMut(&TextRow<'_>) -> Result<()>) -> Result<Outcome> {
        // SAFETY: right after sending, before any result is read.
        unsafe { PQsetSingleRowMode(self.conn) };
        self.rows(each)
    }

    fn rows(&mut self, mut each: impl FnMut(&TextRow<'_>) -> Result<()>) -> Result<Outcome> {
        self.results(|result| {
            // SAFETY: a live result.
            let rows = unsafe { PQntuples(result.0) };
            for row in 0..rows {
                each(&TextRow { result, row })?;
            }
            Ok(())
        })
    }

    /// Text parameters as C strings (None for NULL).
    fn c_params(&self, params: &[Option<&str>]) -> Result<Vec<Option<CString>>> {
        params
            .iter()
            .map(|param| param.map(|text| self.c_string(text)).transpose())
            .collect()
    }

    pub(super) fn c_string(&self, text: &str) -> Result<CString> {
        CString::new(text).map_err(|_| {
            ShardError::InvalidArgument(
                "a statement or value for a node contains a NUL byte".into(),
            )
        })
    }

    pub(super) fn sent(&mut self, sent: c_int) -> Result<()> {
        if sent != 1 {
            return Err(self.failure(self.error_message()));
        }
        self.flush()
    }

    /// Push what libpq buffered to the node.
    pub(super) fn flush(&mut self) -> Result<()> {
        loop {
            // SAFETY: a valid non-blocking connection.
            match unsafe { PQflush(self.conn) } {
                0 => return Ok(()),
                1 => {
                    self.wait(
                        pg_sys::WL_SOCKET_WRITEABLE | pg_sys::WL_SOCKET_READABLE,
                        None,
                    );
                    // SAFETY: reading what the node sent meanwhile keeps it from blocking.
                    if unsafe { PQconsumeInput(self.conn) } == 0 {
                        return Err(self.failure(self.error_message()));
                    }
                }
                _ => return Err(self.failure(self.error_message())),
            }
        }
    }

    /// The next result of the statement sent, waiting for it; None when
    /// there are no more.
    pub(super) fn next_result(&mut self) -> Result<Option<ResultGuard>> {
        // SAFETY: a valid connection; waits on the latch and socket.
        unsafe {
            while PQisBusy(self.conn) != 0 {
                self.wait(pg_sys::WL_SOCKET_READABLE, None);
                if PQconsumeInput(self.conn) == 0 {
                    return Err(self.failure(self.error_message()));
                }
            }
            let result = PQgetResult(self.conn);
            Ok((!result.is_null()).then_some(ResultGuard(result)))
        }
    }

    /// Read every result of the statement sent; rows go to `rows`. The
    /// first error is returned once all results are read, so the
    /// connection is ready for the next statement.
    pub(super) fn results(
        &mut self,
        mut rows: impl FnMut(&ResultGuard) -> Result<()>,
    ) -> Result<Outcome> {
        let mut outcome = Outcome::default();
        let mut first_error: Option<ShardError> = None;
        while let Some(result) = self.next_result()? {
            // SAFETY: a live result.
            let status = unsafe { PQresultStatus(result.0) };
            match status {
                PGRES_SINGLE_TUPLE | PGRES_TUPLES_OK | PGRES_COMMAND_OK => {
                    if first_error.is_none() {
                        if let Err(e) = rows(&result) {
                            first_error = Some(e);
                        }
                    }
                    if status != PGRES_SINGLE_TUPLE {
                        outcome.rows += command_rows(&result);
                    }
                }
                PGRES_EMPTY_QUERY => {}
                PGRES_COPY_IN | PGRES_COPY_OUT => {
                    // Not asked for: end it so the connection stays usable.
                    // SAFETY: a connection in COPY mode.
                    unsafe {
                        PQputCopyEnd(self.conn, c"unexpected COPY".as_ptr());
                    }
                    first_error.get_or_insert_with(|| {
                        self.failure("the node started a COPY that was not asked for".into())
                    });
                }
                _ => {
                    let error = self.result_error(&result);
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(outcome),
        }
    }

    pub(super) fn error_message(&self) -> String {
        // SAFETY: a live connection (until Drop).
        unsafe { connection_message(self.conn) }
    }

    pub(super) fn failure(&self, cause: String) -> ShardError {
        node_failure(&self.node, cause)
    }

    /// The error a failed result reports, with the node's SQLSTATE.
    pub(super) fn result_error(&self, result: &ResultGuard) -> ShardError {
        super::node_errors::result_error(&self.node, result, || self.error_message())
    }
}

/// The name of this database's encoding (as `server_encoding` names it).
pub(crate) fn database_encoding() -> String {
    // SAFETY: returns a static string naming the database's encoding.
    unsafe { CStr::from_ptr(pg_sys::GetDatabaseEncodingName()) }
        .to_string_lossy()
        .into_owned()
}

impl Drop for NodeConnection {
    fn drop(&mut self) {
        // A query still running there (an interrupt, an error raised while
        // rows arrived) is cancelled rather than left to run to its end.
        // SAFETY: the connection is valid until PQfinish, called once.
        unsafe {
            if self.cancel_on_drop && PQtransactionStatus(self.conn) == PQTRANS_ACTIVE {
                self.cancel();
            }
            PQfinish(self.conn);
        }
        if let Some(set) = self.wait_set.take() {
            set.free();
        }
    }
}

/// Pointers to parameter C strings (NULL for NULL), valid while `owned` is.
fn value_pointers(owned: &[Option<CString>]) -> Vec<*const c_char> {
    owned
        .iter()
        .map(|p| p.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()))
        .collect()
}

unsafe extern "C" fn ignore_notice(_arg: *mut std::ffi::c_void, _result: *const PGresult) {}

#[cfg(test)]
mod tests {
    use super::{planning_settings, Planning};

    #[test]
    fn planning_changes_set_only_what_differs() {
        assert!(planning_settings("SET", Planning::Own, Planning::Own).is_empty());
        assert_eq!(
            planning_settings("SET", Planning::Own, Planning::SharedCores),
            vec!["SET max_parallel_workers_per_gather = 0"]
        );
        assert_eq!(
            planning_settings("SET LOCAL", Planning::Own, Planning::Branches),
            vec![
                "SET LOCAL jit = off",
                "SET LOCAL max_parallel_workers_per_gather = 0",
                "SET LOCAL random_page_cost = 2",
            ]
        );
        assert_eq!(
            planning_settings("SET", Planning::Branches, Planning::SharedCores),
            vec!["SET jit TO DEFAULT", "SET random_page_cost TO DEFAULT"]
        );
        assert_eq!(
            planning_settings("SET", Planning::SharedCores, Planning::Own),
            vec!["SET max_parallel_workers_per_gather TO DEFAULT"]
        );
    }
}
