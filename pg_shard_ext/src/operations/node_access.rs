//! A job's connections to the nodes it works on, and the small statements it
//! runs over them.

use crate::error::Result;
use crate::metadata::Node;
use crate::quote;
use crate::transaction::client as remote;
use postgres::Client;

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

pub(crate) fn value_on<T>(node: &Node, client: &mut Client, sql: &str) -> Result<Option<T>>
where
    T: for<'a> postgres::types::FromSql<'a>,
{
    let row = client
        .query_opt(sql, &[])
        .map_err(|e| remote::remote_error(node, &e))?;
    Ok(row.map(|row| row.get(0)))
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
