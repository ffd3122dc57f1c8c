//! `pg_shard.node_health()`: whether each node answers, and the two-phase
//! commits pg_shard left prepared there, for monitoring (`/metrics` on the
//! coordinator and its alert rules: a node down, prepared transactions
//! left behind).

use crate::error::Result;
use crate::transaction::client::connect;
use pgrx::prelude::*;

/// Prepared transactions of pg_shard's (gid `pg_shard_…`) in this
/// database: how many, and the age of the oldest in seconds.
const PREPARED: &str = "SELECT count(*), \
       coalesce(extract(epoch FROM now() - min(prepared)), 0)::float8 \
  FROM pg_catalog.pg_prepared_xacts \
 WHERE gid LIKE 'pg\\_shard\\_%' AND database = current_database()";

// (pgrx declares the SQL columns from this type: no alias possible)
#[allow(clippy::type_complexity)]
#[pg_extern(schema = "pg_shard")]
fn node_health() -> TableIterator<
    'static,
    (
        name!(node_id, i32),
        name!(host, String),
        name!(port, i32),
        name!(reachable, bool),
        name!(prepared_transactions, Option<i64>),
        name!(oldest_prepared_seconds, Option<f64>),
    ),
> {
    let rows = match collect() {
        Ok(rows) => rows,
        Err(error) => error.report(),
    };
    TableIterator::new(rows)
}

type HealthRow = (i32, String, i32, bool, Option<i64>, Option<f64>);

fn collect() -> Result<Vec<HealthRow>> {
    let mut rows = Vec::new();
    for node in crate::metadata::catalog::all_nodes()? {
        let answer = connect(&node.host, node.port)
            .ok()
            .and_then(|mut client| client.query_one(PREPARED, &[]).ok());
        let (reachable, prepared, oldest) = match answer {
            Some(row) => (
                true,
                row.try_get::<_, i64>(0).ok(),
                row.try_get::<_, f64>(1).ok(),
            ),
            None => (false, None, None),
        };
        rows.push((
            node.node_id,
            node.host,
            node.port,
            reachable,
            prepared,
            oldest,
        ));
    }
    Ok(rows)
}
