//! The replication objects of a job on the source (publication, slot,
//! marker table) and on the target (subscription), and the write pause of a
//! cutover.

use super::job::Job;
use super::node_access::{connect, exists_on, run_on};
use crate::error::Result;
use crate::quote;
use postgres::Client;

/// Object names of a job: publication, slot and subscription share one.
pub(crate) fn replication_name(job: &Job) -> String {
    format!("pg_shard_job_{}", job.job_id)
}

pub(crate) fn marker_table(job: &Job) -> String {
    quote::qualified("pg_shard", &format!("job_{}_marker", job.job_id))
}

/// Makes sure the job's publication (of `tables`) and its `pgoutput` slot
/// exist on the source.
pub(crate) fn publish_and_reserve_slot(
    job: &Job,
    source: &mut Client,
    tables: &[String],
) -> Result<()> {
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

/// Flushes the source's WAL up to now: a synchronous commit that writes WAL
/// (a logical message, which no subscription receives). The node may
/// commit asynchronously, and an idle node flushes nothing, while slots and
/// their readers only go as far as the flushed end.
pub(crate) fn flush_wal(job: &Job, client: &mut Client) -> Result<()> {
    run_on(
        &job.source,
        client,
        "SELECT pg_logical_emit_message(true, 'pg_shard', 'flush')",
    )
}

/// Takes the EXCLUSIVE lock of a cutover on the source tables, in a
/// transaction of the returned connection: writers wait, readers go on.
pub(crate) fn lock_for_cutover(job: &Job, tables: &[String]) -> Result<Client> {
    let mut lock_holder = connect(&job.source)?;
    run_on(
        &job.source,
        &mut lock_holder,
        &format!("BEGIN;\nLOCK TABLE {} IN EXCLUSIVE MODE", tables.join(", ")),
    )?;
    Ok(lock_holder)
}

/// Drops the subscription (with its slot), publication and markers.
pub(crate) fn drop_replication(job: &Job) -> Result<()> {
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
