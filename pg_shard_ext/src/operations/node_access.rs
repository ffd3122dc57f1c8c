//! A job's connections to the nodes it works on, and the small statements it
//! runs over them.

use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::quote;
use crate::transaction::client as remote;
use postgres::Client;
use std::time::{Duration, Instant};

/// A connection to `node` for the job. Commits wait for their WAL flush
/// whatever the server's default: a job's progress must survive a crash.
pub(crate) fn connect(node: &Node) -> Result<Client> {
    let mut client = remote::connect(&node.host, node.port)?;
    run_on(node, &mut client, "SET synchronous_commit = on")?;
    Ok(client)
}

pub(crate) fn run_on(node: &Node, client: &mut Client, sql: &str) -> Result<()> {
    client
        .batch_execute(sql)
        .map_err(|e| remote::remote_error(node, &e))
}

/// The first column of `sql`'s row, if it has one. One round trip (no
/// separate prepare): the cutover's pause asks several of these.
pub(crate) fn value_on<T>(node: &Node, client: &mut Client, sql: &str) -> Result<Option<T>>
where
    T: for<'a> postgres::types::FromSql<'a>,
{
    let row = client
        .query_typed_opt(sql, &[])
        .map_err(|e| remote::remote_error(node, &e))?;
    Ok(row.map(|row| row.get(0)))
}

/// Runs `sql` (several statements, in one round trip) and returns the
/// first column of the last row they returned, as text.
pub(crate) fn batch_value(node: &Node, client: &mut Client, sql: &str) -> Result<Option<String>> {
    client
        .simple_query(sql)
        .map(|messages| last_value(&messages))
        .map_err(|e| remote::remote_error(node, &e))
}

/// The first column of the last row among a batch's answers.
pub(crate) fn last_value(messages: &[postgres::SimpleQueryMessage]) -> Option<String> {
    messages.iter().rev().find_map(|message| match message {
        postgres::SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_string)),
        _ => None,
    })?
}

/// Whether `catalog` on `node` has a row whose `column` is `name`.
pub(crate) fn exists_on(
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

/// Asks `sql` (a boolean) on `node` every `interval` until it is true;
/// after `limit`, a timeout error saying that `what` did not happen.
pub(crate) fn poll_until(
    node: &Node,
    client: &mut Client,
    sql: &str,
    (interval, limit): (Duration, Duration),
    what: &str,
) -> Result<()> {
    let started = Instant::now();
    while !value_on::<bool>(node, client, sql)?.unwrap_or(false) {
        if started.elapsed() > limit {
            return Err(ShardError::Timeout(format!("{what} within {limit:?}")));
        }
        std::thread::sleep(interval);
    }
    Ok(())
}

/// `node`'s WAL insert position now (text, as `pg_lsn` prints it).
pub(crate) fn wal_insert_position(node: &Node, client: &mut Client) -> Result<String> {
    Ok(
        value_on::<String>(node, client, "SELECT pg_current_wal_insert_lsn()::text")?
            .unwrap_or_default(),
    )
}

/// The keyspace range of shard `shard_id` in `node`'s ownership records.
pub(crate) fn shard_range(node: &Node, client: &mut Client, shard_id: i64) -> Result<(i64, i64)> {
    client
        .query_one(
            "SELECT range_start, range_end FROM pg_shard.local_shard WHERE shard_id = $1",
            &[&shard_id],
        )
        .map(|row| (row.get(0), row.get(1)))
        .map_err(|e| remote::remote_error(node, &e))
}
