//! A split after its cutover: reverse replication (the source tables, kept
//! retired, receive the halves' writes) until the old tables' drop time or
//! `pg_shard.complete_job`, and `pg_shard.revert_job`, which gives the
//! range back to the source tables as one shard group again.
//!
//! * The reverse publication (of the halves) and its slot are made on the
//!   node at the end of the catch-up, and the slot moved up before the
//!   cutover's lock: the halves' writes until then are the forward
//!   apply's. The node's WAL position once the last forward writes are
//!   applied is recorded with the published map (`reverse_from`).
//! * The cleanup drops the forward slot and publication (the reverse
//!   apply writes the source tables, which it published), moves the
//!   reverse slot to `reverse_from` and records it as the reverse apply's
//!   progress.
//! * reverse_replicating: each look at the job applies the halves' changes
//!   to the source tables ([`super::apply`], in reverse) for up to a step.
//! * A revert (phase `reverting`) is the split's cutover the other way:
//!   the catalog's two shard groups merged back into one at the next map
//!   version (in the runner's transaction, just before the lock), the
//!   halves locked, the rest of their changes applied, the halves retired
//!   and the source tables activated at that version in one transaction
//!   on the node, and the runner's commit publishes the map; `revert_cleanup` puts the
//!   source's foreign partition back and drops the replication and the
//!   halves. A failure before the publish abandons the revert: the split
//!   stands and the shards' states are set right again.

use super::apply::{self, Apply, Direction};
use super::phases::apply_for_a_step;
use super::stream::Streamed;
use super::tables::{
    half_shards, hand_over_script, qualified_halves, source_shards, Ranges, SplitTable,
};
use crate::error::{Result, ShardError};
use crate::operations::group_shards::{drop_shard_tables, shard_id_list};
use crate::operations::job::{Job, Next, Phase};
use crate::operations::node_access::{connect, run_on};
use crate::operations::pause_clock::{record_publish, PauseClock};
use crate::operations::replication::{lock_for_cutover, marker_table, warm_up, Link};
use crate::operations::reverse::{after_a_look, forget_failed_revert, requests, reverse_from};
use crate::operations::settings::FINAL_WAIT;
use crate::quote;
use crate::spi::query_one;
use postgres::Client;

/// At the end of the catch-up (and again, a no-op then, before the
/// cutover's lock): the reverse publication of the halves and its slot.
pub(super) fn prepare(job: &Job, tables: &[SplitTable], node: &mut Client) -> Result<()> {
    Link::reverse(job).publish_and_reserve_slot(node, &qualified_halves(tables))
}

/// In the cleanup: the forward replication goes, and the reverse apply
/// starts from where the cutover left off.
pub(super) fn start(job: &Job) -> Result<()> {
    Link::forward(job).drop()?;
    let from = reverse_from(job)?;
    let mut node = connect(&job.source)?;
    Link::reverse(job).advance_slot(&mut node, &from)?;
    run_on(
        &job.source,
        &mut node,
        &format!(
            "INSERT INTO {} (job, applied) VALUES ({}, {}) ON CONFLICT (job) DO NOTHING",
            marker_table(job),
            Direction::Reverse.progress_key(job),
            quote::literal(&from)
        ),
    )
}

/// Reverse replication runs: each look applies the halves' changes to the
/// source tables for up to a step, then goes on as the DBA asked (revert
/// once the source tables are nearly caught up; complete) or when the drop
/// time comes.
pub(super) fn reverse_replicating(job: &Job, tables: &[SplitTable]) -> Result<Next> {
    let requests = requests(job)?;
    if requests.revert_failed {
        restore_after_failed_revert(job, tables)?;
    }
    // Completed or due: the old tables go without another apply (one that
    // keeps failing must not keep them, and the slot's WAL, for ever).
    if requests.requested.as_deref() != Some("revert") {
        if let next @ Next::Phase(_) = after_a_look(&requests, false) {
            return Ok(next);
        }
    }
    let caught_up = apply_for_a_step(job, tables, Direction::Reverse, false)?;
    Ok(after_a_look(&requests, caught_up))
}

/// After a revert that failed before its map was published: the halves
/// active again and the source tables retired again, in one transaction
/// on the node (the revert may have swapped them).
fn restore_after_failed_revert(job: &Job, tables: &[SplitTable]) -> Result<()> {
    let mut node = connect(&job.source)?;
    run_on(
        &job.source,
        &mut node,
        &format!(
            "BEGIN;\n\
             UPDATE pg_shard.local_shard SET state = 'active' WHERE shard_id IN ({}) AND state = 'retired';\n\
             UPDATE pg_shard.local_shard SET state = 'retired' WHERE shard_id IN ({}) AND state = 'active';\n\
             COMMIT",
            shard_id_list(&half_shards(tables)),
            shard_id_list(&source_shards(tables)),
        ),
    )?;
    forget_failed_revert(job)
}

/// The revert's cutover, in one step (run again from the start after a
/// crash): the catalog's one shard group again and the next map version,
/// written first in the runner's transaction; then writes to the halves
/// wait on a lock while the job applies the last of them to the source
/// tables, the halves are retired and the source tables activated at that
/// version in one transaction on the node, and the runner's commit
/// publishes the map with the next phase.
pub(super) fn revert(job: &Job, tables: &[SplitTable]) -> Result<Next> {
    let ranges = Ranges::load(job)?;
    let apply = Apply {
        job,
        tables,
        ranges: &ranges,
        direction: Direction::Reverse,
    };
    // Connections first, and what came in since the last look applied
    // before the lock (a round through SQL, then over the stream up to a
    // mark): only the rest is applied while writers wait.
    let mut node = apply::connection(job)?;
    let mut lock_holder = connect(&job.source)?;
    let every_shard = [source_shards(tables), half_shards(tables)].concat();
    warm_up(
        &job.source,
        &mut lock_holder,
        (&qualified_halves(tables), &shard_id_list(&every_shard)),
        "",
    )?;
    apply::refresh_restart_point(job, &mut node);
    let now = apply::flushed_position(job, &mut node)?;
    apply.up_to(&mut node, now, "the writes before the revert were")?;
    let mut stream = Streamed::open(&apply, &mut node, FINAL_WAIT)?;
    // The map as before the split, written just before the lock
    // (published when the runner's transaction commits).
    unpublish(job, tables, &ranges)?;
    let version = crate::metadata::catalog::bump_map_version_for(&[job.shard_group_id])?;
    let drain_limit = apply.drain_limit()?;
    let mut pause = PauseClock::start();
    let mark = stream.next_mark();
    lock_for_cutover(
        job,
        &job.source,
        &mut lock_holder,
        &qualified_halves(tables),
        &mark,
    )?;
    pause.mark("locked");
    let last_writes = apply::last_writes(&stream.finish(&mut node, drain_limit)?);
    pause.mark("drained");
    run_on(
        &job.source,
        &mut lock_holder,
        &hand_over_script(
            &last_writes,
            &half_shards(tables),
            &source_shards(tables),
            version,
        ),
    )?;
    pause.mark("retired");
    pause.mark("published");
    record_publish(job, ("reverted_version", version), ("revert_ms", &pause))?;
    Ok(Next::Phase(Phase::RevertCleanup))
}

/// The metadata catalog as before the split: the upper half's shard group
/// merged back into the job's, and every table's halves replaced by its
/// source shard.
fn unpublish(job: &Job, tables: &[SplitTable], ranges: &Ranges) -> Result<()> {
    let upper_group = query_one::<i64>(
        "SELECT (resources->>'upper_group')::bigint FROM pg_shard.job WHERE job_id = $1",
        &[job.job_id.into()],
    )?
    .ok_or_else(|| {
        ShardError::InvalidArgument(format!(
            "job {} did not record its upper shard group",
            job.job_id
        ))
    })?;
    for table in tables {
        let table_rel = query_one::<pgrx::pg_sys::Oid>(
            "SELECT table_rel::oid FROM pg_shard.shard WHERE shard_id = $1",
            &[table.lower.shard_id.into()],
        )?
        .ok_or_else(|| {
            ShardError::InvalidArgument(format!("shard {} is gone", table.lower.shard_id))
        })?;
        crate::spi::run_with_args(
            "DELETE FROM pg_shard.shard WHERE shard_id IN ($1, $2)",
            &[table.lower.shard_id.into(), table.upper.shard_id.into()],
        )?;
        crate::metadata::catalog::insert_shard(
            table.source.shard_id,
            table_rel,
            job.shard_group_id,
            &table.source.schema,
            &table.source.name,
        )?;
    }
    crate::spi::run_with_args(
        "WITH upper AS (DELETE FROM pg_shard.placement WHERE shard_group_id = $2), \
              merged AS (UPDATE pg_shard.shard_group SET range_end = $3 \
                         WHERE shard_group_id = $1 RETURNING colocation_id) \
         UPDATE pg_shard.colocation_group SET shard_count = shard_count - 1 \
          WHERE colocation_id = (SELECT colocation_id FROM merged)",
        &[
            job.shard_group_id.into(),
            upper_group.into(),
            ranges.range_end.into(),
        ],
    )?;
    crate::spi::run_with_args(
        "DELETE FROM pg_shard.shard_group WHERE shard_group_id = $1",
        &[upper_group.into()],
    )?;
    Ok(())
}

/// After the revert's publish: the source's foreign partitions back in
/// place of the halves', then the reverse replication, the markers and the
/// (retired) halves go.
pub(super) fn revert_cleanup(job: &Job, tables: &[SplitTable]) -> Result<Next> {
    super::phases::restore_partitions(job, tables)?;
    crate::operations::reverse::stop(job)?;
    drop_shard_tables(&job.source, &half_shards(tables), " AND state = 'retired'")?;
    Ok(Next::Done("reverted"))
}
