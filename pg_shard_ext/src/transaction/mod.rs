//! Work on other nodes: connections, remote transactions tied to the local
//! one by two-phase commit ([`remote`]), and statements run on every shard
//! of a table ([`fan_out`]).

pub(crate) mod fan_out;
pub(crate) mod remote;
