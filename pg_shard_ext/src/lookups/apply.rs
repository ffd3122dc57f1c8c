//! The metadata node's part of keeping lookups: the changes a write made
//! on a base table's shards are taken from the nodes that made them
//! (`pg_shard.take_lookup_changes()`, [`take`]) and written to the lookup
//! tables' shards ([`apply`]) in the local transaction's remote
//! transactions: they commit with the write, by two-phase commit when more
//! than one node wrote.
//!
//! Removals go before additions (a row whose value moves to another row
//! in one statement), and a statement's shards are written in one order
//! (node, shard, value). Two transactions that change each other's values
//! on two nodes can still wait for each other there, which no node sees
//! as a deadlock: they wait until a lock_timeout or statement_timeout.

use super::catalog::{self, Lookup};
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::quote;
use crate::transaction::connection::{NodeConnection, Planning};
use crate::transaction::remote::{with_declared_transactions, Access};
use std::collections::{BTreeMap, HashMap};

/// Values per statement on a lookup shard.
const BATCH: usize = 1000;

/// One change of a lookup: `delta` rows with `value` now have the key
/// whose keyspace id is `key_id`.
pub(crate) struct Change {
    pub(crate) lookup_id: i32,
    pub(crate) delta: i64,
    pub(crate) value: String,
    /// The value's keyspace id: the lookup shard it goes to.
    pub(crate) value_id: i64,
    pub(crate) key_id: i64,
}

/// What a node recorded in the open transaction, taken from it.
pub(crate) fn take(connection: &mut NodeConnection, into: &mut Vec<Change>) -> Result<()> {
    let damaged = || ShardError::Internal("a node returned a damaged lookup change".into());
    let mut failure = None;
    connection.for_each_row(
        "SELECT lookup_id, delta, value, value_keyspace_id, keyspace_id \
         FROM pg_shard.take_lookup_changes()",
        &[],
        &[],
        |row| {
            let number = |i: usize| row.text(i).and_then(|t| t.parse::<i64>().ok());
            match (number(0), number(1), row.text(2), number(3), number(4)) {
                (Some(lookup_id), Some(delta), Some(value), Some(value_id), Some(key_id)) => into
                    .push(Change {
                        lookup_id: lookup_id as i32,
                        delta,
                        value,
                        value_id,
                        key_id,
                    }),
                _ => failure = Some(damaged()),
            }
            Ok(())
        },
    )?;
    failure.map_or(Ok(()), Err)
}

/// The changes of one lookup shard.
struct ShardWrites {
    lookup: Lookup,
    qualified: String,
    /// (value, key id) → rows, summed.
    rows: BTreeMap<(String, i64), i64>,
}

/// Writes `changes` to the lookup shards, declaring `map_version` there.
pub(crate) fn apply(changes: Vec<Change>, map_version: i64) -> Result<()> {
    if changes.is_empty() {
        return Ok(());
    }
    // By node, then shard: the order every writer takes.
    let mut shards: BTreeMap<(i32, String), (Node, ShardWrites)> = BTreeMap::new();
    let mut lookups: HashMap<i32, Lookup> = HashMap::new();
    for change in changes {
        let lookup = match lookups.get(&change.lookup_id) {
            Some(lookup) => lookup.clone(),
            None => {
                let lookup = catalog::by_id(change.lookup_id)?;
                lookups.insert(change.lookup_id, lookup.clone());
                lookup
            }
        };
        let (node, qualified) = owner(&lookup, change.value_id, map_version)?;
        let (_, writes) = shards
            .entry((node.node_id, qualified.clone()))
            .or_insert_with(|| {
                (
                    node,
                    ShardWrites {
                        lookup,
                        qualified,
                        rows: BTreeMap::new(),
                    },
                )
            });
        *writes
            .rows
            .entry((change.value, change.key_id))
            .or_default() += change.delta;
    }
    let mut nodes: Vec<Node> = Vec::new();
    for (node, _) in shards.values() {
        if !nodes.iter().any(|n| n.same_server(node)) {
            nodes.push(node.clone());
        }
    }
    let timezone = crate::executor::router_scan::current_timezone();
    with_declared_transactions(&nodes, Access::Write, Some(map_version), |connections| {
        for connection in connections.iter_mut() {
            connection.declare_session(map_version, &timezone, Planning::Own)?;
        }
        // Removals everywhere first, then additions.
        for removing in [true, false] {
            for (node, writes) in shards.values() {
                let connection = connections
                    .iter_mut()
                    .find(|c| c.node().same_server(node))
                    .ok_or_else(|| {
                        ShardError::Internal("a lookup shard's node is not open".into())
                    })?;
                write_shard(connection, writes, removing)?;
            }
        }
        Ok(())
    })
}

/// The lookup shard that holds `value_id` at map `map_version`: its node
/// and table.
fn owner(lookup: &Lookup, value_id: i64, map_version: i64) -> Result<(Node, String)> {
    // (A statement run again after a move or split knows of a newer map
    // than its snapshot's catalog: then the owner committed now.)
    if crate::metadata::shard_lookup::map_version_now()? >= map_version {
        if let Some(shard) = crate::metadata::shard_lookup::shard_of(lookup.lookup_rel, value_id)? {
            return Ok((shard.node, shard.qualified));
        }
    }
    // Between a move's or split's map changes: the owner committed now.
    crate::metadata::shard_lookup::latest_owner(lookup.lookup_rel, value_id)?.ok_or_else(|| {
        ShardError::Timeout(format!(
            "the shard of lookup {} holding a value is being moved or split; run the statement \
             again",
            lookup.display
        ))
    })
}

/// One lookup shard's removals (`removing`) or additions.
fn write_shard(
    connection: &mut NodeConnection,
    writes: &ShardWrites,
    removing: bool,
) -> Result<()> {
    let lookup = &writes.lookup;
    let rows: Vec<(&String, i64, i64)> = writes
        .rows
        .iter()
        .filter(|(_, delta)| **delta != 0 && (**delta < 0) == removing)
        .map(|((value, key_id), delta)| (value, *key_id, *delta))
        .collect();
    for batch in rows.chunks(BATCH) {
        let value = |v: &str| format!("{}::{}", quote::literal(v), lookup.value_type);
        let table = &writes.qualified;
        if removing {
            let keys: Vec<String> = batch
                .iter()
                .map(|(v, key_id, _)| format!("({}, {key_id}::bigint)", value(v)))
                .collect();
            let keys = keys.join(", ");
            // Every entry removed must be found: one a transaction still
            // commits there (between the two phases of its commit) is not
            // visible yet, and a removal that missed it would leave it for
            // good. Then the statement fails, to be run again.
            let found = if lookup.unique {
                connection.execute(&format!(
                    "DELETE FROM {table} WHERE (value, keyspace_id) IN (VALUES {keys})"
                ))?
            } else {
                let counts: Vec<String> = batch
                    .iter()
                    .map(|(v, key_id, delta)| {
                        format!("({}, {key_id}::bigint, {delta}::bigint)", value(v))
                    })
                    .collect();
                let found = connection.execute(&format!(
                    "UPDATE {table} AS l SET rows = l.rows + c.delta \
                     FROM (VALUES {}) AS c (value, keyspace_id, delta) \
                     WHERE l.value = c.value AND l.keyspace_id = c.keyspace_id",
                    counts.join(", ")
                ))?;
                connection.execute(&format!(
                    "DELETE FROM {table} WHERE rows <= 0 AND (value, keyspace_id) IN (VALUES {keys})"
                ))?;
                found
            };
            if found.rows < batch.len() as u64 {
                return Err(ShardError::LookupEntryMissing(lookup.display.clone()));
            }
            continue;
        }
        let values: Vec<String> = batch
            .iter()
            .map(|(v, key_id, delta)| format!("({}, {key_id}, {delta})", value(v)))
            .collect();
        let values = values.join(", ");
        if !lookup.unique {
            connection.execute(&format!(
                "INSERT INTO {table} AS l (value, keyspace_id, rows) VALUES {values} \
                 ON CONFLICT (value, keyspace_id) DO UPDATE SET rows = l.rows + excluded.rows"
            ))?;
            continue;
        }
        // A value held already (or twice in the batch, or by two rows of
        // one key) inserts nothing: the first such value is the error.
        if let Some(&(v, _, _)) = batch.iter().find(|(_, _, delta)| *delta > 1) {
            return Err(duplicate(lookup, v));
        }
        let mut inserted: HashMap<String, usize> = HashMap::new();
        connection.for_each_row(
            &format!(
                "INSERT INTO {table} (value, keyspace_id, rows) VALUES {values} \
                 ON CONFLICT (value) DO NOTHING RETURNING value::text"
            ),
            &[],
            &[],
            |row| {
                *inserted.entry(row.text(0).unwrap_or_default()).or_default() += 1;
                Ok(())
            },
        )?;
        for (v, _, _) in batch {
            match inserted.get_mut(*v) {
                Some(count) if *count > 0 => *count -= 1,
                _ => return Err(duplicate(lookup, v)),
            }
        }
    }
    Ok(())
}

fn duplicate(lookup: &Lookup, value: &str) -> ShardError {
    ShardError::LookupDuplicate {
        lookup: lookup.display.clone(),
        column: lookup.column.clone(),
        value: value.to_string(),
    }
}
