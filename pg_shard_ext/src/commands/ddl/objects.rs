//! Indexes and constraints of distributed and reference tables: CREATE /
//! DROP INDEX (also CONCURRENTLY) and ALTER TABLE ADD / DROP / VALIDATE
//! CONSTRAINT (CHECK, PRIMARY KEY, UNIQUE).
//!
//! A reference table is an ordinary table on the metadata node: it runs the
//! statement, and its indexes and constraints before and after tell what
//! the shards do. A distributed table's are kept in
//! `pg_shard.table_constraint` instead (its partitions are foreign tables,
//! which hold none). The statement then runs on a scratch copy: a temporary
//! table with the table's name, columns, indexes and constraints. So
//! PostgreSQL checks the statement, picks the names it would pick and
//! prints the definitions, and the difference before and after is what the
//! catalog and the shards get. A PRIMARY KEY or UNIQUE constraint or index
//! must include the distribution column: each shard checks its own rows
//! only.

use super::parse::{logical_table_named, StatementText};
use super::plan::{Local, Planned};
use super::shard_names::{index_name_taken, namespace_of};
use crate::error::{Result, ShardError};
use crate::metadata::LogicalTable;
use crate::quote;
use crate::shard_ddl::TableShape;
use crate::spi::query_one;
use crate::transaction::fan_out::{on_shards_in_transaction, on_shards_one_by_one, ShardTable};
use pgrx::prelude::*;
use std::ffi::CStr;

/// An index or constraint, as `pg_shard.table_constraint` records it.
#[derive(Clone, Debug, PartialEq)]
struct Object {
    kind: char,
    name: String,
    definition: String,
    unique_index: bool,
}

impl Object {
    /// Indexes and index-backed constraints: their names are unique per
    /// schema, so each shard table's carry its shard id.
    fn index_backed(&self) -> bool {
        matches!(self.kind, 'p' | 'u' | 'x' | 'i')
    }

    fn shard_name(&self, shard_id: i64) -> String {
        super::shard_names::shard_object_name(self.kind, &self.name, shard_id)
    }

    fn create_sql(&self, table: &str, name: &str, concurrently: bool) -> String {
        if self.kind == 'i' {
            format!(
                "CREATE {}INDEX {}{} ON {table} {}",
                if self.unique_index { "UNIQUE " } else { "" },
                if concurrently { "CONCURRENTLY " } else { "" },
                quote::ident(name),
                self.definition
            )
        } else {
            format!(
                "ALTER TABLE {table} ADD CONSTRAINT {} {}",
                quote::ident(name),
                self.definition
            )
        }
    }

    fn drop_sql(&self, table: &str, schema: &str, name: &str, concurrently: bool) -> String {
        if self.kind == 'i' {
            format!(
                "DROP INDEX {}IF EXISTS {}",
                if concurrently { "CONCURRENTLY " } else { "" },
                quote::qualified(schema, name)
            )
        } else {
            format!(
                "ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {}",
                quote::ident(name)
            )
        }
    }
}

/// What a statement changed: objects dropped, constraints validated and
/// objects added.
#[derive(Default)]
struct Difference {
    dropped: Vec<Object>,
    validated: Vec<Object>,
    added: Vec<Object>,
}

impl Difference {
    fn between(before: &[Object], after: &[Object]) -> Difference {
        let mut difference = Difference::default();
        for old in before {
            match after.iter().find(|new| new.name == old.name) {
                None => difference.dropped.push(old.clone()),
                Some(new) if new == old => {}
                Some(new)
                    if new.kind == old.kind
                        && old.definition.strip_suffix(" NOT VALID") == Some(&new.definition) =>
                {
                    difference.validated.push(new.clone())
                }
                Some(new) => {
                    difference.dropped.push(old.clone());
                    difference.added.push(new.clone());
                }
            }
        }
        for new in after {
            if !before.iter().any(|old| old.name == new.name) {
                difference.added.push(new.clone());
            }
        }
        difference
    }

    fn is_empty(&self) -> bool {
        self.dropped.is_empty() && self.validated.is_empty() && self.added.is_empty()
    }

    /// The statements that make one shard table follow (in a transaction).
    fn shard_sql(&self, shard: &ShardTable) -> Vec<String> {
        let table = &shard.qualified;
        let mut sql = Vec::new();
        for object in &self.dropped {
            let name = object.shard_name(shard.shard_id);
            sql.push(object.drop_sql(table, &shard.schema, &name, false));
        }
        for object in &self.validated {
            sql.push(format!(
                "ALTER TABLE {table} VALIDATE CONSTRAINT {}",
                quote::ident(&object.shard_name(shard.shard_id))
            ));
        }
        for object in &self.added {
            sql.push(object.create_sql(table, &object.shard_name(shard.shard_id), false));
        }
        sql
    }

    /// The shards follow: in their transactions, or for CONCURRENTLY (one
    /// index created or dropped) one shard at a time.
    fn apply_to_shards(&self, relid: pg_sys::Oid, concurrently: bool) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        if !concurrently {
            return on_shards_in_transaction(relid, |shard| self.shard_sql(shard));
        }
        let index = |shard: &ShardTable| {
            let object = self.added.first().or(self.dropped.first());
            object.map(|o| (o.clone(), o.shard_name(shard.shard_id)))
        };
        let create = !self.added.is_empty();
        on_shards_one_by_one(
            relid,
            |shard| match index(shard) {
                Some((o, name)) if create => o.create_sql(&shard.qualified, &name, true),
                Some((o, name)) => o.drop_sql(&shard.qualified, &shard.schema, &name, true),
                None => String::new(),
            },
            // A failed CREATE INDEX CONCURRENTLY leaves an invalid index.
            |shard| match index(shard) {
                Some((o, name)) if create => {
                    o.drop_sql(&shard.qualified, &shard.schema, &name, true)
                }
                _ => String::new(),
            },
        )
    }

    /// The catalog of a distributed table follows.
    fn record(&self, relid: pg_sys::Oid) -> Result<()> {
        for object in self.dropped.iter().chain(&self.validated) {
            crate::spi::run_with_args(
                "DELETE FROM pg_shard.table_constraint WHERE table_rel = $1 AND name = $2",
                &[relid.into(), object.name.as_str().into()],
            )?;
        }
        for object in self.validated.iter().chain(&self.added) {
            crate::metadata::catalog::insert_table_constraint(
                relid,
                object.kind,
                &object.name,
                &object.definition,
                object.unique_index,
            )?;
        }
        Ok(())
    }
}

/// The indexes and constraints of an ordinary table, as PostgreSQL prints
/// them.
fn objects_of(relid: pg_sys::Oid) -> Result<Vec<Object>> {
    Ok(TableShape::load(relid)?
        .constraint_rows()
        .into_iter()
        .map(|(kind, name, definition, unique_index)| Object {
            kind,
            name,
            definition,
            unique_index,
        })
        .collect())
}

/// The indexes and constraints a distributed table's shards carry.
fn recorded_objects(relid: pg_sys::Oid) -> Result<Vec<Object>> {
    crate::spi::connect(|client| {
        let mut objects = Vec::new();
        for row in client.select(
            "SELECT kind::text, name::text, definition, unique_index \
             FROM pg_shard.table_constraint WHERE table_rel = $1 ORDER BY name",
            None,
            &[relid.into()],
        )? {
            objects.push(Object {
                kind: row
                    .get::<String>(1)?
                    .and_then(|k| k.chars().next())
                    .unwrap_or('c'),
                name: row.get::<String>(2)?.unwrap_or_default(),
                definition: row.get::<String>(3)?.unwrap_or_default(),
                unique_index: row.get::<bool>(4)?.unwrap_or(false),
            });
        }
        Ok(objects)
    })
}

/// The names of a distributed table's recorded indexes and index-backed
/// constraints (unique per schema).
pub(super) fn recorded_index_names(relid: pg_sys::Oid) -> Result<Vec<String>> {
    Ok(recorded_objects(relid)?
        .into_iter()
        .filter(Object::index_backed)
        .map(|object| object.name)
        .collect())
}

/// Statements that give `target` the indexes and constraints a distributed
/// table's shards carry, under their own names.
pub(crate) fn recorded_objects_sql(relid: pg_sys::Oid, target: &str) -> Result<Vec<String>> {
    Ok(recorded_objects(relid)?
        .iter()
        .map(|object| object.create_sql(target, &object.name, false))
        .collect())
}

/// A temporary table standing in for a distributed table: its name,
/// columns, indexes and constraints.
struct Scratch {
    relid: pg_sys::Oid,
    /// `pg_temp.name`, quoted.
    qualified: String,
    table: LogicalTable,
    /// The table's own `schema.name`, quoted (its plain name now means the
    /// scratch table).
    table_qualified: String,
}

impl Scratch {
    fn of(table: &LogicalTable) -> Result<Scratch> {
        let (name, table_qualified) = crate::spi::connect(|client| {
            let row = client
                .select(
                    "SELECT c.relname::text, format('%I.%I', n.nspname, c.relname) \
                     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                     WHERE c.oid = $1",
                    Some(1),
                    &[table.relid.into()],
                )?
                .next()
                .map(|row| Ok::<_, ShardError>((row.get::<String>(1)?, row.get::<String>(2)?)))
                .transpose()?;
            Ok::<_, ShardError>(row.unwrap_or((None, None)))
        })?;
        let qualified = quote::qualified("pg_temp", &name.unwrap_or_default());
        let table_qualified = table_qualified.unwrap_or_default();
        crate::spi::run(&format!(
            "CREATE TEMPORARY TABLE {qualified} (LIKE {table_qualified})"
        ))?;
        let relid =
            query_one::<pg_sys::Oid>("SELECT $1::regclass::oid", &[qualified.as_str().into()])?
                .unwrap_or(pg_sys::InvalidOid);
        let scratch = Scratch {
            relid,
            qualified,
            table: table.clone(),
            table_qualified,
        };
        // (Foreign keys are planned apart: a temporary table cannot have
        // them.)
        for object in recorded_objects(table.relid)?
            .iter()
            .filter(|o| o.kind != 'f')
        {
            crate::spi::run(&object.create_sql(&scratch.qualified, &object.name, false))?;
        }
        Ok(scratch)
    }

    /// Drop the scratch table (on error the transaction's abort does).
    fn finish(self) -> Result<()> {
        crate::spi::run(&format!("DROP TABLE {}", self.qualified))?;
        Ok(())
    }

    /// Run `statement` on the scratch table: what it changed.
    fn run(&self, statement: &str) -> Result<Difference> {
        let difference = self.run_unchecked(statement)?;
        self.check(&difference)?;
        Ok(difference)
    }

    fn run_unchecked(&self, statement: &str) -> Result<Difference> {
        let before = objects_of(self.relid)?;
        crate::spi::run(statement)?;
        let after = objects_of(self.relid)?;
        Ok(Difference::between(&before, &after))
    }

    /// A distributed table's unique constraints and indexes include the
    /// distribution column; its index names are free in its schema.
    fn check(&self, difference: &Difference) -> Result<()> {
        let dist = self.table.dist_column.clone().unwrap_or_default();
        for object in &difference.added {
            if object.kind == 'x' {
                return Err(self.table.refuse(format!(
                    "exclusion constraints are not supported on distributed tables (\"{}\")",
                    object.name
                )));
            }
            let unique = matches!(object.kind, 'p' | 'u') || object.unique_index;
            let includes_dist = query_one::<bool>(
                "SELECT a.attnum = ANY (i.indkey::int2[]) FROM pg_index i \
                 JOIN pg_class c ON c.oid = i.indexrelid \
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attname = $3 \
                 WHERE i.indrelid = $1 AND c.relname = $2",
                &[
                    self.relid.into(),
                    object.name.as_str().into(),
                    dist.as_str().into(),
                ],
            )?
            .unwrap_or(false);
            if unique && !includes_dist {
                return Err(ShardError::UniqueWithoutDistributionColumn {
                    table: self.table.display.clone(),
                    name: object.name.clone(),
                    column: dist.clone(),
                });
            }
            if object.index_backed()
                && index_name_taken(
                    namespace_of(self.table.relid)?,
                    &object.name,
                    Some(self.table.relid),
                )?
            {
                return Err(ShardError::RelationExists(object.name.clone()));
            }
        }
        Ok(())
    }

    /// Columns a new primary key made NOT NULL on the scratch table, as
    /// statements for the metadata node's table.
    fn new_not_null(&self) -> Result<Vec<String>> {
        crate::spi::connect(|client| {
            let mut statements = Vec::new();
            for row in client.select(
                "SELECT quote_ident(s.attname) FROM pg_attribute s \
                 JOIN pg_attribute t ON t.attrelid = $2 AND t.attname = s.attname \
                 WHERE s.attrelid = $1 AND s.attnum > 0 AND NOT s.attisdropped \
                   AND s.attnotnull AND NOT t.attnotnull",
                None,
                &[self.relid.into(), self.table.relid.into()],
            )? {
                statements.push(format!(
                    "ALTER TABLE {} ALTER COLUMN {} SET NOT NULL",
                    self.table_qualified,
                    row.get::<String>(1)?.unwrap_or_default()
                ));
            }
            Ok(statements)
        })
    }
}

/// How a column change (`actions`: the ALTER TABLE's text after the
/// table's name) changes a distributed table's recorded indexes and
/// constraints: a renamed column renames it in their definitions, a dropped
/// one drops those on it, a new type may print differently. The shards'
/// own indexes and constraints follow by themselves.
pub(super) struct RecordedChange(Difference);

impl RecordedChange {
    pub(crate) fn of_column_change(table: &LogicalTable, actions: &str) -> Result<RecordedChange> {
        let scratch = Scratch::of(table)?;
        let difference =
            scratch.run_unchecked(&format!("ALTER TABLE {} {actions}", scratch.qualified))?;
        scratch.finish()?;
        Ok(RecordedChange(difference))
    }

    pub(crate) fn record(&self, relid: pg_sys::Oid) -> Result<()> {
        self.0.record(relid)
    }
}

/// ADD / DROP / VALIDATE CONSTRAINT; `actions` is the statement's text
/// after the table's name.
pub(super) fn plan_alter_constraints(table: LogicalTable, actions: String) -> Result<Planned> {
    table.refuse_during_job()?;
    if table.is_distributed() {
        table.require_owner()?;
    }
    table.lock(pg_sys::AccessExclusiveLock);
    if !table.is_distributed() {
        return follow_reference_table(table, Local::Run);
    }
    let scratch = Scratch::of(&table)?;
    let difference = scratch.run(&format!("ALTER TABLE {} {actions}", scratch.qualified))?;
    let not_null = scratch.new_not_null()?;
    scratch.finish()?;
    let relid = table.relid;
    Ok(Planned::new(Local::Skip, move || {
        for statement in not_null {
            super::internal::run_internal(&statement)?;
        }
        difference.record(relid)?;
        difference.apply_to_shards(relid, false)
    }))
}

/// A reference table runs the statement itself; its shards then follow
/// what changed.
/// (Also for CONCURRENTLY, which runs as an ordinary statement on the
/// metadata node and the copies: a reference table is usually small, and a
/// build that fails on one copy after the others finished could not be
/// undone otherwise.)
fn follow_reference_table(table: LogicalTable, local: Local) -> Result<Planned> {
    let before = objects_of(table.relid)?;
    Ok(Planned::new(local, move || {
        let after = objects_of(table.relid)?;
        Difference::between(&before, &after).apply_to_shards(table.relid, false)
    }))
}

fn prevent_in_transaction_block(top_level: bool, statement: &CStr) {
    // SAFETY: raises an ERROR (through pgrx's guard) inside a transaction
    // block or function, as PostgreSQL does for these statements.
    unsafe { pg_sys::PreventInTransactionBlock(top_level, statement.as_ptr()) };
}

/// # Safety
/// `index` is the statement's IndexStmt.
pub(super) unsafe fn plan_create_index(
    pstmt: *mut pg_sys::PlannedStmt,
    index: *mut pg_sys::IndexStmt,
    text: StatementText,
    top_level: bool,
) -> Result<Option<Planned>> {
    // SAFETY: the caller's node.
    let index = unsafe { &*index };
    // SAFETY: the statement's RangeVar.
    let Some(table) = (unsafe { logical_table_named(index.relation)? }) else {
        return Ok(None);
    };
    table.refuse_during_job()?;
    if !table.is_distributed() {
        if !index.concurrent {
            return follow_reference_table(table, Local::Run).map(Some);
        }
        prevent_in_transaction_block(top_level, c"CREATE INDEX CONCURRENTLY");
        // SAFETY: ProcessUtility's statement, an IndexStmt.
        let (copy, statement) = unsafe { super::parse::copy_statement::<pg_sys::IndexStmt>(pstmt) };
        // SAFETY: the copy's own node.
        unsafe { (*statement).concurrent = false };
        return follow_reference_table(table, Local::Replace(copy)).map(Some);
    }
    table.require_owner()?;
    if index.concurrent {
        prevent_in_transaction_block(top_level, c"CREATE INDEX CONCURRENTLY");
        table.lock(pg_sys::ShareUpdateExclusiveLock);
    } else {
        table.lock(pg_sys::ShareLock);
    }
    // SAFETY: the statement's RangeVar.
    let (_, end) = unsafe { text.name_span(index.relation, &table)? };
    let name = if index.idxname.is_null() {
        String::new()
    } else {
        // SAFETY: the index name of the parse tree.
        quote::ident(&unsafe { CStr::from_ptr(index.idxname) }.to_string_lossy())
    };
    let scratch = Scratch::of(&table)?;
    let difference = scratch.run(&format!(
        "CREATE {}INDEX {}{name} ON {} {}",
        if index.unique { "UNIQUE " } else { "" },
        if index.if_not_exists {
            "IF NOT EXISTS "
        } else {
            ""
        },
        scratch.qualified,
        &text.text[end..]
    ))?;
    scratch.finish()?;
    let relid = table.relid;
    let concurrently = index.concurrent;
    Ok(Some(Planned::new(Local::Skip, move || {
        difference.record(relid)?;
        difference.apply_to_shards(relid, concurrently)
    })))
}

/// DROP INDEX of an index of a distributed table (one in
/// `pg_shard.table_constraint`) or of a reference table.
///
/// # Safety
/// `drop` is the statement's DropStmt.
pub(super) unsafe fn plan_drop_index(
    pstmt: *mut pg_sys::PlannedStmt,
    drop: *mut pg_sys::DropStmt,
    top_level: bool,
) -> Result<Option<Planned>> {
    // SAFETY: the caller's node.
    let drop = unsafe { &*drop };
    if drop.removeType != pg_sys::ObjectType::OBJECT_INDEX {
        return Ok(None);
    }
    // SAFETY: DROP INDEX's objects are lists of name strings.
    let names = unsafe { pgrx::PgList::<pg_sys::List>::from_pg(drop.objects) };
    let mut found = Vec::new();
    for name in names.iter_ptr() {
        // SAFETY: a list of String nodes.
        let parts = unsafe { super::parse::string_list(name) };
        if let Some(index) = index_of_logical_table(&parts)? {
            found.push(index);
        }
    }
    let Some((table, index_name)) = found.pop() else {
        return Ok(None);
    };
    if names.len() > 1 {
        return Err(
            table.refuse("drop the indexes of distributed and reference tables one at a time")
        );
    }
    table.refuse_during_job()?;
    let relid = table.relid;
    let concurrently = drop.concurrent;
    if !table.is_distributed() {
        // The metadata node drops its index, the copies theirs.
        let dropped = Difference {
            dropped: vec![Object {
                kind: 'i',
                name: index_name,
                definition: String::new(),
                unique_index: false,
            }],
            ..Difference::default()
        };
        let mut local = Local::Run;
        if concurrently {
            // As for CREATE INDEX CONCURRENTLY of a reference table.
            prevent_in_transaction_block(top_level, c"DROP INDEX CONCURRENTLY");
            // SAFETY: ProcessUtility's statement, a DropStmt.
            let (copy, statement) =
                unsafe { super::parse::copy_statement::<pg_sys::DropStmt>(pstmt) };
            // SAFETY: the copy's own node.
            unsafe { (*statement).concurrent = false };
            local = Local::Replace(copy);
        }
        return Ok(Some(Planned::new(local, move || {
            dropped.apply_to_shards(relid, false)
        })));
    }
    table.require_owner()?;
    if drop.concurrent {
        prevent_in_transaction_block(top_level, c"DROP INDEX CONCURRENTLY");
        table.lock(pg_sys::ShareUpdateExclusiveLock);
    } else {
        table.lock(pg_sys::AccessExclusiveLock);
    }
    let scratch = Scratch::of(&table)?;
    let difference = scratch.run(&format!(
        "DROP INDEX pg_temp.{}{}",
        quote::ident(&index_name),
        if drop.behavior == pg_sys::DropBehavior::DROP_CASCADE {
            " CASCADE"
        } else {
            ""
        }
    ))?;
    scratch.finish()?;
    Ok(Some(Planned::new(Local::Skip, move || {
        difference.record(relid)?;
        difference.apply_to_shards(relid, concurrently)
    })))
}

/// The table of the index named `parts` (`[schema, ]name`) and the index's
/// own name, if the table is distributed (the index is recorded in the
/// catalog) or a reference table (the index exists on the metadata node).
pub(super) fn index_of_logical_table(parts: &[String]) -> Result<Option<(LogicalTable, String)>> {
    let (schema, name) = match parts {
        [name] => (None, name.clone()),
        [schema, name] => (Some(schema.clone()), name.clone()),
        _ => return Ok(None),
    };
    // The first schema of the search path that has a table with an index of
    // that name, as PostgreSQL would look it up.
    let relid = query_one::<pg_sys::Oid>(
        "SELECT table_rel FROM ( \
           SELECT t.table_rel::oid AS table_rel, c.relnamespace FROM pg_shard.table_constraint t \
           JOIN pg_class c ON c.oid = t.table_rel \
           WHERE t.kind IN ('p', 'u', 'x', 'i') AND t.name = $2 \
           UNION ALL \
           SELECT i.indrelid, c.relnamespace FROM pg_index i \
           JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = $2) found \
         JOIN LATERAL unnest(CASE WHEN $1::text IS NULL \
                                  THEN $3::text[] ELSE ARRAY[$1::text] END) \
              WITH ORDINALITY AS path(nspname, position) \
           ON path.nspname = (SELECT nspname::text FROM pg_namespace WHERE oid = relnamespace) \
         ORDER BY path.position LIMIT 1",
        &[
            schema.into(),
            name.as_str().into(),
            crate::spi::caller_schemas().into(),
        ],
    )?;
    let Some(relid) = relid else {
        return Ok(None);
    };
    Ok(LogicalTable::of(relid)?.map(|table| (table, name)))
}
