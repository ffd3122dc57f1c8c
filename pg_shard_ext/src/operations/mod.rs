//! Shard moves (and, in [`split`], splits), run by background workers over
//! PostgreSQL logical replication.
//!
//! `pg_shard.move_shard` queues a job (sql/pg_shard_api.sql); a *job runner*
//! (one dynamic background worker per database, started on demand and by
//! the *launcher* when the server starts) takes the jobs in order and runs
//! each through persisted phases. Every phase can run again after a crash
//! (it checks what already exists), so a restarted runner resumes where the
//! job's row says it was:
//!
//! plan → create_target → copy → catch_up → verify → catch_up →
//! [reads_switched] → cutover → cleanup → reverse_replicating → drop_old →
//! done (completed), or, by `revert_job` while reverse replication runs:
//! reverting → revert_cleanup → done (reverted)
//!
//! * plan: record the names of everything the job will create; check that
//!   replication can identify the rows.
//! * create_target: the group's shard tables on the target, recreated from
//!   the source's (same names), recorded as `frozen` at epoch 0 so nothing
//!   but replication writes them; a marker table on both sides.
//! * copy: publication and slot on the source, a snapshot cut while writers
//!   wait for a moment, its rows copied at a limited rate
//!   ([`snapshot_copy`]), then a subscription on the target streaming from
//!   the slot (advanced to the cut).
//! * catch_up: until the slot's lag is small.
//! * verify ([`verification`]): once, source and copy compared at one
//!   consistent point while replication goes on (row counts and checksums
//!   per key range; a mismatch rolls back); then catch_up again.
//! * reads_switched ([`reads_first`], only when the job was queued with
//!   `switch_reads_first`): a map version routes the range's reads to the
//!   new copy while writes stay; replication goes on until the writes are
//!   due (`pg_shard.switch_writes_delay`, `pg_shard.switch_writes`).
//! * cutover ([`moves`]): the new map written in the runner's transaction
//!   (placement, next version, NOTIFY); then writes to the source wait on
//!   a lock while the last of them reach the target (a marker row tells),
//!   the source is retired, the target activated at that version, and the
//!   runner's commit publishes the map (the metadata node's foreign
//!   partitions follow in the cleanup).
//! * cleanup: the forward subscription (and with it the slot) and
//!   publication go, and the source subscribes to the target's changes
//!   ([`reverse`]). reverse_replicating: until `pg_shard.move_drop_delay`
//!   has passed or `complete_job`; drop_old: the reverse replication,
//!   markers and old shard tables go.
//! * reverting / revert_cleanup ([`reverse`]): ownership back to the old
//!   copy by the cutover's protocol, then the new copy goes.
//!
//! A failure or `cancel_job` before publish rolls back: what the job created
//! is dropped and the source is unfrozen. From publish on the job only goes
//! forward (or, by a revert, back through a new cutover).
//!
//! Modules: [`runner`] (the launcher and job runner background workers, one
//! step at a time), [`job`] (job rows and their [`job::Phase`]), [`moves`]
//! and [`split`] (the phases), [`reads_first`] (reads before writes),
//! [`reverse`] (after a move's cutover:
//! reverse replication and revert; a split's is in [`split`]), [`group_shards`], [`replication`] and
//! [`snapshot_copy`] (what both kinds share), [`node_access`] (a job's
//! connections), [`shard_functions`] (the worker-side SQL functions a job
//! calls), [`settings`] (GUCs and timings), [`own_transaction`], and
//! [`data_copy`] (existing rows into new shard tables, for
//! `create_distributed_table`).

pub(crate) mod data_copy;
mod group_shards;
mod job;
mod moves;
mod node_access;
mod own_transaction;
mod pacing;
mod pause_clock;
mod reads_first;
mod replication;
mod reverse;
mod runner;
mod settings;
mod shard_functions;
mod snapshot_copy;
mod split;
mod table_scan;
mod verification;

pub(crate) use runner::register_launcher;
pub(crate) use settings::register_gucs;
