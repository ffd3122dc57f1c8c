//! The phases of a split (the order is in [`super`]'s overview); cleanup
//! and drop_old are a move's.

use super::apply::{self, Apply, Direction};
use super::reverse;
use super::stream::Streamed;
use super::tables::{
    half_shards, hand_over_script, qualified_halves, source_shards, split_tables, Half, Ranges,
    SplitTable,
};
use crate::error::{Result, ShardError};
use crate::operations::group_shards::shard_id_list;
use crate::operations::group_shards::{
    drop_shard_tables, frozen_shard_script, lookup_trigger_script, row_guard_script, GroupShard,
};
use crate::operations::job::{Job, Next, Phase};
use crate::operations::moves::{self, finish_rollback, record_plan};
use crate::operations::node_access::batch_value;
use crate::operations::node_access::{connect, run_on, value_on};
use crate::operations::pacing;
use crate::operations::pause_clock::{record_publish, PauseClock};
use crate::operations::reads_first;
use crate::operations::replication::{
    drop_replication, lock_for_cutover, marker_table, warm_up, Link,
};
use crate::operations::settings::FINAL_WAIT;
use crate::operations::snapshot_copy::{self, exported_snapshot, hold_snapshot, release_snapshot};
use crate::quote;
use crate::spi::query_one;
use pgrx::prelude::*;
use postgres::Client;
use std::time::{Duration, Instant};

/// A round that read fewer messages than this found the halves nearly
/// caught up: the cutover's pause then only has to apply what came in
/// during one round.
const CAUGHT_UP: i64 = 3_000;

/// How long one step of the catch-up goes on before the job's progress is
/// recorded.
const STEP_TIME: Duration = Duration::from_secs(1);

/// While the halves serve reads (reads first): the pause between apply
/// rounds that found little to apply.
const APPLY_PAUSE: Duration = Duration::from_millis(50);

/// Runs one step of a split job.
pub(crate) fn step(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    // The plan makes the halves the other phases read.
    if matches!(job.phase(), Ok(Phase::Plan)) {
        return plan(job, shards);
    }
    let tables = split_tables(job)?;
    match job.phase()? {
        Phase::Plan => plan(job, shards),
        Phase::CreateTarget => create_target(job, &tables),
        Phase::Copy => copy(job, &tables),
        Phase::CatchUp => catch_up(job, &tables),
        Phase::Verify => super::verify::verify_split(job, &tables),
        Phase::ReadsSwitched => reads_switched(job, &tables),
        Phase::Cutover => cutover(job, &tables),
        Phase::Cleanup => {
            replace_partitions(job, &tables)?;
            reverse::start(job)?;
            moves::set_drop_after(job)?;
            Ok(Next::Phase(Phase::ReverseReplicating))
        }
        Phase::ReverseReplicating => reverse::reverse_replicating(job, &tables),
        Phase::DropOld => {
            crate::operations::reverse::stop(job)?;
            moves::drop_old(job, &source_shards(&tables))
        }
        Phase::Reverting => reverse::revert(job, &tables),
        Phase::RevertCleanup => reverse::revert_cleanup(job, &tables),
        Phase::Rollback => rollback(job, &tables),
    }
}

fn plan(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let mut source = connect(&job.source)?;
    let mut halves = Vec::new();
    for shard in shards {
        // Rows are found by their key (or all their values) when changes
        // are applied, and the source must log it (REPLICA IDENTITY NOTHING
        // would also make its updates fail once it is published).
        let identity = value_on::<String>(
            &job.source,
            &mut source,
            &format!(
                "SELECT relreplident::text FROM pg_class WHERE oid = {}::regclass",
                quote::literal(&shard.qualified())
            ),
        )?
        .unwrap_or_default();
        let key_columns = value_on::<Vec<String>>(
            &job.source,
            &mut source,
            &format!(
                "SELECT CASE WHEN c.relreplident = 'n' THEN '{{}}'::text[] ELSE array(SELECT a.attname::text \
                   FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n) \
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                  WHERE i.indrelid = c.oid \
                    AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END \
                  ORDER BY k.n) END \
                 FROM pg_class c WHERE c.oid = {}::regclass",
                quote::literal(&shard.qualified())
            ),
        )?
        .unwrap_or_default();
        if key_columns.is_empty() && identity != "f" {
            return Err(ShardError::NoReplicaIdentity(shard.qualified()));
        }
        let lower_id = crate::metadata::catalog::next_shard_id()?;
        let upper_id = crate::metadata::catalog::next_shard_id()?;
        let name = |id| crate::shard_ddl::shard_table_name(&shard.table_name, id);
        halves.push((
            shard,
            key_columns,
            lower_id,
            name(lower_id),
            upper_id,
            name(upper_id),
        ));
    }
    record_plan(job, shards)?;
    for (shard, key_columns, lower_id, lower_name, upper_id, upper_name) in halves {
        crate::spi::run_with_args(
            "UPDATE pg_shard.job SET resources = jsonb_set(resources, '{halves}', \
                 coalesce(resources->'halves', '[]'::jsonb) || jsonb_build_object('source_id', $2::bigint, 'schema', $3::text, \
                     'source_name', $4::text, 'table_name', $5::text, 'dist_column', $6::text, \
                     'key_columns', $7::text[], 'lower_id', $8::bigint, 'lower_name', $9::text, \
                     'upper_id', $10::bigint, 'upper_name', $11::text)) \
             WHERE job_id = $1",
            &[
                job.job_id.into(),
                shard.shard_id.into(),
                shard.schema.as_str().into(),
                shard.name.as_str().into(),
                shard.table_name.as_str().into(),
                shard.dist_column.clone().into(),
                key_columns.into(),
                lower_id.into(),
                lower_name.into(),
                upper_id.into(),
                upper_name.into(),
            ],
        )?;
    }
    Ok(Next::Phase(Phase::CreateTarget))
}

fn create_target(job: &Job, tables: &[SplitTable]) -> Result<Next> {
    let ranges = Ranges::load(job)?;
    let mut node = connect(&job.source)?;
    let mut script = vec![format!(
        "CREATE TABLE IF NOT EXISTS {} (job bigint PRIMARY KEY, applied pg_lsn NOT NULL)",
        marker_table(job)
    )];
    for table in tables {
        for (half, start, end) in [
            (&table.lower, ranges.range_start, ranges.split_at - 1),
            (&table.upper, ranges.split_at, ranges.range_end),
        ] {
            let ddl = half_ddl(job, table, half, &mut node, "table")?
                .into_iter()
                .filter(|s| *s != crate::shard_ddl::create_schema_if_missing(&table.source.schema))
                .collect();
            script.extend(frozen_shard_script(
                &table.half_shard(half),
                ddl,
                (start, end),
            ));
        }
    }
    // Foreign keys to reference tables while the halves are empty (those
    // among the halves come after the copy, with the indexes).
    script.extend(half_foreign_keys(job, tables, &mut node, false)?);
    run_on(
        &job.source,
        &mut node,
        &format!("BEGIN;\n{};\nCOMMIT", script.join(";\n")),
    )?;
    Ok(Next::Phase(Phase::Copy))
}

fn copy(job: &Job, tables: &[SplitTable]) -> Result<Next> {
    let ranges = Ranges::load(job)?;
    let mut node = connect(&job.source)?;
    let sources: Vec<String> = tables.iter().map(|t| t.source.qualified()).collect();
    if snapshot_copy::pages_copied(job, sources.len())? {
        release_snapshot();
        let script = after_copy_script(job, &ranges, tables, &mut node)?;
        snapshot_copy::finish(
            job,
            &job.source,
            &mut node,
            &qualified_halves(tables),
            &script,
        )?;
        return Ok(Next::Phase(Phase::CatchUp));
    }
    let snapshot = match exported_snapshot(job) {
        Some(snapshot) => snapshot,
        None => start_copy(job, tables, &mut node)?,
    };
    snapshot_copy::copy_step(job, &sources, &mut node, |index, start, end, node| {
        copy_pages(job, &ranges, &tables[index], &snapshot, start, end, node)
    })?;
    Ok(Next::Again)
}

/// The `part` (`table` or `indexes`) of the DDL of a half of a table of the
/// group.
fn half_ddl(
    job: &Job,
    table: &SplitTable,
    half: &Half,
    node: &mut Client,
    part: &str,
) -> Result<Vec<String>> {
    Ok(value_on::<Vec<String>>(
        &job.source,
        node,
        &format!(
            "SELECT pg_shard.shard_table_ddl_as({}::regclass, {}, {}, {}, {})",
            quote::literal(&table.source.qualified()),
            quote::literal(&half.name),
            table.source.shard_id,
            half.shard_id,
            quote::literal(part)
        ),
    )?
    .unwrap_or_default())
}

/// What the halves get once the copy is in ([`snapshot_copy::finish`]):
/// their indexes and row guards, then their foreign keys among them, which
/// need the indexes they reference.
fn after_copy_script(
    job: &Job,
    ranges: &Ranges,
    tables: &[SplitTable],
    node: &mut Client,
) -> Result<Vec<String>> {
    let mut script = Vec::new();
    for table in tables {
        for (half, range) in [
            (&table.lower, (ranges.range_start, ranges.split_at - 1)),
            (&table.upper, (ranges.split_at, ranges.range_end)),
        ] {
            script.extend(half_ddl(job, table, half, node, "indexes")?);
            script.extend(row_guard_script(&table.half_shard(half), range));
            script.extend(lookup_trigger_script(
                table.source.shard_id,
                &table.half_shard(half),
            )?);
        }
    }
    script.extend(half_foreign_keys(job, tables, node, true)?);
    Ok(script)
}

/// The foreign keys of the halves that reference the group's tables
/// (`within`: a half references the same half of a co-located table), or
/// the others (those that reference reference tables).
fn half_foreign_keys(
    job: &Job,
    tables: &[SplitTable],
    node: &mut Client,
    within: bool,
) -> Result<Vec<String>> {
    let sources: Vec<String> = tables.iter().map(|t| t.source.qualified()).collect();
    let mut script = Vec::new();
    for half_of in [
        |t: &SplitTable| t.lower.name.clone(),
        |t: &SplitTable| t.upper.name.clone(),
    ] {
        let halves: Vec<String> = tables
            .iter()
            .map(|t| quote::qualified(&t.source.schema, &half_of(t)))
            .collect();
        for table in tables {
            let foreign_keys = value_on::<Vec<String>>(
                &job.source,
                node,
                &format!(
                    "SELECT pg_shard.shard_foreign_key_ddl({}::regclass, {}, {}, {}, {within})",
                    quote::literal(&table.source.qualified()),
                    quote::literal(&half_of(table)),
                    quote::text_array(&sources),
                    quote::text_array(&halves)
                ),
            )?
            .unwrap_or_default();
            script.extend(foreign_keys);
        }
    }
    Ok(script)
}

/// Starts (or starts over) the copy: empties the halves, makes sure the
/// publication and the slot exist, and exports a snapshot taken after the
/// slot, recording which transactions it sees.
fn start_copy(job: &Job, tables: &[SplitTable], node: &mut Client) -> Result<String> {
    release_snapshot();
    let halves = qualified_halves(tables);
    run_on(
        &job.source,
        node,
        &format!(
            "BEGIN;\nSET LOCAL session_replication_role = replica;\nTRUNCATE {};\n\
             DELETE FROM {marker};\nINSERT INTO {marker} VALUES ({}, '0/0');\nCOMMIT",
            halves.join(", "),
            job.job_id,
            marker = marker_table(job),
        ),
    )?;
    let sources: Vec<String> = tables.iter().map(|t| t.source.qualified()).collect();
    Link::forward(job).publish_and_reserve_slot(node, &sources)?;
    // Every transaction that commits after the snapshot is in the slot:
    // the slot was consistent before the snapshot was taken.
    let (holder, snapshot, visible) =
        snapshot_copy::export_snapshot(job, "pg_current_snapshot()::text")?;
    snapshot_copy::restart_progress(job)?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources || jsonb_build_object('copy_snapshot', $2::text) \
         WHERE job_id = $1",
        &[job.job_id.into(), visible.as_str().into()],
    )?;
    hold_snapshot(job, holder, &snapshot);
    Ok(snapshot)
}

/// Copies the rows of pages [start, end) of the source, as the snapshot
/// sees them, into the halves; returns the rows copied.
fn copy_pages(
    job: &Job,
    ranges: &Ranges,
    table: &SplitTable,
    snapshot: &str,
    start: i64,
    end: i64,
    node: &mut Client,
) -> Result<i64> {
    let dist = quote::ident(table.source.dist_column.as_deref().unwrap_or_default());
    run_on(
        &job.source,
        node,
        &format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ;\nSET TRANSACTION SNAPSHOT {};\n\
             SET LOCAL session_replication_role = replica",
            quote::literal(snapshot)
        ),
    )?;
    let copied = value_on::<i64>(
        &job.source,
        node,
        &format!(
            "WITH page_rows AS MATERIALIZED ( \
                 SELECT * FROM {source} WHERE ctid >= '({start},0)'::tid AND ctid < '({end},0)'::tid), \
             low AS (INSERT INTO {lower} SELECT * FROM page_rows \
                     WHERE pg_shard.keyspace_id(page_rows.{dist}) < {split} RETURNING 1), \
             high AS (INSERT INTO {upper} SELECT * FROM page_rows \
                      WHERE pg_shard.keyspace_id(page_rows.{dist}) >= {split} RETURNING 1) \
             SELECT (SELECT count(*) FROM low) + (SELECT count(*) FROM high)",
            source = table.source.qualified(),
            lower = table.qualified(&table.lower),
            upper = table.qualified(&table.upper),
            split = ranges.split_at,
        ),
    )?
    .unwrap_or(0);
    run_on(&job.source, node, "COMMIT")?;
    Ok(copied)
}

fn catch_up(job: &Job, tables: &[SplitTable]) -> Result<Next> {
    if apply_for_a_step(job, tables, Direction::Forward, false)? {
        // The reverse replication's slot, for after the cutover: made now
        // (a new slot waits for the node's transactions in progress, which
        // may wait for the cutover's lock).
        super::reverse::prepare(job, tables, &mut connect(&job.source)?)?;
        // Verified once, at a point of this catch-up; then the cutover
        // (or first the reads).
        if crate::operations::verification::verified(job)? {
            return Ok(Next::Phase(reads_first::after_catch_up(job)?));
        }
        return Ok(Next::Phase(Phase::Verify));
    }
    Ok(Next::Stay)
}

/// Reads of the range on the halves, writes on the source
/// ([`reads_first`]): the job keeps applying the source's writes to the
/// halves, and once the writes are due and the halves caught up, the
/// cutover follows.
fn reads_switched(job: &Job, tables: &[SplitTable]) -> Result<Next> {
    if reads_first::switch_reads(job)? {
        return Ok(Next::Stay);
    }
    // Every few seconds the reverse slot moves up past the applied writes
    // (so the node does not keep their WAL for the whole wait).
    if reads_first::replication_check_due(job)? {
        crate::operations::reverse::skip_ahead(job, &mut connect(&job.source)?)?;
    }
    if apply_for_a_step(job, tables, Direction::Forward, true)? && reads_first::writes_due(job)? {
        return Ok(Next::Phase(Phase::Cutover));
    }
    Ok(Next::Stay)
}

/// Applies the changes of `direction` for up to a step's time (or until
/// the node's pacing asks to wait), records the lag; true when the
/// destination tables are nearly caught up. `whole_step`: go on applying
/// what comes in for the whole step once caught up (the halves serve
/// reads; one connection per step rather than per round).
pub(super) fn apply_for_a_step(
    job: &Job,
    tables: &[SplitTable],
    direction: Direction,
    whole_step: bool,
) -> Result<bool> {
    let ranges = Ranges::load(job)?;
    let apply = Apply {
        job,
        tables,
        ranges: &ranges,
        direction,
    };
    let mut node = apply::connection(job)?;
    let started = Instant::now();
    let caught_up = loop {
        let read = apply.round(&mut node, None)?;
        if read < CAUGHT_UP {
            if whole_step && started.elapsed() < STEP_TIME {
                std::thread::sleep(APPLY_PAUSE);
                continue;
            }
            break true;
        }
        // Much left to apply: forward, paced like the copy (in reverse the
        // old tables must keep up with the owners' writes, and a job held
        // there too long would fail for good: the writes keep coming).
        if started.elapsed() >= STEP_TIME
            || (direction == Direction::Forward && pacing::throttle(job, &mut node)?.is_some())
        {
            break false;
        }
    };
    let link = match direction {
        Direction::Forward => Link::forward(job),
        Direction::Reverse => Link::reverse(job),
    };
    let lag = link.lag(&mut node)?;
    // `lag_at`: the runner looks at a job in reverse replication again
    // after a few seconds, or at once while it is behind. Forward, an
    // error of an earlier try is over (in reverse it may be a failed
    // revert's, which the DBA is to see).
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET lag_bytes = $2, \
             error = CASE WHEN $4 THEN NULL ELSE error END, \
             resources = CASE WHEN $3 THEN resources || jsonb_build_object('lag_at', clock_timestamp()) \
                              ELSE resources - 'lag_at' END \
         WHERE job_id = $1",
        &[
            job.job_id.into(),
            lag.into(),
            caught_up.into(),
            (direction == Direction::Forward).into(),
        ],
    )?;
    // (The lag counts all of the node's WAL, the halves' own included: it
    // is shown, not used.)
    Ok(caught_up)
}

/// The split's cutover: the new map written first (in the runner's
/// transaction); then writes to the source wait on a lock while the job
/// applies the last of them (the halves were verified before, in the
/// `verify` phase), the source is retired and the halves activated at the
/// new map's version in one transaction on the node, and the runner's
/// commit publishes the map.
fn cutover(job: &Job, tables: &[SplitTable]) -> Result<Next> {
    let ranges = Ranges::load(job)?;
    let apply = Apply {
        job,
        tables,
        ranges: &ranges,
        direction: Direction::Forward,
    };
    let sources: Vec<String> = tables.iter().map(|t| t.source.qualified()).collect();
    // The connections first: a new one would count in the pause. And what
    // was written since the last step is applied before the lock (a round
    // through SQL, then over the stream up to a mark): only the rest is
    // applied while writers wait.
    let mut node = apply::connection(job)?;
    let mut lock_holder = connect(&job.source)?;
    let every_shard = [source_shards(tables), half_shards(tables)].concat();
    warm_up(
        &job.source,
        &mut lock_holder,
        (&sources, &shard_id_list(&every_shard)),
        "",
    )?;
    super::reverse::prepare(job, tables, &mut node)?;
    crate::operations::reverse::skip_ahead(job, &mut node)?;
    // (Before the map's row is taken: it waits for the node's
    // transactions.)
    apply::refresh_restart_point(job, &mut node);
    let now = apply::flushed_position(job, &mut node)?;
    apply.up_to(&mut node, now, "the writes before the cutover were")?;
    let mut stream = Streamed::open(&apply, &mut node, FINAL_WAIT)?;
    // The new map, written just before the lock in this step's transaction
    // (published when it commits; nothing in it depends on the drain): the
    // read routes go, the catalog's two groups for one, the next version.
    reads_first::forget_routes(job)?;
    let upper_group = publish(job, tables, &ranges)?;
    let version =
        crate::metadata::catalog::bump_map_version_for(&[job.shard_group_id, upper_group])?;
    let drain_limit = apply.drain_limit()?;
    let mut pause = PauseClock::start();
    // Nothing writes the source once it is locked: everything before the
    // mark written then (and flushed, in the same round trip) is
    // everything there is.
    let mark = stream.next_mark();
    lock_for_cutover(job, &job.source, &mut lock_holder, &sources, &mark)?;
    pause.mark("locked");
    let last_writes = apply::last_writes(&stream.finish(&mut node, drain_limit)?);
    pause.mark("drained");
    // The last writes, the retire and the activation, committed together;
    // every write of the halves after the position returned then is the
    // new owners': where the reverse replication starts.
    let reverse_from = batch_value(
        &job.source,
        &mut lock_holder,
        &hand_over_script(
            &last_writes,
            &source_shards(tables),
            &half_shards(tables),
            version,
        ),
    )?
    .ok_or_else(|| ShardError::InvalidArgument("the node returned no WAL position".into()))?;
    pause.mark("retired");
    pause.mark("published");
    record_publish(job, ("new_version", version), ("cutover_ms", &pause))?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources \
             || jsonb_build_object('reverse_from', $2::text, 'upper_group', $3::bigint) \
         WHERE job_id = $1",
        &[job.job_id.into(), reverse_from.into(), upper_group.into()],
    )?;
    Ok(Next::Phase(Phase::Cleanup))
}

/// The metadata catalog after the split: the group keeps the lower half,
/// a new group on the same node takes the upper one; every table's shard
/// is replaced by its halves (their foreign partitions follow in the
/// cleanup, [`replace_partitions`]).
fn publish(job: &Job, tables: &[SplitTable], ranges: &Ranges) -> Result<i64> {
    let upper_group = crate::metadata::catalog::write_returning::<i64>(
        "WITH lower AS (UPDATE pg_shard.shard_group SET range_end = $2 - 1 \
                        WHERE shard_group_id = $1 RETURNING colocation_id) \
         INSERT INTO pg_shard.shard_group (colocation_id, range_start, range_end) \
         SELECT colocation_id, $2, $3 FROM lower RETURNING shard_group_id",
        &[
            job.shard_group_id.into(),
            ranges.split_at.into(),
            ranges.range_end.into(),
        ],
    )?
    .ok_or_else(|| {
        ShardError::InvalidArgument(format!("shard group {} is gone", job.shard_group_id))
    })?;
    crate::metadata::catalog::insert_placement(upper_group, job.source.node_id)?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.colocation_group SET shard_count = shard_count + 1 \
          WHERE colocation_id = (SELECT colocation_id FROM pg_shard.shard_group WHERE shard_group_id = $1)",
        &[upper_group.into()],
    )?;
    for table in tables {
        let table_rel = query_one::<pg_sys::Oid>(
            "SELECT table_rel::oid FROM pg_shard.shard WHERE shard_id = $1",
            &[table.source.shard_id.into()],
        )?
        .ok_or_else(|| {
            ShardError::InvalidArgument(format!("shard {} is gone", table.source.shard_id))
        })?;
        crate::spi::run_with_args(
            "DELETE FROM pg_shard.shard WHERE shard_id = $1",
            &[table.source.shard_id.into()],
        )?;
        for (half, group) in [
            (&table.lower, job.shard_group_id),
            (&table.upper, upper_group),
        ] {
            crate::metadata::catalog::insert_shard(
                half.shard_id,
                table_rel,
                group,
                &table.source.schema,
                &half.name,
            )?;
        }
    }
    Ok(upper_group)
}

/// The halves' foreign partitions in place of the source's, once the
/// cutover published the map (in the cleanup, a transaction of its own:
/// replacing a partition locks the distributed table, which a statement
/// refused at the cutover still holds while it waits for that map). Done
/// already when the source's partition is gone.
fn replace_partitions(job: &Job, tables: &[SplitTable]) -> Result<()> {
    let ranges = Ranges::load(job)?;
    for table in tables {
        let lower = (
            table.lower.shard_id,
            ranges.range_start,
            ranges.split_at - 1,
        );
        let upper = (table.upper.shard_id, ranges.split_at, ranges.range_end);
        swap_partitions(job, table, &[table.source.shard_id], &[lower, upper])?;
    }
    Ok(())
}

/// After a revert's publish: the source's foreign partition (the whole
/// range again) in place of the halves'. Done already when the lower
/// half's partition is gone.
pub(super) fn restore_partitions(job: &Job, tables: &[SplitTable]) -> Result<()> {
    let ranges = Ranges::load(job)?;
    for table in tables {
        let whole = (table.source.shard_id, ranges.range_start, ranges.range_end);
        swap_partitions(
            job,
            table,
            &[table.lower.shard_id, table.upper.shard_id],
            &[whole],
        )?;
    }
    Ok(())
}

/// Replaces the metadata node's foreign partitions of shards `old` of
/// `table` by partitions of the shards `new` (shard id, first and last
/// keyspace id); nothing when the first old one is gone already.
fn swap_partitions(
    job: &Job,
    table: &SplitTable,
    old: &[i64],
    new: &[(i64, i64, i64)],
) -> Result<()> {
    use crate::metadata::routing_table::partition_name;
    let partition = |id| {
        quote::qualified(
            "pg_shard_partitions",
            &partition_name(&table.source.table_name, id, job.source.node_id),
        )
    };
    let Some(first) = old.first() else {
        return Ok(());
    };
    let parent = query_one::<String>(
        "SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = to_regclass($1)",
        &[partition(*first).as_str().into()],
    )?;
    let Some(parent) = parent else {
        return Ok(());
    };
    for id in old {
        let name = partition(*id);
        let attached = query_one::<bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass($1))",
            &[name.as_str().into()],
        )?
        .unwrap_or(false);
        if attached {
            crate::commands::ddl::run_internal(&format!(
                "ALTER TABLE {parent} DETACH PARTITION {name}"
            ))?;
        }
        crate::spi::run(&format!("DROP FOREIGN TABLE IF EXISTS {name}"))?;
    }
    for (shard_id, first, last) in new {
        let upper_bound = if *last == i64::MAX {
            "MAXVALUE".to_string()
        } else {
            (last + 1).to_string()
        };
        let name = table
            .halves()
            .into_iter()
            .find(|h| h.shard_id == *shard_id)
            .map(|h| h.name.clone())
            .unwrap_or_else(|| table.source.name.clone());
        crate::metadata::routing_table::create_foreign_partition(
            &parent,
            &partition(*shard_id),
            &format!("FOR VALUES FROM ({first}) TO ({upper_bound})"),
            job.source.node_id,
            &table.source.schema,
            &name,
        )?;
    }
    Ok(())
}

fn rollback(job: &Job, tables: &[SplitTable]) -> Result<Next> {
    if reads_first::unpublish(job)? {
        return Ok(Next::Stay);
    }
    release_snapshot();
    drop_replication(job)?;
    drop_shard_tables(&job.source, &half_shards(tables), "")?;
    finish_rollback(job, &source_shards(tables))
}
