//! The part of libpq (PostgreSQL's client library, as postgres_fdw and
//! dblink use it) that node connections need: declarations only, used by
//! [`super::connection`] alone.
//!
//! libpq rather than a Rust client: its non-blocking API lets a backend wait
//! for a worker on its latch (so a cancel, statement_timeout or postmaster
//! death interrupts the wait), results come as text (which every type's
//! input function reads, whatever its oid on the worker), and its cancel
//! request stops the remote query.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

#[repr(C)]
pub(super) struct PGconn {
    _private: [u8; 0],
}

#[repr(C)]
pub(super) struct PGresult {
    _private: [u8; 0],
}

#[repr(C)]
pub(super) struct PGcancel {
    _private: [u8; 0],
}

pub(super) const CONNECTION_OK: c_int = 0;

pub(super) const PGRES_POLLING_FAILED: c_int = 0;
pub(super) const PGRES_POLLING_READING: c_int = 1;
pub(super) const PGRES_POLLING_WRITING: c_int = 2;
pub(super) const PGRES_POLLING_OK: c_int = 3;

pub(super) const PGRES_EMPTY_QUERY: c_int = 0;
pub(super) const PGRES_COMMAND_OK: c_int = 1;
pub(super) const PGRES_TUPLES_OK: c_int = 2;
pub(super) const PGRES_COPY_OUT: c_int = 3;
pub(super) const PGRES_COPY_IN: c_int = 4;
pub(super) const PGRES_FATAL_ERROR: c_int = 7;
pub(super) const PGRES_COPY_BOTH: c_int = 8;
pub(super) const PGRES_SINGLE_TUPLE: c_int = 9;

pub(super) const PQTRANS_IDLE: c_int = 0;
pub(super) const PQTRANS_ACTIVE: c_int = 1;
pub(super) const PQTRANS_INTRANS: c_int = 2;

pub(super) const PG_DIAG_SQLSTATE: c_int = b'C' as c_int;
pub(super) const PG_DIAG_MESSAGE_PRIMARY: c_int = b'M' as c_int;
pub(super) const PG_DIAG_MESSAGE_DETAIL: c_int = b'D' as c_int;
pub(super) const PG_DIAG_MESSAGE_HINT: c_int = b'H' as c_int;
pub(super) const PG_DIAG_CONTEXT: c_int = b'W' as c_int;

pub(super) type PQnoticeReceiver =
    Option<unsafe extern "C" fn(arg: *mut c_void, res: *const PGresult)>;

#[link(name = "pq")]
unsafe extern "C" {
    pub(super) fn PQconnectStartParams(
        keywords: *const *const c_char,
        values: *const *const c_char,
        expand_dbname: c_int,
    ) -> *mut PGconn;
    pub(super) fn PQconnectPoll(conn: *mut PGconn) -> c_int;
    pub(super) fn PQstatus(conn: *const PGconn) -> c_int;
    pub(super) fn PQerrorMessage(conn: *const PGconn) -> *const c_char;
    pub(super) fn PQsocket(conn: *const PGconn) -> c_int;
    pub(super) fn PQfinish(conn: *mut PGconn);
    pub(super) fn PQsetnonblocking(conn: *mut PGconn, arg: c_int) -> c_int;
    pub(super) fn PQtransactionStatus(conn: *const PGconn) -> c_int;
    pub(super) fn PQsetNoticeReceiver(
        conn: *mut PGconn,
        proc_: PQnoticeReceiver,
        arg: *mut c_void,
    ) -> PQnoticeReceiver;

    pub(super) fn PQsendQuery(conn: *mut PGconn, query: *const c_char) -> c_int;
    pub(super) fn PQsendQueryParams(
        conn: *mut PGconn,
        command: *const c_char,
        n_params: c_int,
        param_types: *const u32,
        param_values: *const *const c_char,
        param_lengths: *const c_int,
        param_formats: *const c_int,
        result_format: c_int,
    ) -> c_int;
    pub(super) fn PQsendPrepare(
        conn: *mut PGconn,
        stmt_name: *const c_char,
        query: *const c_char,
        n_params: c_int,
        param_types: *const u32,
    ) -> c_int;
    pub(super) fn PQsendQueryPrepared(
        conn: *mut PGconn,
        stmt_name: *const c_char,
        n_params: c_int,
        param_values: *const *const c_char,
        param_lengths: *const c_int,
        param_formats: *const c_int,
        result_format: c_int,
    ) -> c_int;
    pub(super) fn PQsetSingleRowMode(conn: *mut PGconn) -> c_int;
    pub(super) fn PQflush(conn: *mut PGconn) -> c_int;
    pub(super) fn PQconsumeInput(conn: *mut PGconn) -> c_int;
    pub(super) fn PQisBusy(conn: *mut PGconn) -> c_int;
    pub(super) fn PQparameterStatus(
        conn: *const PGconn,
        param_name: *const c_char,
    ) -> *const c_char;
    pub(super) fn PQgetResult(conn: *mut PGconn) -> *mut PGresult;

    pub(super) fn PQresultStatus(res: *const PGresult) -> c_int;
    pub(super) fn PQresultErrorField(res: *const PGresult, fieldcode: c_int) -> *const c_char;
    pub(super) fn PQresultErrorMessage(res: *const PGresult) -> *const c_char;
    pub(super) fn PQntuples(res: *const PGresult) -> c_int;
    pub(super) fn PQnfields(res: *const PGresult) -> c_int;
    pub(super) fn PQgetvalue(res: *const PGresult, row: c_int, column: c_int) -> *const c_char;
    pub(super) fn PQgetisnull(res: *const PGresult, row: c_int, column: c_int) -> c_int;
    pub(super) fn PQgetlength(res: *const PGresult, row: c_int, column: c_int) -> c_int;
    pub(super) fn PQcmdTuples(res: *mut PGresult) -> *const c_char;
    pub(super) fn PQclear(res: *mut PGresult);

    pub(super) fn PQputCopyData(conn: *mut PGconn, buffer: *const c_char, nbytes: c_int) -> c_int;
    pub(super) fn PQputCopyEnd(conn: *mut PGconn, errormsg: *const c_char) -> c_int;
    pub(super) fn PQgetCopyData(
        conn: *mut PGconn,
        buffer: *mut *mut c_char,
        async_: c_int,
    ) -> c_int;
    pub(super) fn PQfreemem(ptr: *mut c_void);

    pub(super) fn PQgetCancel(conn: *mut PGconn) -> *mut PGcancel;
    pub(super) fn PQcancel(cancel: *mut PGcancel, errbuf: *mut c_char, errbufsize: c_int) -> c_int;
    pub(super) fn PQfreeCancel(cancel: *mut PGcancel);
}
