//! Job records: a row of `pg_shard.job` as the runner reads it, its phase,
//! and the writes of its state, phase and errors.

use super::own_transaction::transaction;
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use std::time::Duration;

/// A phase of a job, stored as its name in `pg_shard.job.phase`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Plan,
    CreateTarget,
    Copy,
    CatchUp,
    Verify,
    /// A reads-first job: reads of the range go to the new copy, writes
    /// stay, until the delay ends or `switch_writes`.
    ReadsSwitched,
    Cutover,
    Cleanup,
    /// A move or split after its cleanup: the old copy receives the new
    /// owner's writes until the drop time, `complete_job` or `revert_job`.
    ReverseReplicating,
    DropOld,
    /// A revert's cutover: ownership back to the old copy.
    Reverting,
    /// After a revert: the new copy and the reverse replication go.
    RevertCleanup,
    Rollback,
}

impl Phase {
    /// The phases a move goes through when nothing fails, in order (it is
    /// done after the last; a job not asked to switch reads first skips
    /// reads_switched).
    pub(crate) const FORWARD: [Phase; 10] = [
        Phase::Plan,
        Phase::CreateTarget,
        Phase::Copy,
        Phase::CatchUp,
        Phase::Verify,
        Phase::ReadsSwitched,
        Phase::Cutover,
        Phase::Cleanup,
        Phase::ReverseReplicating,
        Phase::DropOld,
    ];

    /// The phases of a revert, after reverse_replicating.
    pub(crate) const REVERT: [Phase; 2] = [Phase::Reverting, Phase::RevertCleanup];

    /// The name stored in the job's row.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Plan => "plan",
            Phase::CreateTarget => "create_target",
            Phase::Copy => "copy",
            Phase::CatchUp => "catch_up",
            Phase::Verify => "verify",
            Phase::ReadsSwitched => "reads_switched",
            Phase::Cutover => "cutover",
            Phase::Cleanup => "cleanup",
            Phase::ReverseReplicating => "reverse_replicating",
            Phase::DropOld => "drop_old",
            Phase::Reverting => "reverting",
            Phase::RevertCleanup => "revert_cleanup",
            Phase::Rollback => "rollback",
        }
    }

    /// The phase a stored name means, if any.
    pub(crate) fn parse(name: &str) -> Option<Phase> {
        Phase::FORWARD
            .into_iter()
            .chain(Phase::REVERT)
            .chain([Phase::Rollback])
            .find(|phase| phase.as_str() == name)
    }

    /// Phases that a failure or a cancel rolls back (the new map is not
    /// published yet).
    pub(crate) fn before_publish(self) -> bool {
        matches!(
            self,
            Phase::Plan
                | Phase::CreateTarget
                | Phase::Copy
                | Phase::CatchUp
                | Phase::Verify
                | Phase::ReadsSwitched
                | Phase::Cutover
        )
    }
}

/// A job as the runner needs it.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    pub(crate) job_id: i64,
    pub(crate) kind: String,
    /// As stored; [`Job::phase`] reads it.
    pub(crate) phase_name: String,
    pub(crate) shard_group_id: i64,
    /// A split's first keyspace id of the upper half.
    pub(crate) split_at: Option<i64>,
    /// Steps that failed in a row (reset when a phase completes).
    pub(crate) failures: i64,
    pub(crate) source: Node,
    pub(crate) target: Node,
    pub(crate) cancel_requested: bool,
}

/// The oldest unfinished job that can go on now; running ones first (they
/// resume). A job waiting for its old tables' drop time (replicating back
/// to them meanwhile) does not hold up the others, unless a revert was
/// asked for or one failed (its shards are to be set right); it is looked
/// at every few seconds (its reverse lag is recorded).
pub(crate) fn next_job() -> Result<Option<Job>> {
    crate::spi::connect(|client| {
        let rows = client.select(
            "SELECT j.job_id, j.kind, j.phase, j.shard_group_id, j.cancel_requested, \
                    s.node_id, s.host, s.port, t.node_id, t.host, t.port, \
                    coalesce((j.resources->>'failures')::bigint, 0), j.split_at \
             FROM pg_shard.job j \
             JOIN pg_shard.node s ON s.node_id = j.source_node \
             JOIN pg_shard.node t ON t.node_id = j.target_node \
             WHERE j.state IN ('queued', 'running') \
               AND NOT (j.phase IN ('reverse_replicating', 'drop_old') \
                        AND coalesce((j.resources->>'drop_after')::timestamptz, now()) > now() \
                        AND j.resources->>'requested' IS DISTINCT FROM 'revert' \
                        AND NOT coalesce((j.resources->>'revert_failed')::boolean, false) \
                        AND (j.phase = 'drop_old' \
                             OR coalesce((j.resources->>'lag_at')::timestamptz, '-infinity') \
                                > now() - interval '5 seconds')) \
             ORDER BY j.state = 'running' DESC, j.job_id LIMIT 1",
            None,
            &[],
        )?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        Ok(Some(Job {
            job_id: row.get::<i64>(1)?.unwrap_or_default(),
            kind: row.get::<String>(2)?.unwrap_or_default(),
            phase_name: row.get::<String>(3)?.unwrap_or_default(),
            shard_group_id: row.get::<i64>(4)?.unwrap_or_default(),
            cancel_requested: row.get::<bool>(5)?.unwrap_or(false),
            source: Node::from_row(&row, 6)?,
            target: Node::from_row(&row, 9)?,
            failures: row.get::<i64>(12)?.unwrap_or_default(),
            split_at: row.get::<i64>(13)?,
        }))
    })
}

/// What a phase leads to.
pub(crate) enum Next {
    Phase(Phase),
    /// Not finished yet (waiting for replication); run it again.
    Stay,
    /// Not finished yet, but it made progress (a copy step): run it again
    /// at once.
    Again,
    Finished(String, Option<String>),
    /// Done; the job's row keeps this last phase's name (`completed`, or
    /// `reverted`).
    Done(&'static str),
}

pub(crate) fn write_state(job: &Job, state: &str, phase: &str, error: Option<&str>) -> Result<()> {
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET state = $2, phase = $3, \
             resources = (resources - 'failures') || CASE WHEN phase = $3 THEN '{}'::jsonb \
                 ELSE jsonb_build_object('phase_times', coalesce(resources->'phase_times', '{}'::jsonb) \
                                                        || jsonb_build_object($3, clock_timestamp())) END, \
             error = CASE WHEN $2 = 'running' AND $4 IS NULL THEN NULL ELSE coalesce($4, error) END, \
             started_at = coalesce(started_at, now()), \
             phase_started_at = CASE WHEN phase = $3 THEN phase_started_at ELSE clock_timestamp() END, \
             finished_at = CASE WHEN $2 IN ('done', 'failed', 'canceled') THEN now() END \
         WHERE job_id = $1",
        &[
            job.job_id.into(),
            state.into(),
            phase.into(),
            error.map(str::to_owned).into(),
        ],
    )?;
    Ok(())
}

pub(crate) fn record(job: &Job, state: &str, phase: &str, error: Option<&str>) {
    if let Err(e) = transaction(|| write_state(job, state, phase, error)) {
        pgrx::warning!(
            "pg_shard job {}: could not record its state: {e}",
            job.job_id
        );
    }
}

/// Records an error of the job's current step; `failures`: the count of
/// failed tries so far, when the step will be tried again.
pub(crate) fn record_error(job: &Job, error: &str, failures: Option<i64>) {
    let recorded = transaction(|| {
        // (`lag_at` too: a job waiting for its drop time whose step fails
        // is looked at again in a few seconds, not at every poll before
        // the other jobs.)
        crate::spi::run_with_args(
            "UPDATE pg_shard.job SET error = $2, \
                 resources = CASE WHEN $3::bigint IS NULL THEN resources \
                                  ELSE resources || jsonb_build_object('failures', $3::bigint) END \
                             || jsonb_build_object('lag_at', clock_timestamp()) \
             WHERE job_id = $1",
            &[job.job_id.into(), error.into(), failures.into()],
        )?;
        Ok(())
    });
    if let Err(e) = recorded {
        pgrx::warning!(
            "pg_shard job {}: could not record its error: {e}",
            job.job_id
        );
    }
}

/// A revert that failed before its map was published: the job goes back
/// to reverse_replicating, which first sets the shards' states right again
/// (`revert_failed`), and the request is dropped; the DBA may ask again
/// (the old copy is kept at least five more minutes for that).
pub(crate) fn abandon_revert(job: &Job, error: &str) {
    let recorded = transaction(|| {
        write_state(
            job,
            "running",
            Phase::ReverseReplicating.as_str(),
            Some(error),
        )?;
        crate::spi::run_with_args(
            "UPDATE pg_shard.job SET resources = (resources - 'requested') \
                 || jsonb_build_object('revert_failed', true, 'drop_after', \
                        greatest((resources->>'drop_after')::timestamptz, now() + interval '5 minutes')) \
             WHERE job_id = $1",
            &[job.job_id.into()],
        )?;
        Ok(())
    });
    if let Err(e) = recorded {
        pgrx::warning!(
            "pg_shard job {}: could not record its failed revert: {e}",
            job.job_id
        );
    }
}

impl Job {
    /// A wait the job recorded in its `resources` when it was queued
    /// (`key`, in milliseconds, from a setting), or `default` for a job
    /// queued before that setting existed.
    pub(crate) fn recorded_wait(&self, key: &str, default: Duration) -> Result<Duration> {
        Ok(self
            .recorded(key)?
            .filter(|ms| *ms > 0)
            .map_or(default, |ms| Duration::from_millis(ms as u64)))
    }

    /// A number the job keeps in its `resources` under `key` (a setting
    /// recorded when it was queued, or its progress), as it is now.
    pub(crate) fn recorded(&self, key: &str) -> Result<Option<i64>> {
        crate::spi::query_one::<i64>(
            "SELECT (resources->>$2)::bigint FROM pg_shard.job WHERE job_id = $1",
            &[self.job_id.into(), key.into()],
        )
    }

    /// The job's phase; an error for a name no phase has.
    pub(crate) fn phase(&self) -> Result<Phase> {
        Phase::parse(&self.phase_name).ok_or_else(|| {
            ShardError::InvalidArgument(format!(
                "job {} is in an unknown phase {}",
                self.job_id, self.phase_name
            ))
        })
    }

    /// Whether a failure or a cancel now rolls the job back.
    pub(crate) fn before_publish(&self) -> bool {
        self.phase().is_ok_and(Phase::before_publish)
    }
}

/// A pause point for tests and operators: a session holding the advisory
/// lock (hashtext('pg_shard job phase'), hashtext(`name`)) holds every job
/// there: at the start of the phase `name`, or at `copied` (a copy's tables
/// finished, before the step that finished them is recorded).
pub(crate) fn pause_point(name: &str) -> Result<()> {
    crate::spi::run_with_args(
        "SELECT pg_advisory_xact_lock_shared(hashtext('pg_shard job phase'), hashtext($1))",
        &[name.into()],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Phase;

    const ALL: [Phase; 13] = [
        Phase::Plan,
        Phase::CreateTarget,
        Phase::Copy,
        Phase::CatchUp,
        Phase::Verify,
        Phase::ReadsSwitched,
        Phase::Cutover,
        Phase::Cleanup,
        Phase::ReverseReplicating,
        Phase::DropOld,
        Phase::Reverting,
        Phase::RevertCleanup,
        Phase::Rollback,
    ];

    #[test]
    fn phase_names_round_trip() {
        for phase in ALL {
            assert_eq!(Phase::parse(phase.as_str()), Some(phase));
        }
        assert_eq!(Phase::parse("done"), None);
        assert_eq!(Phase::parse("Plan"), None);
        assert_eq!(Phase::parse(""), None);
    }

    #[test]
    fn stored_names_are_unchanged() {
        // The names in pg_shard.job.phase (and in cancel_job's SQL).
        let names: Vec<&str> = ALL.iter().map(|phase| phase.as_str()).collect();
        assert_eq!(
            names,
            [
                "plan",
                "create_target",
                "copy",
                "catch_up",
                "verify",
                "reads_switched",
                "cutover",
                "cleanup",
                "reverse_replicating",
                "drop_old",
                "reverting",
                "revert_cleanup",
                "rollback"
            ]
        );
    }

    #[test]
    fn forward_order_starts_at_plan_and_ends_at_drop_old() {
        assert_eq!(Phase::FORWARD.first(), Some(&Phase::Plan));
        assert_eq!(Phase::FORWARD.last(), Some(&Phase::DropOld));
        assert!(!Phase::FORWARD.contains(&Phase::Rollback));
    }

    #[test]
    fn only_phases_up_to_the_cutover_roll_back() {
        let cutover = Phase::FORWARD
            .iter()
            .position(|phase| *phase == Phase::Cutover)
            .expect("the cutover is a forward phase");
        for (index, phase) in Phase::FORWARD.into_iter().enumerate() {
            assert_eq!(phase.before_publish(), index <= cutover, "{phase:?}");
        }
        assert!(!Phase::Rollback.before_publish());
        for phase in Phase::REVERT {
            assert!(!phase.before_publish(), "{phase:?}");
        }
    }
}
