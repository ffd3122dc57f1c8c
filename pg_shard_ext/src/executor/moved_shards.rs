//! Finding a routed statement's shards again after a move or split.
//!
//! A router plan names shard tables. The map may change under it: a plan
//! cached across a move, or a statement that reached the old owner while
//! the move's cutover held it, is refused there (PS001: the shard is
//! retired; or 42P01 once the old table is dropped). Like the coordinator,
//! the statement then waits for the new map and runs again where its keys
//! now live, provided nothing of its transaction has run on the workers
//! before it (autocommit, or the transaction's first statement): rolling
//! back what it began loses nothing.

use super::pushdown_scan::NodeTask;
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// Runs of a statement in all, the first included (as the coordinator's
/// `--wrong-shard-tries`).
pub(crate) const TRIES: u32 = 3;

/// How long a refused statement waits for a newer map before it gives up
/// and reports the refusal.
const MAP_WAIT: Duration = Duration::from_secs(5);

/// A shard table a router plan names, and how to find it again: its
/// logical table and the keyspace id it holds (None: the one the plan's
/// key parameter gives when it runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ShardTarget {
    pub(crate) name: String,
    pub(crate) relid: pg_sys::Oid,
    pub(crate) keyspace_id: Option<i64>,
}

impl ShardTarget {
    /// Three strings each, for a plan's private list.
    pub(crate) fn encode(targets: &[ShardTarget]) -> Vec<String> {
        targets
            .iter()
            .flat_map(|t| {
                [
                    t.name.clone(),
                    t.relid.to_u32().to_string(),
                    t.keyspace_id.map(|id| id.to_string()).unwrap_or_default(),
                ]
            })
            .collect()
    }

    pub(crate) fn decode(fields: &[String]) -> Result<Vec<ShardTarget>> {
        let damaged = || ShardError::Internal("a router plan with a damaged shard list".into());
        fields
            .chunks(3)
            .map(|chunk| {
                let [name, relid, keyspace_id] = chunk else {
                    return Err(damaged());
                };
                Ok(ShardTarget {
                    name: name.clone(),
                    relid: pg_sys::Oid::from(relid.parse::<u32>().map_err(|_| damaged())?),
                    keyspace_id: if keyspace_id.is_empty() {
                        None
                    } else {
                        Some(keyspace_id.parse().map_err(|_| damaged())?)
                    },
                })
            })
            .collect()
    }
}

/// Where a statement's shards are: for each target the node and table
/// holding its keyspace id (`parameter_id` for the parameter-keyed ones),
/// found by `owner`; all must be on one node. The query's shard names are
/// replaced by the ones found. None when a shard has no single active
/// placement.
pub(crate) fn locate(
    targets: &[ShardTarget],
    parameter_id: Option<i64>,
    query: &str,
    owner: impl Fn(pg_sys::Oid, i64) -> Result<Option<(Node, String)>>,
) -> Result<Option<(Node, String)>> {
    let mut node: Option<Node> = None;
    let mut renames = Vec::with_capacity(targets.len());
    for target in targets {
        // `key = NULL` (a parameter-keyed read) matches no row on any shard.
        let keyspace_id = target.keyspace_id.or(parameter_id).unwrap_or(i64::MIN);
        let Some((found, table)) = owner(target.relid, keyspace_id)? else {
            return Ok(None);
        };
        match &node {
            None => node = Some(found),
            Some(node) if *node != found => return Ok(None),
            Some(_) => {}
        }
        if table != target.name {
            renames.push((target.name.clone(), table));
        }
    }
    let Some(node) = node else {
        return Ok(None);
    };
    Ok(Some((node, crate::quote::replace_names(query, &renames))))
}

/// Runs a pushdown or multi-shard DML statement: `run` with None runs the
/// plan's own tasks; if a shard refuses them because it moved or split,
/// and the statement may run again ([`may_run_again`]), waits for the new
/// map, finds the shard groups again from the plan's encoded `targets`
/// ([`ShardGroupTargets`]) and runs `run` with those tasks, up to
/// [`TRIES`] runs in all. `run` gets the map version to declare.
pub(crate) fn run_over_shard_groups<T>(
    map_version: i64,
    targets: &[String],
    mut run: impl FnMut(Option<&[NodeTask]>, i64) -> Result<T>,
) -> Result<T> {
    let may_run_again = may_run_again();
    let mut map_version = map_version;
    let mut found_again: Option<Vec<NodeTask>> = None;
    let mut tries = 1;
    loop {
        match run(found_again.as_deref(), map_version) {
            Err(error) if may_run_again && tries < TRIES && is_wrong_shard(&error) => {
                // What it began on the nodes is rolled back; the new map
                // says where the shard groups are.
                crate::transaction::remote::roll_back_statement();
                let Some(version) = wait_for_newer_map(map_version)? else {
                    return Err(error);
                };
                let targets = ShardGroupTargets::decode(targets)?;
                // SAFETY: the targets of a plan made in this database.
                let Some(tasks) = (unsafe { crate::planner::shard_group_tasks_again(&targets)? })
                else {
                    return Err(error);
                };
                found_again = Some(tasks);
                map_version = version;
                tries += 1;
            }
            result => return result,
        }
    }
}

/// Whether a worker's error says the statement reached a shard that is
/// not (or no longer) there for it.
pub(crate) fn is_wrong_shard(error: &ShardError) -> bool {
    matches!(error, ShardError::RemoteStatement { sqlstate, .. }
        if sqlstate == "PS001" || sqlstate == "42P01")
}

/// Whether the statement about to run may run again after such an error:
/// its transaction has nothing on the workers yet and wrote nothing here.
pub(crate) fn may_run_again() -> bool {
    // SAFETY: reads whether the local transaction has an id.
    let local_wrote = unsafe { pg_sys::GetTopTransactionIdIfAny() } != pg_sys::InvalidTransactionId;
    crate::transaction::remote::none_open() && !local_wrote
}

/// Waits until a map newer than `seen` is committed, and returns its
/// version; None if none came within [`MAP_WAIT`]. A cancel or
/// statement_timeout ends the wait.
pub(crate) fn wait_for_newer_map(seen: i64) -> Result<Option<i64>> {
    let deadline = Instant::now() + MAP_WAIT;
    let mut pause = Duration::from_millis(2);
    loop {
        let version = crate::metadata::shard_lookup::latest_map_version()?;
        if version > seen {
            crate::metadata::shard_lookup::forget();
            return Ok(Some(version));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        crate::latch::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// What a pushdown or multi-shard DML plan keeps to find its shard groups
/// again (the router's [`ShardTarget`]s name one shard each; these
/// statements read or write every shard group their key conditions allow,
/// which a split may have made two): the worker query's tree and what the
/// planner split it over, for `planner::shard_group_tasks_again` under the
/// new map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ShardGroupTargets {
    /// The worker query (`nodeToString`).
    pub(crate) worker: String,
    pub(crate) distributed: Vec<pg_sys::Oid>,
    pub(crate) references: Vec<pg_sys::Oid>,
    /// The keyspace ids the key conditions allow (None: every one).
    pub(crate) keyspace_ids: Option<Vec<i64>>,
    /// One statement per shard group (DML) rather than rows.
    pub(crate) statements: bool,
}

/// The strings [`ShardGroupTargets::encode`] makes.
pub(crate) const SHARD_GROUP_TARGET_FIELDS: usize = 5;

impl ShardGroupTargets {
    /// Strings for a plan's private list.
    pub(crate) fn encode(&self) -> [String; SHARD_GROUP_TARGET_FIELDS] {
        let list = |values: &mut dyn Iterator<Item = String>| values.collect::<Vec<_>>().join(",");
        [
            self.worker.clone(),
            list(&mut self.distributed.iter().map(|o| o.to_u32().to_string())),
            list(&mut self.references.iter().map(|o| o.to_u32().to_string())),
            match &self.keyspace_ids {
                None => "*".to_string(),
                Some(ids) => list(&mut ids.iter().map(|id| id.to_string())),
            },
            if self.statements { "t" } else { "f" }.to_string(),
        ]
    }

    pub(crate) fn decode(fields: &[String]) -> Result<ShardGroupTargets> {
        let damaged =
            || ShardError::Internal("a distributed plan with a damaged shard list".into());
        let [worker, distributed, references, keyspace_ids, statements] = fields else {
            return Err(damaged());
        };
        let oids = |text: &str| -> Result<Vec<pg_sys::Oid>> {
            text.split(',')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<u32>()
                        .map(pg_sys::Oid::from)
                        .map_err(|_| damaged())
                })
                .collect()
        };
        Ok(ShardGroupTargets {
            worker: worker.clone(),
            distributed: oids(distributed)?,
            references: oids(references)?,
            keyspace_ids: if keyspace_ids == "*" {
                None
            } else {
                Some(
                    keyspace_ids
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(|s| s.parse().map_err(|_| damaged()))
                        .collect::<Result<_>>()?,
                )
            },
            statements: statements == "t",
        })
    }
}
