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
use crate::error::{RemoteNotes, Result, ShardError};
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
const SESSION_OPTIONS: &str = "-c search_path=pg_catalog -c datestyle=ISO \
                               -c intervalstyle=postgres -c extra_float_digits=3 \
                               -c bytea_output=hex";

pub(crate) struct NodeConnection {
    conn: *mut PGconn,
    node: Node,
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
}

/// One row of a result, as text.
pub(crate) struct TextRow<'a> {
    result: &'a ResultGuard,
    row: c_int,
}

impl TextRow<'_> {
    pub(crate) fn len(&self) -> usize {
        // SAFETY: the result is alive for the row's lifetime.
        unsafe { PQnfields(self.result.0) as usize }
    }

    /// Column `column`'s bytes, or None for NULL.
    pub(crate) fn bytes(&self, column: usize) -> Option<&[u8]> {
        let column = column as c_int;
        // SAFETY: row and column are within the result (callers iterate
        // 0..len(); libpq returns NULL flags and lengths for them).
        unsafe {
            if PQgetisnull(self.result.0, self.row, column) != 0 {
                return None;
            }
            let value = PQgetvalue(self.result.0, self.row, column) as *const u8;
            let length = PQgetlength(self.result.0, self.row, column) as usize;
            Some(std::slice::from_raw_parts(value, length))
        }
    }

    /// Column `column` as a NUL-terminated C string (libpq terminates every
    /// value), or None for NULL.
    pub(crate) fn c_str(&self, column: usize) -> Option<&CStr> {
        let column = column as c_int;
        // SAFETY: as above; libpq values are NUL-terminated.
        unsafe {
            if PQgetisnull(self.result.0, self.row, column) != 0 {
                return None;
            }
            Some(CStr::from_ptr(PQgetvalue(self.result.0, self.row, column)))
        }
    }

    pub(crate) fn text(&self, column: usize) -> Option<String> {
        self.bytes(column)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

/// Frees a result however the scope is left (an interrupt unwinds).
struct ResultGuard(*mut PGresult);

impl Drop for ResultGuard {
    fn drop(&mut self) {
        // SAFETY: a result from PQgetResult, freed once.
        unsafe { PQclear(self.0) }
    }
}

/// What a statement's results came to.
#[derive(Default)]
pub(crate) struct Outcome {
    /// The rows its commands affected or returned (their command tags'
    /// counts, added up when a string held several).
    pub(crate) rows: u64,
}

impl NodeConnection {
    /// Connect to `node`, in the current database, as the acting role.
    pub(crate) fn open(node: &Node) -> Result<NodeConnection> {
        let unreachable = |cause: String| ShardError::Unreachable {
            host: node.host.clone(),
            port: node.port,
            cause,
        };
        let database = crate::spi::query_value::<String>("SELECT current_database()::text")?
            .unwrap_or_else(|| "postgres".into());
        let user = crate::metadata::catalog::acting_user()?;
        // SAFETY: returns a static string naming the database's encoding.
        let encoding = unsafe { CStr::from_ptr(pg_sys::GetDatabaseEncodingName()) }
            .to_string_lossy()
            .into_owned();
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
        let mut owned = Vec::with_capacity(settings.len() * 2);
        for (key, value) in settings {
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
        match version {
            Some(version) => {
                self.execute(&format!(
                    "{begin}{reset}; SET LOCAL pg_shard.map_version = {version}"
                ))?;
                self.declared_version = Some(version);
            }
            None => {
                self.execute(&format!("{begin}{reset}"))?;
            }
        }
        Ok(())
    }

    /// Declare map `version` and `timezone` for the session's autocommit
    /// statements, where they differ from what it has.
    pub(crate) fn declare_for_autocommit(&mut self, version: i64, timezone: &str) -> Result<()> {
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
        if statements.is_empty() {
            return Ok(());
        }
        self.execute(&statements.join("; "))?;
        self.session_version = Some(version);
        self.timezone = timezone.to_string();
        Ok(())
    }

    /// Declare map `version` for the open transaction, and give the
    /// session `timezone`, where they differ from what it has (one round
    /// trip when either changed).
    pub(crate) fn declare_session(&mut self, version: i64, timezone: &str) -> Result<()> {
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
        if statements.is_empty() {
            return Ok(());
        }
        self.execute(&statements.join("; "))?;
        self.declared_version = Some(version);
        self.timezone = timezone.to_string();
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
        let name = match self.prepared.iter().position(|(text, _)| text == sql) {
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
                self.prepared.push((sql.to_string(), name.clone()));
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

    /// Send `COPY … FROM STDIN` and all of `data` without waiting for the
    /// node to finish storing it, so the caller can prepare the next batch
    /// (or keep another node busy) meanwhile. [`NodeConnection::finish_copy_in`]
    /// must read the outcome before the connection is used again.
    pub(crate) fn start_copy_in(&mut self, sql: &str, data: &[u8]) -> Result<()> {
        let statement = self.c_string(sql)?;
        // SAFETY: as in execute.
        let sent = unsafe { PQsendQuery(self.conn, statement.as_ptr()) };
        self.sent(sent)?;
        let result = self.next_result()?;
        let Some(result) = result else {
            return Err(self.failure("COPY returned no result".into()));
        };
        // SAFETY: a live result.
        if unsafe { PQresultStatus(result.0) } != PGRES_COPY_IN {
            let error = self.result_error(&result);
            drop(result);
            let _ = self.results(|_| Ok(()));
            return Err(error);
        }
        drop(result);
        for chunk in data.chunks(1 << 20) {
            loop {
                // SAFETY: a connection in COPY IN; chunk is valid for the call.
                let put = unsafe {
                    PQputCopyData(
                        self.conn,
                        chunk.as_ptr() as *const c_char,
                        chunk.len() as c_int,
                    )
                };
                match put {
                    1 => break,
                    0 => {
                        self.wait(pg_sys::WL_SOCKET_WRITEABLE, None);
                    }
                    _ => return Err(self.failure(self.error_message())),
                }
            }
        }
        loop {
            // SAFETY: as above.
            match unsafe { PQputCopyEnd(self.conn, std::ptr::null()) } {
                1 => break,
                0 => {
                    self.wait(pg_sys::WL_SOCKET_WRITEABLE, None);
                }
                _ => return Err(self.failure(self.error_message())),
            }
        }
        self.send_some()
    }

    /// Pass what libpq holds of a started COPY on to the node as far as
    /// the socket takes it now, without waiting.
    pub(crate) fn send_some(&mut self) -> Result<()> {
        // SAFETY: a valid non-blocking connection; PQflush sends what the
        // socket takes and keeps the rest, and reading what the node sent
        // meanwhile keeps it from blocking on us.
        unsafe {
            if PQflush(self.conn) < 0 || PQconsumeInput(self.conn) == 0 {
                return Err(self.failure(self.error_message()));
            }
        }
        Ok(())
    }

    /// The outcome of the COPY [`NodeConnection::start_copy_in`] sent, once
    /// all of its data has reached the node.
    pub(crate) fn finish_copy_in(&mut self) -> Result<Outcome> {
        self.flush()?;
        self.results(|_| Ok(()))
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

    fn c_string(&self, text: &str) -> Result<CString> {
        CString::new(text).map_err(|_| {
            ShardError::InvalidArgument(
                "a statement or value for a node contains a NUL byte".into(),
            )
        })
    }

    fn sent(&mut self, sent: c_int) -> Result<()> {
        if sent != 1 {
            return Err(self.failure(self.error_message()));
        }
        self.flush()
    }

    /// Push what libpq buffered to the node.
    fn flush(&mut self) -> Result<()> {
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
    fn next_result(&mut self) -> Result<Option<ResultGuard>> {
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
    fn results(&mut self, mut rows: impl FnMut(&ResultGuard) -> Result<()>) -> Result<Outcome> {
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

    /// Wait for `events` on the socket, or the latch, until `deadline`;
    /// false when the deadline passed. Interrupts are served here.
    fn wait(&self, events: u32, deadline: Option<Instant>) -> bool {
        // SAFETY: a valid connection.
        if unsafe { PQsocket(self.conn) } < 0 {
            // Closed: the caller's next libpq call reports why (PostgreSQL
            // refuses to wait on no socket).
            return true;
        }
        loop {
            let timeout = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    left.as_millis().max(1) as std::ffi::c_long
                }
                None => -1,
            };
            let mut flags = events | pg_sys::WL_LATCH_SET | pg_sys::WL_EXIT_ON_PM_DEATH;
            if deadline.is_some() {
                flags |= pg_sys::WL_TIMEOUT;
            }
            // SAFETY: MyLatch is the backend's latch; the socket belongs to
            // this open connection.
            let fired = unsafe {
                pg_sys::WaitLatchOrSocket(
                    pg_sys::MyLatch,
                    flags as c_int,
                    PQsocket(self.conn),
                    timeout,
                    pg_sys::PG_WAIT_EXTENSION,
                )
            } as u32;
            if fired & pg_sys::WL_LATCH_SET != 0 {
                // SAFETY: resetting our own latch before serving interrupts.
                unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
                pgrx::check_for_interrupts!();
            }
            if fired & events != 0 {
                return true;
            }
            if fired & pg_sys::WL_TIMEOUT != 0 {
                return false;
            }
        }
    }

    fn error_message(&self) -> String {
        // SAFETY: libpq's message for this connection, copied out.
        let text = unsafe { CStr::from_ptr(PQerrorMessage(self.conn)) };
        let text = text.to_string_lossy();
        let text = text.trim();
        if text.is_empty() {
            "connection lost".into()
        } else {
            text.to_string()
        }
    }

    fn failure(&self, cause: String) -> ShardError {
        ShardError::Remote {
            host: self.node.host.clone(),
            port: self.node.port,
            cause,
        }
    }

    /// The error a failed result reports, with the node's SQLSTATE.
    fn result_error(&self, result: &ResultGuard) -> ShardError {
        let field = |code: c_int| {
            // SAFETY: a live result; fields are NUL-terminated or NULL.
            let value = unsafe { PQresultErrorField(result.0, code) };
            (!value.is_null()).then(|| {
                // SAFETY: non-NULL, NUL-terminated.
                unsafe { CStr::from_ptr(value) }
                    .to_string_lossy()
                    .into_owned()
            })
        };
        let message = field(PG_DIAG_MESSAGE_PRIMARY).unwrap_or_else(|| {
            // SAFETY: as above.
            let whole = unsafe { CStr::from_ptr(PQresultErrorMessage(result.0)) };
            let whole = whole.to_string_lossy().trim().to_string();
            if whole.is_empty() {
                self.error_message()
            } else {
                whole
            }
        });
        ShardError::RemoteStatement {
            node: self.node.label(),
            sqlstate: field(PG_DIAG_SQLSTATE).unwrap_or_else(|| "08000".into()),
            message,
            detail: field(PG_DIAG_MESSAGE_DETAIL),
            notes: Box::new(RemoteNotes {
                hint: field(PG_DIAG_MESSAGE_HINT),
                context: field(PG_DIAG_CONTEXT),
            }),
        }
    }

    /// Ask the node to cancel what this connection runs (best effort).
    fn cancel(&self) {
        // SAFETY: a cancel object for this connection, freed here; PQcancel
        // writes at most errbuf's size.
        unsafe {
            let cancel = PQgetCancel(self.conn);
            if cancel.is_null() {
                return;
            }
            let mut errbuf = [0 as c_char; 256];
            PQcancel(cancel, errbuf.as_mut_ptr(), errbuf.len() as c_int);
            PQfreeCancel(cancel);
        }
    }
}

impl Drop for NodeConnection {
    fn drop(&mut self) {
        // A query still running there (an interrupt, an error raised while
        // rows arrived) is cancelled rather than left to run to its end.
        // SAFETY: the connection is valid until PQfinish, called once.
        unsafe {
            if PQtransactionStatus(self.conn) == PQTRANS_ACTIVE {
                self.cancel();
            }
            PQfinish(self.conn);
        }
    }
}

/// libpq's reason a connection failed, without the address the error
/// message names already: `connection to server at "h", port p failed:
/// Connection refused` and its hint line become `Connection refused`.
fn connection_failure(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message);
    let reason = match first.find(" failed: ") {
        Some(at) if first.starts_with("connection to server") => &first[at + " failed: ".len()..],
        _ => first,
    };
    reason.trim().to_string()
}

/// Pointers to parameter C strings (NULL for NULL), valid while `owned` is.
fn value_pointers(owned: &[Option<CString>]) -> Vec<*const c_char> {
    owned
        .iter()
        .map(|p| p.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()))
        .collect()
}

/// The count in a result's command tag (0 for commands without one).
fn command_rows(result: &ResultGuard) -> u64 {
    // SAFETY: a live result; PQcmdTuples returns "" when there is no count.
    let text = unsafe { CStr::from_ptr(PQcmdTuples(result.0)) };
    text.to_str().ok().and_then(|t| t.parse().ok()).unwrap_or(0)
}

unsafe extern "C" fn ignore_notice(_arg: *mut std::ffi::c_void, _result: *const PGresult) {}

/// Whether `sqlstate` (a failed node statement's) is `code`.
pub(crate) fn is_sqlstate(error: &ShardError, code: &str) -> bool {
    matches!(error, ShardError::RemoteStatement { sqlstate, .. } if sqlstate == code)
}

#[cfg(test)]
mod tests {
    #[test]
    fn connection_failures_keep_the_reason() {
        assert_eq!(
            super::connection_failure(
                "connection to server at \"127.0.0.1\", port 1 failed: Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?"
            ),
            "Connection refused"
        );
        assert_eq!(
            super::connection_failure("timeout expired"),
            "timeout expired"
        );
    }
}
