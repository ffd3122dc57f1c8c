//! The initial copy of a move or split: the rows a snapshot sees, copied in
//! page ranges, each in a short transaction that imports the snapshot, at
//! most `pg_shard.copy_rate_limit` MB/s so that the node keeps serving live
//! traffic with its usual latency.
//!
//! The snapshot is exported by a transaction the job runner keeps open while
//! the copy runs; a runner that restarts (or a node that restarts) loses it,
//! and the copy starts over. Progress (table, page) is kept in the job's
//! resources.

use super::job::Job;
use super::node_access::{connect, run_on, value_on};
use crate::error::Result;
use crate::metadata::Node;
use crate::quote;
use crate::worker::fencing::COLUMN_GUARD_TRIGGERS;
use postgres::Client;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// How long one step of the copy goes on before its progress is recorded.
const STEP_TIME: Duration = Duration::from_secs(1);
/// Largest page range copied in one transaction.
const MAX_PAGES_PER_BATCH: i64 = 1024;
pub(super) const PAGE_BYTES: i64 = 8192;

/// The copy's snapshot and the connection whose open transaction keeps it.
struct ExportedSnapshot {
    job_id: i64,
    holder: Client,
    name: String,
}

thread_local! {
    static EXPORTED: RefCell<Option<ExportedSnapshot>> = const { RefCell::new(None) };
}

/// The snapshot of `job`'s copy if this runner still holds it.
pub(super) fn exported_snapshot(job: &Job) -> Option<String> {
    EXPORTED.with(|cell| {
        let mut exported = cell.borrow_mut();
        match exported.as_ref() {
            Some(e) if e.job_id == job.job_id && !e.holder.is_closed() => Some(e.name.clone()),
            Some(_) => {
                *exported = None;
                None
            }
            None => None,
        }
    })
}

/// Keeps `holder`, whose open transaction exported `name`, for the copy.
pub(super) fn hold_snapshot(job: &Job, holder: Client, name: &str) {
    EXPORTED.with(|cell| {
        *cell.borrow_mut() = Some(ExportedSnapshot {
            job_id: job.job_id,
            holder,
            name: name.to_owned(),
        })
    });
}

/// Opens the transaction (REPEATABLE READ) whose snapshot the copy reads:
/// returns its connection, the exported snapshot's name and the text of
/// `also` (an expression) evaluated in it.
pub(super) fn export_snapshot(job: &Job, also: &str) -> Result<(Client, String, String)> {
    let mut holder = connect(&job.source)?;
    run_on(
        &job.source,
        &mut holder,
        "BEGIN ISOLATION LEVEL REPEATABLE READ",
    )?;
    let row = holder
        .query_one(&format!("SELECT pg_export_snapshot(), {also}"), &[])
        .map_err(|e| crate::transaction::client::remote_error(&job.source, &e))?;
    let (snapshot, also) = (row.get(0), row.get(1));
    Ok((holder, snapshot, also))
}

/// Ends the exporting transaction (its connection closes).
pub(super) fn release_snapshot() {
    EXPORTED.with(|cell| cell.borrow_mut().take());
}

/// Records that the copy starts (over) from the first page.
pub(super) fn restart_progress(job: &Job) -> Result<()> {
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET rows_copied = 0, bytes_copied = 0, \
             resources = (resources - 'copy_bytes_total') || jsonb_build_object('copy_table', 0, 'copy_page', 0) \
         WHERE job_id = $1",
        &[job.job_id.into()],
    )?;
    Ok(())
}

/// Copies page ranges of the `sources` (qualified names, on the node
/// `source` is connected to) for about a second, with `copy_pages(table
/// index, first page, end page, source)` returning the rows it copied;
/// records the progress (complete: [`pages_copied`]).
pub(super) fn copy_step(
    job: &Job,
    sources: &[String],
    source: &mut Client,
    mut copy_pages: impl FnMut(usize, i64, i64, &mut Client) -> Result<i64>,
) -> Result<()> {
    let rate = job.recorded("copy_rate")?.unwrap_or(0);
    let mut table = job.recorded("copy_table")?.unwrap_or(0) as usize;
    let mut page = job.recorded("copy_page")?.unwrap_or(0);
    // Page ranges sized for about ten per second at the rate.
    let pages_per_batch = if rate > 0 {
        (rate * 1024 * 1024 / PAGE_BYTES / 10).clamp(1, MAX_PAGES_PER_BATCH)
    } else {
        MAX_PAGES_PER_BATCH
    };
    // What the whole copy reads, for its progress (pg_shard.job_progress):
    // the sources' sizes when it starts.
    let total = match job.recorded("copy_bytes_total")? {
        Some(total) => total,
        None => value_on::<i64>(
            &job.source,
            source,
            &format!(
                "SELECT coalesce(sum(pg_relation_size(t::regclass)), 0)::bigint \
                 FROM unnest({}::text[]) t",
                quote::text_array(sources)
            ),
        )?
        .unwrap_or(0),
    };
    let started = Instant::now();
    let (mut rows, mut bytes) = (0i64, 0i64);
    while started.elapsed() < STEP_TIME {
        let Some(name) = sources.get(table) else {
            break;
        };
        // Pages added after the snapshot hold no row it sees.
        let pages = value_on::<i64>(
            &job.source,
            source,
            &format!(
                "SELECT pg_relation_size({}::regclass) / {PAGE_BYTES}",
                quote::literal(name)
            ),
        )?
        .unwrap_or(0);
        if page >= pages {
            table += 1;
            page = 0;
            continue;
        }
        // Paced by the source's other work too (pg_shard.max_replication_lag,
        // pg_shard.max_source_latency): the step ends and comes back.
        if super::pacing::throttle(job, source)?.is_some() {
            break;
        }
        let end = (page + pages_per_batch).min(pages);
        rows += copy_pages(table, page, end, source)?;
        bytes += (end - page) * PAGE_BYTES;
        page = end;
        // (The last page of the last table is recorded as the end of the
        // copy by this step, not the next.)
        if page >= pages {
            table += 1;
            page = 0;
        }
        if rate > 0 {
            // Stay under the rate: sleep until this step's bytes are due.
            let due = Duration::from_secs_f64(bytes as f64 / (rate as f64 * 1024.0 * 1024.0));
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET rows_copied = rows_copied + $2, bytes_copied = bytes_copied + $3, \
             resources = resources || jsonb_build_object('copy_table', $4::bigint, 'copy_page', $5::bigint, \
                                                         'copy_bytes_total', $6::bigint) \
         WHERE job_id = $1",
        &[
            job.job_id.into(),
            rows.into(),
            bytes.into(),
            (table as i64).into(),
            page.into(),
            total.into(),
        ],
    )?;
    Ok(())
}

/// Ends the copy into `tables` on `target`: runs `script`, their indexes,
/// row guards and foreign keys, and records when the copy ended
/// (`copied_at`).
///
/// The new tables are made without them and get them here, one sorted
/// build per index, because maintaining them row by row made the target's
/// COPY the copy's bound (about half its time). Called in a step of its
/// own ([`pages_copied`]): the step holds no lock on the job's row while
/// the indexes are built, so that a cancel need not wait for them. A step
/// that runs again (its runner restarted before it recorded the next
/// phase) finds them built and builds nothing: the script runs in one
/// transaction that first locks the tables (so it also waits for a build
/// still running for a runner that is gone), and any index or row guard
/// on the tables means all of it is there (a foreign key among them needs
/// an index; those to reference tables are made with the tables).
pub(super) fn finish(
    job: &Job,
    target: &Node,
    client: &mut Client,
    tables: &[String],
    script: &[String],
) -> Result<()> {
    let table_list = tables
        .iter()
        .map(|t| format!("{}::regclass", quote::literal(t)))
        .collect::<Vec<_>>()
        .join(", ");
    run_on(
        target,
        client,
        &format!(
            "BEGIN;\nLOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            tables.join(", ")
        ),
    )?;
    let built = value_on::<bool>(
        target,
        client,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_index WHERE indrelid IN ({table_list})) \
                 OR EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid IN ({table_list}) AND tgname IN ({guards}))",
            guards = COLUMN_GUARD_TRIGGERS
                .iter()
                .map(|name| quote::literal(name))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )?
    .unwrap_or(false);
    let mut statements = if built { Vec::new() } else { script.to_vec() };
    statements.push("COMMIT".to_string());
    run_on(target, client, &statements.join(";\n"))?;
    super::job::pause_point("copied")?;
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources || jsonb_build_object('copied_at', clock_timestamp()) \
         WHERE job_id = $1",
        &[job.job_id.into()],
    )?;
    Ok(())
}

/// Whether an earlier step copied the last page of the `tables` sources
/// (then [`finish`] comes next).
pub(super) fn pages_copied(job: &Job, tables: usize) -> Result<bool> {
    Ok(job.recorded("copy_table")?.unwrap_or(0) >= tables as i64)
}
