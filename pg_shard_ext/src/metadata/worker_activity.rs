//! `pg_shard.worker_activity()`: what the backends pg_shard opened on the
//! workers are doing, and for which backend of this node.
//!
//! Every connection pg_shard opens to a worker names the backend it works
//! for in its application_name (`pg_shard pid=N`, see
//! [`crate::transaction::client::application_name`]), so a DBA can tell
//! which session a worker backend serves and what it waits for: a statement
//! routed to a worker waits there, not here, and pg_stat_activity on this
//! node only shows it reading from a socket.

use crate::error::Result;
use crate::transaction::client::{connect, remote_error};
use pgrx::prelude::*;

/// One worker backend: (node_id, worker_pid, origin_pid, state,
/// wait_event_type, wait_event, blocked_by, xact_start, query).
type ActivityRow = (
    i32,
    i32,
    Option<i32>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<Vec<i32>>,
    Option<TimestampWithTimeZone>,
    Option<String>,
);

/// The worker's pg_stat_activity rows of pg_shard's connections. The
/// connection runs as the caller, so a role sees the query texts it would
/// see on the worker itself.
const ACTIVITY_QUERY: &str = "\
    SELECT pid, substring(application_name FROM '^pg_shard pid=([0-9]+)$')::int4, \
           state, wait_event_type, wait_event, pg_catalog.pg_blocking_pids(pid), \
           xact_start, query \
      FROM pg_catalog.pg_stat_activity \
     WHERE application_name LIKE 'pg\\_shard%' AND pid <> pg_catalog.pg_backend_pid() \
     ORDER BY pid";

// pgrx reads the column names from the signature's `name!`s, so the type
// cannot be an alias.
#[allow(clippy::type_complexity)]
#[pg_extern(schema = "pg_shard")]
fn worker_activity() -> TableIterator<
    'static,
    (
        name!(node_id, i32),
        name!(worker_pid, i32),
        name!(origin_pid, Option<i32>),
        name!(state, Option<String>),
        name!(wait_event_type, Option<String>),
        name!(wait_event, Option<String>),
        name!(blocked_by, Option<Vec<i32>>),
        name!(xact_start, Option<TimestampWithTimeZone>),
        name!(query, Option<String>),
    ),
> {
    match collect_activity() {
        Ok(rows) => TableIterator::new(rows),
        Err(error) => error.report(),
    }
}

/// One connection per active node; a node that cannot be reached gives a
/// WARNING and no rows rather than failing the whole call.
fn collect_activity() -> Result<Vec<ActivityRow>> {
    let mut activity = Vec::new();
    for node in crate::metadata::catalog::active_nodes()? {
        let fetched = connect(&node.host, node.port).and_then(|mut client| {
            client
                .query(ACTIVITY_QUERY, &[])
                .map_err(|e| remote_error(&node, &e))
        });
        let rows = match fetched {
            Ok(rows) => rows,
            Err(error) => {
                warning!(
                    "pg_shard: activity on {} unavailable: {error}",
                    node.label()
                );
                continue;
            }
        };
        for row in rows {
            let remote = |e: postgres::Error| remote_error(&node, &e);
            let xact_start: Option<std::time::SystemTime> = row.try_get(6).map_err(remote)?;
            activity.push((
                node.node_id,
                row.try_get(0).map_err(remote)?,
                row.try_get(1).map_err(remote)?,
                row.try_get(2).map_err(remote)?,
                row.try_get(3).map_err(remote)?,
                row.try_get(4).map_err(remote)?,
                row.try_get(5).map_err(remote)?,
                xact_start.and_then(to_timestamptz),
                row.try_get(7).map_err(remote)?,
            ));
        }
    }
    Ok(activity)
}

/// A wall-clock time as PostgreSQL's timestamptz (microseconds since
/// 2000-01-01 UTC).
fn to_timestamptz(at: std::time::SystemTime) -> Option<TimestampWithTimeZone> {
    const POSTGRES_EPOCH_UNIX_SECONDS: i64 = 946_684_800;
    let micros = match at.duration_since(std::time::UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_micros()).ok()?,
        Err(before) => -i64::try_from(before.duration().as_micros()).ok()?,
    };
    let postgres_micros = micros - POSTGRES_EPOCH_UNIX_SECONDS * 1_000_000;
    TimestampWithTimeZone::try_from(postgres_micros).ok()
}
