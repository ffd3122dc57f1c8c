//! Shard moves (and, in [`split`], splits), run by background workers over
//! PostgreSQL logical replication.
//!
//! `pg_shard.move_shard` queues a job (sql/pg_shard_api.sql); a *job runner*
//! (one dynamic background worker per database, started on demand and by
//! the *launcher* when the server starts) takes the jobs in order and runs
//! each through persisted phases. Every phase can run again after a crash
//! (it checks what already exists), so a restarted runner resumes where the
//! job's row says it was:
//!
//! plan → create_target → copy → catch_up → cutover → cleanup → drop_old →
//! done
//!
//! * plan: record the names of everything the job will create; check that
//!   replication can identify the rows.
//! * create_target: the group's shard tables on the target, recreated from
//!   the source's (same names), recorded as `frozen` at epoch 0 so nothing
//!   but replication writes them; a marker table on both sides.
//! * copy: publication and slot on the source, a snapshot cut while writers
//!   wait for a moment, its rows copied at a limited rate
//!   ([`snapshot_copy`]), then a subscription on the target streaming from
//!   the slot (advanced to the cut).
//! * catch_up: until the slot's lag is small.
//! * cutover ([`cutover`]): writes to the source wait on a lock while the
//!   last of them reach the target (a marker row tells), the copies are
//!   verified (row counts and checksums; a mismatch rolls back), the source
//!   is retired, the target activated at the next map version, and the new
//!   map published (placement, the metadata node's foreign partitions,
//!   version, NOTIFY) in one metadata transaction.
//! * cleanup: subscription (and with it the slot), publication and markers
//!   go. drop_old: the old shard tables go after `pg_shard.move_drop_delay`.
//!
//! A failure or `cancel_job` before publish rolls back: what the job created
//! is dropped and the source is unfrozen. From publish on the job only goes
//! forward.

use crate::catalog::{query_one, Node};
use crate::error::{Result, ShardError};
use crate::quote;
use crate::remote;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use postgres::Client;
use std::ffi::CString;
use std::time::{Duration, Instant};

mod snapshot_copy;
mod split;

/// How often a runner looks at its jobs and their progress.
const POLL: Duration = Duration::from_millis(200);
/// How often the launcher starts the runners (which end prepared remote
/// transactions left behind).
const RECOVERY_INTERVAL: Duration = Duration::from_secs(60);
/// A runner with no unfinished job for this long exits.
const IDLE_EXIT: Duration = Duration::from_secs(10);
/// Replication lag (bytes) below which writes are frozen for the cutover.
const CUTOVER_LAG: i64 = 1024 * 1024;
/// Tries of a step that failed because a node could not be reached, before
/// the job rolls back.
const TRANSIENT_TRIES: i64 = 5;
/// Longest wait for the target to apply the last frozen write.
const FINAL_WAIT: Duration = Duration::from_secs(60);

/// Seconds a moved shard's old tables are kept on the source after the
/// cutover (recorded per job when it is queued).
static DROP_DELAY: GucSetting<i32> = GucSetting::<i32>::new(60);

/// MB/s the initial copy of a move or split may read (0: no limit),
/// recorded per job when it is queued.
static COPY_RATE_LIMIT: GucSetting<i32> = GucSetting::<i32>::new(32);

/// The database the launcher connects to (to list the others).
static LAUNCHER_DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));

pub fn register_gucs() {
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
        c"pg_shard.copy_rate_limit",
        c"Megabytes per second the initial copy of a shard move or split may read (0: no limit).",
        c"Read when the job is queued; it keeps the copy from taking the nodes' I/O and CPU from live traffic.",
        &COPY_RATE_LIMIT,
        0,
        1_000_000,
        GucContext::Userset,
        GucFlags::default(),
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

/// Registers the launcher (from `_PG_init` while shared_preload_libraries
/// loads): it starts a job runner for every database when the server starts
/// or restarts after a crash, so interrupted jobs resume.
pub fn register_launcher() {
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
    match transaction(crate::remote::recover) {
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

/// A job as the runner needs it.
#[derive(Clone, Debug)]
struct Job {
    job_id: i64,
    kind: String,
    phase: String,
    shard_group_id: i64,
    /// A split's first keyspace id of the upper half.
    split_at: Option<i64>,
    /// Steps that failed in a row (reset when a phase completes).
    failures: i64,
    source: Node,
    target: Node,
    cancel_requested: bool,
}

/// One shard table of the group being moved.
#[derive(Clone, Debug)]
struct GroupShard {
    shard_id: i64,
    schema: String,
    name: String,
    table_name: String,
    dist_column: Option<String>,
}

impl GroupShard {
    fn qualified(&self) -> String {
        quote::qualified(&self.schema, &self.name)
    }
}

/// The oldest unfinished job that can go on now; running ones first (they
/// resume). A job waiting for its old tables' drop time does not hold up
/// the others.
fn next_job() -> Result<Option<Job>> {
    crate::spi::connect(|client| {
        let rows = client.select(
            "SELECT j.job_id, j.kind, j.phase, j.shard_group_id, j.cancel_requested, \
                    s.node_id, s.host, s.port, t.node_id, t.host, t.port, \
                    coalesce((j.resources->>'failures')::bigint, 0), j.split_at \
             FROM pg_shard.job j \
             JOIN pg_shard.node s ON s.node_id = j.source_node \
             JOIN pg_shard.node t ON t.node_id = j.target_node \
             WHERE j.state IN ('queued', 'running') \
               AND NOT (j.phase = 'drop_old' AND (j.resources->>'drop_after')::timestamptz > now()) \
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
            phase: row.get::<String>(3)?.unwrap_or_default(),
            shard_group_id: row.get::<i64>(4)?.unwrap_or_default(),
            cancel_requested: row.get::<bool>(5)?.unwrap_or(false),
            source: Node {
                node_id: row.get::<i32>(6)?.unwrap_or_default(),
                host: row.get::<String>(7)?.unwrap_or_default(),
                port: row.get::<i32>(8)?.unwrap_or_default(),
            },
            target: Node {
                node_id: row.get::<i32>(9)?.unwrap_or_default(),
                host: row.get::<String>(10)?.unwrap_or_default(),
                port: row.get::<i32>(11)?.unwrap_or_default(),
            },
            failures: row.get::<i64>(12)?.unwrap_or_default(),
            split_at: row.get::<i64>(13)?,
        }))
    })
}

/// Runs the job's current phase once and records what follows.
fn run_step(job: Job) {
    // The phase that follows commits with the step's own catalog changes.
    let outcome = transaction(|| {
        let next = step(&job)?;
        if let Next::Phase(phase) = &next {
            write_state(&job, "running", phase, None)?;
        }
        Ok(next)
    });
    match outcome {
        Ok(Next::Phase(_)) | Ok(Next::Stay) => {}
        Ok(Next::Finished(state, error)) => record(&job, &state, &job.phase, error.as_deref()),
        Err(e) => {
            let message = e.to_string();
            // A node that cannot be reached (restarting, a network blip)
            // gets a few more tries before the job gives up.
            let transient = matches!(e, ShardError::Unreachable { .. });
            if transient && job.failures < TRANSIENT_TRIES && job.phase != "rollback" {
                pgrx::log!("pg_shard job {}: {message}; will try again", job.job_id);
                record_error(&job, &message, Some(job.failures + 1));
                std::thread::sleep(Duration::from_secs(1 << job.failures.min(4)));
            } else if before_publish(&job.phase) {
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

/// What a phase leads to.
enum Next {
    Phase(String),
    /// Not finished yet (waiting for replication); run it again.
    Stay,
    Finished(String, Option<String>),
}

/// Phases that a failure or a cancel rolls back (the new map is not
/// published yet).
fn before_publish(phase: &str) -> bool {
    matches!(
        phase,
        "plan" | "create_target" | "copy" | "catch_up" | "cutover"
    )
}

/// Runs `body` in a transaction of its own: committed when it returns Ok,
/// rolled back when it returns an error or raises one.
fn transaction<T>(body: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: called from the job runner's main loop, outside any
    // transaction; every path below ends the transaction it starts.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = PgTryBuilder::new(std::panic::AssertUnwindSafe(body))
        .catch_others(|caught| Err(ShardError::InvalidArgument(caught_message(&caught))))
        .execute();
    // SAFETY: ends the transaction started above; after a caught error the
    // transaction is in an aborted state and only AbortCurrentTransaction
    // may follow.
    unsafe {
        if result.is_ok() {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        } else {
            pg_sys::AbortCurrentTransaction();
        }
    }
    result
}

fn caught_message(caught: &pg_sys::panic::CaughtError) -> String {
    use pg_sys::panic::CaughtError;
    match caught {
        CaughtError::PostgresError(report)
        | CaughtError::ErrorReport(report)
        | CaughtError::RustPanic {
            ereport: report, ..
        } => report.message().to_string(),
    }
}

fn write_state(job: &Job, state: &str, phase: &str, error: Option<&str>) -> Result<()> {
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

fn record(job: &Job, state: &str, phase: &str, error: Option<&str>) {
    if let Err(e) = transaction(|| write_state(job, state, phase, error)) {
        pgrx::warning!(
            "pg_shard job {}: could not record its state: {e}",
            job.job_id
        );
    }
}

/// Records an error of the job's current step; `failures`: the count of
/// failed tries so far, when the step will be tried again.
fn record_error(job: &Job, error: &str, failures: Option<i64>) {
    let recorded = transaction(|| {
        crate::spi::run_with_args(
            "UPDATE pg_shard.job SET error = $2, \
                 resources = CASE WHEN $3::bigint IS NULL THEN resources \
                                  ELSE resources || jsonb_build_object('failures', $3::bigint) END \
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

/// Object names of a job: publication, slot and subscription share one.
fn replication_name(job: &Job) -> String {
    format!("pg_shard_job_{}", job.job_id)
}

fn marker_table(job: &Job) -> String {
    quote::qualified("pg_shard", &format!("job_{}_marker", job.job_id))
}

fn step(job: &Job) -> Result<Next> {
    if job.cancel_requested && before_publish(&job.phase) {
        return Ok(Next::Phase("rollback".into()));
    }
    // A pause point for tests and operators: a session holding the
    // advisory lock (hashtext('pg_shard job phase'), hashtext(<phase>))
    // holds every job at the start of that phase.
    crate::spi::run_with_args(
        "SELECT pg_advisory_xact_lock_shared(hashtext('pg_shard job phase'), hashtext($1))",
        &[job.phase.as_str().into()],
    )?;
    let shards = group_shards(job.shard_group_id)?;
    if job.kind == "split" {
        return split::step(job, &shards);
    }
    match job.phase.as_str() {
        "plan" => plan(job, &shards),
        "create_target" => create_target(job, &shards),
        "copy" => copy(job, &shards),
        "catch_up" => catch_up(job, &shards),
        "cutover" => cutover(job, &shards),
        "cleanup" => cleanup(job, &shards),
        "drop_old" => drop_old(job, &shards),
        "rollback" => rollback(job, &shards),
        other => Err(ShardError::InvalidArgument(format!(
            "job {} is in an unknown phase {other}",
            job.job_id
        ))),
    }
}

fn group_shards(shard_group_id: i64) -> Result<Vec<GroupShard>> {
    crate::spi::connect(|client| {
        let mut shards = Vec::new();
        for row in client.select(
            "SELECT s.shard_id, s.shard_schema, s.shard_name, \
                    (SELECT c.relname::text FROM pg_class c WHERE c.oid = s.table_rel), t.dist_column \
             FROM pg_shard.shard s JOIN pg_shard.logical_table t USING (table_rel) \
             WHERE s.shard_group_id = $1 ORDER BY s.shard_id",
            None,
            &[shard_group_id.into()],
        )? {
            shards.push(GroupShard {
                shard_id: row.get::<i64>(1)?.unwrap_or_default(),
                schema: row.get::<String>(2)?.unwrap_or_default(),
                name: row.get::<String>(3)?.unwrap_or_default(),
                table_name: row.get::<String>(4)?.unwrap_or_default(),
                dist_column: row.get::<String>(5)?,
            });
        }
        Ok(shards)
    })
}

/// A connection to `node` for the job. Commits wait for their WAL flush
/// whatever the server's default: a job's progress must survive a crash.
fn connect(node: &Node) -> Result<Client> {
    let mut client = remote::connect(&node.host, node.port)?;
    run_on(node, &mut client, "SET synchronous_commit = on")?;
    Ok(client)
}

fn run_on(node: &Node, client: &mut Client, sql: &str) -> Result<()> {
    client
        .batch_execute(sql)
        .map_err(|e| remote::remote_error(node, &e))
}

fn value_on<T>(node: &Node, client: &mut Client, sql: &str) -> Result<Option<T>>
where
    T: for<'a> postgres::types::FromSql<'a>,
{
    let row = client
        .query_opt(sql, &[])
        .map_err(|e| remote::remote_error(node, &e))?;
    Ok(row.map(|row| row.get(0)))
}

/// Whether `catalog` on `node` has a row whose `column` is `name`.
fn exists_on(
    node: &Node,
    client: &mut Client,
    catalog: &str,
    column: &str,
    name: &str,
) -> Result<bool> {
    Ok(value_on::<bool>(
        node,
        client,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.{catalog} WHERE {column} = {})",
            quote::literal(name)
        ),
    )?
    .unwrap_or(false))
}

/// The group's shard ids, as a SQL list.
fn shard_id_list(shards: &[GroupShard]) -> String {
    shards
        .iter()
        .map(|s| s.shard_id.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn plan(job: &Job, shards: &[GroupShard]) -> Result<Next> {
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
    Ok(Next::Phase("create_target".into()))
}

/// Records the plan: the map version it was made at and the names of what
/// the job creates (a move also a subscription).
fn record_plan(job: &Job, shards: &[GroupShard]) -> Result<()> {
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

/// Takes the EXCLUSIVE lock of a cutover on the source tables, in a
/// transaction of the returned connection: writers wait, readers go on.
fn lock_for_cutover(job: &Job, tables: &[String]) -> Result<Client> {
    let mut lock_holder = connect(&job.source)?;
    run_on(
        &job.source,
        &mut lock_holder,
        &format!("BEGIN;\nLOCK TABLE {} IN EXCLUSIVE MODE", tables.join(", ")),
    )?;
    Ok(lock_holder)
}

/// Flushes the source's WAL up to now: a synchronous commit that writes WAL
/// (a logical message, which no subscription receives). The node may
/// commit asynchronously, and an idle node flushes nothing, while slots and
/// their readers only go as far as the flushed end.
fn flush_wal(job: &Job, client: &mut Client) -> Result<()> {
    run_on(
        &job.source,
        client,
        "SELECT pg_logical_emit_message(true, 'pg_shard', 'flush')",
    )
}

/// The end of a rollback: `sources` (still the group's shards) active
/// again, the job canceled or failed.
fn finish_rollback(job: &Job, sources: &[GroupShard]) -> Result<Next> {
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

fn create_target(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let mut source = connect(&job.source)?;
    let mut script = vec![format!(
        "CREATE TABLE IF NOT EXISTS {} (job bigint PRIMARY KEY)",
        marker_table(job)
    )];
    for shard in shards {
        let ddl: Vec<String> = value_on::<Vec<String>>(
            &job.source,
            &mut source,
            &format!(
                "SELECT pg_shard.shard_table_ddl({}::regclass)",
                quote::literal(&shard.qualified())
            ),
        )?
        .unwrap_or_default();
        let (range_start, range_end) = source
            .query_one(
                "SELECT range_start, range_end FROM pg_shard.local_shard WHERE shard_id = $1",
                &[&shard.shard_id],
            )
            .map(|row| (row.get::<_, i64>(0), row.get::<_, i64>(1)))
            .map_err(|e| remote::remote_error(&job.source, &e))?;
        script.extend(frozen_shard_script(shard, ddl, (range_start, range_end)));
    }
    // Foreign keys once every table of the group exists (the copy and the
    // apply run as replication sessions, which do not check them).
    for shard in shards {
        let foreign_keys = value_on::<Vec<String>>(
            &job.source,
            &mut source,
            &format!(
                "SELECT pg_shard.shard_foreign_key_ddl({}::regclass, {}, '{{}}', '{{}}')",
                quote::literal(&shard.qualified()),
                quote::literal(&shard.name)
            ),
        )?
        .unwrap_or_default();
        script.extend(foreign_keys);
    }
    let mut target = connect(&job.target)?;
    run_on(
        &job.target,
        &mut target,
        &format!("BEGIN;\n{};\nCOMMIT", script.join(";\n")),
    )?;
    run_on(
        &job.source,
        &mut source,
        &format!(
            "CREATE TABLE IF NOT EXISTS {} (job bigint PRIMARY KEY)",
            marker_table(job)
        ),
    )?;
    Ok(Next::Phase("copy".into()))
}

/// The statements that (re)create a shard table of a job from its DDL, with
/// its guard triggers and ownership record: frozen at epoch 0 until the job
/// publishes it, so nothing writes it but the job (whose sessions fire no
/// trigger), and readable for the verification. A leftover of an
/// interrupted attempt goes first.
fn frozen_shard_script(shard: &GroupShard, ddl: Vec<String>, range: (i64, i64)) -> Vec<String> {
    let qualified = shard.qualified();
    let (range_start, range_end) = range;
    let mut script = vec![
        format!(
            "DELETE FROM pg_shard.local_shard WHERE shard_id = {}",
            shard.shard_id
        ),
        // CASCADE: a leftover's foreign keys may reference it.
        format!("DROP TABLE IF EXISTS {qualified} CASCADE"),
    ];
    script.extend(ddl);
    script.extend(crate::fencing::guard_trigger_ddl(
        &qualified,
        shard.dist_column.as_deref(),
        range_start,
        range_end,
    ));
    script.push(format!(
        "INSERT INTO pg_shard.local_shard \
         (shard_rel, shard_id, dist_column, range_start, range_end, state, epoch) \
         VALUES ({}::regclass, {}, {}, {range_start}, {range_end}, 'frozen', 0)",
        quote::literal(&qualified),
        shard.shard_id,
        shard
            .dist_column
            .as_deref()
            .map_or_else(|| "NULL".to_string(), quote::literal),
    ));
    script
}

/// Makes sure the job's publication (of `tables`) and its `pgoutput` slot
/// exist on the source.
fn publish_and_reserve_slot(job: &Job, source: &mut Client, tables: &[String]) -> Result<()> {
    let name = replication_name(job);
    if !exists_on(&job.source, source, "pg_publication", "pubname", &name)? {
        run_on(
            &job.source,
            source,
            &format!(
                "CREATE PUBLICATION {} FOR TABLE {}",
                quote::ident(&name),
                tables.join(", ")
            ),
        )?;
    }
    if !exists_on(
        &job.source,
        source,
        "pg_replication_slots",
        "slot_name",
        &name,
    )? {
        run_on(
            &job.source,
            source,
            &format!(
                "SELECT pg_create_logical_replication_slot({}, 'pgoutput')",
                quote::literal(&name)
            ),
        )?;
    }
    Ok(())
}

/// The initial copy (throttled, [`snapshot_copy`]), then a subscription
/// that streams every change committed after the copy's snapshot.
fn copy(job: &Job, shards: &[GroupShard]) -> Result<Next> {
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
        return Ok(Next::Phase("catch_up".into()));
    }
    let mut source = connect(&job.source)?;
    let snapshot = match snapshot_copy::exported_snapshot(job) {
        Some(snapshot) => snapshot,
        None => match start_copy(job, shards, &mut source, &mut target)? {
            Some(snapshot) => snapshot,
            // Writers held the tables: try again at the next step.
            None => return Ok(Next::Stay),
        },
    };
    let sources: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    let finished =
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
    if !finished {
        return Ok(Next::Stay);
    }
    snapshot_copy::release_snapshot();
    subscribe(job, &mut target)?;
    Ok(Next::Phase("catch_up".into()))
}

/// Starts (or starts over) the copy: empties the target tables, makes sure
/// the publication and the slot exist, and takes the copy's snapshot at a
/// moment when no write to the source tables is in flight (they wait on a
/// lock for that moment), so that the WAL position then separates what the
/// snapshot sees from what the slot must stream; the slot is advanced to
/// it. None: the lock could not be had within a second (a long write
/// transaction), nothing was waited for longer.
fn start_copy(
    job: &Job,
    shards: &[GroupShard],
    source: &mut Client,
    target: &mut Client,
) -> Result<Option<String>> {
    snapshot_copy::release_snapshot();
    let name = replication_name(job);
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
    publish_and_reserve_slot(job, source, &published)?;
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
    // The slot may only move over flushed WAL: flushed past the cut, it
    // moves.
    flush_wal(job, source)?;
    let started = Instant::now();
    loop {
        let flushed = value_on::<bool>(
            &job.source,
            source,
            &format!(
                "SELECT pg_current_wal_flush_lsn() >= {}::pg_lsn",
                quote::literal(&cut)
            ),
        )?
        .unwrap_or(false);
        if flushed {
            break;
        }
        if started.elapsed() > FINAL_WAIT {
            return Err(ShardError::InvalidArgument(format!(
                "the source did not flush its WAL to {cut} within {FINAL_WAIT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    run_on(
        &job.source,
        source,
        &format!(
            "SELECT pg_replication_slot_advance(slot_name, {cut}) FROM pg_replication_slots \
             WHERE slot_name = {} AND confirmed_flush_lsn < {cut}",
            quote::literal(&name),
            cut = quote::literal(&cut),
        ),
    )?;
    snapshot_copy::restart_progress(job)?;
    snapshot_copy::hold_snapshot(job, holder, &snapshot);
    Ok(Some(snapshot))
}

/// Copies the rows of pages [start, end) of a source table, as the
/// snapshot sees them, to the target (binary COPY, one transaction on each
/// side); returns the rows copied.
fn copy_pages(
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

/// The subscription streaming from the slot (positioned after the copy's
/// snapshot): no initial copy of its own, no slot of its own.
fn subscribe(job: &Job, target: &mut Client) -> Result<()> {
    let name = replication_name(job);
    let database = query_one::<String>("SELECT current_database()::text", &[])?.unwrap_or_default();
    let user = query_one::<String>("SELECT current_user::text", &[])?.unwrap_or_default();
    let connection = format!(
        "host={} port={} dbname={} user={} application_name={}",
        conninfo_value(&job.source.host),
        job.source.port,
        conninfo_value(&database),
        conninfo_value(&user),
        conninfo_value(&name),
    );
    // Not in a transaction block: CREATE SUBSCRIPTION connects to the source.
    run_on(
        &job.target,
        target,
        &format!(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} \
             WITH (slot_name = {}, create_slot = false, copy_data = false)",
            quote::ident(&name),
            quote::literal(&connection),
            quote::ident(&name),
            quote::literal(&name),
        ),
    )
}

/// A value in a libpq connection string, quoted.
fn conninfo_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Replication lag in bytes (None: the slot is not there yet) and whether
/// every table finished its initial copy.
fn replication_state(
    job: &Job,
    source: &mut Client,
    target: &mut Client,
) -> Result<(Option<i64>, bool)> {
    let name = quote::literal(&replication_name(job));
    let lag = value_on::<Option<i64>>(
        &job.source,
        source,
        &format!(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint \
             FROM pg_replication_slots WHERE slot_name = {name}"
        ),
    )?
    .flatten();
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

fn catch_up(job: &Job, _shards: &[GroupShard]) -> Result<Next> {
    let mut source = connect(&job.source)?;
    let mut target = connect(&job.target)?;
    let (lag, synced) = replication_state(job, &mut source, &mut target)?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET lag_bytes = $2 WHERE job_id = $1",
        &[job.job_id.into(), lag.into()],
    )?;
    if synced && lag.is_some_and(|lag| lag < CUTOVER_LAG) {
        return Ok(Next::Phase("cutover".into()));
    }
    Ok(Next::Stay)
}

/// The cutover, in one step (a crash anywhere in it leaves the job to run
/// it again from the start, or to roll back):
/// 1. lock the source shard tables EXCLUSIVE in a transaction kept open:
///    writers holding locks finish first, new ones wait (the write pause;
///    readers go on);
/// 2. a row into the marker table; once it is on the target, every write
///    before the lock is too;
/// 3. verify row counts and checksums, source against target;
/// 4. retire the source shards and commit (the waiting writers get
///    WrongShard and their routers look for the new map);
/// 5. activate the target shards at the next map version and publish it
///    (placement, foreign partitions, version, NOTIFY) with the job's next
///    phase, in one metadata transaction.
fn cutover(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let tables: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    let ids = shard_id_list(shards);
    let mut lock_holder = lock_for_cutover(job, &tables)?;
    let mut source = connect(&job.source)?;
    run_on(
        &job.source,
        &mut source,
        &format!(
            "INSERT INTO {} VALUES ({}) ON CONFLICT DO NOTHING",
            marker_table(job),
            job.job_id
        ),
    )?;
    wait_for_marker(job)?;
    verify(job, shards)?;
    run_on(
        &job.source,
        &mut lock_holder,
        &format!(
            "UPDATE pg_shard.local_shard SET state = 'retired' WHERE shard_id IN ({ids});\nCOMMIT"
        ),
    )?;
    // The next version, held until this transaction commits.
    let version = crate::catalog::write_returning::<i64>(
        "SELECT coalesce((SELECT version FROM pg_shard.map_state WHERE singleton FOR UPDATE), 0) + 1",
        &[],
    )?
    .unwrap_or(1);
    let mut target = connect(&job.target)?;
    run_on(
        &job.target,
        &mut target,
        &format!(
            "UPDATE pg_shard.local_shard SET state = 'active', epoch = {version} WHERE shard_id IN ({ids})"
        ),
    )?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.placement SET node_id = $3 WHERE shard_group_id = $1 AND node_id = $2",
        &[
            job.shard_group_id.into(),
            job.source.node_id.into(),
            job.target.node_id.into(),
        ],
    )?;
    for shard in shards {
        repoint_partition(shard, job)?;
    }
    let published = crate::catalog::bump_map_version()?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources || jsonb_build_object('new_version', $2) \
         WHERE job_id = $1",
        &[job.job_id.into(), published.into()],
    )?;
    Ok(Next::Phase("cleanup".into()))
}

fn wait_for_marker(job: &Job) -> Result<()> {
    let mut target = connect(&job.target)?;
    let started = Instant::now();
    loop {
        let arrived = value_on::<bool>(
            &job.target,
            &mut target,
            &format!(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE job = {})",
                marker_table(job),
                job.job_id
            ),
        )?
        .unwrap_or(false);
        if arrived {
            return Ok(());
        }
        if started.elapsed() > FINAL_WAIT {
            return Err(ShardError::InvalidArgument(format!(
                "the target did not apply the last writes within {FINAL_WAIT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn verify(job: &Job, shards: &[GroupShard]) -> Result<()> {
    let mut source = connect(&job.source)?;
    let mut target = connect(&job.target)?;
    for shard in shards {
        // Count and an order-independent checksum of the rows' text.
        let sql = format!(
            "SELECT count(*)::bigint, coalesce(sum(hashtext(t::text)::bigint), 0)::bigint FROM {} t",
            shard.qualified()
        );
        let read = |node: &Node, client: &mut Client| -> Result<(i64, i64)> {
            client
                .query_one(&sql, &[])
                .map(|row| (row.get(0), row.get(1)))
                .map_err(|e| remote::remote_error(node, &e))
        };
        let on_source = read(&job.source, &mut source)?;
        let on_target = read(&job.target, &mut target)?;
        if on_source != on_target {
            return Err(ShardError::InvalidArgument(format!(
                "verification failed for {}: {} rows (checksum {}) on the source, {} rows (checksum {}) on the target",
                shard.qualified(),
                on_source.0,
                on_source.1,
                on_target.0,
                on_target.1
            )));
        }
    }
    Ok(())
}

/// Replaces the metadata node's foreign partition of `shard` by one on the
/// target's server (a foreign table cannot change its server).
fn repoint_partition(shard: &GroupShard, job: &Job) -> Result<()> {
    use crate::routing_table::partition_name;
    let old = quote::qualified(
        "pg_shard_partitions",
        &partition_name(&shard.table_name, shard.shard_id, job.source.node_id),
    );
    let new = quote::qualified(
        "pg_shard_partitions",
        &partition_name(&shard.table_name, shard.shard_id, job.target.node_id),
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
    crate::ddl::run_internal(&format!("ALTER TABLE {parent} DETACH PARTITION {old}"))?;
    crate::routing_table::create_foreign_partition(
        parent,
        &new,
        bounds,
        job.target.node_id,
        &shard.schema,
        &shard.name,
    )?;
    crate::spi::run(&format!("DROP FOREIGN TABLE {old}"))?;
    Ok(())
}

/// Drops the subscription (with its slot), publication and markers.
fn drop_replication(job: &Job) -> Result<()> {
    let name = replication_name(job);
    let mut target = connect(&job.target)?;
    let subscribed = exists_on(
        &job.target,
        &mut target,
        "pg_subscription",
        "subname",
        &name,
    )?;
    if subscribed {
        run_on(
            &job.target,
            &mut target,
            &format!("DROP SUBSCRIPTION {}", quote::ident(&name)),
        )?;
    }
    run_on(
        &job.target,
        &mut target,
        &format!("DROP TABLE IF EXISTS {}", marker_table(job)),
    )?;
    let mut source = connect(&job.source)?;
    // The slot goes with the subscription; one left by a subscription that
    // was never made (or lost its connection) goes here.
    let leftover_slot = exists_on(
        &job.source,
        &mut source,
        "pg_replication_slots",
        "slot_name",
        &name,
    )?;
    if leftover_slot {
        run_on(
            &job.source,
            &mut source,
            &format!("SELECT pg_drop_replication_slot({})", quote::literal(&name)),
        )?;
    }
    run_on(
        &job.source,
        &mut source,
        &format!(
            "DROP PUBLICATION IF EXISTS {};\nDROP TABLE IF EXISTS {}",
            quote::ident(&name),
            marker_table(job)
        ),
    )?;
    Ok(())
}

fn cleanup(job: &Job, _shards: &[GroupShard]) -> Result<Next> {
    drop_replication(job)?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources || jsonb_build_object('drop_after', \
             now() + coalesce((resources->>'drop_delay')::interval, interval '60 seconds')) \
         WHERE job_id = $1",
        &[job.job_id.into()],
    )?;
    Ok(Next::Phase("drop_old".into()))
}

fn drop_old(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    let due = query_one::<bool>(
        "SELECT now() >= (resources->>'drop_after')::timestamptz FROM pg_shard.job WHERE job_id = $1",
        &[job.job_id.into()],
    )?
    .unwrap_or(true);
    if !due {
        return Ok(Next::Stay);
    }
    drop_shard_tables(&job.source, shards, "")?;
    Ok(Next::Finished("done".into(), None))
}

/// Drops the group's shard tables on `node` and their ownership records
/// (those matching `condition`, e.g. only the unpublished copies), in one
/// transaction.
fn drop_shard_tables(node: &Node, shards: &[GroupShard], condition: &str) -> Result<()> {
    let mut script = Vec::new();
    for shard in shards {
        script.push(format!(
            "DELETE FROM pg_shard.local_shard WHERE shard_id = {}{condition}",
            shard.shard_id
        ));
    }
    // One statement: the tables' foreign keys among them do not stand in
    // the way.
    let tables: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    if tables.is_empty() {
        return Ok(());
    }
    script.push(format!("DROP TABLE IF EXISTS {}", tables.join(", ")));
    let mut client = connect(node)?;
    run_on(
        node,
        &mut client,
        &format!("BEGIN;\n{};\nCOMMIT", script.join(";\n")),
    )
}

fn rollback(job: &Job, shards: &[GroupShard]) -> Result<Next> {
    snapshot_copy::release_snapshot();
    drop_replication(job)?;
    drop_shard_tables(&job.target, shards, " AND state = 'frozen' AND epoch = 0")?;
    finish_rollback(job, shards)
}

/// The statements that recreate a shard table of this node as it is (for
/// a move to another node).
#[pg_extern(schema = "pg_shard", volatile)]
fn shard_table_ddl(shard_rel: pg_sys::Oid) -> Vec<String> {
    use crate::error::OrReport;
    crate::shard_ddl::TableShape::load(shard_rel)
        .map(|shape| shape.same_ddl())
        .or_report()
}

/// The statements that give a copy of a shard table of this node, named
/// `shard_name` (in the same schema), the foreign keys the shard table has;
/// a referenced table named in `old_names` is replaced by the same place in
/// `new_names` (the halves of a split reference each other).
#[pg_extern(schema = "pg_shard", volatile)]
fn shard_foreign_key_ddl(
    shard_rel: pg_sys::Oid,
    shard_name: &str,
    old_names: Vec<String>,
    new_names: Vec<String>,
) -> Vec<String> {
    use crate::error::OrReport;
    // The old names as pg_get_constraintdef prints them.
    let printed = |name: &String| {
        crate::settings::with_settings(crate::settings::QUALIFIED_NAMES, || {
            crate::catalog::query_one::<String>(
                "SELECT to_regclass($1)::text",
                &[name.as_str().into()],
            )
        })
        .map(|printed| printed.unwrap_or_else(|| name.clone()))
    };
    let old_names: crate::error::Result<Vec<String>> = old_names.iter().map(printed).collect();
    old_names
        .and_then(|old_names| Ok((old_names, crate::shard_ddl::TableShape::load(shard_rel)?)))
        .map(|(old_names, shape)| {
            let target = quote::qualified(&shape.schema, shard_name);
            shape.foreign_key_ddl(&target, &|definition: &str| {
                old_names.iter().zip(&new_names).fold(
                    definition.to_string(),
                    |definition, (old, new)| {
                        definition.replace(
                            &format!(" REFERENCES {old}("),
                            &format!(" REFERENCES {new}("),
                        )
                    },
                )
            })
        })
        .or_report()
}

/// The statements that create a copy of a shard table of this node under
/// another name and shard id (a half of a split).
#[pg_extern(schema = "pg_shard", volatile)]
fn shard_table_ddl_as(
    shard_rel: pg_sys::Oid,
    shard_name: &str,
    old_shard_id: i64,
    new_shard_id: i64,
) -> Vec<String> {
    use crate::error::OrReport;
    crate::shard_ddl::TableShape::load(shard_rel)
        .map(|shape| shape.renamed_shard_ddl(shard_name, old_shard_id, new_shard_id))
        .or_report()
}
