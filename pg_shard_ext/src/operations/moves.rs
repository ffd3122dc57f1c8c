//! The phases of a shard move, from the plan to the drop of the old shard
//! tables (the order is in [`super`]'s overview).

use super::group_shards::{
    drop_shard_tables, frozen_shard_script, lookup_trigger_script, row_guard_script, shard_id_list,
    GroupShard,
};
use super::job::{Job, Next, Phase};
use super::node_access::{connect, exists_on, run_on, shard_range, value_on};
use super::pacing;
use super::pause_clock::{record_publish, PauseClock};
use super::reads_first;
use super::replication::{
    drop_replication, marker_table, marker_table_script, replication_name, Link,
};
use super::reverse;
use super::settings::CUTOVER_LAG;
use super::snapshot_copy;
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::quote;
use crate::spi::query_one;
use crate::transaction::client as remote;
use postgres::Client;

/// Runs the move's current phase once.
pub(crate) fn step(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    match job.phase()? {
        Phase::Plan => plan(job, shards),
        Phase::CreateTarget => create_target(job, shards),
        Phase::Copy => copy(job, shards),
        Phase::CatchUp => catch_up(job, shards),
        Phase::Verify => super::verification::verify_move(job, shards),
        Phase::ReadsSwitched => reads_switched(job, shards),
        Phase::Cutover => cutover(job, shards),
        Phase::Cleanup => {
            repoint_partitions(shards, &job.source, &job.target)?;
            reverse::start(job)?;
            set_drop_after(job)?;
            Ok(Next::Phase(Phase::ReverseReplicating))
        }
        Phase::ReverseReplicating => reverse::reverse_replicating(job, shards),
        Phase::DropOld => {
            reverse::stop(job)?;
            drop_old(job, shards)
        }
        Phase::Reverting => reverse::revert(job, shards),
        Phase::RevertCleanup => {
            repoint_partitions(shards, &job.target, &job.source)?;
            reverse::revert_cleanup(job, shards)
        }
        Phase::Rollback => rollback(job, shards),
    }
}

pub(crate) fn plan(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let mut source = connect(&job.source)?;
    for shard in shards {
        // Logical replication must be able to identify rows.
        let identified = value_on::<bool>(
            &job.source,
            &mut source,
            &format!(
                "SELECT c.relreplident IN ('f', 'i') OR (c.relreplident = 'd' AND EXISTS \
                   (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)) \
                 FROM pg_class c WHERE c.oid = {}::regclass",
                quote::literal(&shard.qualified())
            ),
        )?
        .unwrap_or(false);
        if !identified {
            return Err(ShardError::NoReplicaIdentity(shard.qualified()));
        }
    }
    record_plan(job, shards)?;
    Ok(Next::Phase(Phase::CreateTarget))
}

/// Records the plan: the map version it was made at and the names of what
/// the job creates (a move also a subscription).
pub(crate) fn record_plan(job: &Job, shards: &[GroupShard]) -> Result<()> {
    let tables: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET planned_version = pg_shard.map_version(), \
             resources = resources || jsonb_build_object('publication', $2::text, 'slot', $2::text, \
                 'marker', $3::text, 'tables', $4::text[]) \
                 || CASE WHEN kind = 'move' THEN jsonb_build_object('subscription', $2::text) \
                         ELSE '{}'::jsonb END \
         WHERE job_id = $1",
        &[
            job.job_id.into(),
            replication_name(job).into(),
            marker_table(job).into(),
            tables.into(),
        ],
    )?;
    Ok(())
}

/// The end of a rollback: `sources` (still the group's shards) active
/// again, the job canceled or failed.
pub(crate) fn finish_rollback(job: &Job, sources: &[GroupShard]) -> Result<Next> {
    if !sources.is_empty() {
        let mut source = connect(&job.source)?;
        run_on(
            &job.source,
            &mut source,
            &format!(
                "UPDATE pg_shard.local_shard SET state = 'active' WHERE shard_id IN ({}) AND state IN ('frozen', 'retired')",
                shard_id_list(sources)
            ),
        )?;
    }
    let state = if job.cancel_requested {
        "canceled"
    } else {
        "failed"
    };
    Ok(Next::Finished(state.into(), None))
}

pub(crate) fn create_target(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let mut source = connect(&job.source)?;
    let mut script = vec![marker_table_script(job)];
    for shard in shards {
        let ddl = group_table_ddl(job, shard, &mut source, "table")?;
        let range = shard_range(&job.source, &mut source, shard.shard_id)?;
        script.extend(frozen_shard_script(shard, ddl, range));
    }
    // Foreign keys to reference tables while the tables are empty (those
    // among the group's tables come after the copy, with the indexes).
    script.extend(group_foreign_keys(job, shards, &mut source, false)?);
    // On the target the marker's apply stops at a verification point
    // while the job takes its snapshot (operations/verification.rs); the
    // apply runs as a replica session, hence ALWAYS.
    script.push(format!(
        "CREATE OR REPLACE TRIGGER pg_shard_verification_point BEFORE INSERT ON {} \
         FOR EACH ROW EXECUTE FUNCTION pg_shard.verification_point({})",
        marker_table(job),
        quote::literal(&job.job_id.to_string())
    ));
    script.push(format!(
        "ALTER TABLE {} ENABLE ALWAYS TRIGGER pg_shard_verification_point",
        marker_table(job)
    ));
    let mut target = connect(&job.target)?;
    run_on(
        &job.target,
        &mut target,
        &format!("BEGIN;\n{};\nCOMMIT", script.join(";\n")),
    )?;
    run_on(
        &job.source,
        &mut source,
        &format!("BEGIN;\n{};\nCOMMIT", marker_table_script(job)),
    )?;
    Ok(Next::Phase(Phase::Copy))
}

/// The initial copy (throttled, [`snapshot_copy`]), then a subscription
/// that streams every change committed after the copy's snapshot.
pub(crate) fn copy(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let name = replication_name(job);
    let mut target = connect(&job.target)?;
    // Once subscribed the copy is complete (it is made last).
    if exists_on(
        &job.target,
        &mut target,
        "pg_subscription",
        "subname",
        &name,
    )? {
        snapshot_copy::release_snapshot();
        return Ok(Next::Phase(Phase::CatchUp));
    }
    let mut source = connect(&job.source)?;
    let sources: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    if snapshot_copy::pages_copied(job, sources.len())? {
        snapshot_copy::release_snapshot();
        snapshot_copy::finish(
            job,
            &job.target,
            &mut target,
            &sources,
            &after_copy_script(job, shards, &mut source)?,
        )?;
        Link::forward(job).subscribe(&mut target)?;
        return Ok(Next::Phase(Phase::CatchUp));
    }
    let snapshot = match snapshot_copy::exported_snapshot(job) {
        Some(snapshot) => snapshot,
        None => match start_copy(job, shards, &mut source, &mut target)? {
            Some(snapshot) => snapshot,
            // Writers held the tables: try again at the next step.
            None => return Ok(Next::Stay),
        },
    };
    snapshot_copy::copy_step(job, &sources, &mut source, |index, start, end, source| {
        copy_pages(
            job,
            &shards[index],
            &snapshot,
            (start, end),
            source,
            &mut target,
        )
    })?;
    Ok(Next::Again)
}

/// The `part` (`table` or `indexes`) of the DDL of a shard of the group as
/// it is on the source.
fn group_table_ddl(
    job: &Job,
    shard: &GroupShard,
    source: &mut Client,
    part: &str,
) -> Result<Vec<String>> {
    Ok(value_on::<Vec<String>>(
        &job.source,
        source,
        &format!(
            "SELECT pg_shard.shard_table_ddl({}::regclass, {})",
            quote::literal(&shard.qualified()),
            quote::literal(part)
        ),
    )?
    .unwrap_or_default())
}

/// What the group's tables on the target get once the copy is in
/// ([`snapshot_copy::finish`]): their indexes and row guards, then their
/// foreign keys among them, which need the indexes they reference.
fn after_copy_script(job: &Job, shards: &[GroupShard], source: &mut Client) -> Result<Vec<String>> {
    let mut script = Vec::new();
    for shard in shards {
        script.extend(group_table_ddl(job, shard, source, "indexes")?);
        let range = shard_range(&job.source, source, shard.shard_id)?;
        script.extend(row_guard_script(shard, range));
        script.extend(lookup_trigger_script(shard.shard_id, shard)?);
    }
    script.extend(group_foreign_keys(job, shards, source, true)?);
    Ok(script)
}

/// The foreign keys of the group's tables that reference one of them
/// (`within`), or the others (those that reference reference tables).
fn group_foreign_keys(
    job: &Job,
    shards: &[GroupShard],
    source: &mut Client,
    within: bool,
) -> Result<Vec<String>> {
    let group = quote::text_array(&shards.iter().map(GroupShard::qualified).collect::<Vec<_>>());
    let mut script = Vec::new();
    for shard in shards {
        let foreign_keys = value_on::<Vec<String>>(
            &job.source,
            source,
            &format!(
                "SELECT pg_shard.shard_foreign_key_ddl({}::regclass, {}, {group}, {group}, {within})",
                quote::literal(&shard.qualified()),
                quote::literal(&shard.name)
            ),
        )?
        .unwrap_or_default();
        script.extend(foreign_keys);
    }
    Ok(script)
}

/// Starts (or starts over) the copy: empties the target tables, makes sure
/// the publication and the slot exist, and takes the copy's snapshot at a
/// moment when no write to the source tables is in flight (they wait on a
/// lock for that moment), so that the WAL position then separates what the
/// snapshot sees from what the slot must stream; the slot is advanced to
/// it. None: the lock could not be had within a second (a long write
/// transaction), nothing was waited for longer.
pub(crate) fn start_copy(
    job: &Job,
    shards: &[GroupShard],
    source: &mut Client,
    target: &mut Client,
) -> Result<Option<String>> {
    snapshot_copy::release_snapshot();
    let tables: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    run_on(
        &job.target,
        target,
        &format!(
            "BEGIN;\nSET LOCAL session_replication_role = replica;\nTRUNCATE {};\nCOMMIT",
            tables.join(", ")
        ),
    )?;
    let mut published = tables.clone();
    published.push(marker_table(job));
    let link = Link::forward(job);
    link.publish_and_reserve_slot(source, &published)?;
    let mut lock = connect(&job.source)?;
    let locked = lock.batch_execute(&format!(
        "BEGIN;\nSET LOCAL lock_timeout = '1s';\nLOCK TABLE {} IN EXCLUSIVE MODE",
        tables.join(", ")
    ));
    if let Err(e) = locked {
        if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
            pgrx::log!(
                "pg_shard job {}: writers held the source tables; the copy starts later",
                job.job_id
            );
            return Ok(None);
        }
        return Err(remote::remote_error(&job.source, &e));
    }
    let (holder, snapshot, cut) =
        snapshot_copy::export_snapshot(job, "pg_current_wal_insert_lsn()::text")?;
    run_on(&job.source, &mut lock, "COMMIT")?;
    link.advance_slot(source, &cut)?;
    snapshot_copy::restart_progress(job)?;
    snapshot_copy::hold_snapshot(job, holder, &snapshot);
    Ok(Some(snapshot))
}

/// Copies the rows of pages [start, end) of a source table, as the
/// snapshot sees them, to the target (binary COPY, one transaction on each
/// side); returns the rows copied.
pub(crate) fn copy_pages(
    job: &Job,
    shard: &GroupShard,
    snapshot: &str,
    (start, end): (i64, i64),
    source: &mut Client,
    target: &mut Client,
) -> Result<i64> {
    run_on(
        &job.source,
        source,
        &format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ;\nSET TRANSACTION SNAPSHOT {}",
            quote::literal(snapshot)
        ),
    )?;
    run_on(
        &job.target,
        target,
        "BEGIN;\nSET LOCAL session_replication_role = replica",
    )?;
    let copy_error = |node: &Node, e: std::io::Error| ShardError::Remote {
        host: node.host.clone(),
        port: node.port,
        cause: e.to_string(),
    };
    let mut reader = source
        .copy_out(&format!(
            "COPY (SELECT * FROM {} WHERE ctid >= '({start},0)'::tid AND ctid < '({end},0)'::tid) \
             TO STDOUT (FORMAT binary)",
            shard.qualified()
        ))
        .map_err(|e| remote::remote_error(&job.source, &e))?;
    let mut writer = target
        .copy_in(&format!(
            "COPY {} FROM STDIN (FORMAT binary)",
            shard.qualified()
        ))
        .map_err(|e| remote::remote_error(&job.target, &e))?;
    std::io::copy(&mut reader, &mut writer).map_err(|e| copy_error(&job.source, e))?;
    drop(reader);
    let rows = writer
        .finish()
        .map_err(|e| remote::remote_error(&job.target, &e))?;
    run_on(&job.target, target, "COMMIT")?;
    run_on(&job.source, source, "COMMIT")?;
    Ok(rows as i64)
}

/// Replication lag in bytes (None: the slot is not there yet) and whether
/// every table finished its initial copy.
pub(crate) fn replication_state(
    job: &Job,
    source: &mut Client,
    target: &mut Client,
) -> Result<(Option<i64>, bool)> {
    let lag = Link::forward(job).lag(source)?;
    let name = quote::literal(&replication_name(job));
    let pending = value_on::<i64>(
        &job.target,
        target,
        &format!(
            "SELECT count(*) FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid \
             WHERE s.subname = {name} AND r.srsubstate <> 'r'"
        ),
    )?
    .unwrap_or(1);
    Ok((lag, pending == 0))
}

/// The forward replication's lag recorded in the job; true when every
/// table has its copy and the lag is small enough for a cutover.
fn caught_up(job: &Job, source: &mut Client, target: &mut Client) -> Result<bool> {
    let (lag, synced) = replication_state(job, source, target)?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET lag_bytes = $2 WHERE job_id = $1",
        &[job.job_id.into(), lag.into()],
    )?;
    Ok(synced && lag.is_some_and(|lag| lag < CUTOVER_LAG))
}

pub(crate) fn catch_up(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let mut target = connect(&job.target)?;
    // Paced like the copy: while the source is over a limit, the
    // subscription stops (and with it the source's walsender) and the
    // job waits; it runs again before the job goes on.
    let mut source = connect(&job.source)?;
    if pacing::over_limit(job, &mut source)?.is_some() {
        set_subscription_enabled(job, &mut target, false)?;
        pacing::throttle(job, &mut source)?;
        return Ok(Next::Stay);
    }
    set_subscription_enabled(job, &mut target, true)?;
    if caught_up(job, &mut source, &mut target)? {
        // The reverse slot now, while nothing of the job holds a lock:
        // making a slot waits for the target's transactions in progress,
        // and one of them may wait for the cutover's lock.
        reverse::prepare(job, shards, &mut target)?;
        // Verified once, at a point of this catch-up; then the cutover
        // (or first the reads).
        if super::verification::verified(job)? {
            return Ok(Next::Phase(reads_first::after_catch_up(job)?));
        }
        return Ok(Next::Phase(Phase::Verify));
    }
    Ok(Next::Stay)
}

/// Enables or disables the forward subscription on the target (nothing
/// when it is so already).
fn set_subscription_enabled(job: &Job, target: &mut Client, enabled: bool) -> Result<()> {
    let name = replication_name(job);
    let differs = value_on::<bool>(
        &job.target,
        target,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_subscription WHERE subname = {} \
                            AND subenabled <> {enabled})",
            quote::literal(&name)
        ),
    )?
    .unwrap_or(false);
    if differs {
        let action = if enabled { "ENABLE" } else { "DISABLE" };
        run_on(
            &job.target,
            target,
            &format!("ALTER SUBSCRIPTION {} {action}", quote::ident(&name)),
        )?;
    }
    Ok(())
}

/// Reads of the range on the target, writes on the source
/// ([`reads_first`]); the subscription keeps applying the source's writes.
/// Every few seconds the lag is recorded (what the reads may miss) and
/// the reverse slot moved up past the applied writes (so the target does
/// not keep their WAL for the whole wait); a node that cannot be reached
/// fails the step. Once the writes are due, the cutover follows when the
/// lag is small.
fn reads_switched(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    if reads_first::switch_reads(job)? {
        return Ok(Next::Stay);
    }
    let due = reads_first::writes_due(job)?;
    if !due && !reads_first::replication_check_due(job)? {
        return Ok(Next::Stay);
    }
    let mut target = connect(&job.target)?;
    let caught_up = caught_up(job, &mut connect(&job.source)?, &mut target)?;
    reverse::prepare(job, shards, &mut target)?;
    reverse::skip_ahead(job, &mut target)?;
    if due && caught_up {
        return Ok(Next::Phase(Phase::Cutover));
    }
    Ok(Next::Stay)
}

/// The cutover, in one step (a crash anywhere in it leaves the job to run
/// it again from the start, or to roll back):
/// 0. the new map written just before the lock, in the runner's
///    transaction (placement, the next version, NOTIFY; published when it
///    commits at the end of the step): nothing of it depends on what
///    follows, and so none of it is inside the pause;
/// 1. lock the source shard tables EXCLUSIVE in a transaction kept open:
///    writers holding locks finish first, new ones wait (the write pause;
///    readers go on);
/// 2. a marker row on the source; once it is on the target, every write
///    before the lock is too (the copy was verified before, in the
///    `verify` phase: nothing here reads the shard);
/// 3. retire the source shards and commit (the waiting writers get
///    WrongShard and their routers look for the new map);
/// 4. activate the target shards at that version; the runner's commit
///    (with the job's next phase) publishes the map; the foreign
///    partitions follow in the cleanup.
///
/// The reverse replication's slot on the target is there already (made at
/// the end of the catch-up; checked again here, before the lock), and the
/// target's WAL position once the last writes are applied (before any
/// write of the new owner) is where it will stream from.
pub(crate) fn cutover(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let tables: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    let ids = shard_id_list(shards);
    let forward = Link::forward(job);
    // Connections first: a new one costs a server process's start, which
    // would count in the pause.
    let mut source = connect(&job.source)?;
    let mut target = connect(&job.target)?;
    let lock_holder = forward.lock_holder(job, (&tables, &ids))?;
    reverse::prepare(job, shards, &mut target)?;
    reverse::skip_ahead(job, &mut target)?;
    forward.drain_unlocked(job, &ids, (&mut source, &mut target))?;
    // The new map just before the lock (the version's row is held from
    // here to the step's commit); the read routes go with it.
    reads_first::forget_routes(job)?;
    let version = forward.publish_ahead(job)?;
    let mut pause = PauseClock::start();
    let reverse_from = forward.cut_over(
        job,
        (&tables, &ids, version),
        lock_holder,
        (&mut source, &mut target),
        &mut pause,
    )?;
    record_publish(job, ("new_version", version), ("cutover_ms", &pause))?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources || jsonb_build_object('reverse_from', $2::text) \
         WHERE job_id = $1",
        &[job.job_id.into(), reverse_from.into()],
    )?;
    Ok(Next::Phase(Phase::Cleanup))
}

/// The foreign partitions follow a published map (`from` → `to`), in a
/// transaction of their own: replacing a partition locks its distributed
/// table, which a statement refused at the cutover still holds while it
/// waits for that map (see `executor::moved_shards`). Until then the
/// postgres_fdw path reaches the retired shards and is refused (PS001).
pub(crate) fn repoint_partitions(shards: &[GroupShard], from: &Node, to: &Node) -> Result<()> {
    for shard in shards {
        repoint_partition(shard, from, to)?;
    }
    Ok(())
}

/// Replaces the metadata node's foreign partition of `shard` on `from`'s
/// server by one on `to`'s (a foreign table cannot change its server).
fn repoint_partition(shard: &GroupShard, from: &Node, to: &Node) -> Result<()> {
    use crate::metadata::routing_table::partition_name;
    let old = quote::qualified(
        "pg_shard_partitions",
        &partition_name(&shard.table_name, shard.shard_id, from.node_id),
    );
    let new = quote::qualified(
        "pg_shard_partitions",
        &partition_name(&shard.table_name, shard.shard_id, to.node_id),
    );
    // Apart: a quoted name may hold spaces.
    let parent_and_bounds = crate::spi::connect(|client| {
        let mut rows = client.select(
            "SELECT i.inhparent::regclass::text, pg_get_expr(c.relpartbound, c.oid) \
             FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid WHERE c.oid = to_regclass($1)",
            Some(1),
            &[old.as_str().into()],
        )?;
        match rows.next() {
            None => Ok::<_, ShardError>(None),
            Some(row) => Ok(Some((row.get::<String>(1)?, row.get::<String>(2)?))),
        }
    })?;
    let Some((parent, bounds)) = parent_and_bounds else {
        // Done already (a repeated phase).
        return Ok(());
    };
    let (Some(parent), Some(bounds)) = (parent, bounds) else {
        return Err(ShardError::InvalidArgument(format!("no bounds for {old}")));
    };
    let (parent, bounds) = (parent.as_str(), bounds.as_str());
    crate::commands::ddl::run_internal(&format!("ALTER TABLE {parent} DETACH PARTITION {old}"))?;
    crate::metadata::routing_table::create_foreign_partition(
        parent,
        &new,
        bounds,
        to.node_id,
        &shard.schema,
        &shard.name,
    )?;
    crate::spi::run(&format!("DROP FOREIGN TABLE {old}"))?;
    Ok(())
}

/// When the old tables go: `pg_shard.move_drop_delay` (as recorded when
/// the job was queued) from now, unless set already (by a repeated phase,
/// or by `pg_shard.complete_job`).
pub(crate) fn set_drop_after(job: &Job) -> Result<()> {
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources || jsonb_build_object('drop_after', \
             coalesce((resources->>'drop_after')::timestamptz, \
                      now() + coalesce((resources->>'drop_delay')::interval, interval '60 seconds'))) \
         WHERE job_id = $1",
        &[job.job_id.into()],
    )?;
    Ok(())
}

pub(crate) fn drop_old(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let due = query_one::<bool>(
        "SELECT now() >= (resources->>'drop_after')::timestamptz FROM pg_shard.job WHERE job_id = $1",
        &[job.job_id.into()],
    )?
    .unwrap_or(true);
    if !due {
        return Ok(Next::Stay);
    }
    drop_shard_tables(&job.source, shards, "")?;
    Ok(Next::Done("completed"))
}

pub(crate) fn rollback(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    if reads_first::unpublish(job)? {
        return Ok(Next::Stay);
    }
    snapshot_copy::release_snapshot();
    drop_replication(job)?;
    drop_shard_tables(&job.target, shards, " AND state = 'frozen' AND epoch = 0")?;
    finish_rollback(job, shards)
}
