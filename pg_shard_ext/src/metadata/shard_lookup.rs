//! What the router reads from the catalog, cached per map version (and
//! emptied on every relcache invalidation: tables distributed, dropped or
//! altered, partitions replaced): which tables are reference tables and
//! where their copies are, and each distributed table's active shards with
//! their ranges, nodes, tables and foreign partitions; and the read
//! routes of reads-first jobs (`pg_shard.read_route`).

use super::Node;
use crate::error::{Result, ShardError};
use pgrx::prelude::*;
use std::collections::HashMap;

/// One shard of a distributed table, where the router finds it.
#[derive(Clone)]
pub(crate) struct Shard {
    pub(crate) node: Node,
    /// Its table on the node, quoted.
    pub(crate) qualified: String,
    /// The metadata node's foreign partition standing for it
    /// (`InvalidOid` between a move's or split's new map and its cleanup).
    pub(crate) partition: pg_sys::Oid,
}

/// Catalog reads from now on are for map `version` (a newer one empties
/// the cache).
pub(crate) fn at_version(version: i64) {
    CACHE.with(|cache| cache.borrow_mut().at_version(version));
}

pub(crate) fn is_reference_table(relid: pg_sys::Oid) -> Result<bool> {
    if let Some(known) = CACHE.with(|cache| cache.borrow().references.get(&relid).copied()) {
        return Ok(known);
    }
    let reference = read_is_reference_table(relid)?;
    CACHE.with(|cache| cache.borrow_mut().references.insert(relid, reference));
    Ok(reference)
}

fn read_is_reference_table(relid: pg_sys::Oid) -> Result<bool> {
    Ok(crate::spi::query_one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_shard.logical_table \
                        WHERE table_rel = $1 AND kind = 'reference')",
        &[relid.into()],
    )?
    .unwrap_or(false))
}

/// One of `relid`'s active shards, standing in for the one a parameter
/// picks.
pub(crate) fn any_shard(relid: pg_sys::Oid) -> Result<Option<Shard>> {
    // (The lowest keyspace id: every co-located table's first group.)
    shard_of(relid, i64::MIN)
}

/// The map version the router's catalog reads are for: read again after
/// an invalidation emptied them (a plan may have been made at an older one).
pub(crate) fn map_version_now() -> Result<i64> {
    if let Some(version) = CACHE.with(|cache| cache.borrow().version) {
        return Ok(version);
    }
    let version = crate::metadata::catalog::current_map_version()?;
    CACHE.with(|cache| cache.borrow_mut().at_version(version));
    Ok(version)
}

/// A reference table's copy on `node_id`, quoted; None if it has none
/// there that is active.
pub(crate) fn reference_copy(relid: pg_sys::Oid, node_id: i32) -> Result<Option<String>> {
    let key = (relid, node_id);
    if let Some(known) = CACHE.with(|cache| cache.borrow().copies.get(&key).cloned()) {
        return Ok(known);
    }
    let copy = read_reference_copy(relid, node_id)?;
    CACHE.with(|cache| cache.borrow_mut().copies.insert(key, copy.clone()));
    Ok(copy)
}

fn read_reference_copy(relid: pg_sys::Oid, node_id: i32) -> Result<Option<String>> {
    crate::spi::query_one::<String>(
        "SELECT pg_catalog.quote_ident(s.shard_schema) || '.' || pg_catalog.quote_ident(s.shard_name) \
         FROM pg_shard.shard s JOIN pg_shard.placement p USING (shard_group_id) \
         WHERE s.table_rel = $1 AND p.node_id = $2 AND p.state = 'active' LIMIT 1",
        &[relid.into(), node_id.into()],
    )
}

/// The active shard of `relid` holding `keyspace_id`, with its foreign
/// partition; None while its group is frozen or moving (the fdw path then
/// waits or fails as before).
pub(crate) fn shard_of(relid: pg_sys::Oid, keyspace_id: i64) -> Result<Option<Shard>> {
    cache_shards(relid)?;
    Ok(CACHE.with(|cache| {
        let cache = cache.borrow();
        let shards = cache.shards.get(&relid)?;
        let mut holding = shards
            .iter()
            .filter(|(start, end, _)| (*start..=*end).contains(&keyspace_id));
        match (holding.next(), holding.next()) {
            (Some((_, _, shard)), None) => Some(shard.clone()),
            // None, or two placements (a move between its phases).
            _ => None,
        }
    }))
}

/// Whether the map has read routes: a reads-first job sends the reads of
/// a range to its new copy (`operations::reads_first`).
pub(crate) fn has_read_routes() -> Result<bool> {
    cache_read_routes()?;
    Ok(CACHE.with(|cache| {
        cache
            .borrow()
            .read_routes
            .as_ref()
            .is_some_and(|routes| !routes.is_empty())
    }))
}

/// Where a read of `relid`'s `keyspace_id` goes: a read route's node and
/// table when a reads-first job has one for it, else the active shard's
/// (as [`shard_of`]); the table quoted.
pub(crate) fn reader_of(relid: pg_sys::Oid, keyspace_id: i64) -> Result<Option<(Node, String)>> {
    cache_read_routes()?;
    let routed = CACHE.with(|cache| {
        cache.borrow().read_routes.as_ref().and_then(|routes| {
            routes
                .iter()
                .find(|route| {
                    route.relid == relid && (route.start..=route.end).contains(&keyspace_id)
                })
                .map(|route| (route.node.clone(), route.qualified.clone()))
        })
    });
    if routed.is_some() {
        return Ok(routed);
    }
    Ok(shard_of(relid, keyspace_id)?.map(|shard| (shard.node, shard.qualified)))
}

fn cache_read_routes() -> Result<()> {
    if CACHE.with(|cache| cache.borrow().read_routes.is_some()) {
        return Ok(());
    }
    let routes = crate::spi::connect(|client| {
        let rows = client.select(
            "SELECT r.table_rel::oid, n.node_id, n.host, n.port, \
                    pg_catalog.quote_ident(r.shard_schema) || '.' || pg_catalog.quote_ident(r.shard_name), \
                    r.range_start, r.range_end \
             FROM pg_shard.read_route r JOIN pg_shard.node n USING (node_id)",
            None,
            &[],
        )?;
        let mut routes = Vec::new();
        for row in rows {
            let (Some(relid), Some(qualified), Some(start), Some(end)) = (
                row.get::<pg_sys::Oid>(1)?,
                row.get::<String>(5)?,
                row.get::<i64>(6)?,
                row.get::<i64>(7)?,
            ) else {
                continue;
            };
            routes.push(ReadRoute {
                relid,
                start,
                end,
                node: Node::from_row(&row, 2)?,
                qualified,
            });
        }
        Ok::<_, ShardError>(routes)
    })?;
    CACHE.with(|cache| cache.borrow_mut().read_routes = Some(routes));
    Ok(())
}

/// A range of a table whose reads a reads-first job sends to its new copy.
struct ReadRoute {
    relid: pg_sys::Oid,
    start: i64,
    end: i64,
    node: Node,
    /// The new copy's table on `node`, quoted.
    qualified: String,
}

/// The start of every range of `relid`'s shard groups with its active
/// shard, in keyspace order; None while a group has no single active
/// placement (frozen or moving: the postgres_fdw path then waits or fails
/// as before).
pub(crate) fn shard_ranges(relid: pg_sys::Oid) -> Result<Option<Vec<(i64, Shard)>>> {
    cache_shards(relid)?;
    Ok(CACHE.with(|cache| tiled(cache.borrow().shards.get(&relid)?.clone())))
}

/// [`shard_ranges`] as committed now, not as the statement's snapshot
/// sees them (uncached): for a statement that runs again once a move or
/// split published its map. The foreign partitions, which the move
/// replaces after it publishes, may be missing then (`InvalidOid`).
pub(crate) fn latest_shard_ranges(relid: pg_sys::Oid) -> Result<Option<Vec<(i64, Shard)>>> {
    Ok(tiled(crate::spi::with_latest_snapshot(|| {
        active_shards(relid)
    })?))
}

/// The ranges in keyspace order, if they tile the keyspace with one
/// placement each.
fn tiled(mut shards: Vec<(i64, i64, Shard)>) -> Option<Vec<(i64, Shard)>> {
    shards.sort_by_key(|(start, _, _)| *start);
    let mut next = i64::MIN;
    let mut ranges = Vec::with_capacity(shards.len());
    for (start, end, shard) in shards {
        if start != next {
            return None;
        }
        ranges.push((start, shard));
        if end == i64::MAX {
            return Some(ranges);
        }
        next = end.checked_add(1)?;
    }
    None
}

/// Read `relid`'s active shards into the cache, unless they are there.
/// A placement whose foreign partition is not there (a move's or split's
/// new map is published, its cleanup has not replaced the partitions yet;
/// or the statement's snapshot still shows a partition the cleanup has
/// dropped since) has none (`InvalidOid`: router and pushdown statements
/// name the distributed table itself for it), and such a read is not
/// kept: it is read again until the partitions are there. (The
/// replacement's invalidation comes before such a read — a statement takes
/// its snapshot before it locks its tables — so a kept read would stay for
/// the rest of the map version.)
fn cache_shards(relid: pg_sys::Oid) -> Result<()> {
    let cached = CACHE.with(|cache| {
        let cache = cache.borrow();
        cache.shards.contains_key(&relid) && !cache.incomplete.contains(&relid)
    });
    if !cached {
        let mut shards = active_shards(relid)?;
        let mut complete = true;
        for (_, _, shard) in &mut shards {
            if !partition_exists(shard.partition) {
                shard.partition = pg_sys::InvalidOid;
                complete = false;
            }
        }
        CACHE.with(|cache| {
            let mut cache = cache.borrow_mut();
            cache.shards.insert(relid, shards);
            if complete {
                cache.incomplete.remove(&relid);
            } else {
                cache.incomplete.insert(relid);
            }
        });
    }
    Ok(())
}

/// Whether foreign partition `partition` exists now (the syscache sees
/// what is committed, not the statement's snapshot).
fn partition_exists(partition: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup; NULL when there is no such relation.
    partition != pg_sys::InvalidOid && unsafe { !pg_sys::get_rel_name(partition).is_null() }
}

/// Every active placement of `relid`'s shards: range, node, table, foreign
/// partition (`InvalidOid` while there is none).
fn active_shards(relid: pg_sys::Oid) -> Result<Vec<(i64, i64, Shard)>> {
    crate::spi::connect(|client| {
        let rows = client.select(
            "SELECT n.node_id, n.host, n.port, \
                    pg_catalog.quote_ident(s.shard_schema) || '.' || pg_catalog.quote_ident(s.shard_name), \
                    (SELECT i.inhrelid FROM pg_catalog.pg_inherits i \
                       JOIN pg_catalog.pg_foreign_table f ON f.ftrelid = i.inhrelid \
                      WHERE i.inhparent = s.table_rel \
                        AND ('table_name=' || s.shard_name) = ANY (f.ftoptions) \
                        AND ('schema_name=' || s.shard_schema) = ANY (f.ftoptions) \
                      LIMIT 1), \
                    g.range_start, g.range_end \
             FROM pg_shard.shard s JOIN pg_shard.shard_group g USING (shard_group_id) \
             JOIN pg_shard.placement p USING (shard_group_id) JOIN pg_shard.node n USING (node_id) \
             WHERE s.table_rel = $1 AND p.state = 'active'",
            None,
            &[relid.into()],
        )?;
        let mut shards = Vec::new();
        for row in rows {
            let (Some(qualified), partition, Some(start), Some(end)) = (
                row.get::<String>(4)?,
                row.get::<pg_sys::Oid>(5)?,
                row.get::<i64>(6)?,
                row.get::<i64>(7)?,
            ) else {
                continue;
            };
            let partition = partition.unwrap_or(pg_sys::InvalidOid);
            shards.push((
                start,
                end,
                Shard {
                    node: Node::from_row(&row, 1)?,
                    qualified,
                    partition,
                },
            ));
        }
        Ok::<_, ShardError>(shards)
    })
}

/// What the router read from the catalog, for the map version it read it
/// at; emptied on every relcache invalidation too ([`forget`]).
#[derive(Default)]
struct RouterCache {
    version: Option<i64>,
    references: HashMap<pg_sys::Oid, bool>,
    copies: HashMap<(pg_sys::Oid, i32), Option<String>>,
    shards: HashMap<pg_sys::Oid, Vec<(i64, i64, Shard)>>,
    /// Every read route of the map (None: not read yet).
    read_routes: Option<Vec<ReadRoute>>,
    /// Tables whose `shards` lack a placement's foreign partition: read
    /// again each time.
    incomplete: std::collections::HashSet<pg_sys::Oid>,
}

impl RouterCache {
    fn at_version(&mut self, version: i64) {
        if self.version != Some(version) {
            *self = RouterCache {
                version: Some(version),
                ..RouterCache::default()
            };
        }
    }
}

thread_local! {
    static CACHE: std::cell::RefCell<RouterCache> = std::cell::RefCell::new(RouterCache::default());
}

/// Forget what the router read (called on every relcache invalidation:
/// tables distributed, dropped or altered, partitions replaced).
pub(crate) fn forget() {
    CACHE.with(|cache| *cache.borrow_mut() = RouterCache::default());
}

/// The map version committed now.
pub(crate) fn latest_map_version() -> Result<i64> {
    crate::spi::with_latest_snapshot(crate::metadata::catalog::current_map_version)
}

/// Where the shard of `relid` holding `keyspace_id` is now, as committed:
/// its node and its table there (quoted); None if no single active
/// placement holds it. Uncached, and without the foreign partition (which
/// a move or split replaces after it publishes the new map).
pub(crate) fn latest_owner(relid: pg_sys::Oid, keyspace_id: i64) -> Result<Option<(Node, String)>> {
    crate::spi::with_latest_snapshot(|| {
        crate::spi::connect(|client| {
            let rows = client.select(
                "SELECT n.node_id, n.host, n.port, \
                        pg_catalog.quote_ident(s.shard_schema) || '.' || pg_catalog.quote_ident(s.shard_name) \
                 FROM pg_shard.shard s JOIN pg_shard.shard_group g USING (shard_group_id) \
                 JOIN pg_shard.placement p USING (shard_group_id) JOIN pg_shard.node n USING (node_id) \
                 WHERE s.table_rel = $1 AND p.state = 'active' \
                   AND $2 BETWEEN g.range_start AND g.range_end",
                None,
                &[relid.into(), keyspace_id.into()],
            )?;
            if rows.len() != 1 {
                return Ok(None);
            }
            let mut found = None;
            for row in rows {
                let Some(table) = row.get::<String>(4)? else {
                    return Ok(None);
                };
                found = Some((Node::from_row(&row, 1)?, table));
            }
            Ok::<_, ShardError>(found)
        })
    })
}
