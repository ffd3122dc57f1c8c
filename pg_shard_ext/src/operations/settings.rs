//! The job runner's settings: the GUCs a DBA sets and the fixed timings of
//! the runner and its phases.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;
use std::time::Duration;

/// How often a runner looks at its jobs and their progress.
pub(crate) const POLL: Duration = Duration::from_millis(200);

/// How often the launcher starts the runners (which end prepared remote
/// transactions left behind).
pub(crate) const RECOVERY_INTERVAL: Duration = Duration::from_secs(60);

/// A runner with no unfinished job for this long exits.
pub(crate) const IDLE_EXIT: Duration = Duration::from_secs(10);

/// Replication lag (bytes) below which writes are frozen for the cutover.
pub(crate) const CUTOVER_LAG: i64 = 1024 * 1024;

/// Tries of a step that failed because a node could not be reached, before
/// the job rolls back.
pub(crate) const TRANSIENT_TRIES: i64 = 5;

/// Longest wait for the target to apply the writes up to a marker outside
/// a cutover's pause (the cutover's own wait is the job's
/// `pg_shard.cutover_apply_timeout`).
pub(crate) const FINAL_WAIT: Duration = Duration::from_secs(60);

/// The key of `pg_shard.cutover_apply_timeout` in a job's `resources`, and
/// its default for a job queued before it existed.
pub(crate) const APPLY_WAIT: (&str, Duration) = ("apply_wait_ms", Duration::from_secs(10));

/// The key of `pg_shard.cutover_lock_timeout` in a job's `resources`, and
/// its default for a job queued before it existed.
pub(crate) const LOCK_WAIT: (&str, Duration) = ("lock_wait_ms", Duration::from_millis(100));

/// Key ranges a shard table is compared in before the cutover (a mismatch
/// names the ranges that differ).
pub(crate) const VERIFY_RANGES: i64 = 16;

/// Longest wait for the lock that fixes the verification's point: writers
/// queue behind it, so a long transaction on the source makes the job try
/// again later rather than hold them.
pub(crate) const VERIFY_LOCK_WAIT: &str = "200ms";

/// Seconds a moved shard's old tables are kept on the source after the
/// cutover (recorded per job when it is queued).
static DROP_DELAY: GucSetting<i32> = GucSetting::<i32>::new(60);

/// Seconds a reads-first job serves the range's reads from its new copy
/// before it switches writes (recorded per job when it is queued).
static SWITCH_WRITES_DELAY: GucSetting<i32> = GucSetting::<i32>::new(300);

/// `pg_shard.cutover_lock_timeout`: milliseconds a cutover's EXCLUSIVE
/// lock may wait for the transactions in flight, recorded per job.
static CUTOVER_LOCK_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(100);

/// `pg_shard.cutover_apply_timeout`: milliseconds a cutover waits, writes
/// paused, for the new side to have the last writes, recorded per job.
static CUTOVER_APPLY_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(10_000);

/// MB/s the initial copy of a move or split may read (0: no limit),
/// recorded per job when it is queued.
static COPY_RATE_LIMIT: GucSetting<i32> = GucSetting::<i32>::new(32);

/// pg_shard.job_progress_interval: read by pg_shard.wait_job (SQL).
static JOB_PROGRESS_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(2);

/// kB of replication lag on a job's source (its standbys, its other slots)
/// above which the job's copy and a split's catch-up wait (0: no limit),
/// recorded per job when it is queued.
static MAX_REPLICATION_LAG: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);

/// Milliseconds a trivial statement may take on a job's source before its
/// copy and a split's catch-up wait (0: no limit), recorded per job.
static MAX_SOURCE_LATENCY: GucSetting<i32> = GucSetting::<i32>::new(0);

/// The database the launcher connects to (to list the others).
pub(crate) static LAUNCHER_DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));

pub(crate) fn register_gucs() {
    GucRegistry::define_int_guc(
        c"pg_shard.move_drop_delay",
        c"Seconds the old shard tables of a move are kept on the source after the cutover.",
        c"Read when pg_shard.move_shard() queues the job.",
        &DROP_DELAY,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"pg_shard.switch_writes_delay",
        c"Seconds a reads-first move or split routes reads to the new copy before it switches writes.",
        c"Read when the job is queued; pg_shard.switch_writes(job_id) ends the wait sooner.",
        &SWITCH_WRITES_DELAY,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"pg_shard.cutover_lock_timeout",
        c"Time a cutover's lock may wait for the transactions in flight on its tables before the cutover is tried again.",
        c"Read when the job is queued; writers that come meanwhile wait behind the lock, so this bounds what a long transaction adds to the write pause.",
        &CUTOVER_LOCK_TIMEOUT,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_shard.cutover_apply_timeout",
        c"Time a cutover waits, with the shard's writes paused, for the new side to have the last writes before it gives the shard back to the old side.",
        c"Read when the job is queued; past it the old side takes its writes again and the job rolls back.",
        &CUTOVER_APPLY_TIMEOUT,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_shard.job_progress_interval",
        c"Seconds between the progress NOTICEs of pg_shard.wait_job (0: none).",
        c"Each says the job's phase, how much of its copy is done and its replication lag; a job that ends sooner prints none.",
        &JOB_PROGRESS_INTERVAL,
        0,
        3600,
        GucContext::Userset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"pg_shard.copy_rate_limit",
        c"Megabytes per second the initial copy of a shard move or split may read (0: no limit).",
        c"Read when the job is queued; it keeps the copy from taking the nodes' I/O and CPU from live traffic.",
        &COPY_RATE_LIMIT,
        0,
        1_000_000,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_shard.max_replication_lag",
        c"Replication lag of a job's source (standbys, other slots) above which its copy waits (0: no limit).",
        c"Read when the job is queued; the copy of a move or split and a split's catch-up wait while a consumer of the source's WAL lags more.",
        &MAX_REPLICATION_LAG,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"pg_shard.max_source_latency",
        c"Time a trivial statement may take on a job's source before its copy waits (0: no limit).",
        c"Read when the job is queued; the job measures it over its own connection between batches.",
        &MAX_SOURCE_LATENCY,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_string_guc(
        c"pg_shard.launcher_database",
        c"Database the pg_shard job launcher connects to, to find the databases whose jobs to resume.",
        c"It stays connected (a database with a session cannot serve as a CREATE DATABASE template).",
        &LAUNCHER_DATABASE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}
