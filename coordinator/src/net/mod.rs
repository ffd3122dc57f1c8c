//! The wire: PostgreSQL protocol messages, SQLSTATE codes, sockets, SCRAM.

pub mod protocol;
pub mod scram;
pub mod socket;
pub mod sqlstate;
pub mod tags;
