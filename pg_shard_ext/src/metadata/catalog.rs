//! Reads and writes of the metadata node's catalog (schema pg_shard), and the
//! map version that every change to ranges or placements bumps.

use super::node::Node;
use crate::error::{OrReport, Result};
use crate::spi::{query_one, query_value};
use pgrx::prelude::*;

thread_local! {
    /// While [`as_extension_owner`] runs: the role it stands in for.
    static ACTING_USER: std::cell::Cell<Option<pg_sys::Oid>> =
        const { std::cell::Cell::new(None) };
}

/// Run `work` as the extension's owner (the superuser who created it), for
/// catalog writes that follow a change the current role was allowed to make
/// (its own table's schema change, a write to a reference table): the
/// catalog tables are not writable by other roles. Connections to workers
/// made meanwhile still act as the current role ([`acting_user`]), so the
/// workers check its privileges on the shard tables.
pub(crate) fn as_extension_owner<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    if crate::access::is_superuser() {
        // Writes the catalog anyway; connections go out as this role.
        return work();
    }
    let owner = query_value::<pg_sys::Oid>(
        "SELECT extowner FROM pg_catalog.pg_extension WHERE extname = 'pg_shard'",
    )?;
    let Some(owner) = owner else {
        return work();
    };
    let (mut user, mut context) = (pg_sys::InvalidOid, 0);
    // SAFETY: reads the backend's current user and security context.
    unsafe { pg_sys::GetUserIdAndSecContext(&mut user, &mut context) };
    struct Restore {
        user: pg_sys::Oid,
        context: i32,
        acting: Option<pg_sys::Oid>,
    }
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: puts back what GetUserIdAndSecContext returned (also
            // while an error unwinds; an abort resets it as well).
            unsafe { pg_sys::SetUserIdAndSecContext(self.user, self.context) };
            ACTING_USER.set(self.acting);
        }
    }
    let acting = ACTING_USER.get();
    let _restore = Restore {
        user,
        context,
        acting,
    };
    // As for a SECURITY DEFINER function: names resolve in pg_catalog (and
    // temporary relations last), never in a schema the role could plant a
    // function or table in.
    crate::settings::with_settings(crate::settings::CATALOG_ONLY, || {
        ACTING_USER.set(Some(acting.unwrap_or(user)));
        // SAFETY: a user switch for this backend, undone by `_restore`;
        // SECURITY_LOCAL_USERID_CHANGE keeps SET ROLE from undoing it
        // meanwhile.
        unsafe {
            pg_sys::SetUserIdAndSecContext(
                owner,
                context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
            )
        };
        work()
    })
}

/// The role the current statement acts as: the current user, or inside
/// [`as_extension_owner`] the one it stands in for.
pub(crate) fn acting_user() -> Result<String> {
    // SAFETY: the current user's id.
    let user = ACTING_USER
        .get()
        .unwrap_or_else(|| unsafe { pg_sys::GetUserId() });
    // SAFETY: a syscache lookup of an existing role (the current one, or
    // the one as_extension_owner stands in for), copied out.
    let name = unsafe { std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(user, false)) };
    Ok(name.to_string_lossy().into_owned())
}

/// Like [`crate::spi::query_one`] for a statement that writes the catalog
/// (`INSERT … RETURNING`, `nextval`): runs with a fresh snapshot per
/// statement, as the extension's owner (the role's right to the change was
/// checked before).
pub(crate) fn write_returning<T: FromDatum + IntoDatum>(
    query: &str,
    args: &[pgrx::datum::DatumWithOid<'_>],
) -> Result<Option<T>> {
    as_extension_owner(|| crate::spi::update_one(query, args))
}

/// A statement that writes the catalog, as the extension's owner.
pub(crate) fn write(query: &str, args: &[pgrx::datum::DatumWithOid<'_>]) -> Result<()> {
    as_extension_owner(|| {
        crate::spi::run_with_args(query, args)?;
        Ok(())
    })
}

/// A co-location group: tables that share ranges and placements.
#[derive(Clone, Debug)]
pub(crate) struct ColocationGroup {
    pub(crate) colocation_id: i32,
    pub(crate) shard_count: i32,
    pub(crate) key_encoding: Option<String>,
}

/// One range of a co-location group and the node holding it.
#[derive(Clone, Debug)]
pub(crate) struct ShardGroup {
    pub(crate) shard_group_id: i64,
    pub(crate) range_start: i64,
    pub(crate) range_end: i64,
    pub(crate) node: Node,
}

/// `pg_shard.map_version() → bigint`: the current version of the shard map.
#[pg_extern(schema = "pg_shard", stable, parallel_safe)]
fn map_version() -> i64 {
    current_map_version().or_report()
}

pub(crate) fn current_map_version() -> Result<i64> {
    Ok(query_value::<i64>("SELECT version FROM pg_shard.map_state WHERE singleton")?.unwrap_or(0))
}

/// Increment the map version in the current transaction and announce it on
/// the `pg_shard_map` channel (delivered at commit, so listeners never see a
/// version that was rolled back).
pub(crate) fn bump_map_version() -> Result<i64> {
    bump_map_version_for(&[])
}

/// [`bump_map_version`] for a change of the shard groups `groups` (a
/// move, a split or a revert, written before): the announcement carries
/// their shards as they are now ([`super::map_change`]).
pub(crate) fn bump_map_version_for(groups: &[i64]) -> Result<i64> {
    // (The foreign servers' options are the extension owner's too.)
    as_extension_owner(|| bump_as_owner(groups))
}

fn bump_as_owner(groups: &[i64]) -> Result<i64> {
    let version = write_returning::<i64>(
        "INSERT INTO pg_shard.map_state AS m (singleton, version) VALUES (true, 1) \
         ON CONFLICT (singleton) DO UPDATE SET version = m.version + 1 \
         RETURNING version",
        &[],
    )?
    .unwrap_or(1);
    crate::spi::run_with_args(
        "SELECT pg_catalog.pg_notify('pg_shard_map', $1)",
        &[super::map_change::notification(version, groups)?.into()],
    )?;
    super::fdw::declare_map_version(version)?;
    Ok(version)
}

fn nodes_where(filter: &str) -> Result<Vec<Node>> {
    let query = format!("SELECT node_id, host, port FROM pg_shard.node {filter} ORDER BY node_id");
    crate::spi::connect(|client| {
        let mut nodes = Vec::new();
        for row in client.select(&query, None, &[])? {
            nodes.push(Node::from_row(&row, 1)?);
        }
        Ok(nodes)
    })
}

/// Every node, active or not, in node id order.
pub(crate) fn all_nodes() -> Result<Vec<Node>> {
    nodes_where("")
}

/// Active worker nodes, in node id order (the round-robin placement order).
pub(crate) fn active_nodes() -> Result<Vec<Node>> {
    nodes_where("WHERE state = 'active'")
}

pub(crate) fn node_by_address(host: &str, port: i32) -> Result<Option<i32>> {
    query_one::<i32>(
        "SELECT node_id FROM pg_shard.node WHERE host = $1 AND port = $2",
        &[host.into(), port.into()],
    )
}

pub(crate) fn insert_node(host: &str, port: i32) -> Result<i32> {
    Ok(write_returning::<i32>(
        "INSERT INTO pg_shard.node (host, port) VALUES ($1, $2) RETURNING node_id",
        &[host.into(), port.into()],
    )?
    .unwrap_or_default())
}

pub(crate) fn colocation_group(colocation_id: i32) -> Result<Option<ColocationGroup>> {
    crate::spi::connect(|client| {
        let rows = client.select(
            "SELECT colocation_id, shard_count, key_encoding FROM pg_shard.colocation_group \
             WHERE colocation_id = $1",
            Some(1),
            &[colocation_id.into()],
        )?;
        read_group(rows.into_iter().next())
    })
}

/// The oldest distributed co-location group with this shard count and key
/// encoding: tables of the same shape are co-located by default.
pub(crate) fn default_colocation_group(
    shard_count: i32,
    key_encoding: &str,
) -> Result<Option<ColocationGroup>> {
    crate::spi::connect(|client| {
        let rows = client.select(
            "SELECT colocation_id, shard_count, key_encoding FROM pg_shard.colocation_group \
             WHERE kind = 'distributed' AND shard_count = $1 AND key_encoding = $2 \
             ORDER BY colocation_id LIMIT 1",
            Some(1),
            &[shard_count.into(), key_encoding.into()],
        )?;
        read_group(rows.into_iter().next())
    })
}

fn read_group(row: Option<pgrx::spi::SpiHeapTupleData<'_>>) -> Result<Option<ColocationGroup>> {
    match row {
        None => Ok(None),
        Some(row) => Ok(Some(ColocationGroup {
            colocation_id: row.get::<i32>(1)?.unwrap_or_default(),
            shard_count: row.get::<i32>(2)?.unwrap_or_default(),
            key_encoding: row.get::<String>(3)?,
        })),
    }
}

pub(crate) fn insert_colocation_group(
    kind: &str,
    shard_count: i32,
    key_encoding: Option<&str>,
) -> Result<i32> {
    Ok(write_returning::<i32>(
        "INSERT INTO pg_shard.colocation_group (kind, shard_count, key_encoding) \
         VALUES ($1, $2, $3) RETURNING colocation_id",
        &[kind.into(), shard_count.into(), key_encoding.into()],
    )?
    .unwrap_or_default())
}

pub(crate) fn insert_shard_group(
    colocation_id: i32,
    range_start: i64,
    range_end: i64,
) -> Result<i64> {
    Ok(write_returning::<i64>(
        "INSERT INTO pg_shard.shard_group (colocation_id, range_start, range_end) \
         VALUES ($1, $2, $3) RETURNING shard_group_id",
        &[colocation_id.into(), range_start.into(), range_end.into()],
    )?
    .unwrap_or_default())
}

pub(crate) fn insert_placement(shard_group_id: i64, node_id: i32) -> Result<()> {
    write(
        "INSERT INTO pg_shard.placement (shard_group_id, node_id) VALUES ($1, $2)",
        &[shard_group_id.into(), node_id.into()],
    )?;
    Ok(())
}

/// The shard groups of a co-location group with their placements, in range
/// order. A reference group has one shard group placed on every node; it is
/// returned once per placement.
pub(crate) fn shard_groups(colocation_id: i32) -> Result<Vec<ShardGroup>> {
    crate::spi::connect(|client| {
        let mut groups = Vec::new();
        let rows = client.select(
            "SELECT g.shard_group_id, g.range_start, g.range_end, n.node_id, n.host, n.port \
             FROM pg_shard.shard_group g \
             JOIN pg_shard.placement p USING (shard_group_id) \
             JOIN pg_shard.node n USING (node_id) \
             WHERE g.colocation_id = $1 \
             ORDER BY g.range_start, n.node_id",
            None,
            &[colocation_id.into()],
        )?;
        for row in rows {
            groups.push(ShardGroup {
                shard_group_id: row.get::<i64>(1)?.unwrap_or_default(),
                range_start: row.get::<i64>(2)?.unwrap_or_default(),
                range_end: row.get::<i64>(3)?.unwrap_or_default(),
                node: Node::from_row(&row, 4)?,
            });
        }
        Ok(groups)
    })
}

pub(crate) fn insert_logical_table(
    relid: pg_sys::Oid,
    kind: &str,
    dist_column: Option<&str>,
    colocation_id: i32,
) -> Result<()> {
    write(
        "INSERT INTO pg_shard.logical_table (table_rel, kind, dist_column, colocation_id) \
         VALUES ($1::oid::regclass, $2, $3, $4)",
        &[
            relid.into(),
            kind.into(),
            dist_column.into(),
            colocation_id.into(),
        ],
    )?;
    Ok(())
}

/// The sequences owned by columns of `relid` (serial columns), as
/// (sequence, quoted column).
pub(crate) fn owned_sequences(relid: pg_sys::Oid) -> Result<Vec<(String, String)>> {
    crate::spi::connect(|client| {
        let mut sequences = Vec::new();
        for row in client.select(
            "SELECT format('%I.%I', n.nspname, s.relname), quote_ident(a.attname) \
             FROM pg_depend d \
             JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' \
             JOIN pg_namespace n ON n.oid = s.relnamespace \
             JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid \
             WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass \
               AND d.refobjid = $1 AND d.deptype = 'a'",
            None,
            &[relid.into()],
        )? {
            sequences.push((
                row.get::<String>(1)?.unwrap_or_default(),
                row.get::<String>(2)?.unwrap_or_default(),
            ));
        }
        Ok(sequences)
    })
}

/// Record an index or constraint that a distributed table's shards carry.
pub(crate) fn insert_table_constraint(
    relid: pg_sys::Oid,
    kind: char,
    name: &str,
    definition: &str,
    unique_index: bool,
) -> Result<()> {
    write(
        "INSERT INTO pg_shard.table_constraint (table_rel, kind, name, definition, unique_index) \
         VALUES ($1, $2::text::\"char\", $3, $4, $5)",
        &[
            relid.into(),
            kind.to_string().into(),
            name.into(),
            definition.into(),
            unique_index.into(),
        ],
    )?;
    Ok(())
}

pub(crate) fn next_shard_id() -> Result<i64> {
    Ok(write_returning::<i64>("SELECT nextval('pg_shard.shard_id_seq')", &[])?.unwrap_or_default())
}

pub(crate) fn insert_shard(
    shard_id: i64,
    relid: pg_sys::Oid,
    shard_group_id: i64,
    shard_schema: &str,
    shard_name: &str,
) -> Result<()> {
    write(
        "INSERT INTO pg_shard.shard (shard_id, table_rel, shard_group_id, shard_schema, shard_name) \
         VALUES ($1, $2::oid::regclass, $3, $4, $5)",
        &[
            shard_id.into(),
            relid.into(),
            shard_group_id.into(),
            shard_schema.into(),
            shard_name.into(),
        ],
    )?;
    Ok(())
}

/// Reference tables, for copying onto a newly added node.
pub(crate) fn reference_tables() -> Result<Vec<(pg_sys::Oid, i64)>> {
    crate::spi::connect(|client| {
        let mut tables = Vec::new();
        let rows = client.select(
            "SELECT t.table_rel::oid, g.shard_group_id FROM pg_shard.logical_table t \
             JOIN pg_shard.shard_group g USING (colocation_id) \
             WHERE t.kind = 'reference' ORDER BY t.table_rel::oid",
            None,
            &[],
        )?;
        for row in rows {
            tables.push((
                row.get::<pg_sys::Oid>(1)?.unwrap_or(pg_sys::InvalidOid),
                row.get::<i64>(2)?.unwrap_or_default(),
            ));
        }
        Ok(tables)
    })
}

/// The shard of `relid` in a shard group: (shard_id, schema, name).
pub(crate) fn shard_in_group(
    relid: pg_sys::Oid,
    shard_group_id: i64,
) -> Result<Option<(i64, String, String)>> {
    crate::spi::connect(|client| {
        let rows = client.select(
            "SELECT shard_id, shard_schema, shard_name FROM pg_shard.shard \
             WHERE table_rel = $1 AND shard_group_id = $2",
            Some(1),
            &[relid.into(), shard_group_id.into()],
        )?;
        match rows.into_iter().next() {
            None => Ok(None),
            Some(row) => Ok(Some((
                row.get::<i64>(1)?.unwrap_or_default(),
                row.get::<String>(2)?.unwrap_or_default(),
                row.get::<String>(3)?.unwrap_or_default(),
            ))),
        }
    })
}

/// The co-location group shared by all reference tables, if there is one.
pub(crate) fn reference_group() -> Result<Option<i32>> {
    query_value::<i32>(
        "SELECT min(colocation_id) FROM pg_shard.colocation_group WHERE kind = 'reference'",
    )
}

/// Shard tables by node: every placement of the shards of `relids` (or of
/// all shards), as (shard id, qualified shard table name), grouped by node
/// in node id order.
pub(crate) type ShardsByNode = std::collections::BTreeMap<i32, (Node, Vec<(i64, String)>)>;

pub(crate) fn shards_by_node(relids: Option<&[pg_sys::Oid]>) -> Result<ShardsByNode> {
    let relids: Option<Vec<pg_sys::Oid>> = relids.map(<[pg_sys::Oid]>::to_vec);
    crate::spi::connect(|client| {
        let mut by_node = ShardsByNode::new();
        let rows = client.select(
            "SELECT n.node_id, n.host, n.port, s.shard_id, \
                    format('%I.%I', s.shard_schema, s.shard_name) \
             FROM pg_shard.shard s \
             JOIN pg_shard.placement p USING (shard_group_id) \
             JOIN pg_shard.node n USING (node_id) \
             WHERE $1::oid[] IS NULL OR s.table_rel::oid = ANY ($1) \
             ORDER BY n.node_id, s.shard_id",
            None,
            &[relids.into()],
        )?;
        for row in rows {
            let node = Node::from_row(&row, 1)?;
            let shard = (
                row.get::<i64>(4)?.unwrap_or_default(),
                row.get::<String>(5)?.unwrap_or_default(),
            );
            by_node
                .entry(node.node_id)
                .or_insert_with(|| (node, Vec::new()))
                .1
                .push(shard);
        }
        Ok(by_node)
    })
}
