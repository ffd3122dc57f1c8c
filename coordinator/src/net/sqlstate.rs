//! The SQLSTATE codes the coordinator raises itself (PostgreSQL's names,
//! errcodes.txt), and pg_shard's WrongShard.

/// Lost or unusable connection to a server (or its map).
pub const CONNECTION_FAILURE: &str = "08006";
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
pub const IN_FAILED_SQL_TRANSACTION: &str = "25P02";
pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
pub const INVALID_AUTHORIZATION_SPECIFICATION: &str = "28000";
pub const INVALID_PASSWORD: &str = "28P01";
pub const PROTOCOL_VIOLATION: &str = "08P01";
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
pub const UNDEFINED_TABLE: &str = "42P01";
pub const TOO_MANY_CONNECTIONS: &str = "53300";
pub const QUERY_CANCELED: &str = "57014";
pub const IDLE_SESSION_TIMEOUT: &str = "57P05";
pub const INTERNAL_ERROR: &str = "XX000";
/// pg_shard's WrongShard: the shard map the statement was routed with is
/// stale (refresh it and retry).
pub const WRONG_SHARD: &str = "PS001";
