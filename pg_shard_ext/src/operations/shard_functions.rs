//! Worker-side SQL functions a job calls on the source node: the DDL that
//! recreates a shard table there (as it is, under another name, with its
//! foreign keys), read from [`crate::shard_ddl::TableShape`].

use crate::quote;
use pgrx::prelude::*;

/// The statements that recreate a shard table of this node as it is (for
/// a move to another node); `part`: `table` or `indexes` (built once the
/// copy is in), see [`crate::shard_ddl::ShardTableDdl::part`].
#[pg_extern(schema = "pg_shard", volatile)]
fn shard_table_ddl(shard_rel: pg_sys::Oid, part: &str) -> Vec<String> {
    use crate::error::OrReport;
    crate::shard_ddl::TableShape::load(shard_rel)
        .and_then(|shape| shape.same_ddl().part(part))
        .or_report()
}

/// The statements that give a copy of a shard table of this node, named
/// `shard_name` (in the same schema), the foreign keys the shard table has;
/// a referenced table named in `old_names` is replaced by the same place in
/// `new_names` (the halves of a split reference each other). With
/// `within_old_names`, only the keys that reference one of `old_names` (the
/// group's tables: added once their rows and indexes are in), else only
/// the others (reference tables: added while the copy is empty, since the
/// rows of the copy's snapshot may reference rows deleted since).
#[pg_extern(schema = "pg_shard", volatile)]
fn shard_foreign_key_ddl(
    shard_rel: pg_sys::Oid,
    shard_name: &str,
    old_names: Vec<String>,
    new_names: Vec<String>,
    within_old_names: bool,
) -> Vec<String> {
    use crate::error::OrReport;
    // The old names as pg_get_constraintdef prints them.
    let printed = |name: &String| {
        crate::settings::with_settings(crate::settings::QUALIFIED_NAMES, || {
            crate::spi::query_one::<String>("SELECT to_regclass($1)::text", &[name.as_str().into()])
        })
        .map(|printed| printed.unwrap_or_else(|| name.clone()))
    };
    let old_names: crate::error::Result<Vec<String>> = old_names.iter().map(printed).collect();
    old_names
        .and_then(|old_names| Ok((old_names, crate::shard_ddl::TableShape::load(shard_rel)?)))
        .map(|(old_names, shape)| {
            let target = quote::qualified(&shape.schema, shard_name);
            let reference = |name: &str| format!(" REFERENCES {name}(");
            shape.foreign_key_ddl(
                &target,
                &|definition: &str| {
                    old_names
                        .iter()
                        .any(|old| definition.contains(&reference(old)))
                        == within_old_names
                },
                &|definition: &str| {
                    old_names.iter().zip(&new_names).fold(
                        definition.to_string(),
                        |definition, (old, new)| {
                            definition.replace(&reference(old), &reference(new))
                        },
                    )
                },
            )
        })
        .or_report()
}

/// The statements that create a copy of a shard table of this node under
/// another name and shard id (a half of a split); `part` as for
/// `shard_table_ddl`.
#[pg_extern(schema = "pg_shard", volatile)]
fn shard_table_ddl_as(
    shard_rel: pg_sys::Oid,
    shard_name: &str,
    old_shard_id: i64,
    new_shard_id: i64,
    part: &str,
) -> Vec<String> {
    use crate::error::OrReport;
    crate::shard_ddl::TableShape::load(shard_rel)
        .and_then(|shape| {
            shape
                .renamed_shard_ddl(shard_name, old_shard_id, new_shard_id)
                .part(part)
        })
        .or_report()
}
