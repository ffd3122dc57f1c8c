//! Work on other nodes: libpq connections ([`connection`]), remote
//! transactions tied to the local one ([`remote`]), statements run on every
//! shard of a table ([`fan_out`]), and the job runners' blocking clients
//! ([`client`]).

pub(crate) mod client;
pub(crate) mod connection;
pub(crate) mod fan_out;
mod libpq;
pub(crate) mod paths;
pub(crate) mod remote;
pub(crate) mod shard_copy;
