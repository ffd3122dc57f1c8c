//! Verification before the cutover (the `verify` phase of moves and
//! splits): the source and its copy compared at one consistent point while
//! replication goes on — row counts and checksums per key range — so that
//! the freeze only waits for the last writes and publishes, whatever the
//! shard's size.
//!
//! The point: the source's shard tables are locked for a moment (writers
//! wait, readers go on) while a snapshot is taken there and the point is
//! marked in the change stream; then the lock goes and the comparison reads
//! the source in that snapshot. The copy is read at the same point:
//! * a move's target applies through a subscription; the point is a row in
//!   the job's marker table whose trigger on the target
//!   (`pg_shard.verification_point`) waits for a lock the job holds, so the
//!   apply stops with everything before the point committed and nothing
//!   after; the job takes its snapshot of the target then and lets it go on;
//! * a split applies by itself: it applies up to the point's WAL position
//!   and no further until the comparison is done (split/verify.rs).
//!
//! A mismatch fails the job (it rolls back: nothing was published), naming
//! each table and key range that differs.

use super::group_shards::GroupShard;
use super::job::{Job, Next, Phase};
use super::node_access::{connect, poll_until, run_on, shard_range, value_on};
use super::replication::marker_table;
use super::settings::{FINAL_WAIT, VERIFY_LOCK_WAIT, VERIFY_RANGES};
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::quote;
use crate::transaction::client as remote;
use postgres::Client;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The advisory lock a move's target apply waits for at a verification
/// point: a tag in the top 16 bits, then 24 bits of the job id and 24 of
/// the point's number, so an apply held at an older point of the job (an
/// attempt that failed before the apply reached it) is not taken for this
/// one. `pg_shard.verification_point()` (sql/pg_shard_api.sql) computes
/// the same.
fn point_lock(job: &Job, point: i64) -> i64 {
    const TAG: i64 = 0x7067;
    const LOW_24: i64 = 0xff_ffff;
    (TAG << 48) | ((job.job_id % (LOW_24 + 1)) << 24) | (point % (LOW_24 + 1))
}

/// Per key range (bucket number): row count and checksum.
pub(crate) type Digest = BTreeMap<i64, (i64, i64)>;

/// A move's verification: the target at the point its subscription
/// reached the marker row, against the source's snapshot of that point.
pub(crate) fn verify_move(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let started = Instant::now();
    // Every connection first: none is opened while writers wait.
    let mut gate = connect(&job.target)?;
    let mut marker_writer = connect(&job.source)?;
    let mut source = connect(&job.source)?;
    let mut target = connect(&job.target)?;
    let mut watcher = connect(&job.target)?;
    comparable_output(&job.source, &mut source)?;
    comparable_output(&job.target, &mut target)?;
    // This attempt's point (the marker row -point); one runner per job.
    let point = value_on::<i64>(
        &job.source,
        &mut marker_writer,
        &format!(
            "SELECT 1 - least(coalesce(min(job), 0), 0) FROM {}",
            marker_table(job)
        ),
    )?
    .unwrap_or(1);
    let key = point_lock(job, point);
    // The target's apply will wait at the point until the job lets it go.
    run_on(
        &job.target,
        &mut gate,
        &format!("SELECT pg_catalog.pg_advisory_lock({key})"),
    )?;
    let tables: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    let Some(mut lock_holder) = lock_briefly(&job.source, &tables)? else {
        return Ok(Next::Stay);
    };
    run_on(
        &job.source,
        &mut marker_writer,
        &format!("INSERT INTO {} VALUES ({})", marker_table(job), -point),
    )?;
    begin_snapshot(&job.source, &mut source)?;
    run_on(&job.source, &mut lock_holder, "COMMIT")?;
    drop(lock_holder);

    wait_for_apply_at_point(job, &mut watcher, key)?;
    begin_snapshot(&job.target, &mut target)?;
    run_on(
        &job.target,
        &mut gate,
        &format!("SELECT pg_catalog.pg_advisory_unlock({key})"),
    )?;
    drop(gate);

    let mut differences = Vec::new();
    let mut rows = 0;
    for shard in shards {
        let range = shard_range(&job.source, &mut source, shard.shard_id)?;
        let from = shard.qualified();
        let column = shard.dist_column.as_deref();
        let on_source = digest(&job.source, &mut source, &from, column, range)?;
        let on_target = digest(&job.target, &mut target, &from, column, range)?;
        rows += on_source.values().map(|(count, _)| count).sum::<i64>();
        differences.extend(compare(&from, range, &on_source, &on_target, "target"));
    }
    run_on(&job.source, &mut source, "COMMIT")?;
    run_on(&job.target, &mut target, "COMMIT")?;
    finish(job, differences, rows, started)
}

/// Locks `tables` EXCLUSIVE in a transaction of a new connection to `node`,
/// waiting at most [`VERIFY_LOCK_WAIT`] in all (writers queue behind the
/// lock while it waits); None when that was not enough.
pub(crate) fn lock_briefly(node: &Node, tables: &[String]) -> Result<Option<Client>> {
    let mut holder = connect(node)?;
    // lock_timeout bounds each table's wait, statement_timeout all of them.
    let locked = holder.batch_execute(&format!(
        "BEGIN;\nSET LOCAL lock_timeout = {wait};\nSET LOCAL statement_timeout = {wait};\n\
         LOCK TABLE {} IN EXCLUSIVE MODE;\nSET LOCAL statement_timeout = 0",
        tables.join(", "),
        wait = quote::literal(VERIFY_LOCK_WAIT),
    ));
    match locked {
        Ok(()) => Ok(Some(holder)),
        Err(e)
            if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE)
                || e.code() == Some(&postgres::error::SqlState::QUERY_CANCELED) =>
        {
            Ok(None)
        }
        Err(e) => Err(remote::remote_error(node, &e)),
    }
}

/// Sets what a row's text depends on, the same on both sides of a
/// comparison (servers may differ in their defaults).
pub(crate) fn comparable_output(node: &Node, client: &mut Client) -> Result<()> {
    run_on(
        node,
        client,
        "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; \
         SET extra_float_digits = 1; SET bytea_output = 'hex'",
    )
}

/// Starts a read-only transaction whose snapshot is taken now.
pub(crate) fn begin_snapshot(node: &Node, client: &mut Client) -> Result<()> {
    run_on(
        node,
        client,
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;\nSELECT 1",
    )
}

/// Waits until the target's apply waits at the verification point: the
/// point's lock has a waiter.
fn wait_for_apply_at_point(job: &Job, watcher: &mut Client, key: i64) -> Result<()> {
    poll_until(
        &job.target,
        watcher,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks \
             WHERE locktype = 'advisory' AND NOT granted \
               AND database = (SELECT oid FROM pg_catalog.pg_database \
                                WHERE datname = pg_catalog.current_database()) \
               AND classid = {}::pg_catalog.oid AND objid = {}::pg_catalog.oid \
               AND objsubid = 1)",
            key >> 32,
            key & 0xffff_ffff
        ),
        // (Outside the write pause; pg_locks is not cheap to read.)
        (Duration::from_millis(10), FINAL_WAIT),
        "the target did not reach the verification point",
    )
}

/// Row counts and checksums of the rows of `from` per key range: the
/// shard's range cut in [`VERIFY_RANGES`] equal parts by keyspace id (one
/// part without a distribution column).
pub(crate) fn digest(
    node: &Node,
    client: &mut Client,
    from: &str,
    column: Option<&str>,
    (start, end): (i64, i64),
) -> Result<Digest> {
    let bucket = match column {
        Some(column) => format!(
            "pg_catalog.floor((pg_shard.keyspace_id(t.{})::pg_catalog.numeric - {start}) * {VERIFY_RANGES} \
             / ({end}::pg_catalog.numeric - {start} + 1))::bigint",
            quote::ident(column)
        ),
        None => "0::bigint".into(),
    };
    let sql = format!(
        "SELECT {bucket}, pg_catalog.count(*)::bigint, \
                coalesce(pg_catalog.sum(pg_catalog.hashtext(t::text)::bigint), 0)::bigint \
         FROM {from} t GROUP BY 1"
    );
    let rows = client
        .query(&sql, &[])
        .map_err(|e| remote::remote_error(node, &e))?;
    Ok(rows
        .iter()
        .map(|row| (row.get::<_, i64>(0), (row.get(1), row.get(2))))
        .collect())
}

/// The key ranges where `copy` differs from `source`, described.
pub(crate) fn compare(
    table: &str,
    range: (i64, i64),
    source: &Digest,
    copy: &Digest,
    copy_name: &str,
) -> Vec<String> {
    let buckets: std::collections::BTreeSet<i64> =
        source.keys().chain(copy.keys()).copied().collect();
    buckets
        .into_iter()
        .filter(|bucket| source.get(bucket) != copy.get(bucket))
        .map(|bucket| {
            let (rows, sum) = source.get(&bucket).copied().unwrap_or((0, 0));
            let (copy_rows, copy_sum) = copy.get(&bucket).copied().unwrap_or((0, 0));
            let keys = match bucket_bounds(range, bucket) {
                Some((low, high)) => format!("keyspace ids {low}..{high}"),
                None => "keys outside the shard's range".into(),
            };
            format!(
                "{table} {keys}: {rows} rows (checksum {sum}) on the source, \
                 {copy_rows} rows (checksum {copy_sum}) in the {copy_name}"
            )
        })
        .collect()
}

/// The first and last keyspace id of bucket `bucket` of `range` (None for
/// a bucket outside it), as [`digest`] cuts it.
fn bucket_bounds((start, end): (i64, i64), bucket: i64) -> Option<(i64, i64)> {
    if !(0..VERIFY_RANGES).contains(&bucket) {
        return None;
    }
    let width = i128::from(end) - i128::from(start) + 1;
    let parts = i128::from(VERIFY_RANGES);
    // The least offset whose bucket is b: ceil(b * width / parts).
    let first_offset = |b: i128| (b * width + parts - 1) / parts;
    let low = i128::from(start) + first_offset(i128::from(bucket));
    let high = i128::from(start) + first_offset(i128::from(bucket) + 1) - 1;
    Some((i64::try_from(low).ok()?, i64::try_from(high).ok()?))
}

/// Fails the job with the differences, or records the verification and
/// goes back to catching up (the cutover follows once the lag is small).
pub(crate) fn finish(
    job: &Job,
    differences: Vec<String>,
    rows: i64,
    started: Instant,
) -> Result<Next> {
    if !differences.is_empty() {
        return Err(ShardError::VerificationMismatch(format!(
            "the copy differs from the source before the cutover: {}",
            differences.join("; ")
        )));
    }
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources || jsonb_build_object('verified', \
             jsonb_build_object('rows', $2, 'ranges', $3, 'seconds', $4)) \
         WHERE job_id = $1",
        &[
            job.job_id.into(),
            rows.into(),
            VERIFY_RANGES.into(),
            started.elapsed().as_secs_f64().into(),
        ],
    )?;
    Ok(Next::Phase(Phase::CatchUp))
}

/// Whether the job's copy was verified (catch_up then leads to the cutover).
pub(crate) fn verified(job: &Job) -> Result<bool> {
    Ok(crate::spi::query_one::<bool>(
        "SELECT resources ? 'verified' FROM pg_shard.job WHERE job_id = $1",
        &[job.job_id.into()],
    )?
    .unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::{bucket_bounds, VERIFY_RANGES};

    #[test]
    fn buckets_cover_the_range_without_gaps() {
        for range in [
            (0, 576_460_752_303_423_487),
            (-100, 37),
            (i64::MIN, i64::MAX),
            (5, 5),
        ] {
            let mut next = range.0;
            for bucket in 0..VERIFY_RANGES {
                if let Some((low, high)) = bucket_bounds(range, bucket) {
                    if low > high {
                        continue; // an empty part of a narrow range
                    }
                    assert_eq!(low, next, "{range:?} bucket {bucket}");
                    next = high.wrapping_add(1);
                }
            }
            assert_eq!(next, range.1.wrapping_add(1), "{range:?}");
        }
        assert_eq!(bucket_bounds((0, 15), 3), Some((3, 3)));
        assert_eq!(bucket_bounds((0, 15), VERIFY_RANGES), None);
        assert_eq!(bucket_bounds((0, 15), -1), None);
    }
}
