//! The errors the extension reports, each with the SQLSTATE a client sees.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use std::ffi::{c_char, c_int};
use thiserror::Error;

#[derive(Debug, Error)]
pub(crate) enum ShardError {
    #[error("relation \"{0}\" does not exist")]
    UnknownTable(String),
    #[error("column \"{column}\" of relation {table} does not exist")]
    UnknownColumn { table: String, column: String },
    #[error(
        "distribution column \"{column}\" has type {type_name}, which has no keyspace encoding"
    )]
    UnsupportedKeyType { column: String, type_name: String },
    #[error("keyspace_id is not defined for type {0}")]
    UnsupportedValueType(String),
    #[error("null value in distribution column \"{column}\" of relation {table}")]
    NullKey { table: String, column: String },
    /// A row's error raised by PostgreSQL on this node while COPY read it,
    /// with the CONTEXT that names the line.
    #[error("{message}")]
    CopyRow {
        sqlstate: String,
        message: String,
        detail: Option<String>,
        hint: Option<String>,
        context: Option<String>,
    },
    #[error("table {0} is already distributed")]
    AlreadyDistributed(String),
    #[error("table {0} is not a distributed table")]
    NotDistributed(String),
    #[error("cannot distribute {table}: {reason}")]
    UnsupportedTable { table: String, reason: String },
    #[error("cannot change {table}: {reason}")]
    UnsupportedSchemaChange { table: String, reason: String },
    #[error(
        "cannot add \"{name}\" to {table}: a unique constraint or index of a distributed \
         table must include its distribution column \"{column}\""
    )]
    UniqueWithoutDistributionColumn {
        table: String,
        name: String,
        column: String,
    },
    #[error("{0}")]
    PermissionDenied(String),
    #[error("cannot drop {0}")]
    DependentObjects(String),
    #[error("table {0} is neither a distributed nor a reference table")]
    NotLogicalTable(String),
    #[error("relation \"{0}\" already exists")]
    RelationExists(String),
    #[error("constraint \"{constraint}\" of relation {table} does not exist")]
    UnknownConstraint { constraint: String, table: String },
    #[error("constraint \"{constraint}\" for relation {table} already exists")]
    ConstraintExists { constraint: String, table: String },
    #[error("cannot change {0}: a shard move or split of it is in progress")]
    SchemaChangeDuringJob(String),
    #[error("cannot distribute {table} now: job {job} is moving or splitting a shard group of the co-location group it would join")]
    DistributeDuringJob { table: String, job: i64 },
    #[error("table {0} has no primary key or replica identity")]
    NoReplicaIdentity(String),
    #[error("cannot co-locate {table} with {other}: {reason}")]
    Colocation {
        table: String,
        other: String,
        reason: String,
    },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("pg_shard.next_id cannot make ids on this node: {0}")]
    NoIdGenerator(String),
    /// A table's shard boundaries are not multiples of 2^54, so its ids'
    /// prefixes do not name one shard each.
    #[error("{0}")]
    UnalignedRanges(String),
    /// A job's copies differ from their source (row counts or checksums).
    #[error("{0}")]
    VerificationMismatch(String),
    /// A node did not reach the state a job waits for in time (WAL flushed,
    /// the last writes applied).
    #[error("{0}")]
    Timeout(String),
    /// A cutover's EXCLUSIVE lock waited longer than its bound for the
    /// transactions in flight (new writers queue behind the request): the
    /// step is given up, with its catalog changes, and tried again.
    #[error("the cutover's lock on {node} waited more than {waited_ms} ms for transactions in flight; it is tried again")]
    CutoverLockBusy { node: String, waited_ms: u64 },
    /// A PostgreSQL ERROR or a Rust panic raised (rather than returned)
    /// inside one of the job runner's own transactions.
    #[error("{0}")]
    JobPanicked(String),
    /// Something that cannot happen unless the catalog or the code is
    /// wrong (a NULL in a NOT NULL column).
    #[error("{0}")]
    Internal(String),
    #[error("there are no active worker nodes; add one with pg_shard.add_node(host, port)")]
    NoWorkers,
    #[error("node {host}:{port} is already in the cluster as node {node_id}")]
    NodeExists {
        host: String,
        port: i32,
        node_id: i32,
    },
    #[error(
        "that server is node {node_id} ({existing}) of the cluster already; add each server once, \
         under one address"
    )]
    SameServer { node_id: i32, existing: String },
    #[error("could not connect to node {host}:{port}: {cause}")]
    Unreachable {
        host: String,
        port: i32,
        cause: String,
    },
    #[error("the pg_shard extension is not installed on the server at {host}:{port}")]
    ExtensionMissing { host: String, port: i32 },
    #[error("node {host}:{port} failed: {cause}")]
    Remote {
        host: String,
        port: i32,
        cause: String,
    },
    /// A statement a node ran failed: reported as the node reported it.
    #[error("{message}")]
    RemoteStatement {
        node: String,
        sqlstate: String,
        message: String,
        detail: Option<String>,
        notes: Box<RemoteNotes>,
    },
    #[error(
        "a rolled-back subtransaction had changed worker nodes, so this transaction \
         cannot commit"
    )]
    SubtransactionRolledBack,
    #[error(
        "pg_shard must move rows in a READ COMMITTED transaction, not REPEATABLE READ \
         or SERIALIZABLE"
    )]
    NeedsReadCommitted,
    #[error(
        "a prepared statement planned for pg_shard's own connections cannot run in a \
         transaction that wrote over postgres_fdw (they would not see what it wrote)"
    )]
    PlanAfterFdwWrite,
    #[error(
        "this statement runs over postgres_fdw, which cannot see what an earlier statement of \
         the same transaction wrote on a worker through pg_shard's own connection"
    )]
    PathsMixed,
    #[error("cannot update the distribution column of a distributed table")]
    KeyUpdate,
    /// A statement pg_shard cannot run as it is written.
    #[error("{statement}")]
    UnsupportedStatement { statement: String, hint: String },
    /// A lookup entry to remove was not there (a transaction that wrote it
    /// may still be committing on its node).
    #[error("could not serialize access due to a concurrent change of lookup {0}")]
    LookupEntryMissing(String),
    /// A value a unique lookup holds already, for another row.
    #[error("duplicate key value violates unique lookup {lookup}")]
    LookupDuplicate {
        lookup: String,
        column: String,
        value: String,
    },
    #[error("cannot PREPARE a transaction that has changed worker nodes through pg_shard")]
    CannotPrepare,
    #[error(
        "pg_shard.coordinated_commit_gids() must run inside the transaction whose commit \
         decides (BEGIN first)"
    )]
    DecisionOutsideTransaction,
    #[error("catalog query failed: {0}")]
    Spi(#[from] pgrx::spi::SpiError),
    #[error("{0}")]
    Range(#[from] pg_shard_core::RangeError),
    #[error("invalid shard map: {0}")]
    ShardMap(#[from] pg_shard_core::ShardMapError),
}

/// The rarer fields of a node's error (boxed: every Result stays small).
#[derive(Debug, Default)]
pub(crate) struct RemoteNotes {
    pub(crate) hint: Option<String>,
    /// The node's CONTEXT (its own names and lines: not raised as is).
    pub(crate) context: Option<String>,
}

impl ShardError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            ShardError::UnknownColumn { .. } => ERRCODE_UNDEFINED_COLUMN,
            ShardError::UnknownTable(_) => ERRCODE_UNDEFINED_TABLE,
            ShardError::UnsupportedKeyType { .. } | ShardError::UnsupportedValueType(_) => {
                ERRCODE_FEATURE_NOT_SUPPORTED
            }
            ShardError::NullKey { .. } => ERRCODE_NOT_NULL_VIOLATION,
            ShardError::AlreadyDistributed(_) => ERRCODE_DUPLICATE_OBJECT,
            ShardError::NotDistributed(_) => ERRCODE_INVALID_TABLE_DEFINITION,
            ShardError::UnsupportedTable { .. } | ShardError::UnsupportedSchemaChange { .. } => {
                ERRCODE_FEATURE_NOT_SUPPORTED
            }
            ShardError::SchemaChangeDuringJob(_) | ShardError::DistributeDuringJob { .. } => {
                ERRCODE_OBJECT_IN_USE
            }
            ShardError::UniqueWithoutDistributionColumn { .. } => ERRCODE_FEATURE_NOT_SUPPORTED,
            ShardError::RelationExists(_) => ERRCODE_DUPLICATE_TABLE,
            ShardError::UnknownConstraint { .. } => ERRCODE_UNDEFINED_OBJECT,
            ShardError::ConstraintExists { .. } => ERRCODE_DUPLICATE_OBJECT,
            ShardError::PermissionDenied(_) => ERRCODE_INSUFFICIENT_PRIVILEGE,
            ShardError::NotLogicalTable(_) => ERRCODE_INVALID_TABLE_DEFINITION,
            ShardError::DependentObjects(_) => ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
            ShardError::NoReplicaIdentity(_) => ERRCODE_INVALID_TABLE_DEFINITION,
            ShardError::Colocation { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            ShardError::InvalidArgument(_) | ShardError::Range(_) => {
                ERRCODE_INVALID_PARAMETER_VALUE
            }
            ShardError::NoIdGenerator(_) | ShardError::UnalignedRanges(_) => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            ShardError::VerificationMismatch(_) => ERRCODE_DATA_CORRUPTED,
            ShardError::Timeout(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            ShardError::CutoverLockBusy { .. } => ERRCODE_LOCK_NOT_AVAILABLE,
            ShardError::JobPanicked(_) | ShardError::Internal(_) => ERRCODE_INTERNAL_ERROR,
            ShardError::NoWorkers => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            ShardError::NodeExists { .. } | ShardError::SameServer { .. } => {
                ERRCODE_DUPLICATE_OBJECT
            }
            ShardError::Unreachable { .. } => ERRCODE_CONNECTION_FAILURE,
            ShardError::ExtensionMissing { .. } => ERRCODE_UNDEFINED_OBJECT,
            ShardError::Remote { .. } => ERRCODE_CONNECTION_EXCEPTION,
            ShardError::RemoteStatement { sqlstate, .. } | ShardError::CopyRow { sqlstate, .. } => {
                sqlstate_code(sqlstate)
            }
            ShardError::SubtransactionRolledBack => ERRCODE_INVALID_TRANSACTION_STATE,
            ShardError::CannotPrepare | ShardError::KeyUpdate => ERRCODE_FEATURE_NOT_SUPPORTED,
            ShardError::LookupDuplicate { .. } => ERRCODE_UNIQUE_VIOLATION,
            ShardError::LookupEntryMissing(_) => ERRCODE_T_R_SERIALIZATION_FAILURE,
            ShardError::UnsupportedStatement { .. } => ERRCODE_FEATURE_NOT_SUPPORTED,
            ShardError::PlanAfterFdwWrite | ShardError::PathsMixed => ERRCODE_FEATURE_NOT_SUPPORTED,
            ShardError::NeedsReadCommitted => ERRCODE_INVALID_TRANSACTION_STATE,
            ShardError::DecisionOutsideTransaction => ERRCODE_NO_ACTIVE_SQL_TRANSACTION,
            ShardError::Spi(_) | ShardError::ShardMap(_) => ERRCODE_INTERNAL_ERROR,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            ShardError::UnsupportedKeyType { .. } | ShardError::UnsupportedValueType(_) => {
                Some(format!(
                    "supported key types: {}",
                    pg_shard_core::KeyEncoding::SUPPORTED_TYPES
                ))
            }
            ShardError::NoReplicaIdentity(table) => Some(format!(
                "shard moves replicate rows logically and need to identify them: \
                 add a primary key, or run ALTER TABLE {table} REPLICA IDENTITY FULL"
            )),
            ShardError::NoIdGenerator(_) => Some(
                "call it on the metadata node (through the coordinator, statements that call \
                 it run there)"
                    .into(),
            ),
            ShardError::UnalignedRanges(_) => Some(
                "routing ids need shard boundaries at multiples of 2^54 (1/1024th of the \
                 keyspace): distribute the table with a power-of-two shard_count of at most \
                 1024, and split at such boundaries"
                    .into(),
            ),
            ShardError::NeedsReadCommitted => Some(
                "a snapshot taken before the table was locked could miss rows; \
                 run it in its own transaction or one started at READ COMMITTED"
                    .into(),
            ),
            ShardError::KeyUpdate => Some(
                "moving a row to another key is not supported yet: DELETE it and INSERT it \
                 with the new key"
                    .into(),
            ),
            ShardError::PlanAfterFdwWrite => {
                Some("run it again: it is planned anew for the transaction".into())
            }
            ShardError::SubtransactionRolledBack => Some(
                "roll the transaction back and run the pg_shard functions again, \
                 outside the savepoint that failed"
                    .into(),
            ),
            ShardError::UniqueWithoutDistributionColumn { column, .. } => Some(format!(
                "each shard checks only its own rows; add \"{column}\" to the key, or keep \
                 the values unique in a lookup table (a reference table, or a table \
                 distributed by that value) that the application writes in the same transaction"
            )),
            ShardError::DependentObjects(_) => Some(
                "drop the foreign key first (ALTER TABLE … DROP CONSTRAINT), or drop both tables \
                 in one statement"
                    .into(),
            ),
            ShardError::SchemaChangeDuringJob(_) => Some(
                "wait for it (pg_shard.wait_job), cancel it (pg_shard.cancel_job), or past its cutover complete it (pg_shard.complete_job) first".into(),
            ),
            ShardError::DistributeDuringJob { .. } => Some(
                "wait for it (pg_shard.wait_job), cancel it (pg_shard.cancel_job), or past its cutover complete it (pg_shard.complete_job) first; colocate_with => 'none' gives the table a group of its own".into(),
            ),
            ShardError::ExtensionMissing { .. } => Some(
                "install the pg_shard package on that server (make install), \
                 then call add_node again"
                    .into(),
            ),
            ShardError::RemoteStatement { notes, .. } => notes.hint.clone(),
            ShardError::UnsupportedStatement { hint, .. } => Some(hint.clone()),
            ShardError::LookupEntryMissing(_) => Some(
                "an entry the write would remove is not there yet (its writer may still be \
                 committing, or be settled by pg_shard.recover_prepared_transactions()): run \
                 the transaction again"
                    .into(),
            ),
            ShardError::CopyRow { hint, .. } => hint.clone(),
            _ => None,
        }
    }

    /// A node statement's failure as the message pg_shard's own commands
    /// give ("node h:p failed: message (detail)"), for errors that are not
    /// the user's statement's.
    pub(crate) fn into_node_failure(self) -> ShardError {
        match self {
            ShardError::RemoteStatement {
                node,
                message,
                detail,
                ..
            } => {
                let (host, port) = node.rsplit_once(':').unwrap_or((node.as_str(), "0"));
                let mut cause = message;
                if let Some(detail) = detail {
                    cause.push_str(" (");
                    cause.push_str(&detail);
                    cause.push(')');
                }
                ShardError::Remote {
                    host: host.to_string(),
                    port: port.parse().unwrap_or(0),
                    cause,
                }
            }
            other => other,
        }
    }

    fn detail(&self) -> Option<String> {
        match self {
            ShardError::RemoteStatement { detail, .. } => detail.clone(),
            ShardError::LookupDuplicate { column, value, .. } => {
                Some(format!("Key ({column})=({value}) already exists."))
            }
            // Reported through pgrx (from a SQL function: distributing a
            // table with rows), which has no CONTEXT: the row goes into
            // the DETAIL, where the COPY command's own path (`raise`) names
            // it in the CONTEXT.
            ShardError::CopyRow {
                detail, context, ..
            } => match (detail, context) {
                (Some(detail), Some(context)) => Some(format!("{detail}\nWhile {context}.")),
                (None, Some(context)) => Some(format!("While {context}.")),
                (detail, None) => detail.clone(),
            },
            _ => None,
        }
    }

    /// Raise this error as a PostgreSQL ERROR.
    pub(crate) fn report(self) -> ! {
        let mut report = ErrorReport::new(self.sqlstate(), self.to_string(), "pg_shard");
        if let Some(hint) = self.hint() {
            report = report.set_hint(hint);
        }
        if let Some(detail) = self.detail() {
            report = report.set_detail(detail);
        }
        report.report(PgLogLevel::ERROR);
        unreachable!("ERROR-level reports do not return")
    }
}

/// The PostgreSQL error code of a five-character SQLSTATE (codes pgrx does
/// not know become internal errors: those are raised by
/// [`raise_with_sqlstate`]).
fn sqlstate_code(sqlstate: &str) -> PgSqlErrorCode {
    if sqlstate.len() != 5 {
        return PgSqlErrorCode::ERRCODE_INTERNAL_ERROR;
    }
    PgSqlErrorCode::from(make_sqlstate(sqlstate))
}

/// MAKE_SQLSTATE: six bits per character, the first lowest.
pub(crate) fn make_sqlstate(code: &str) -> c_int {
    code.bytes()
        .enumerate()
        .map(|(i, ch)| ((ch.wrapping_sub(b'0') & 0x3f) as c_int) << (6 * i))
        .sum()
}

/// Raise an ERROR with any SQLSTATE (pgrx's reports know PostgreSQL's own
/// only), message, and optional detail and hint (NULL for none). Never
/// returns: errfinish longjmps to PostgreSQL's error handler.
///
/// # Safety
/// The strings are NUL-terminated and palloc'd (or static); called where a
/// longjmp skips no Rust frame that owns resources.
pub(crate) unsafe fn raise_with_sqlstate(
    sqlstate: &str,
    message: *const c_char,
    detail: *const c_char,
    hint: *const c_char,
) -> ! {
    let code = make_sqlstate(sqlstate);
    // SAFETY: as the caller promises.
    unsafe { raise_with_code(code, message, detail, hint, std::ptr::null()) }
}

/// [`raise_with_sqlstate`] with the code made already.
///
/// # Safety
/// As for [`raise_with_sqlstate`].
unsafe fn raise_with_code(
    code: c_int,
    message: *const c_char,
    detail: *const c_char,
    hint: *const c_char,
    context: *const c_char,
) -> ! {
    unsafe extern "C-unwind" {
        fn errcontext_msg(fmt: *const c_char, ...) -> c_int;
        fn errstart(elevel: c_int, domain: *const c_char) -> bool;
        fn errcode(sqlerrcode: c_int) -> c_int;
        fn errmsg(fmt: *const c_char, ...) -> c_int;
        fn errdetail(fmt: *const c_char, ...) -> c_int;
        fn errhint(fmt: *const c_char, ...) -> c_int;
        fn errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
    }
    // SAFETY: as the caller promises.
    unsafe {
        if errstart(pgrx::PgLogLevel::ERROR as c_int, std::ptr::null()) {
            errcode(code);
            errmsg(c"%s".as_ptr(), message);
            if !detail.is_null() {
                errdetail(c"%s".as_ptr(), detail);
            }
            if !hint.is_null() {
                errhint(c"%s".as_ptr(), hint);
            }
            if !context.is_null() {
                errcontext_msg(c"%s".as_ptr(), context);
            }
            errfinish(
                c"error.rs".as_ptr(),
                line!() as c_int,
                c"raise_with_sqlstate".as_ptr(),
            );
        }
    }
    unreachable!("an ERROR does not return")
}

impl ShardError {
    /// Raise this error, a node's with the node's own SQLSTATE whatever it
    /// is (WrongShard's PS001 included).
    ///
    /// # Safety
    /// Called where a longjmp skips no Rust frame that owns resources.
    pub(crate) unsafe fn raise(self) -> ! {
        let (sqlstate, message, detail, hint, context) = match self {
            ShardError::RemoteStatement {
                sqlstate,
                message,
                detail,
                notes,
                ..
            } => (sqlstate, message, detail, notes.hint, None),
            ShardError::CopyRow {
                sqlstate,
                message,
                detail,
                hint,
                context,
            } => (sqlstate, message, detail, hint, context),
            other => {
                // report raises by panicking; the guard turns the panic into
                // the ERROR at its boundary (unwinding past our caller, a C
                // frame of the executor, would abort the backend).
                // SAFETY: the guard catches the panic; nothing is left to unwind.
                unsafe {
                    pgrx::pg_sys::panic::pgrx_extern_c_guard::<_, ()>(move || other.report())
                };
                unreachable!("an ERROR does not return")
            }
        };
        let palloc = |text: Option<String>| match text {
            None => std::ptr::null(),
            Some(text) => {
                let owned = std::ffi::CString::new(text.replace('\0', "")).unwrap_or_default();
                // SAFETY: copies a NUL-terminated string into the current context.
                unsafe { pgrx::pg_sys::pstrdup(owned.as_ptr()) as *const c_char }
            }
        };
        let (message, detail, hint, context) = (
            palloc(Some(message)),
            palloc(detail),
            palloc(hint),
            palloc(context),
        );
        let code = make_sqlstate(&sqlstate);
        drop(sqlstate);
        // SAFETY: palloc'd strings; no Rust value owning memory is left.
        unsafe { raise_with_code(code, message, detail, hint, context) }
    }
}

pub(crate) type Result<T> = std::result::Result<T, ShardError>;

/// Unwrap a result at the SQL boundary, reporting errors as PostgreSQL errors.
pub(crate) trait OrReport<T> {
    fn or_report(self) -> T;
}

impl<T> OrReport<T> for Result<T> {
    fn or_report(self) -> T {
        match self {
            Ok(value) => value,
            Err(error) => error.report(),
        }
    }
}
