//! Reads first: a job queued with `switch_reads_first` publishes, once its
//! copy is verified and caught up, a map version whose read routes
//! (`pg_shard.read_route`) send the range's reads to the new copy (a
//! move's target tables, a split's halves) while writes stay on the
//! placement that owns the range: phase reads_switched. Replication goes on
//! meanwhile, so those reads see the owner's writes after the replication
//! lag. Writes follow by the ordinary cutover, once
//! `pg_shard.switch_writes_delay` has passed or `pg_shard.switch_writes`
//! asked for it; the cutover's publish deletes the routes. A rollback
//! deletes them and publishes that in a step of its own, before it drops
//! the new copy (routers then no longer send reads there).

use super::job::{Job, Phase};
use crate::error::{Result, ShardError};
use crate::spi::query_one;

/// The read routes of a job, one per table and range: a move's target
/// tables over the group's range, a split's halves over theirs.
const INSERT_ROUTES: &str = "\
    INSERT INTO pg_shard.read_route \
        (job_id, table_rel, range_start, range_end, node_id, shard_id, shard_schema, shard_name) \
    SELECT j.job_id, s.table_rel, g.range_start, g.range_end, j.target_node, \
           s.shard_id, s.shard_schema, s.shard_name \
      FROM pg_shard.job j \
      JOIN pg_shard.shard_group g ON g.shard_group_id = j.shard_group_id \
      JOIN pg_shard.shard s ON s.shard_group_id = j.shard_group_id \
     WHERE j.job_id = $1 AND j.kind = 'move' \
    UNION ALL \
    SELECT j.job_id, s.table_rel, half.range_start, half.range_end, j.target_node, \
           half.shard_id, s.shard_schema, half.shard_name \
      FROM pg_shard.job j \
      JOIN pg_shard.shard_group g ON g.shard_group_id = j.shard_group_id \
     CROSS JOIN jsonb_to_recordset(j.resources->'halves') \
           AS h(source_id bigint, lower_id bigint, lower_name text, upper_id bigint, upper_name text) \
      JOIN pg_shard.shard s ON s.shard_id = h.source_id \
     CROSS JOIN LATERAL (VALUES (g.range_start, j.split_at - 1, h.lower_id, h.lower_name), \
                                (j.split_at, g.range_end, h.upper_id, h.upper_name)) \
           AS half(range_start, range_end, shard_id, shard_name) \
     WHERE j.job_id = $1 AND j.kind = 'split'";

/// The phase after the catch-up that follows the verification: reads
/// first when the job was queued so, else the cutover.
pub(crate) fn after_catch_up(job: &Job) -> Result<Phase> {
    let reads_first = query_one::<bool>(
        "SELECT coalesce((resources->>'reads_first')::boolean, false) \
         FROM pg_shard.job WHERE job_id = $1",
        &[job.job_id.into()],
    )?
    .unwrap_or(false);
    Ok(if reads_first {
        Phase::ReadsSwitched
    } else {
        Phase::Cutover
    })
}

/// Publishes the job's read routes at a new map version, unless it did
/// (a step run again); true when it did: the step ends there, so that the
/// map commits. No route to publish (the group's tables are gone) is an
/// error.
pub(crate) fn switch_reads(job: &Job) -> Result<bool> {
    let published = query_one::<bool>(
        "SELECT resources ? 'reads_version' FROM pg_shard.job WHERE job_id = $1",
        &[job.job_id.into()],
    )?
    .unwrap_or(false);
    if published {
        return Ok(false);
    }
    let routes = crate::metadata::catalog::write_returning::<i64>(
        &format!("WITH routes AS ({INSERT_ROUTES} RETURNING 1) SELECT count(*) FROM routes"),
        &[job.job_id.into()],
    )?
    .unwrap_or(0);
    if routes == 0 {
        return Err(ShardError::InvalidArgument(format!(
            "job {}: its shard group has no tables to route reads to",
            job.job_id
        )));
    }
    let version = crate::metadata::catalog::bump_map_version()?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources || jsonb_build_object( \
             'reads_version', $2::bigint, 'reads_switched_at', now(), \
             'switch_writes_at', now() + coalesce((resources->>'switch_writes_delay')::interval, \
                                                  interval '5 minutes')) \
         WHERE job_id = $1",
        &[job.job_id.into(), version.into()],
    )?;
    pgrx::log!(
        "pg_shard job {}: reads of its range go to the new copy from map version {version}",
        job.job_id
    );
    Ok(true)
}

/// Whether the writes are to switch now: the delay has passed, or
/// `pg_shard.switch_writes` asked.
pub(crate) fn writes_due(job: &Job) -> Result<bool> {
    Ok(query_one::<bool>(
        "SELECT resources->>'requested' IS NOT DISTINCT FROM 'switch_writes' \
                OR now() >= coalesce((resources->>'switch_writes_at')::timestamptz, now()) \
         FROM pg_shard.job WHERE job_id = $1",
        &[job.job_id.into()],
    )?
    .unwrap_or(true))
}

/// Whether a waiting job's replication is to be looked at in this step
/// (every few seconds, not at every step); records the time.
pub(crate) fn replication_check_due(job: &Job) -> Result<bool> {
    Ok(crate::spi::update_one::<bool>(
        "UPDATE pg_shard.job \
            SET resources = resources || jsonb_build_object('reads_checked_at', now()) \
          WHERE job_id = $1 \
            AND coalesce((resources->>'reads_checked_at')::timestamptz, '-infinity') \
                <= now() - interval '3 seconds' \
         RETURNING true",
        &[job.job_id.into()],
    )?
    .unwrap_or(false))
}

/// Deletes the job's read routes (the cutover does, in the transaction
/// that publishes its map); true if there were any.
pub(crate) fn forget_routes(job: &Job) -> Result<bool> {
    let deleted = crate::metadata::catalog::write_returning::<i64>(
        "WITH gone AS (DELETE FROM pg_shard.read_route WHERE job_id = $1 RETURNING 1) \
         SELECT count(*) FROM gone",
        &[job.job_id.into()],
    )?
    .unwrap_or(0);
    Ok(deleted > 0)
}

/// A rollback's first step when reads were switched: the routes go and a
/// map without them is published; true when it did (the step ends there,
/// so that the map commits before the new copy is dropped).
pub(crate) fn unpublish(job: &Job) -> Result<bool> {
    if !forget_routes(job)? {
        return Ok(false);
    }
    crate::metadata::catalog::bump_map_version()?;
    pgrx::log!(
        "pg_shard job {}: reads of its range go back to the old copy",
        job.job_id
    );
    Ok(true)
}
