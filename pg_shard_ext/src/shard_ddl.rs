//! The shape of a table (columns, constraints, indexes, replica identity) and
//! the DDL that recreates it as a shard table on a worker.
//!
//! Carried over: column types, NOT NULL, collations, primary key, unique,
//! check and exclusion constraints, other indexes, replica identity, storage
//! parameters and column statistics settings, owner, privileges, comments.
//! Not carried over (documented in docs/sql-api.md): column defaults and
//! identity (rows arrive with their values; ids are assigned where the row
//! is routed from) and user-defined types, which must already exist on the
//! workers. Tables with foreign keys are refused before anything changes.

use crate::error::{Result, ShardError};
use crate::quote;
use crate::settings::{with_settings, QUALIFIED_NAMES};
use pgrx::prelude::*;

#[derive(Clone, Debug)]
pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) type_sql: String,
    pub(crate) type_oid: pg_sys::Oid,
    pub(crate) not_null: bool,
    pub(crate) collation: Option<(String, String)>,
    /// The DEFAULT expression, schema-qualified (kept on the metadata node's
    /// routing table, where rows are routed from; not on shards).
    pub(crate) default: Option<String>,
    /// An identity or generated column (not supported on distributed tables yet).
    pub(crate) identity_or_generated: bool,
}

#[derive(Clone, Debug)]
struct Constraint {
    name: String,
    definition: String,
    /// Whether the constraint owns an index, whose name must be unique per schema.
    has_index: bool,
    /// pg_constraint.contype: 'p', 'u', 'c' or 'x'.
    kind: char,
}

#[derive(Clone, Debug)]
struct Index {
    name: String,
    /// Everything after `… ON table ` in pg_get_indexdef: `USING btree (…) …`.
    tail: String,
    unique: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct TableShape {
    pub(crate) schema: String,
    pub(crate) name: String,
    /// The name as PostgreSQL prints it (regclass output), for messages.
    pub(crate) display_name: String,
    pub(crate) columns: Vec<Column>,
    constraints: Vec<Constraint>,
    indexes: Vec<Index>,
    /// 'd' default (primary key), 'n' nothing, 'f' full, 'i' index.
    replica_identity: char,
    replica_identity_index: Option<String>,
    pub(crate) has_primary_key: bool,
    /// Foreign keys from or to the table, as `name (on table)`: not carried
    /// over to shards yet, so distributing such a table is refused.
    pub(crate) foreign_keys: Vec<String>,
    /// The table's own foreign keys: (name, definition). Created after all
    /// tables of a group exist, as [`TableShape::foreign_key_ddl`].
    foreign_key_definitions: Vec<(String, String)>,
    /// Whether row-level security is enabled on the table.
    pub(crate) row_security: bool,
    /// Whether the table has inheritance parents or children.
    pub(crate) in_inheritance_tree: bool,
    pub(crate) relkind: char,
    pub(crate) persistence: char,
    /// The owning role, quoted.
    owner: String,
    /// Storage parameters and column statistics settings, as ALTER TABLE
    /// actions (`SET (fillfactor = '70')`, `ALTER COLUMN "c" SET STATISTICS
    /// 500`): shard tables carry them, the metadata node's partitioned
    /// table cannot hold storage parameters.
    settings: Vec<String>,
    /// Table privileges: (grantee, already quoted or PUBLIC; privilege;
    /// with grant option).
    grants: Vec<(String, String, bool)>,
    /// Comments on the table (None) and its columns.
    comments: Vec<(Option<String>, String)>,
}

impl TableShape {
    /// Read the shape of `relid`. Call with the table locked: every query runs
    /// with a fresh snapshot (the read-write SPI path), so the shape includes
    /// changes committed while the lock was awaited; names outside pg_catalog
    /// come out schema-qualified so the DDL means the same on a worker.
    pub(crate) fn load(relid: pg_sys::Oid) -> Result<TableShape> {
        let display_name = crate::spi::caller_relation_name(relid);
        let mut shape = with_settings(QUALIFIED_NAMES, || Self::load_qualified(relid))?;
        shape.display_name = display_name;
        Ok(shape)
    }

    fn load_qualified(relid: pg_sys::Oid) -> Result<TableShape> {
        crate::spi::connect_mut(|client| {
            let rel = client.update(
                "SELECT n.nspname::text, c.relname::text, c.relkind::text, c.relreplident::text, \
                        c.relpersistence::text, c.relrowsecurity, \
                        quote_ident(pg_get_userbyid(c.relowner)) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
                Some(1),
                &[relid.into()],
            )?;
            let rel = rel.into_iter().next().ok_or_else(|| {
                ShardError::InvalidArgument(format!("relation with OID {relid:?} does not exist"))
            })?;
            let first_char = |s: Option<String>| s.and_then(|s| s.chars().next()).unwrap_or(' ');
            let mut shape = TableShape {
                schema: rel.get::<String>(1)?.unwrap_or_default(),
                name: rel.get::<String>(2)?.unwrap_or_default(),
                relkind: first_char(rel.get::<String>(3)?),
                replica_identity: first_char(rel.get::<String>(4)?),
                persistence: first_char(rel.get::<String>(5)?),
                display_name: String::new(),
                columns: Vec::new(),
                constraints: Vec::new(),
                indexes: Vec::new(),
                replica_identity_index: None,
                has_primary_key: false,
                foreign_keys: Vec::new(),
                foreign_key_definitions: Vec::new(),
                in_inheritance_tree: false,
                row_security: rel.get::<bool>(6)?.unwrap_or(false),
                owner: rel.get::<String>(7)?.unwrap_or_default(),
                settings: Vec::new(),
                grants: Vec::new(),
                comments: Vec::new(),
            };

            let grants = client.update(
                "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' \
                             ELSE quote_ident(pg_get_userbyid(a.grantee)) END, \
                        a.privilege_type, a.is_grantable \
                 FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = $1 \
                 ORDER BY 1, 2",
                None,
                &[relid.into()],
            )?;
            for row in grants {
                shape.grants.push((
                    row.get::<String>(1)?.unwrap_or_default(),
                    row.get::<String>(2)?.unwrap_or_default(),
                    row.get::<bool>(3)?.unwrap_or(false),
                ));
            }
            let comments = client.update(
                "SELECT NULL::text, obj_description($1, 'pg_class') \
                 UNION ALL \
                 SELECT attname::text, col_description($1, attnum) FROM pg_attribute \
                 WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped",
                None,
                &[relid.into()],
            )?;
            for row in comments {
                if let Some(comment) = row.get::<String>(2)? {
                    shape.comments.push((row.get::<String>(1)?, comment));
                }
            }

            let columns = client.update(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.atttypid, \
                        a.attnotnull, co.collname::text, cn.nspname::text, \
                        pg_get_expr(d.adbin, d.adrelid), \
                        a.attidentity <> '' OR a.attgenerated <> '' \
                 FROM pg_attribute a \
                 LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
                 JOIN pg_type t ON t.oid = a.atttypid \
                 LEFT JOIN pg_collation co \
                        ON co.oid = a.attcollation AND a.attcollation <> t.typcollation \
                 LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace \
                 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
                 ORDER BY a.attnum",
                None,
                &[relid.into()],
            )?;
            for row in columns {
                let collation = match (row.get::<String>(5)?, row.get::<String>(6)?) {
                    (Some(name), Some(schema)) => Some((schema, name)),
                    _ => None,
                };
                shape.columns.push(Column {
                    name: row.get::<String>(1)?.unwrap_or_default(),
                    type_sql: row.get::<String>(2)?.unwrap_or_default(),
                    type_oid: row.get::<pg_sys::Oid>(3)?.unwrap_or(pg_sys::InvalidOid),
                    not_null: row.get::<bool>(4)?.unwrap_or(false),
                    collation,
                    default: row.get::<String>(7)?,
                    identity_or_generated: row.get::<bool>(8)?.unwrap_or(false),
                });
            }

            // Storage parameters (autovacuum settings, fillfactor) and
            // per-column statistics settings, as ALTER TABLE actions (the
            // column options PostgreSQL documents; a server may keep others
            // of its own there).
            let settings = client.update(
                "SELECT format('SET (%s)', string_agg(format('%I = %L', o.option_name, \
                                                             o.option_value), ', ')) \
                 FROM pg_class c, pg_options_to_table(c.reloptions) o WHERE c.oid = $1 \
                 HAVING count(*) > 0 \
                 UNION ALL \
                 SELECT format('ALTER COLUMN %I SET STATISTICS %s', attname, attstattarget) \
                 FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped \
                   AND attstattarget >= 0 \
                 UNION ALL \
                 (SELECT format('ALTER COLUMN %I SET (%s)', a.attname, \
                                string_agg(format('%I = %L', o.option_name, o.option_value), ', ')) \
                  FROM pg_attribute a, pg_options_to_table(a.attoptions) o \
                  WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
                    AND o.option_name IN ('n_distinct', 'n_distinct_inherited') \
                  GROUP BY a.attname ORDER BY a.attname)",
                None,
                &[relid.into()],
            )?;
            for row in settings {
                shape
                    .settings
                    .extend(row.get::<String>(1)?.filter(|s| !s.is_empty()));
            }

            let constraints = client.update(
                "SELECT conname::text, pg_get_constraintdef(oid), contype::text \
                 FROM pg_constraint WHERE conrelid = $1 AND contype IN ('p', 'u', 'c', 'x') \
                 ORDER BY contype = 'p' DESC, conname",
                None,
                &[relid.into()],
            )?;
            for row in constraints {
                let kind = row.get::<String>(3)?.unwrap_or_default();
                shape.has_primary_key |= kind == "p";
                shape.constraints.push(Constraint {
                    name: row.get::<String>(1)?.unwrap_or_default(),
                    definition: row.get::<String>(2)?.unwrap_or_default(),
                    has_index: kind != "c",
                    kind: kind.chars().next().unwrap_or('c'),
                });
            }

            let foreign_keys = client.update(
                "SELECT format('%I (on %s)', conname, conrelid::regclass) FROM pg_constraint \
                 WHERE contype = 'f' AND (conrelid = $1 OR confrelid = $1) ORDER BY conname",
                None,
                &[relid.into()],
            )?;
            for row in foreign_keys {
                shape
                    .foreign_keys
                    .push(row.get::<String>(1)?.unwrap_or_default());
            }
            let definitions = client.update(
                "SELECT conname::text, pg_get_constraintdef(oid) FROM pg_constraint \
                 WHERE contype = 'f' AND conrelid = $1 ORDER BY conname",
                None,
                &[relid.into()],
            )?;
            for row in definitions {
                shape.foreign_key_definitions.push((
                    row.get::<String>(1)?.unwrap_or_default(),
                    row.get::<String>(2)?.unwrap_or_default(),
                ));
            }

            shape.in_inheritance_tree = client
                .select(
                    "SELECT EXISTS (SELECT 1 FROM pg_inherits \
                                    WHERE inhrelid = $1 OR inhparent = $1)",
                    Some(1),
                    &[relid.into()],
                )?
                .next()
                .map(|row| row.get::<bool>(1))
                .transpose()?
                .flatten()
                .unwrap_or(false);

            // pg_get_indexdef always schema-qualifies the table, so the text
            // before `USING` is exactly `CREATE [UNIQUE ]INDEX name ON schema.table `.
            let indexes = client.update(
                "SELECT ic.relname::text, pg_get_indexdef(i.indexrelid), i.indisunique, \
                        i.indisreplident, \
                        format('%I.%I', CASE WHEN c.relpersistence = 't' THEN 'pg_temp' ELSE n.nspname END, c.relname), \
                        quote_ident(ic.relname::text) \
                 FROM pg_index i \
                 JOIN pg_class ic ON ic.oid = i.indexrelid \
                 JOIN pg_class c ON c.oid = i.indrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE i.indrelid = $1 \
                   AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid \
                                   AND k.conrelid = i.indrelid) \
                 ORDER BY ic.relname",
                None,
                &[relid.into()],
            )?;
            for row in indexes {
                let name = row.get::<String>(1)?.unwrap_or_default();
                let definition = row.get::<String>(2)?.unwrap_or_default();
                let unique = row.get::<bool>(3)?.unwrap_or(false);
                let qualified_table = row.get::<String>(5)?.unwrap_or_default();
                let prefix = format!(
                    "CREATE {}INDEX {} ON {} ",
                    if unique { "UNIQUE " } else { "" },
                    row.get::<String>(6)?.unwrap_or_default(),
                    qualified_table
                );
                let tail = definition.strip_prefix(&prefix).ok_or_else(|| {
                    ShardError::UnsupportedTable {
                        table: shape.display_name.clone(),
                        reason: format!("cannot recreate index {name}: {definition}"),
                    }
                })?;
                if row.get::<bool>(4)?.unwrap_or(false) {
                    shape.replica_identity_index = Some(name.clone());
                }
                shape.indexes.push(Index {
                    name,
                    tail: tail.to_string(),
                    unique,
                });
            }
            if shape.replica_identity == 'i' && shape.replica_identity_index.is_none() {
                // The replica identity index backs a constraint.
                shape.replica_identity_index = client
                    .select(
                        "SELECT ic.relname::text FROM pg_index i \
                         JOIN pg_class ic ON ic.oid = i.indexrelid \
                         WHERE i.indrelid = $1 AND i.indisreplident",
                        Some(1),
                        &[relid.into()],
                    )?
                    .next()
                    .map(|row| row.get::<String>(1))
                    .transpose()?
                    .flatten();
            }
            Ok(shape)
        })
    }

    pub(crate) fn qualified(&self) -> String {
        quote::qualified(&self.schema, &self.name)
    }

    pub(crate) fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The statements that give `target` this table's foreign keys whose
    /// definitions `keep` accepts, with each referenced table's name passed
    /// through `referenced` (the halves of a split reference each other's
    /// halves). Run once every table they reference exists.
    pub(crate) fn foreign_key_ddl(
        &self,
        target: &str,
        keep: &dyn Fn(&str) -> bool,
        referenced: &dyn Fn(&str) -> String,
    ) -> Vec<String> {
        self.foreign_key_definitions
            .iter()
            .filter(|(_, definition)| keep(definition))
            .map(|(name, definition)| {
                format!(
                    "ALTER TABLE {target} ADD CONSTRAINT {} {}",
                    quote::ident(name),
                    referenced(definition)
                )
            })
            .collect()
    }

    /// The statements that give `target` this table's owner, privileges
    /// and comments. (The owner's role must exist where `target` is: shard
    /// tables belong to their table's owner, who may then change them.)
    pub(crate) fn owner_grant_and_comment_sql(&self, target: &str) -> Vec<String> {
        let mut sql = vec![self.owner_sql(target)];
        sql.extend(self.grant_sql(target));
        sql.extend(self.comment_sql(target));
        sql
    }

    /// ALTER TABLE … OWNER TO this table's owner.
    pub(crate) fn owner_sql(&self, target: &str) -> String {
        format!("ALTER TABLE {target} OWNER TO {}", self.owner)
    }

    /// GRANT statements that give `target` this table's privileges.
    pub(crate) fn grant_sql(&self, target: &str) -> Vec<String> {
        self.grants
            .iter()
            .map(|(grantee, privilege, grantable)| {
                format!(
                    "GRANT {privilege} ON {target} TO {grantee}{}",
                    if *grantable { " WITH GRANT OPTION" } else { "" }
                )
            })
            .collect()
    }

    fn comment_sql(&self, target: &str) -> Vec<String> {
        self.comments
            .iter()
            .map(|(column, comment)| match column {
                None => format!("COMMENT ON TABLE {target} IS {}", quote::literal(comment)),
                Some(column) => format!(
                    "COMMENT ON COLUMN {target}.{} IS {}",
                    quote::ident(column),
                    quote::literal(comment)
                ),
            })
            .collect()
    }

    /// The grantees of this table's privileges (quoted, or PUBLIC).
    pub(crate) fn grantees(&self) -> Vec<String> {
        let mut grantees: Vec<String> = self.grants.iter().map(|g| g.0.clone()).collect();
        grantees.dedup();
        grantees
    }

    /// Constraints and indexes as rows of pg_shard.table_constraint:
    /// (kind, name, definition, unique index).
    pub(crate) fn constraint_rows(&self) -> Vec<(char, String, String, bool)> {
        let constraints = self
            .constraints
            .iter()
            .map(|c| (c.kind, c.name.clone(), c.definition.clone(), false));
        let indexes = self
            .indexes
            .iter()
            .map(|i| ('i', i.name.clone(), i.tail.clone(), i.unique));
        constraints.chain(indexes).collect()
    }

    /// Whether later moves can identify rows (logical replication needs it).
    pub(crate) fn has_replica_identity(&self) -> bool {
        match self.replica_identity {
            'd' => self.has_primary_key,
            'f' | 'i' => true,
            _ => false,
        }
    }

    /// Quoted column list, in attribute order.
    pub(crate) fn column_list(&self) -> String {
        self.columns
            .iter()
            .map(|c| quote::ident(&c.name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `name type [COLLATE …] [NOT NULL] [DEFAULT …]` for every column;
    /// defaults only when asked for.
    pub(crate) fn column_definitions(&self, with_defaults: bool) -> String {
        self.columns
            .iter()
            .map(|c| {
                let mut column = format!("{} {}", quote::ident(&c.name), c.type_sql);
                if let Some((schema, name)) = &c.collation {
                    column.push_str(&format!(" COLLATE {}", quote::qualified(schema, name)));
                }
                if c.not_null {
                    column.push_str(" NOT NULL");
                }
                if let (true, Some(default)) = (with_defaults, &c.default) {
                    column.push_str(&format!(" DEFAULT {default}"));
                }
                column
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The statements that recreate this table as it is, names and all (a
    /// shard table copied to another node by a move).
    pub(crate) fn same_ddl(&self) -> ShardTableDdl {
        self.ddl_parts(&self.name, "")
    }

    /// The statements that create a copy of this shard table (whose index
    /// names end in `_{old_shard_id}`) as `schema.shard_name` with shard id
    /// `new_shard_id` (a half of a split).
    pub(crate) fn renamed_shard_ddl(
        &self,
        shard_name: &str,
        old_shard_id: i64,
        new_shard_id: i64,
    ) -> ShardTableDdl {
        let old_suffix = format!("_{old_shard_id}");
        let mut shape = self.clone();
        let base = |name: &mut String| {
            if let Some(stripped) = name.strip_suffix(&old_suffix) {
                *name = stripped.to_owned();
            }
        };
        shape.constraints.iter_mut().for_each(|c| {
            if c.has_index {
                base(&mut c.name)
            }
        });
        shape.indexes.iter_mut().for_each(|i| base(&mut i.name));
        if let Some(index) = shape.replica_identity_index.as_mut() {
            base(index);
        }
        shape.shard_table_ddl_parts(shard_name, new_shard_id)
    }

    /// The statements that create this shape as `schema.shard_name` on a
    /// worker, in two parts: the table, and what is better built once its
    /// rows are in (a sorted index build instead of one insertion per row).
    /// Index-backed constraint and index names get the shard id as a
    /// suffix, since index names are unique per schema.
    pub(crate) fn shard_table_ddl_parts(&self, shard_name: &str, shard_id: i64) -> ShardTableDdl {
        self.ddl_parts(shard_name, &format!("_{shard_id}"))
    }

    fn ddl_parts(&self, shard_name: &str, suffix: &str) -> ShardTableDdl {
        let target = quote::qualified(&self.schema, shard_name);
        let columns = self.column_definitions(false);
        let mut table = vec![
            create_schema_if_missing(&self.schema),
            format!("CREATE TABLE {target} ({columns})"),
        ];
        table.extend(
            self.settings
                .iter()
                .map(|setting| format!("ALTER TABLE {target} {setting}")),
        );
        let mut indexes = Vec::new();
        let shard_index_name = |name: &str| quote::name_with_suffix(name, suffix);
        for constraint in &self.constraints {
            if constraint.has_index {
                indexes.push(format!(
                    "ALTER TABLE {target} ADD CONSTRAINT {} {}",
                    quote::ident(&shard_index_name(&constraint.name)),
                    constraint.definition
                ));
            } else {
                table.push(format!(
                    "ALTER TABLE {target} ADD CONSTRAINT {} {}",
                    quote::ident(&constraint.name),
                    constraint.definition
                ));
            }
        }
        for index in &self.indexes {
            indexes.push(format!(
                "CREATE {}INDEX {} ON {target} {}",
                if index.unique { "UNIQUE " } else { "" },
                quote::ident(&shard_index_name(&index.name)),
                index.tail
            ));
        }
        match (self.replica_identity, &self.replica_identity_index) {
            ('f', _) => table.push(format!("ALTER TABLE {target} REPLICA IDENTITY FULL")),
            ('i', Some(index)) => indexes.push(format!(
                "ALTER TABLE {target} REPLICA IDENTITY USING INDEX {}",
                quote::ident(&shard_index_name(index))
            )),
            _ => {}
        }
        ShardTableDdl {
            table,
            indexes,
            ownership: self.owner_grant_and_comment_sql(&target),
        }
    }
}

/// A shard table's DDL: the table (columns, settings, constraints without
/// an index), its indexes (index-backed constraints, indexes, a replica
/// identity using one) and its owner, grants and comments.
pub(crate) struct ShardTableDdl {
    pub(crate) table: Vec<String>,
    pub(crate) indexes: Vec<String>,
    pub(crate) ownership: Vec<String>,
}

impl ShardTableDdl {
    /// One part of the DDL by name: `table` (the table with its owner,
    /// grants and comments) or `indexes` (what is built once the rows are
    /// in).
    pub(crate) fn part(self, part: &str) -> Result<Vec<String>> {
        let ShardTableDdl {
            mut table,
            indexes,
            ownership,
        } = self;
        match part {
            "table" => {
                table.extend(ownership);
                Ok(table)
            }
            "indexes" => Ok(indexes),
            other => Err(ShardError::InvalidArgument(format!(
                "unknown part of a shard table's DDL: {} (expected table or indexes)",
                quote::literal(other)
            ))),
        }
    }
}

/// Name of the shard table for `table_name` with `shard_id`.
pub(crate) fn shard_table_name(table_name: &str, shard_id: i64) -> String {
    quote::name_with_suffix(table_name, &format!("_{shard_id}"))
}

/// The schema on a worker, made if it is missing. (`CREATE SCHEMA IF NOT
/// EXISTS` needs CREATE on the database even when the schema exists, which
/// a table owner making its shards may lack.)
pub(crate) fn create_schema_if_missing(schema: &str) -> String {
    let body = format!(
        "BEGIN IF pg_catalog.to_regnamespace({}) IS NULL THEN CREATE SCHEMA {}; END IF; END",
        quote::literal(&quote::ident(schema)),
        quote::ident(schema)
    );
    format!("DO {}", quote::literal(&body))
}

#[cfg(test)]
mod tests {
    use super::ShardTableDdl;

    fn ddl() -> ShardTableDdl {
        ShardTableDdl {
            table: vec!["CREATE TABLE t ()".into()],
            indexes: vec!["CREATE INDEX i ON t (a)".into()],
            ownership: vec!["ALTER TABLE t OWNER TO o".into()],
        }
    }

    #[test]
    fn the_table_part_has_the_owner_and_no_index() {
        assert_eq!(
            ddl().part("table").ok(),
            Some(vec![
                "CREATE TABLE t ()".to_string(),
                "ALTER TABLE t OWNER TO o".to_string()
            ])
        );
        assert_eq!(
            ddl().part("indexes").ok(),
            Some(vec!["CREATE INDEX i ON t (a)".to_string()])
        );
    }

    #[test]
    fn an_unknown_part_is_refused() {
        let error = ddl().part("all; DROP TABLE t").err().map(|e| e.to_string());
        assert!(
            error
                .as_deref()
                .is_some_and(|e| e.contains("expected table or indexes")),
            "{error:?}"
        );
    }
}
