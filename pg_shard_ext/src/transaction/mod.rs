//! Work on other nodes: libpq connections ([`connection`], made of
//! [`copy_in`], [`node_wait`], [`node_errors`], [`result_rows`]), remote
//! transactions tied to the local one ([`remote`]) and a coordinator's
//! two-phase commit recorded here ([`coordinated`]), statements run on every
//! shard of a table ([`fan_out`]), and the job runners' blocking clients
//! ([`client`]).

pub(crate) mod client;
pub(crate) mod connection;
mod coordinated;
mod copy_in;
pub(crate) mod fan_out;
mod libpq;
mod node_errors;
mod node_wait;
mod password;
pub(crate) mod paths;
pub(crate) mod records;
pub(crate) mod remote;
pub(crate) mod replication_stream;
mod result_rows;
pub(crate) mod shard_copy;
