//! Shard splits: a shard group becomes two, each holding half of its range,
//! on the same node.
//!
//! A subscription cannot do this: it applies a change to the table with the
//! source's name, which on the same node is the source itself. So the split
//! runs the same phases as a move with its own copy and its own apply:
//!
//! * plan: new shard ids and names for both halves of every table, the
//!   columns that identify a row (primary key or replica identity index).
//! * create_target: the halves, frozen at epoch 0 (only the job writes them),
//!   and a progress table.
//! * copy: a publication and a logical replication slot (pgoutput) on the
//!   source tables; then a transaction that stays open exports its snapshot,
//!   and the rows visible in it are copied into the halves in page ranges,
//!   at most `pg_shard.copy_rate_limit` MB/s, each range in a short
//!   transaction that imports the snapshot.
//! * catch_up: the slot's changes are read (`pg_logical_slot_peek_binary_changes`)
//!   and applied to the halves, routed by keyspace id. Transactions the
//!   snapshot saw are skipped; each batch records the position it applied in
//!   the progress table in the same transaction, then the slot advances, so
//!   a crash never applies a transaction twice or skips one.
//! * cutover: as for a move, with the last changes applied by the job itself,
//!   read over a replication stream opened before the lock ([`stream`]);
//!   then the metadata node's catalog gets two shard groups for one.
//! * cleanup: the halves' foreign partitions, the forward slot dropped,
//!   the reverse apply started; reverse_replicating, reverting and
//!   revert_cleanup ([`reverse`]): the halves' writes applied back to the
//!   old tables until the drop time, `complete_job` or `revert_job`, which
//!   merges the halves back.
//! * drop_old and rollback as for a move.

mod apply;
mod phases;
mod reverse;
mod stream;
mod tables;
mod verify;

pub(crate) use phases::step;
