//! The background workers: the launcher, which starts a job runner in every
//! database when the server starts (and every minute), and the job runner,
//! which takes the jobs in order and runs each one step at a time.

use super::group_shards::group_shards;
use super::job::{
    abandon_revert, next_job, pause_point, record, record_error, write_state, Job, Next, Phase,
};
use super::own_transaction::transaction;
use super::settings::{IDLE_EXIT, LAUNCHER_DATABASE, POLL, RECOVERY_INTERVAL, TRANSIENT_TRIES};
use super::{moves, split};
use crate::error::{Result, ShardError};
use crate::spi::query_one;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// Registers the launcher (from `_PG_init` while shared_preload_libraries
/// loads): it starts a job runner for every database when the server starts
/// or restarts after a crash, so interrupted jobs resume.
pub(crate) fn register_launcher() {
    BackgroundWorkerBuilder::new("pg_shard job launcher")
        .set_function("pg_shard_job_launcher")
        .set_library("pg_shard")
        .enable_spi_access()
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_shard_job_launcher(_argument: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let database = LAUNCHER_DATABASE
        .get()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "postgres".to_owned());
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    // Runners start in every database now (they resume interrupted jobs
    // and end prepared remote transactions a crash left behind), and again
    // every minute (a worker that restarted between the two phases of a
    // commit holds its prepared transaction, and its locks, until then).
    // After a crash the postmaster restarts the launcher.
    loop {
        let databases: Vec<String> = BackgroundWorker::transaction(|| {
            crate::spi::connect(|client| {
                client
                    .select(
                        // Not a database an interrupted DROP DATABASE left
                        // invalid (datconnlimit -2): no one can connect,
                        // and a runner would fail and restart forever.
                        "SELECT datname::text FROM pg_database \
                         WHERE datallowconn AND NOT datistemplate AND datconnlimit <> -2",
                        None,
                        &[],
                    )
                    .map(|rows| {
                        rows.filter_map(|row| row.get::<String>(1).ok().flatten())
                            .collect()
                    })
                    .unwrap_or_default()
            })
        });
        for database in databases {
            start_runner(&database, RESUME_ONLY);
        }
        if !BackgroundWorker::wait_latch(Some(RECOVERY_INTERVAL)) {
            break;
        }
    }
}

/// Runner modes (its Datum argument): started by the launcher, it only
/// resumes jobs and exits when there is none; started by a SQL call, it
/// waits a little for the job being queued to commit.
const RESUME_ONLY: i64 = 1;

const ON_DEMAND: i64 = 0;

fn start_runner(database: &str, mode: i64) {
    let started = BackgroundWorkerBuilder::new(&runner_name(database))
        .set_function("pg_shard_job_runner")
        .set_library("pg_shard")
        .set_extra(database)
        .set_argument(Some(pg_sys::Datum::from(mode)))
        .enable_spi_access()
        // After an error exit it comes back and resumes its job.
        .set_restart_time(Some(Duration::from_secs(5)))
        .load_dynamic();
    if started.is_err() {
        pgrx::warning!("pg_shard: could not start a job runner for database {database}");
    }
}

/// Starts the job runner of the current database (it exits at once if one
/// is running already). Not when two are running: one in charge, and one
/// waiting to take over, which sees the new job either way. (Executable by
/// superusers and roles granted it; every call could otherwise take a
/// background worker slot.)
#[pg_extern(schema = "pg_shard", volatile)]
fn start_job_runner() {
    let database = query_one::<String>("SELECT current_database()::text", &[])
        .ok()
        .flatten()
        .unwrap_or_default();
    let running = query_one::<i64>(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = $1",
        &[runner_name(&database).as_str().into()],
    )
    .ok()
    .flatten()
    .unwrap_or(0);
    if running < 2 {
        start_runner(&database, ON_DEMAND);
    }
}

/// Whether `xid` is this transaction's or one of its subtransactions':
/// `pg_shard.wait_job` refuses to wait for a job row this transaction
/// wrote, which no runner sees before it commits (it would wait forever).
#[pg_extern(schema = "pg_shard", stable, parallel_restricted)]
fn written_by_this_transaction(xid: pg_sys::TransactionId) -> bool {
    // SAFETY: reads this backend's own transaction state, in a transaction.
    unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xid) }
}

/// The job runner's name, as pg_stat_activity shows it (`backend_type`).
fn runner_name(database: &str) -> String {
    format!("pg_shard job runner ({database})")
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_shard_job_runner(argument: pg_sys::Datum) {
    let idle_exit = if argument.value() as i64 == RESUME_ONLY {
        Duration::ZERO
    } else {
        IDLE_EXIT
    };
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let database = BackgroundWorker::get_extra().to_owned();
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    // One runner per database: a session-level lock, held until exit. One
    // started for a new job waits a while for a runner that is finishing
    // (it may have looked for jobs before the new one committed).
    let started = Instant::now();
    loop {
        let (installed, in_charge) = BackgroundWorker::transaction(|| {
            let installed = crate::spi::get_one::<bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_shard')",
            )
            .ok()
            .flatten()
            .unwrap_or(false);
            let in_charge = installed
                && crate::spi::get_one::<bool>(
                    "SELECT pg_try_advisory_lock(hashtext('pg_shard job runner'))",
                )
                .ok()
                .flatten()
                .unwrap_or(false);
            (installed, in_charge)
        });
        if in_charge {
            break;
        }
        if !installed || started.elapsed() >= idle_exit || !BackgroundWorker::wait_latch(Some(POLL))
        {
            return;
        }
    }
    // The job's progress must survive a crash, whatever the server's default.
    let durable = transaction(|| {
        crate::spi::run("SET synchronous_commit = on")?;
        Ok(())
    });
    if let Err(e) = durable {
        pgrx::warning!("pg_shard job runner: {e}");
        return;
    }
    // Remote transactions a crash left prepared (the launcher starts a
    // runner in every database when the server starts) are ended now.
    match transaction(crate::transaction::records::recover) {
        Ok(0) => {}
        Ok(ended) => pgrx::log!("pg_shard: recovery ended {ended} prepared remote transactions"),
        Err(e) => pgrx::warning!("pg_shard: recovery of prepared remote transactions: {e}"),
    }
    let mut idle_since = Instant::now();
    while BackgroundWorker::wait_latch(Some(POLL)) {
        let job = transaction(next_job);
        match job {
            Ok(Some(job)) => {
                idle_since = Instant::now();
                run_step(job);
            }
            Ok(None) => {
                // Jobs waiting to drop their old tables keep the runner.
                let waiting = transaction(|| {
                    Ok(query_one::<i64>(
                        "SELECT count(*) FROM pg_shard.job WHERE state IN ('queued', 'running')",
                        &[],
                    )?
                    .unwrap_or(0))
                })
                .unwrap_or(0);
                if waiting == 0 && idle_since.elapsed() >= idle_exit {
                    break;
                }
            }
            Err(e) => {
                pgrx::warning!("pg_shard job runner: {e}");
                break;
            }
        }
    }
}

/// Runs the job's current phase once and records what follows.
fn run_step(job: Job) {
    // The phase that follows commits with the step's own catalog changes.
    let outcome = transaction(|| {
        let next = step(&job)?;
        if let Next::Phase(phase) = &next {
            write_state(&job, "running", phase.as_str(), None)?;
        }
        Ok(next)
    });
    match outcome {
        // A new phase starts at once (the cleanup that follows a cutover
        // brings the foreign partitions up to the published map; a copy's
        // time counts from its phase's start), and a copy that went on for
        // its step goes on at once (its own rate limit and pacing decide its
        // speed). Only a step that waits for something (Stay) waits for the
        // runner's poll.
        Ok(Next::Phase(_)) | Ok(Next::Again) => {
            // SAFETY: sets this process's own latch.
            unsafe { pgrx::pg_sys::SetLatch(pgrx::pg_sys::MyLatch) };
        }
        Ok(Next::Stay) => {}
        Ok(Next::Finished(state, error)) => record(&job, &state, &job.phase_name, error.as_deref()),
        Ok(Next::Done(last_phase)) => record_done(&job, last_phase),
        // A cutover's lock that waited too long for the transactions in
        // flight: given up (its transaction rolled back) and tried again at
        // the next look, without counting as a failure.
        Err(e @ ShardError::CutoverLockBusy { .. }) => {
            let message = e.to_string();
            pgrx::log!("pg_shard job {}: {message}", job.job_id);
            record_error(&job, &message, None);
        }
        Err(e) => {
            let message = e.to_string();
            // A node that cannot be reached (restarting, a network blip)
            // gets a few more tries before the job gives up.
            let transient = matches!(e, ShardError::Unreachable { .. });
            if transient
                && job.failures < TRANSIENT_TRIES
                && job.phase_name != Phase::Rollback.as_str()
            {
                pgrx::log!("pg_shard job {}: {message}; will try again", job.job_id);
                record_error(&job, &message, Some(job.failures + 1));
                std::thread::sleep(Duration::from_secs(1 << job.failures.min(4)));
            } else if job.phase_name == Phase::Reverting.as_str() {
                // Before the revert's map is published: the move stands.
                pgrx::log!(
                    "pg_shard job {}: {message}; the revert is abandoned",
                    job.job_id
                );
                abandon_revert(&job, &message);
            } else if job.before_publish() {
                pgrx::log!("pg_shard job {}: {message}; rolling back", job.job_id);
                record(&job, "running", "rollback", Some(&message));
            } else {
                // Past the point of no return: keep trying the phase.
                pgrx::log!("pg_shard job {}: {message}; will retry", job.job_id);
                record_error(&job, &message, None);
            }
        }
    }
}

/// Records the job done and, in the same transaction, queues the next
/// step of the tenant isolation it is part of, if any (so a crash between
/// them cannot lose it).
fn record_done(job: &Job, last_phase: &str) {
    let recorded = transaction(|| {
        write_state(job, "done", last_phase, None)?;
        crate::spi::run_with_args(
            "SELECT pg_shard.continue_isolation($1)",
            &[job.job_id.into()],
        )?;
        Ok(())
    });
    if let Err(e) = recorded {
        pgrx::warning!(
            "pg_shard job {}: could not record its state: {e}",
            job.job_id
        );
    }
}

fn step(job: &Job) -> Result<Next> {
    if job.cancel_requested && job.before_publish() {
        return Ok(Next::Phase(Phase::Rollback));
    }
    pause_point(&job.phase_name)?;
    let shards = group_shards(job.shard_group_id)?;
    if job.kind == "split" {
        return split::step(job, &shards);
    }
    moves::step(job, &shards)
}
