//! The worker side: shard tables guarded against writes outside their range
//! or map epoch ([`fencing`]), reads of retired shards refused
//! ([`read_fence`]), and the ownership records behind both
//! ([`local_shard`]); the WAL flushed for a job's cutover ([`wal`]), and
//! its wait for the marker the apply brings ([`marker_wait`]); the changes of
//! looked-up columns recorded for the router to take ([`lookup_changes`]).

pub(crate) mod fencing;
pub(crate) mod local_shard;
pub(crate) mod lookup_changes;
pub(crate) mod marker_wait;
pub(crate) mod read_fence;
pub(crate) mod wal;
