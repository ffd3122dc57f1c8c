//! A move after its cutover: reverse replication (the old copy receives
//! the new owner's writes) until the old tables' drop time or
//! `pg_shard.complete_job`, and `pg_shard.revert_job`, which gives the
//! shards back to the old copy by the cutover's own protocol.
//!
//! * The reverse slot is made on the target at the end of the catch-up
//!   (making a slot waits for the node's transactions in progress, which
//!   may wait for the cutover's lock), and
//!   the target's WAL position once the last forward writes are applied is
//!   recorded with the published map (`reverse_from`): every write of the
//!   new owner comes after it.
//! * The cleanup drops the forward subscription first (PostgreSQL 15 cannot
//!   filter changes by origin, so both directions at once would send each
//!   change back), then advances the reverse slot to `reverse_from` and
//!   subscribes the source to it.
//! * A revert (phase `reverting`): the placement back on the source and
//!   the next map version written in the runner's transaction, then the
//!   target's tables locked, a marker row written there and awaited on
//!   the source, the target retired, the source activated at that version,
//!   and the runner's commit publishes the map; then (`revert_cleanup`) the
//!   foreign partitions go back, the replication and the target's tables
//!   go. A failure before the publish abandons the revert: the move stands
//!   and the shards' states are set right again ([`reverse_replicating`]).

use super::group_shards::{drop_shard_tables, shard_id_list, GroupShard};
use super::job::{Job, Next, Phase};
use super::node_access::{connect, exists_on, run_on, value_on, wal_insert_position};
use super::pause_clock::{record_publish, PauseClock};
use super::replication::{drop_markers, marker_table, Link};
use super::settings::CUTOVER_LAG;
use crate::error::{Result, ShardError};
use crate::quote;
use crate::spi::query_one;
use postgres::Client;

/// At the end of the catch-up (and again, a no-op then, before the
/// cutover's lock): the reverse publication (the shard tables and the
/// marker table) and its slot on the target.
pub(crate) fn prepare(job: &Job, shards: &[GroupShard], target: &mut Client) -> Result<()> {
    let mut tables: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    tables.push(marker_table(job));
    Link::reverse(job).publish_and_reserve_slot(target, &tables)
}

/// In the cleanup, once the forward subscription is gone: the source
/// subscribes to the target's changes from where the cutover left off.
pub(crate) fn start(job: &Job) -> Result<()> {
    Link::forward(job).drop()?;
    let reverse = Link::reverse(job);
    let mut source = connect(&job.source)?;
    let mut target = connect(&job.target)?;
    let subscribed = exists_on(
        &job.source,
        &mut source,
        "pg_subscription",
        "subname",
        &reverse.name,
    )?;
    if !subscribed {
        reverse.advance_slot(&mut target, &reverse_from(job)?)?;
        reverse.subscribe(&mut source)?;
    }
    Ok(())
}

/// The new owner's WAL position once the cutover's last forward writes
/// were applied (recorded with the published map): every write of the new
/// owner comes after it.
pub(crate) fn reverse_from(job: &Job) -> Result<String> {
    query_one::<String>(
        "SELECT resources->>'reverse_from' FROM pg_shard.job WHERE job_id = $1",
        &[job.job_id.into()],
    )?
    .ok_or_else(|| {
        ShardError::InvalidArgument(format!(
            "job {} has no reverse replication position",
            job.job_id
        ))
    })
}

/// What the job asked for in `resources`: `requested` ('revert' or
/// 'complete'), a failed revert to set right, whether the drop time is due.
/// Read with the job's row locked until the step commits its next phase:
/// a `revert_job` call waits for it and then sees that phase.
pub(crate) struct Requests {
    pub(crate) requested: Option<String>,
    pub(crate) revert_failed: bool,
    pub(crate) due: bool,
}

pub(crate) fn requests(job: &Job) -> Result<Requests> {
    crate::spi::connect(|client| {
        let mut rows = client.select(
            "SELECT resources->>'requested', \
                    coalesce((resources->>'revert_failed')::boolean, false), \
                    coalesce(now() >= (resources->>'drop_after')::timestamptz, true) \
             FROM pg_shard.job WHERE job_id = $1 FOR UPDATE",
            Some(1),
            &[job.job_id.into()],
        )?;
        let Some(row) = rows.next() else {
            return Err(ShardError::InvalidArgument(format!(
                "job {} is gone",
                job.job_id
            )));
        };
        Ok(Requests {
            requested: row.get::<String>(1)?,
            revert_failed: row.get::<bool>(2)?.unwrap_or(false),
            due: row.get::<bool>(3)?.unwrap_or(true),
        })
    })
}

/// Reverse replication runs (in the source's subscription): the job shows
/// its lag, and goes on to revert when asked, or to drop the old copy when
/// its time comes or `complete_job` asks.
pub(crate) fn reverse_replicating(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let requests = requests(job)?;
    if requests.revert_failed {
        restore_after_failed_revert(job, shards)?;
    }
    let reverse = Link::reverse(job);
    let mut target = connect(&job.target)?;
    let lag = reverse.lag(&mut target)?;
    // (`lag_at`: the runner looks at a waiting job every few seconds; a
    // failed step records it too, see `job::record_error`.)
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET lag_bytes = $2, \
             resources = resources || jsonb_build_object('lag_at', clock_timestamp()) \
         WHERE job_id = $1",
        &[job.job_id.into(), lag.into()],
    )?;
    // The revert's pause waits for what the old copy has not applied
    // yet: only once that is little, and its subscription runs (one stuck
    // on an apply error would make writers wait in vain).
    let ready = requests.requested.as_deref() == Some("revert")
        && lag.is_some_and(|lag| lag < CUTOVER_LAG)
        && applying(job)?;
    Ok(after_a_look(&requests, ready))
}

/// What follows a look at a job in reverse replication: the revert when
/// asked for and `ready_to_revert` (the old copy nearly caught up), the
/// drop of the old copy when asked for or due, else more waiting.
pub(crate) fn after_a_look(requests: &Requests, ready_to_revert: bool) -> Next {
    match requests.requested.as_deref() {
        Some("revert") if ready_to_revert => Next::Phase(Phase::Reverting),
        Some("revert") => Next::Stay,
        Some("complete") => Next::Phase(Phase::DropOld),
        _ if requests.due => Next::Phase(Phase::DropOld),
        _ => Next::Stay,
    }
}

/// Whether the source's reverse subscription has its apply worker running.
fn applying(job: &Job) -> Result<bool> {
    let mut source = connect(&job.source)?;
    Ok(value_on::<bool>(
        &job.source,
        &mut source,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_subscription \
                            WHERE subname = {} AND relid IS NULL AND pid IS NOT NULL)",
            quote::literal(&Link::reverse(job).name)
        ),
    )?
    .unwrap_or(false))
}

/// Before the cutover's lock: the reverse slot moved up to the target's
/// WAL as it is now. Everything the target wrote to the shard tables so
/// far is the forward apply's (the target is not active yet), which the
/// old copy must not receive back; moved now, the cleanup's move to the
/// cutover's position only decodes the pause's WAL. (A split's too: its
/// target is its source node, and its halves are the forward apply's.)
pub(crate) fn skip_ahead(job: &Job, target: &mut Client) -> Result<()> {
    let now = wal_insert_position(&job.target, target)?;
    Link::reverse(job).advance_slot(target, &now)
}

/// After a revert that failed before its map was published: the target
/// (the owner in the map) active again, then the source retired again (the
/// revert may have activated it). The target first: the revert most
/// likely failed because the source went away, and the group must not
/// stay offline for it. A source left active meanwhile is harmless: its
/// epoch is a version the map never published for it, so every router
/// that would send it a statement declares an older one and is refused;
/// a later revert activates it anew and the drop of the old copy drops it.
fn restore_after_failed_revert(job: &Job, shards: &[GroupShard]) -> Result<()> {
    let ids = shard_id_list(shards);
    let mut target = connect(&job.target)?;
    run_on(
        &job.target,
        &mut target,
        &format!(
            "UPDATE pg_shard.local_shard SET state = 'active' WHERE shard_id IN ({ids}) AND state = 'retired'"
        ),
    )?;
    let retired = connect(&job.source).and_then(|mut source| {
        run_on(
            &job.source,
            &mut source,
            &format!(
                "UPDATE pg_shard.local_shard SET state = 'retired' WHERE shard_id IN ({ids}) AND state = 'active'"
            ),
        )
    });
    if let Err(e) = retired {
        pgrx::log!(
            "pg_shard job {}: the old copy could not be retired again after the failed revert: {e}",
            job.job_id
        );
    }
    forget_failed_revert(job)
}

/// The shards' states are right again after a failed revert.
pub(crate) fn forget_failed_revert(job: &Job) -> Result<()> {
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources - 'revert_failed' WHERE job_id = $1",
        &[job.job_id.into()],
    )?;
    Ok(())
}

/// The revert's cutover, in one step (run again from the start after a
/// crash): the cutover's protocol with the roles swapped. The placement
/// back on the source and the next map version written first (in the
/// runner's transaction), the target's tables locked EXCLUSIVE (writers
/// wait), a marker row written there and awaited on the source (every
/// write before the lock is there), the target retired (the waiting
/// writers get WrongShard and look for the new map), the source activated
/// at that version, and the runner's commit publishes the map with the
/// next phase.
pub(crate) fn revert(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let tables: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    let ids = shard_id_list(shards);
    let reverse = Link::reverse(job);
    let mut source = connect(&job.source)?;
    let mut target = connect(&job.target)?;
    let lock_holder = reverse.lock_holder(job, (&tables, &ids))?;
    reverse.drain_unlocked(job, &ids, (&mut target, &mut source))?;
    let version = reverse.publish_ahead(job)?;
    let mut pause = PauseClock::start();
    reverse.cut_over(
        job,
        (&tables, &ids, version),
        lock_holder,
        (&mut target, &mut source),
        &mut pause,
    )?;
    record_publish(job, ("reverted_version", version), ("revert_ms", &pause))?;
    Ok(Next::Phase(Phase::RevertCleanup))
}

/// After the revert's publish (the foreign partitions are back on the
/// source already): the reverse replication, the markers and the target's
/// (retired) tables go.
pub(crate) fn revert_cleanup(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    stop(job)?;
    drop_shard_tables(&job.target, shards, " AND state = 'retired'")?;
    Ok(Next::Done("reverted"))
}

/// The end of reverse replication: the subscription (a move's), its slot
/// and publication, and the marker tables (a split's progress table).
pub(crate) fn stop(job: &Job) -> Result<()> {
    Link::reverse(job).drop()?;
    drop_markers(job)
}
