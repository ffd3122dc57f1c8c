//! Pacing of a job's bulk work (the initial copy, the catch-up) by
//! what the source node is doing for others, besides the copy's own rate
//! limit:
//!
//! * **replication lag**: the largest lag of the source's other consumers
//!   of WAL — its standbys (`pg_stat_replication.replay_lsn`) and
//!   replication slots (logical: `confirmed_flush_lsn`, physical:
//!   `restart_lsn`), pg_shard's job slots left out (a copy's own slot is
//!   not read until the copy ends; two jobs copying from one node would
//!   hold each other up) and slots whose WAL is lost — against
//!   `pg_shard.max_replication_lag` (recorded in the job as `max_lag`);
//! * **foreground latency**: the time a trivial statement takes on the
//!   source, measured by the job over its own connection (a node whose
//!   CPUs or connections are saturated answers it late; the median of
//!   three probes, so one scheduling hiccup does not count) against
//!   `pg_shard.max_source_latency` (`max_latency_ms`).
//!
//! While either is over its limit the work waits (a move's catch-up with
//! its subscription disabled, so that the source's walsender stops too),
//! and the job's
//! `resources` count the time (`throttled_ms`, per reason) and say why
//! (`throttled_by`); `pg_shard.jobs` shows both. A limit of 0 is off. Both
//! limits are read from the job's resources at every check, so a DBA can
//! change them while the job runs. A job held for [`MAX_THROTTLED`] in all
//! fails (and rolls back): its copy keeps a snapshot open on the source,
//! which holds back vacuum there.

use super::job::Job;
use super::node_access::value_on;
use crate::error::{Result, ShardError};
use crate::quote;
use crate::spi::query_one;
use postgres::Client;
use std::time::{Duration, Instant};

/// The longest a job may wait for its source in all.
const MAX_THROTTLED: Duration = Duration::from_secs(30 * 60);

/// How often a throttled job looks again.
const THROTTLE_WAIT: Duration = Duration::from_millis(200);

/// How long one check waits at most before its step ends (the runner
/// records the step's progress and comes back).
const THROTTLE_STEP: Duration = Duration::from_secs(2);

/// Why a job waits.
#[derive(Debug, PartialEq)]
pub(crate) enum Throttle {
    Lag {
        consumer: String,
        bytes: i64,
        limit: i64,
    },
    Latency {
        ms: f64,
        limit: i64,
    },
}

impl Throttle {
    fn key(&self) -> &'static str {
        match self {
            Throttle::Lag { .. } => "replication_lag",
            Throttle::Latency { .. } => "source_latency",
        }
    }

    fn describe(&self) -> String {
        match self {
            Throttle::Lag {
                consumer,
                bytes,
                limit,
            } => format!(
                "replication lag of {consumer} on the source: {} kB > pg_shard.max_replication_lag {} kB",
                bytes / 1024,
                limit / 1024
            ),
            Throttle::Latency { ms, limit } => format!(
                "a trivial statement took {ms:.1} ms on the source > pg_shard.max_source_latency {limit} ms"
            ),
        }
    }
}

/// Checks the limits; while one is passed, waits (up to
/// [`THROTTLE_STEP`]), records the wait and returns why (the caller ends
/// its step and comes back).
pub(crate) fn throttle(job: &Job, source: &mut Client) -> Result<Option<Throttle>> {
    let Some(mut reason) = over_limit(job, source)? else {
        return Ok(None);
    };
    let started = Instant::now();
    loop {
        std::thread::sleep(THROTTLE_WAIT);
        if started.elapsed() >= THROTTLE_STEP {
            break;
        }
        match over_limit(job, source)? {
            Some(still) => reason = still,
            None => break,
        }
    }
    let waited = started.elapsed().as_millis() as i64;
    let total = query_one::<i64>(
        "SELECT coalesce(sum(value::bigint), 0)::bigint FROM pg_shard.job, \
                jsonb_each_text(coalesce(resources->'throttled_ms', '{}'::jsonb)) \
          WHERE job_id = $1",
        &[job.job_id.into()],
    )?
    .unwrap_or(0)
        + waited;
    if total > MAX_THROTTLED.as_millis() as i64 {
        return Err(ShardError::Timeout(format!(
            "the job waited {} s in all for its source ({}); raise the limit \
             (pg_shard.job.resources->'max_lag' / 'max_latency_ms') or remove the cause, \
             and queue it again",
            total / 1000,
            reason.describe()
        )));
    }
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources || jsonb_build_object( \
             'throttled_ms', coalesce(resources->'throttled_ms', '{}'::jsonb) \
                 || jsonb_build_object($2::text, coalesce((resources->'throttled_ms'->>$2)::bigint, 0) + $3), \
             'throttled_by', $4::text) \
         WHERE job_id = $1",
        &[
            job.job_id.into(),
            reason.key().into(),
            waited.into(),
            reason.describe().into(),
        ],
    )?;
    Ok(Some(reason))
}

/// The first limit the source is over now, if any.
pub(crate) fn over_limit(job: &Job, source: &mut Client) -> Result<Option<Throttle>> {
    let max_lag = limit(job, "max_lag")?;
    if max_lag > 0 {
        if let Some((consumer, bytes)) = largest_lag(job, source)? {
            if bytes > max_lag {
                return Ok(Some(Throttle::Lag {
                    consumer,
                    bytes,
                    limit: max_lag,
                }));
            }
        }
    }
    let max_latency = limit(job, "max_latency_ms")?;
    if max_latency > 0 {
        let ms = probe_latency(job, source)?;
        if ms > max_latency as f64 {
            return Ok(Some(Throttle::Latency {
                ms,
                limit: max_latency,
            }));
        }
    }
    Ok(None)
}

fn limit(job: &Job, key: &str) -> Result<i64> {
    Ok(job.recorded(key)?.unwrap_or(0))
}

/// The source's WAL consumer that lags most, with its lag in bytes.
fn largest_lag(job: &Job, source: &mut Client) -> Result<Option<(String, i64)>> {
    let jobs = quote::literal("pg\\_shard\\_job\\_%");
    let row = source
        .query_opt(
            &format!(
                "SELECT consumer, lag FROM ( \
                   SELECT 'slot ' || slot_name AS consumer, \
                          pg_wal_lsn_diff(pg_current_wal_lsn(), \
                                          coalesce(confirmed_flush_lsn, restart_lsn))::bigint AS lag \
                     FROM pg_replication_slots \
                    WHERE slot_name NOT LIKE {jobs} AND wal_status IS DISTINCT FROM 'lost' \
                      AND coalesce(confirmed_flush_lsn, restart_lsn) IS NOT NULL \
                   UNION ALL \
                   SELECT 'standby ' || coalesce(nullif(application_name, ''), client_addr::text, pid::text), \
                          pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint \
                     FROM pg_stat_replication \
                    WHERE replay_lsn IS NOT NULL AND application_name NOT LIKE {jobs} \
                 ) consumers ORDER BY lag DESC LIMIT 1"
            ),
            &[],
        )
        .map_err(|e| crate::transaction::client::remote_error(&job.source, &e))?;
    Ok(row.map(|row| (row.get(0), row.get(1))))
}

/// The median time of three `SELECT 1` round trips on the source, in ms.
fn probe_latency(job: &Job, source: &mut Client) -> Result<f64> {
    let mut times = [0f64; 3];
    for time in &mut times {
        let started = Instant::now();
        value_on::<i32>(&job.source, source, "SELECT 1")?;
        *time = started.elapsed().as_secs_f64() * 1000.0;
    }
    times.sort_by(f64::total_cmp);
    Ok(times[1])
}

#[cfg(test)]
mod tests {
    use super::Throttle;

    #[test]
    fn reasons_name_the_consumer_and_the_setting() {
        let lag = Throttle::Lag {
            consumer: "slot paused".into(),
            bytes: 3 * 1024 * 1024,
            limit: 1024 * 1024,
        };
        assert_eq!(lag.key(), "replication_lag");
        assert!(lag.describe().contains("slot paused"));
        assert!(lag
            .describe()
            .contains("3072 kB > pg_shard.max_replication_lag 1024 kB"));
        let latency = Throttle::Latency { ms: 12.5, limit: 5 };
        assert_eq!(latency.key(), "source_latency");
        assert!(latency.describe().contains("12.5 ms"));
    }
}
