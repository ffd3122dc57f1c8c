//! The wire: PostgreSQL protocol messages, SQLSTATE codes, sockets, SCRAM,
//! busy-polling.

pub mod busy_poll;
pub mod channel_binding;
pub mod protocol;
pub mod scram;
pub mod socket;
pub mod sqlstate;
pub mod tags;
pub mod tls;
pub mod tls_client;
