//! The one-byte codes of protocol v3: the type of each message after
//! startup (one set for what clients send, one for what servers send: the
//! same byte means different messages), what Describe and Close name, and
//! ReadyForQuery's transaction status.

/// Messages a client (or the coordinator, as a server's client) sends.
pub mod frontend {
    pub const BIND: u8 = b'B';
    pub const CLOSE: u8 = b'C';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const COPY_FAIL: u8 = b'f';
    pub const DESCRIBE: u8 = b'D';
    pub const EXECUTE: u8 = b'E';
    pub const FUNCTION_CALL: u8 = b'F';
    pub const PARSE: u8 = b'P';
    /// Also SASLInitialResponse and SASLResponse.
    pub const PASSWORD: u8 = b'p';
    pub const QUERY: u8 = b'Q';
    pub const TERMINATE: u8 = b'X';
}

/// Messages a server (or the coordinator, as the client's server) sends.
pub mod backend {
    pub const AUTHENTICATION: u8 = b'R';
    pub const BACKEND_KEY_DATA: u8 = b'K';
    pub const BIND_COMPLETE: u8 = b'2';
    pub const CLOSE_COMPLETE: u8 = b'3';
    pub const COMMAND_COMPLETE: u8 = b'C';
    pub const COPY_IN_RESPONSE: u8 = b'G';
    pub const DATA_ROW: u8 = b'D';
    pub const EMPTY_QUERY_RESPONSE: u8 = b'I';
    pub const ERROR_RESPONSE: u8 = b'E';
    pub const NO_DATA: u8 = b'n';
    pub const NOTICE_RESPONSE: u8 = b'N';
    pub const NOTIFICATION_RESPONSE: u8 = b'A';
    pub const PARAMETER_DESCRIPTION: u8 = b't';
    pub const PARAMETER_STATUS: u8 = b'S';
    pub const PARSE_COMPLETE: u8 = b'1';
    pub const PORTAL_SUSPENDED: u8 = b's';
    pub const READY_FOR_QUERY: u8 = b'Z';
    pub const ROW_DESCRIPTION: u8 = b'T';
}

/// What a Describe or Close names.
pub const STATEMENT: u8 = b'S';
pub const PORTAL: u8 = b'P';

/// ReadyForQuery's transaction status.
pub mod status {
    pub const IDLE: u8 = b'I';
    pub const IN_TRANSACTION: u8 = b'T';
    pub const FAILED: u8 = b'E';
}
