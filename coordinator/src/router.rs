//! Where a statement runs. Each statement text is parsed once with
//! pg_query into an [`Analysis`] that does not depend on the shard map (so
//! it can be cached by text); [`route`] then combines it with the current
//! map and the bound parameters into a [`Route`]: one worker, with the
//! statement rewritten onto that worker's shard tables, or the metadata
//! node with the statement unchanged.
//!
//! Routing is conservative: a statement goes to a worker only when every
//! table it names is a distributed or reference table, every distributed
//! table's key is fixed (by constants, parameters or equality with another
//! fixed key) to values whose shards all live on one node, and nothing in
//! it needs the metadata node (sequences, subqueries, CTEs, defaults…).

use crate::cluster::{ClusterMap, NodeId, TableKind};
use crate::lexer::Normalized;
use pg_query::protobuf::{self, a_const, node::Node as N};
use pg_shard_core::keyspace::{keyspace_id, keyspace_id_of_int, keyspace_id_of_text};
use pg_shard_core::quote;
use pg_shard_core::{KeyEncoding, KeyspaceId, ShardMap};
use std::collections::HashMap;

/// A transaction control statement the coordinator handles itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransactionCommand {
    /// BEGIN / START TRANSACTION, with its text (isolation level, …).
    Begin,
    Commit,
    Rollback,
    /// SAVEPOINT, RELEASE, ROLLBACK TO, PREPARE TRANSACTION, …: forwarded.
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCommand {
    Pools,
    Stats,
    Shards,
}

#[derive(Debug)]
pub enum Analysis {
    Transaction(TransactionCommand),
    /// Changes how names resolve (SET/RESET search_path, role or session
    /// authorization, RESET ALL, a temporary table or view): unqualified
    /// names can no longer be resolved by the coordinator.
    SearchPath {
        temporary: bool,
    },
    Admin(AdminCommand),
    /// A statement that may go to one worker.
    Routable(Shape),
    /// Parsed, but always for the metadata node. `tableless`: a SELECT,
    /// SET or SHOW that names no table, which may run on whatever node a
    /// transaction is on. `keeps_state`: it leaves session state on its
    /// server connection that RESET ALL does not undo (PREPARE, LISTEN,
    /// DISCARD, DEALLOCATE, a WITH HOLD cursor, set_config or a session
    /// advisory lock), so the client keeps that connection.
    Other {
        tableless: bool,
        keeps_state: bool,
    },
    /// pg_query could not parse it: the metadata node will say why.
    Unparsed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Select,
    Insert,
    Update,
    Delete,
}

/// A table named in the statement.
#[derive(Debug)]
pub struct Relation {
    pub schema: Option<String>,
    pub name: String,
    pub alias: Option<String>,
    /// Byte range of the name in the statement text.
    pub span: (usize, usize),
}

impl Relation {
    /// How columns refer to it.
    fn reference_name(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ColumnRef {
    pub qualifier: Option<String>,
    pub column: String,
}

/// A value fixed per execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Integer(i64),
    /// A string literal; what it means depends on the key's type.
    Text(String),
    /// `$n` (0-based index here); cast says whether it was cast to a
    /// key type, which makes a binary value's format known.
    Param {
        index: usize,
        cast: Option<KeyEncoding>,
    },
}

#[derive(Debug)]
pub enum Fact {
    Equal(ColumnRef, ColumnRef),
    OneOf(ColumnRef, Vec<Value>),
}

#[derive(Debug)]
pub struct InsertShape {
    /// Named target columns; None: the table's columns in order.
    pub columns: Option<Vec<String>>,
    /// Each row's value expressions: Some for a fixed value.
    pub rows: Vec<Vec<Option<Value>>>,
}

#[derive(Debug)]
pub struct Shape {
    pub kind: Kind,
    pub relations: Vec<Relation>,
    pub facts: Vec<Fact>,
    pub insert: Option<InsertShape>,
    /// Columns an UPDATE (or ON CONFLICT DO UPDATE) assigns.
    pub assigned: Vec<String>,
    /// Functions called: (schema, name).
    pub functions: Vec<(Option<String>, String)>,
    /// SELECT … FOR UPDATE/SHARE (waits for row locks).
    pub locks_rows: bool,
}

pub fn analyze(sql: &str) -> Analysis {
    let Ok(parsed) = pg_query::parse(sql) else {
        return Analysis::Unparsed;
    };
    let statements = &parsed.protobuf.stmts;
    let other = Analysis::Other {
        tableless: false,
        keeps_state: false,
    };
    if statements.len() != 1 {
        return other;
    }
    let Some(statement) = statements[0].stmt.as_ref().and_then(|s| s.node.as_ref()) else {
        return other;
    };
    match statement {
        N::TransactionStmt(t) => {
            use protobuf::TransactionStmtKind as T;
            Analysis::Transaction(match T::try_from(t.kind) {
                Ok(T::TransStmtBegin | T::TransStmtStart) => TransactionCommand::Begin,
                Ok(T::TransStmtCommit) if !t.chain => TransactionCommand::Commit,
                Ok(T::TransStmtRollback) if !t.chain => TransactionCommand::Rollback,
                _ => TransactionCommand::Other,
            })
        }
        // `RESET ALL` has no name.
        N::VariableSetStmt(set)
            if matches!(
                set.name.as_str(),
                "search_path" | "role" | "session_authorization" | ""
            ) =>
        {
            Analysis::SearchPath { temporary: false }
        }
        N::VariableSetStmt(_) => Analysis::Other {
            tableless: true,
            keeps_state: false,
        },
        // CURSOR_OPT_HOLD: the cursor outlives its transaction.
        N::DeclareCursorStmt(cursor) if cursor.options & 0x0020 != 0 => Analysis::Other {
            tableless: false,
            keeps_state: true,
        },
        N::PrepareStmt(_) | N::ListenStmt(_) | N::DiscardStmt(_) | N::DeallocateStmt(_) => {
            Analysis::Other {
                tableless: false,
                keeps_state: true,
            }
        }
        N::VariableShowStmt(show) => match show.name.as_str() {
            "pools" => Analysis::Admin(AdminCommand::Pools),
            "stats" => Analysis::Admin(AdminCommand::Stats),
            "shards" => Analysis::Admin(AdminCommand::Shards),
            _ => Analysis::Other {
                tableless: true,
                keeps_state: false,
            },
        },
        N::CreateStmt(create) if temporary(create.relation.as_ref()) => {
            Analysis::SearchPath { temporary: true }
        }
        N::CreateTableAsStmt(create)
            if temporary(create.into.as_ref().and_then(|into| into.rel.as_ref())) =>
        {
            Analysis::SearchPath { temporary: true }
        }
        N::ViewStmt(view) if temporary(view.view.as_ref()) => {
            Analysis::SearchPath { temporary: true }
        }
        N::CreateSeqStmt(sequence) if temporary(sequence.sequence.as_ref()) => {
            Analysis::SearchPath { temporary: true }
        }
        _ => match shape(&parsed, statement).and_then(|shape| with_name_ends(shape, sql)) {
            Some(shape) => Analysis::Routable(shape),
            None => {
                let tree = serde_json::to_string(&parsed.protobuf).unwrap_or_default();
                Analysis::Other {
                    tableless: matches!(statement, N::SelectStmt(_))
                        && !tree.is_empty()
                        && !tree.contains("\"RangeVar\""),
                    keeps_state: SESSION_FUNCTIONS
                        .iter()
                        .any(|name| tree.contains(&format!("\"sval\":\"{name}\""))),
                }
            }
        },
    }
}

/// A temporary relation: it shadows tables of the same name.
fn temporary(relation: Option<&protobuf::RangeVar>) -> bool {
    relation.is_some_and(|r| r.relpersistence == "t")
}

/// Functions whose effects outlive the statement on its connection (and
/// pg_backend_pid: a client that asks for its backend expects to keep it).
const SESSION_FUNCTIONS: [&str; 8] = [
    "pg_backend_pid",
    "set_config",
    "pg_advisory_lock",
    "pg_advisory_lock_shared",
    "pg_try_advisory_lock",
    "pg_try_advisory_lock_shared",
    "pg_advisory_unlock",
    "pg_advisory_unlock_all",
];

/// Completes each relation's span with the end of its (possibly
/// schema-qualified) name, found by scanning the text once.
fn with_name_ends(mut shape: Shape, sql: &str) -> Option<Shape> {
    let tokens = pg_query::scan(sql).ok()?.tokens;
    for relation in &mut shape.relations {
        let start = relation.span.0;
        let first = tokens.iter().position(|t| t.start as usize == start)?;
        let mut end = tokens[first].end as usize;
        if relation.schema.is_some() {
            let dot = tokens.get(first + 1)?;
            let last = tokens.get(first + 2)?;
            if sql.get(dot.start as usize..dot.end as usize)? != "." {
                return None;
            }
            end = last.end as usize;
        }
        relation.span.1 = end;
    }
    Some(shape)
}

/// The routable shape of a single statement, or None.
fn shape(parsed: &pg_query::ParseResult, statement: &N) -> Option<Shape> {
    // EXPLAIN of a routable statement runs where the statement would.
    let statement = match statement {
        N::ExplainStmt(explain) => explain.query.as_ref()?.node.as_ref()?,
        other => other,
    };
    let mut relations = Vec::new();
    let mut facts = Vec::new();
    let mut assigned = Vec::new();
    let mut insert = None;
    let mut locks_rows = false;
    let kind = match statement {
        N::SelectStmt(select) => {
            simple_select(select)?;
            from_clause(&select.from_clause, &mut relations, &mut facts)?;
            conjuncts(select.where_clause.as_deref(), &mut facts);
            locks_rows = !select.locking_clause.is_empty();
            Kind::Select
        }
        N::InsertStmt(ins) => {
            if ins.with_clause.is_some() {
                return None;
            }
            relations.push(relation(ins.relation.as_ref()?)?);
            let columns = if ins.cols.is_empty() {
                None
            } else {
                Some(
                    ins.cols
                        .iter()
                        .map(|c| match c.node.as_ref() {
                            Some(N::ResTarget(t)) if t.indirection.is_empty() => {
                                Some(t.name.clone())
                            }
                            _ => None,
                        })
                        .collect::<Option<Vec<_>>>()?,
                )
            };
            let Some(N::SelectStmt(values)) = ins.select_stmt.as_ref()?.node.as_ref() else {
                return None;
            };
            if values.values_lists.is_empty() || values.with_clause.is_some() {
                return None; // INSERT … SELECT
            }
            let mut rows = Vec::new();
            for row in &values.values_lists {
                let Some(N::List(list)) = row.node.as_ref() else {
                    return None;
                };
                rows.push(list.items.iter().map(value).collect());
            }
            if let Some(conflict) = &ins.on_conflict_clause {
                // Constraint names differ on the shard tables.
                if conflict
                    .infer
                    .as_ref()
                    .is_some_and(|infer| !infer.conname.is_empty())
                {
                    return None;
                }
                for target in &conflict.target_list {
                    if let Some(N::ResTarget(t)) = target.node.as_ref() {
                        assigned.push(t.name.clone());
                    }
                }
            }
            insert = Some(InsertShape { columns, rows });
            Kind::Insert
        }
        N::UpdateStmt(update) => {
            if update.with_clause.is_some() {
                return None;
            }
            relations.push(relation(update.relation.as_ref()?)?);
            for target in &update.target_list {
                if let Some(N::ResTarget(t)) = target.node.as_ref() {
                    assigned.push(t.name.clone());
                }
            }
            from_clause(&update.from_clause, &mut relations, &mut facts)?;
            conjuncts(update.where_clause.as_deref(), &mut facts);
            Kind::Update
        }
        N::DeleteStmt(delete) => {
            if delete.with_clause.is_some() {
                return None;
            }
            relations.push(relation(delete.relation.as_ref()?)?);
            from_clause(&delete.using_clause, &mut relations, &mut facts)?;
            conjuncts(delete.where_clause.as_deref(), &mut facts);
            Kind::Delete
        }
        _ => return None,
    };
    // Every table must be one we found above (none in subqueries, CTEs,
    // …), nothing may need a default, and column references must be
    // unambiguous to us. The whole tree is walked (as JSON, which reaches
    // every node); INSERT/UPDATE/DELETE targets are not Node-wrapped.
    let tree = serde_json::to_value(&parsed.protobuf).ok()?;
    let mut walk = TreeFacts::default();
    walk.visit(&tree)?;
    let range_vars = walk.range_vars + usize::from(kind != Kind::Select);
    let functions = walk.functions;
    if range_vars != relations.len() || relations.is_empty() {
        return None;
    }
    Some(Shape {
        kind,
        relations,
        facts,
        insert,
        assigned,
        functions,
        locks_rows,
    })
}

/// What a walk over the whole parse tree finds.
#[derive(Default)]
struct TreeFacts {
    range_vars: usize,
    functions: Vec<(Option<String>, String)>,
}

impl TreeFacts {
    /// None when the tree holds something that needs the metadata node.
    fn visit(&mut self, value: &serde_json::Value) -> Option<()> {
        match value {
            serde_json::Value::Object(object) => {
                for (key, inner) in object {
                    match key.as_str() {
                        "RangeVar" => self.range_vars += 1,
                        "SubLink" | "RangeSubselect" | "SetToDefault" | "CommonTableExpr"
                        | "IntoClause" | "RangeTableSample" | "RangeTableFunc" => return None,
                        "ColumnRef" => {
                            let fields = inner.get("fields")?.as_array()?;
                            if fields.len() > 2 {
                                return None;
                            }
                        }
                        "FuncCall" => {
                            let names: Vec<String> = inner
                                .get("funcname")?
                                .as_array()?
                                .iter()
                                .map(|n| {
                                    n.pointer("/node/String/sval")
                                        .and_then(|s| s.as_str())
                                        .map(str::to_owned)
                                })
                                .collect::<Option<_>>()?;
                            match names.as_slice() {
                                [name] => self.functions.push((None, name.clone())),
                                [schema, name] => {
                                    self.functions.push((Some(schema.clone()), name.clone()))
                                }
                                _ => return None,
                            }
                        }
                        _ => {}
                    }
                    self.visit(inner)?;
                }
                Some(())
            }
            serde_json::Value::Array(items) => items.iter().try_for_each(|item| self.visit(item)),
            _ => Some(()),
        }
    }
}

/// A plain SELECT (no set operation, INTO or WITH).
fn simple_select(select: &protobuf::SelectStmt) -> Option<()> {
    let plain = select.op == protobuf::SetOperation::SetopNone as i32
        && select.into_clause.is_none()
        && select.with_clause.is_none()
        && select.values_lists.is_empty();
    plain.then_some(())
}

fn relation(range_var: &protobuf::RangeVar) -> Option<Relation> {
    if !range_var.catalogname.is_empty() || range_var.location < 0 {
        return None;
    }
    // `t AS a(x, y)` renames columns: a.x may be any column.
    if range_var
        .alias
        .as_ref()
        .is_some_and(|alias| !alias.colnames.is_empty())
    {
        return None;
    }
    Some(Relation {
        schema: (!range_var.schemaname.is_empty()).then(|| range_var.schemaname.clone()),
        name: range_var.relname.clone(),
        alias: range_var.alias.as_ref().map(|a| a.aliasname.clone()),
        span: (range_var.location as usize, range_var.location as usize),
    })
}

/// Tables of a FROM list and the equalities of its inner joins.
fn from_clause(
    items: &[protobuf::Node],
    relations: &mut Vec<Relation>,
    facts: &mut Vec<Fact>,
) -> Option<()> {
    for item in items {
        from_item(item.node.as_ref()?, relations, facts)?;
    }
    Some(())
}

/// Returns the indexes of the relations the item contributes.
fn from_item(node: &N, relations: &mut Vec<Relation>, facts: &mut Vec<Fact>) -> Option<()> {
    match node {
        N::RangeVar(range_var) => {
            relations.push(relation(range_var)?);
            Some(())
        }
        N::RangeFunction(_) => Some(()),
        N::JoinExpr(join) => {
            if join.is_natural || join.alias.is_some() || join.join_using_alias.is_some() {
                return None;
            }
            let first = relations.len();
            from_item(join.larg.as_ref()?.node.as_ref()?, relations, facts)?;
            let middle = relations.len();
            from_item(join.rarg.as_ref()?.node.as_ref()?, relations, facts)?;
            // Outer joins' conditions do not restrict the preserved side:
            // only inner joins contribute facts.
            if join.jointype == protobuf::JoinType::JoinInner as i32 {
                conjuncts(join.quals.as_deref(), facts);
                for using in &join.using_clause {
                    let column = string_of(using)?;
                    for left in first..middle {
                        for right in middle..relations.len() {
                            facts.push(Fact::Equal(
                                ColumnRef {
                                    qualifier: Some(relations[left].reference_name().to_owned()),
                                    column: column.clone(),
                                },
                                ColumnRef {
                                    qualifier: Some(relations[right].reference_name().to_owned()),
                                    column: column.clone(),
                                },
                            ));
                        }
                    }
                }
            }
            Some(())
        }
        _ => None,
    }
}

/// Equalities among the AND-ed conditions of `condition`.
fn conjuncts(condition: Option<&protobuf::Node>, facts: &mut Vec<Fact>) {
    let Some(node) = condition.and_then(|c| c.node.as_ref()) else {
        return;
    };
    match node {
        N::BoolExpr(b) if b.boolop == protobuf::BoolExprType::AndExpr as i32 => {
            for arg in &b.args {
                conjuncts(Some(arg), facts);
            }
        }
        N::AExpr(e) if is_equals(&e.name) => {
            let (Some(left), Some(right)) = (e.lexpr.as_deref(), e.rexpr.as_deref()) else {
                return;
            };
            if e.kind == protobuf::AExprKind::AexprOp as i32 {
                match (column_ref(left), column_ref(right)) {
                    (Some(a), Some(b)) => facts.push(Fact::Equal(a, b)),
                    (Some(a), None) => {
                        if let Some(v) = value(right) {
                            facts.push(Fact::OneOf(a, vec![v]));
                        }
                    }
                    (None, Some(b)) => {
                        if let Some(v) = value(left) {
                            facts.push(Fact::OneOf(b, vec![v]));
                        }
                    }
                    _ => {}
                }
            } else if e.kind == protobuf::AExprKind::AexprIn as i32 {
                if let (Some(column), Some(N::List(list))) = (column_ref(left), right.node.as_ref())
                {
                    if let Some(values) = list.items.iter().map(value).collect() {
                        facts.push(Fact::OneOf(column, values));
                    }
                }
            }
        }
        _ => {}
    }
}

fn is_equals(name: &[protobuf::Node]) -> bool {
    matches!(name, [only] if string_of(only).as_deref() == Some("="))
}

fn string_of(node: &protobuf::Node) -> Option<String> {
    match node.node.as_ref()? {
        N::String(s) => Some(s.sval.clone()),
        _ => None,
    }
}

fn column_ref(node: &protobuf::Node) -> Option<ColumnRef> {
    let N::ColumnRef(c) = node.node.as_ref()? else {
        return None;
    };
    match c.fields.as_slice() {
        [column] => Some(ColumnRef {
            qualifier: None,
            column: string_of(column)?,
        }),
        [qualifier, column] => Some(ColumnRef {
            qualifier: Some(string_of(qualifier)?),
            column: string_of(column)?,
        }),
        _ => None,
    }
}

/// A constant or parameter, possibly cast to a key type.
fn value(node: &protobuf::Node) -> Option<Value> {
    match node.node.as_ref()? {
        N::AConst(c) => match c.val.as_ref()? {
            a_const::Val::Ival(i) => Some(Value::Integer(i.ival as i64)),
            // Integers beyond int4 arrive as "float" literals.
            a_const::Val::Fval(f) => f.fval.parse::<i64>().ok().map(Value::Integer),
            a_const::Val::Sval(s) => Some(Value::Text(s.sval.clone())),
            _ => None,
        },
        N::ParamRef(p) if p.number >= 1 => Some(Value::Param {
            index: p.number as usize - 1,
            cast: None,
        }),
        N::TypeCast(cast) => {
            // Only a string literal or a parameter cast straight to a key
            // type without a type modifier: other casts can change the value
            // (`007::text` is '7', `'abc'::varchar(2)` is 'ab').
            let type_name = cast.type_name.as_ref()?;
            if !type_name.array_bounds.is_empty() || !type_name.typmods.is_empty() {
                return None;
            }
            let names: Vec<String> = type_name.names.iter().filter_map(string_of).collect();
            let name = match names.as_slice() {
                [name] => name.as_str(),
                [schema, name] if schema == "pg_catalog" => name.as_str(),
                _ => return None,
            };
            let encoding = KeyEncoding::for_type_name(name)?;
            match cast.arg.as_deref()?.node.as_ref()? {
                N::ParamRef(p) if p.number >= 1 => Some(Value::Param {
                    index: p.number as usize - 1,
                    cast: Some(encoding),
                }),
                N::AConst(c) => match c.val.as_ref()? {
                    a_const::Val::Sval(s) => Some(Value::Text(s.sval.clone())),
                    _ => None,
                },
                _ => None,
            }
        }
        _ => None,
    }
}

// ---- routing ----------------------------------------------------------------

/// Parameters bound for one execution.
pub struct Parameters<'a> {
    pub values: &'a [Option<bytes::Bytes>],
    pub formats: &'a dyn Fn(usize) -> i16,
    /// Types declared at Parse (0: inferred by the server).
    pub declared_types: &'a [u32],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Everything on one worker: the rewritten statement.
    Worker {
        node: NodeId,
        sql: String,
        /// Shards touched (for metrics).
        shard: Option<i64>,
        writes: bool,
    },
    /// Only reference tables are read: any node with copies can answer;
    /// `rewrites` gives the text per node.
    ReferenceOnly {
        rewrites: HashMap<NodeId, String>,
    },
    Metadata,
}

/// Context of the client session that routing depends on.
pub struct Session<'a> {
    /// The schemas unqualified names are looked up in; None when the
    /// coordinator does not know them (the client changed search_path, or
    /// its role, or made a temporary table): such names are not routed.
    pub search_path: Option<&'a [String]>,
}

/// Functions that must run where their state lives (the metadata node),
/// or that leave session state on a pooled connection.
const METADATA_FUNCTIONS: [&str; 11] = [
    "nextval",
    "currval",
    "setval",
    "lastval",
    "set_config",
    "pg_advisory_lock",
    "pg_advisory_lock_shared",
    "pg_try_advisory_lock",
    "pg_try_advisory_lock_shared",
    "pg_advisory_unlock",
    "pg_advisory_unlock_all",
];

impl Shape {
    /// Whether it calls a function that may leave session state behind
    /// (set_config, session advisory locks).
    /// A read that may share a pipelined server connection with other
    /// clients' (see multiplex.rs): a SELECT that takes no row locks and
    /// calls no function but a few built-in aggregates and operators-like
    /// functions (others could write, wait or change the session).
    pub fn multiplexable(&self) -> bool {
        const READ_ONLY_FUNCTIONS: [&str; 9] = [
            "count", "sum", "avg", "min", "max", "coalesce", "lower", "upper", "length",
        ];
        self.kind == Kind::Select
            && !self.locks_rows
            && self.functions.iter().all(|(schema, name)| {
                matches!(schema.as_deref(), None | Some("pg_catalog"))
                    && READ_ONLY_FUNCTIONS.contains(&name.as_str())
            })
    }

    pub fn may_change_session(&self) -> bool {
        self.functions
            .iter()
            .any(|(_, name)| SESSION_FUNCTIONS.contains(&name.as_str()))
    }
}

/// `sql` is the statement as the client sent it and `normalized` its
/// literals (the shape was made from `normalized.key`).
pub fn route(
    shape: &Shape,
    sql: &str,
    normalized: &Normalized,
    map: &ClusterMap,
    session: &Session<'_>,
    parameters: Option<&Parameters<'_>>,
) -> Route {
    route_inner(shape, sql, normalized, map, session, parameters).unwrap_or(Route::Metadata)
}

fn route_inner(
    shape: &Shape,
    sql: &str,
    normalized: &Normalized,
    map: &ClusterMap,
    session: &Session<'_>,
    parameters: Option<&Parameters<'_>>,
) -> Option<Route> {
    for (schema, name) in &shape.functions {
        let catalog = matches!(schema.as_deref(), None | Some("pg_catalog"));
        if !catalog
            || !map.catalog_functions.contains(name)
            || METADATA_FUNCTIONS.contains(&name.as_str())
        {
            return None;
        }
    }
    let mut tables = Vec::with_capacity(shape.relations.len());
    for relation in &shape.relations {
        let search_path = match (&relation.schema, session.search_path) {
            (Some(_), _) => &[][..],
            (None, Some(path)) => path,
            (None, None) => return None,
        };
        tables.push(map.table(relation.schema.as_deref(), &relation.name, search_path)?);
    }
    let writes = shape.kind != Kind::Select;
    if writes && !matches!(tables[0].kind, TableKind::Distributed { .. }) {
        return None;
    }
    if let [table] = tables.as_slice() {
        if let Some(route) = route_one_table(shape, sql, normalized, table, parameters, writes) {
            return route;
        }
    }
    // Which relation each column reference means.
    let resolve = |column: &ColumnRef| -> Option<usize> {
        match &column.qualifier {
            Some(qualifier) => {
                let mut found = shape
                    .relations
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.reference_name() == qualifier);
                let first = found.next()?;
                found.next().is_none().then_some(first.0)
            }
            None => {
                let mut found = tables.iter().enumerate().filter(|(_, t)| {
                    matches!(&t.kind, TableKind::Distributed { column: c, .. } if *c == column.column)
                });
                let first = found.next()?;
                found.next().is_none().then_some(first.0)
            }
        }
    };
    // Union-find over (relation, column).
    let mut classes: HashMap<(usize, String), usize> = HashMap::new();
    let mut parent: Vec<usize> = Vec::new();
    let mut class_of = |key: (usize, String), parent: &mut Vec<usize>| -> usize {
        *classes.entry(key).or_insert_with(|| {
            parent.push(parent.len());
            parent.len() - 1
        })
    };
    fn find(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut bound: Vec<(usize, &Vec<Value>)> = Vec::new();
    for fact in &shape.facts {
        match fact {
            Fact::Equal(a, b) => {
                let (Some(ra), Some(rb)) = (resolve(a), resolve(b)) else {
                    continue;
                };
                let ca = class_of((ra, a.column.clone()), &mut parent);
                let cb = class_of((rb, b.column.clone()), &mut parent);
                let (ra, rb) = (find(&mut parent, ca), find(&mut parent, cb));
                parent[ra] = rb;
            }
            Fact::OneOf(column, values) => {
                if let Some(r) = resolve(column) {
                    let class = class_of((r, column.column.clone()), &mut parent);
                    bound.push((class, values));
                }
            }
        }
    }
    let mut node: Option<NodeId> = None;
    let mut shard_of: Vec<Option<String>> = vec![None; shape.relations.len()];
    let mut first_shard = None;
    let mut any_distributed = false;
    for (index, table) in tables.iter().enumerate() {
        let TableKind::Distributed {
            column,
            encoding,
            shards,
        } = &table.kind
        else {
            continue;
        };
        any_distributed = true;
        let values: Vec<&Value> = if index == 0 && shape.kind == Kind::Insert {
            insert_keys(shape.insert.as_ref()?, table, column)?
        } else {
            let own = class_of((index, column.clone()), &mut parent);
            let class = find(&mut parent, own);
            let candidates = bound
                .iter()
                .filter(|(c, _)| find(&mut parent, *c) == class)
                .map(|(_, values)| *values)
                .min_by_key(|values| values.len())?;
            candidates.iter().collect()
        };
        let placement = one_shard(&values, *encoding, shards, normalized, parameters)?;
        if *node.get_or_insert(placement.node) != placement.node {
            return None;
        }
        first_shard.get_or_insert(placement.shard_id);
        shard_of[index] = Some(placement.qualified_name.clone());
    }
    // A write must not move a row: the key is not assigned.
    if writes {
        if let TableKind::Distributed { column, .. } = &tables[0].kind {
            if shape.assigned.iter().any(|c| c == column) {
                return None;
            }
        }
    }
    if !any_distributed {
        let mut rewrites = HashMap::new();
        for node in map.nodes.keys() {
            let mut names = Vec::new();
            for table in &tables {
                let TableKind::Reference { copies } = &table.kind else {
                    return None;
                };
                names.push(copies.get(node)?.clone());
            }
            rewrites.insert(*node, rewrite(sql, normalized, &shape.relations, &names)?);
        }
        return Some(Route::ReferenceOnly { rewrites });
    }
    let node = node?;
    let mut names = Vec::with_capacity(tables.len());
    for (index, table) in tables.iter().enumerate() {
        match &table.kind {
            TableKind::Distributed { .. } => names.push(shard_of[index].clone()?),
            TableKind::Reference { copies } => names.push(copies.get(&node)?.clone()),
        }
    }
    Some(Route::Worker {
        node,
        sql: rewrite(sql, normalized, &shape.relations, &names)?,
        shard: first_shard,
        writes,
    })
}

/// The common case without joins, without building equivalence classes:
/// Some(route) when decided, None to take the general path (a reference
/// table, or facts that need it).
fn route_one_table(
    shape: &Shape,
    sql: &str,
    normalized: &Normalized,
    table: &crate::cluster::Table,
    parameters: Option<&Parameters<'_>>,
    writes: bool,
) -> Option<Option<Route>> {
    let TableKind::Distributed {
        column,
        encoding,
        shards,
    } = &table.kind
    else {
        return None;
    };
    let relation = &shape.relations[0];
    let means_key = |c: &ColumnRef| {
        c.column == *column
            && c.qualifier
                .as_deref()
                .is_none_or(|q| q == relation.reference_name())
    };
    // Equalities between columns could fix the key through another
    // column: the general path handles them.
    if shape
        .facts
        .iter()
        .any(|f| matches!(f, Fact::Equal(a, b) if means_key(a) || means_key(b)))
    {
        return None;
    }
    let decided = (|| {
        if writes && shape.assigned.iter().any(|c| c == column) {
            return None;
        }
        let values: Vec<&Value> = if shape.kind == Kind::Insert {
            insert_keys(shape.insert.as_ref()?, table, column)?
        } else {
            shape
                .facts
                .iter()
                .filter_map(|f| match f {
                    Fact::OneOf(c, values) if means_key(c) => Some(values),
                    _ => None,
                })
                .min_by_key(|values| values.len())?
                .iter()
                .collect()
        };
        let placement = one_shard(&values, *encoding, shards, normalized, parameters)?;
        Some(Route::Worker {
            node: placement.node,
            sql: rewrite(
                sql,
                normalized,
                &shape.relations,
                std::slice::from_ref(&placement.qualified_name),
            )?,
            shard: Some(placement.shard_id),
            writes,
        })
    })();
    Some(decided)
}

/// The one shard that owns every value, if there is one and every value's
/// keyspace id is known.
fn one_shard<'m>(
    values: &[&Value],
    encoding: KeyEncoding,
    shards: &'m ShardMap<crate::cluster::ShardPlacement>,
    normalized: &Normalized,
    parameters: Option<&Parameters<'_>>,
) -> Option<&'m crate::cluster::ShardPlacement> {
    let mut placement: Option<&crate::cluster::ShardPlacement> = None;
    for value in values {
        let id = key_id(value, encoding, normalized, parameters)?;
        let (_, found) = shards.lookup(id);
        match placement {
            None => placement = Some(found),
            Some(p) if p.shard_id == found.shard_id => {}
            Some(_) => return None,
        }
    }
    placement
}

/// The key values of the rows an INSERT writes, if every row's key is
/// fixed and no column the metadata node would fill in is left out.
fn insert_keys<'a>(
    insert: &'a InsertShape,
    table: &crate::cluster::Table,
    key_column: &str,
) -> Option<Vec<&'a Value>> {
    let columns: Vec<&str> = match &insert.columns {
        Some(columns) => columns.iter().map(String::as_str).collect(),
        None => table.columns.iter().map(String::as_str).collect(),
    };
    if table
        .filled_columns
        .iter()
        .any(|c| !columns.contains(&c.as_str()))
    {
        return None;
    }
    let position = columns.iter().position(|c| *c == key_column)?;
    insert
        .rows
        .iter()
        .map(|row| {
            // A short row leaves its last columns to their defaults.
            if row.len() > columns.len()
                || columns[row.len()..]
                    .iter()
                    .any(|c| table.filled_columns.contains(*c))
            {
                return None;
            }
            row.get(position)?.as_ref()
        })
        .collect()
}

/// The keyspace id of a value as a key of `encoding`; None when it cannot
/// be known exactly (the statement then goes to the metadata node).
fn key_id(
    value: &Value,
    encoding: KeyEncoding,
    normalized: &Normalized,
    parameters: Option<&Parameters<'_>>,
) -> Option<KeyspaceId> {
    match value {
        Value::Integer(i) => (encoding == KeyEncoding::Integer).then(|| keyspace_id_of_int(*i)),
        Value::Text(text) => text_key(text, encoding),
        Value::Param { index, cast } => {
            if cast.is_some_and(|c| c != encoding) {
                return None;
            }
            if *index >= normalized.first_literal {
                // A literal of the original text, by its text. A number is
                // a key only of an integer key, uncast or cast to an
                // integer type (a numeric literal cast to text is the
                // number's canonical text, not what was written).
                let literal = normalized.literals.get(index - normalized.first_literal)?;
                if literal.numeric && encoding != KeyEncoding::Integer {
                    return None;
                }
                return text_key(&literal.text, encoding);
            }
            let parameters = parameters?;
            let bytes = parameters.values.get(*index)?.as_ref()?;
            if (parameters.formats)(*index) == 0 {
                text_key(std::str::from_utf8(bytes).ok()?, encoding)
            } else {
                let declared = parameters.declared_types.get(*index).copied().unwrap_or(0);
                if declared == 0 && cast.is_none() {
                    // Inferred from the key column, so it has the key's type.
                } else if declared != 0 && !declared_type_matches(declared, encoding) {
                    return None;
                }
                binary_key(bytes, encoding)
            }
        }
    }
}

/// Type oids whose binary form the key encoding reads.
fn declared_type_matches(oid: u32, encoding: KeyEncoding) -> bool {
    match encoding {
        KeyEncoding::Integer => matches!(oid, 20 | 21 | 23),
        KeyEncoding::Text => matches!(oid, 25 | 1043),
        KeyEncoding::Uuid => oid == 2950,
        KeyEncoding::Bytes => oid == 17,
    }
}

fn text_key(text: &str, encoding: KeyEncoding) -> Option<KeyspaceId> {
    encoding.keyspace_id_of_text_form(text)
}

fn binary_key(bytes: &[u8], encoding: KeyEncoding) -> Option<KeyspaceId> {
    match encoding {
        KeyEncoding::Integer => {
            let value = match bytes.len() {
                2 => i16::from_be_bytes(bytes.try_into().ok()?) as i64,
                4 => i32::from_be_bytes(bytes.try_into().ok()?) as i64,
                8 => i64::from_be_bytes(bytes.try_into().ok()?),
                _ => return None,
            };
            Some(keyspace_id_of_int(value))
        }
        KeyEncoding::Text => std::str::from_utf8(bytes).ok().map(keyspace_id_of_text),
        KeyEncoding::Uuid => (bytes.len() == 16).then(|| keyspace_id(bytes)),
        KeyEncoding::Bytes => Some(keyspace_id(bytes)),
    }
}

/// The statement with each relation's name replaced by `names[i]`, keeping
/// the name the rest of the statement uses for it as an alias.
fn rewrite(
    sql: &str,
    normalized: &Normalized,
    relations: &[Relation],
    names: &[String],
) -> Option<String> {
    let mut edits: Vec<(usize, usize, &Relation, &String)> = relations
        .iter()
        .zip(names)
        .map(|(relation, name)| {
            (
                normalized.original_position(relation.span.0),
                normalized.original_position(relation.span.1),
                relation,
                name,
            )
        })
        .collect();
    edits.sort_by_key(|(start, ..)| *start);
    let mut out = String::with_capacity(sql.len() + 64);
    let mut at = 0;
    for (start, end, relation, name) in edits {
        if start < at || end < start {
            return None;
        }
        out.push_str(sql.get(at..start)?);
        out.push_str(name);
        if relation.alias.is_none() {
            out.push_str(" AS ");
            out.push_str(&quote::ident(&relation.name));
        }
        at = end;
    }
    out.push_str(sql.get(at..)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ServerAddress;
    use crate::cluster::{Node, ShardPlacement, Table};
    use pg_shard_core::range::equal_ranges;
    use pg_shard_core::ShardMap;
    use std::collections::HashSet;
    use std::sync::Arc;

    /// Two workers; `accounts` and `history` co-located (4 shards,
    /// alternating nodes), `branches` a reference table.
    fn cluster() -> ClusterMap {
        let mut map = ClusterMap {
            version: 7,
            ..Default::default()
        };
        for id in [1, 2] {
            map.nodes.insert(
                id,
                Node {
                    id,
                    address: ServerAddress {
                        host: "127.0.0.1".into(),
                        port: 54320 + id as u16,
                    },
                },
            );
        }
        let distributed = |name: &str, base: i64, filled: &[&str]| {
            let entries = equal_ranges(4)
                .unwrap()
                .into_iter()
                .enumerate()
                .map(|(i, range)| {
                    (
                        range,
                        ShardPlacement {
                            shard_id: base + i as i64,
                            qualified_name: format!("\"public\".\"{name}_{}\"", base + i as i64),
                            node: 1 + (i as i32 % 2),
                            shard_group_id: i as i64,
                        },
                    )
                })
                .collect();
            Arc::new(Table {
                schema: "public".into(),
                name: name.into(),
                colocation_id: 1,
                kind: TableKind::Distributed {
                    column: "aid".into(),
                    encoding: KeyEncoding::Integer,
                    shards: ShardMap::new(7, entries).unwrap(),
                },
                columns: vec!["aid".into(), "bid".into(), "abalance".into()],
                filled_columns: filled.iter().map(|s| s.to_string()).collect(),
            })
        };
        map.tables.insert(
            ("public".into(), "accounts".into()),
            distributed("accounts", 100, &[]),
        );
        map.tables.insert(
            ("public".into(), "history".into()),
            distributed("history", 200, &["mtime"]),
        );
        map.tables.insert(
            ("public".into(), "branches".into()),
            Arc::new(Table {
                schema: "public".into(),
                name: "branches".into(),
                colocation_id: 2,
                kind: TableKind::Reference {
                    copies: [
                        (1, "\"public\".\"branches_300\"".to_string()),
                        (2, "\"public\".\"branches_300\"".to_string()),
                    ]
                    .into_iter()
                    .collect(),
                },
                columns: vec!["bid".into()],
                filled_columns: HashSet::new(),
            }),
        );
        map.catalog_functions = ["now", "lower", "nextval", "count", "set_config"]
            .into_iter()
            .map(String::from)
            .collect();
        map
    }

    fn route_text(sql: &str) -> Route {
        let map = cluster();
        let path = default_path("app");
        let session = Session {
            search_path: Some(&path),
        };
        let normalized = crate::lexer::normalize(sql);
        match analyze(&normalized.key) {
            Analysis::Routable(shape) => route(&shape, sql, &normalized, &map, &session, None),
            _ => Route::Metadata,
        }
    }

    fn shard_of(aid: i64) -> (i32, i64) {
        let map = cluster();
        let TableKind::Distributed { shards, .. } =
            &map.tables[&("public".into(), "accounts".into())].kind
        else {
            unreachable!()
        };
        let (_, p) = shards.lookup(keyspace_id_of_int(aid));
        (p.node, p.shard_id)
    }

    #[test]
    fn only_plain_reads_may_share_a_connection() {
        let multiplexable = |sql: &str| match analyze(sql) {
            Analysis::Routable(shape) => shape.multiplexable(),
            _ => false,
        };
        assert!(multiplexable(
            "SELECT abalance FROM accounts WHERE aid = $1"
        ));
        assert!(multiplexable(
            "SELECT count(*), max(abalance) FROM accounts WHERE aid = 1"
        ));
        assert!(multiplexable(
            "SELECT (aid + 1)::float8 / 3 FROM accounts WHERE aid = 1"
        ));
        // Row locks wait; writes wait for row locks; functions may write,
        // wait or change settings.
        assert!(!multiplexable(
            "SELECT abalance FROM accounts WHERE aid = 1 FOR UPDATE"
        ));
        assert!(!multiplexable(
            "SELECT abalance FROM accounts WHERE aid = 1 FOR KEY SHARE"
        ));
        assert!(!multiplexable(
            "UPDATE accounts SET abalance = 0 WHERE aid = 1"
        ));
        assert!(!multiplexable("INSERT INTO accounts (aid) VALUES (1)"));
        assert!(!multiplexable("DELETE FROM accounts WHERE aid = 1"));
        assert!(!multiplexable(
            "SELECT my_function(aid) FROM accounts WHERE aid = 1"
        ));
        assert!(!multiplexable(
            "SELECT public.count(aid) FROM accounts WHERE aid = 1"
        ));
        assert!(!multiplexable(
            "SELECT pg_sleep(1) FROM accounts WHERE aid = 1"
        ));
    }

    #[test]
    fn point_select_goes_to_the_owner_with_the_shard_name() {
        let (node, shard) = shard_of(42);
        assert_eq!(
            route_text("SELECT abalance FROM accounts WHERE aid = 42"),
            Route::Worker {
                node,
                sql: format!("SELECT abalance FROM \"public\".\"accounts_{shard}\" AS \"accounts\" WHERE aid = 42"),
                shard: Some(shard),
                writes: false,
            }
        );
    }

    #[test]
    fn aliases_and_qualified_names_are_kept() {
        let (node, shard) = shard_of(7);
        let Route::Worker { node: n, sql, .. } =
            route_text("select a.abalance from public.accounts a where a.aid = '7'")
        else {
            panic!("not routed");
        };
        assert_eq!(n, node);
        assert_eq!(
            sql,
            format!("select a.abalance from \"public\".\"accounts_{shard}\" a where a.aid = '7'")
        );
    }

    #[test]
    fn co_located_join_and_reference_table() {
        let sql = "SELECT * FROM accounts a JOIN history h ON a.aid = h.aid JOIN branches b ON b.bid = a.bid WHERE h.aid = 5";
        let Route::Worker { sql: rewritten, .. } = route_text(sql) else {
            panic!("not routed");
        };
        assert!(rewritten.contains("branches_300"));
        assert!(rewritten.contains("history_2"));
    }

    #[test]
    fn what_goes_to_the_metadata_node() {
        for sql in [
            "SELECT * FROM accounts",                                   // no key
            "SELECT * FROM accounts WHERE aid = 1 OR aid = 2",          // OR
            "SELECT * FROM accounts WHERE aid > 5",                     // range
            "SELECT * FROM accounts a LEFT JOIN history h ON a.aid = h.aid WHERE a.aid = 1", // outer join
            "SELECT * FROM accounts WHERE aid = (SELECT 1)",            // subquery
            "WITH x AS (SELECT 1) SELECT * FROM accounts WHERE aid = 1", // CTE
            "SELECT * FROM local_table WHERE aid = 1",                  // unknown table
            "SELECT nextval('s') FROM accounts WHERE aid = 1",          // sequence
            "SELECT my_function() FROM accounts WHERE aid = 1",         // not pg_catalog
            "SELECT set_config('search_path', 'x', false) FROM accounts WHERE aid = 1",
            "UPDATE accounts SET aid = 2 WHERE aid = 1",                // moves a row
            "INSERT INTO accounts VALUES (1, 1, 0), (2, 1, 0), (3, 1, 0), (4, 1, 0), (5, 1, 0), (6, 1, 0)", // many shards
            "INSERT INTO history (aid, bid) VALUES (1, 1)",             // mtime default left out
            "INSERT INTO accounts SELECT * FROM accounts WHERE aid = 1", // INSERT … SELECT
            "INSERT INTO accounts VALUES (DEFAULT, 1, 0)",
            "UPDATE branches SET bid = 1",                              // reference write
            "SELECT * FROM accounts WHERE aid = 1.5",                   // not an integer
            "SELECT * FROM accounts WHERE aid = 1::numeric",
            "SELECT * FROM accounts WHERE aid = 1; SELECT 1",
            "SELECT * FROM accounts a, accounts b WHERE a.aid = 1",     // b not fixed
            "SELECT * FROM accounts WHERE aid IN (1, 2, 3, 4, 5, 6, 7, 8)",
            "SELECT * INTO copy FROM accounts WHERE aid = 1",
            "SELECT 1 FROM accounts WHERE aid = 1 UNION SELECT 2",
            "EXPLAIN SELECT * FROM accounts",
        ] {
            assert_eq!(route_text(sql), Route::Metadata, "{sql}");
        }
    }

    #[test]
    fn writes_by_key_are_routed() {
        for sql in [
            "UPDATE accounts SET abalance = abalance + 5 WHERE aid = 3",
            "DELETE FROM accounts WHERE aid = 3 RETURNING *",
            "INSERT INTO accounts (aid, bid, abalance) VALUES (3, 1, 0) ON CONFLICT (aid) DO UPDATE SET abalance = 1",
            "INSERT INTO accounts VALUES (3, 1, 0)",
            "INSERT INTO history (aid, bid, mtime) VALUES (3, 1, now())",
        ] {
            assert!(matches!(route_text(sql), Route::Worker { writes: true, .. }), "{sql}");
        }
    }

    #[test]
    fn explain_goes_where_the_statement_goes() {
        let (node, shard) = shard_of(42);
        assert_eq!(
            route_text("EXPLAIN (COSTS OFF) SELECT * FROM accounts WHERE aid = 42"),
            Route::Worker {
                node,
                sql: format!("EXPLAIN (COSTS OFF) SELECT * FROM \"public\".\"accounts_{shard}\" AS \"accounts\" WHERE aid = 42"),
                shard: Some(shard),
                writes: false,
            }
        );
    }

    #[test]
    fn reference_only_reads_can_go_anywhere() {
        assert!(matches!(
            route_text("SELECT * FROM branches"),
            Route::ReferenceOnly { .. }
        ));
    }

    #[test]
    fn parameters_route_by_their_values() {
        let sql = "SELECT abalance FROM accounts WHERE aid = $1";
        let Analysis::Routable(shape) = analyze(sql) else {
            panic!()
        };
        let normalized = crate::lexer::normalize(sql);
        let map = cluster();
        let path = default_path("app");
        let session = Session {
            search_path: Some(&path),
        };
        let (node, shard) = shard_of(99);
        let text_value = [Some(bytes::Bytes::from_static(b"99"))];
        let text = Parameters {
            values: &text_value,
            formats: &|_| 0,
            declared_types: &[],
        };
        let binary_value = [Some(bytes::Bytes::copy_from_slice(&99i32.to_be_bytes()))];
        let binary = Parameters {
            values: &binary_value,
            formats: &|_| 1,
            declared_types: &[23],
        };
        for parameters in [&text, &binary] {
            assert!(matches!(
                route(&shape, sql, &normalized, &map, &session, Some(parameters)),
                Route::Worker { node: n, shard: Some(s), .. } if n == node && s == shard
            ));
        }
        // A binary numeric is not read as an integer.
        let numeric = Parameters {
            values: &binary_value,
            formats: &|_| 1,
            declared_types: &[1700],
        };
        assert_eq!(
            route(&shape, sql, &normalized, &map, &session, Some(&numeric)),
            Route::Metadata
        );
        // No parameters (Describe before Bind), a NULL: the metadata node.
        assert_eq!(
            route(&shape, sql, &normalized, &map, &session, None),
            Route::Metadata
        );
        let null = Parameters {
            values: &[None],
            formats: &|_| 0,
            declared_types: &[],
        };
        assert_eq!(
            route(&shape, sql, &normalized, &map, &session, Some(&null)),
            Route::Metadata
        );
    }

    #[test]
    fn transaction_and_admin_statements() {
        assert!(matches!(
            analyze("begin"),
            Analysis::Transaction(TransactionCommand::Begin)
        ));
        assert!(matches!(
            analyze("START TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
            Analysis::Transaction(TransactionCommand::Begin)
        ));
        assert!(matches!(
            analyze("END"),
            Analysis::Transaction(TransactionCommand::Commit)
        ));
        assert!(matches!(
            analyze("COMMIT AND CHAIN"),
            Analysis::Transaction(TransactionCommand::Other)
        ));
        assert!(matches!(
            analyze("SHOW POOLS"),
            Analysis::Admin(AdminCommand::Pools)
        ));
        assert!(matches!(
            analyze("set search_path = x"),
            Analysis::SearchPath { temporary: false }
        ));
        assert!(matches!(
            analyze("CREATE TEMP TABLE accounts (aid int)"),
            Analysis::SearchPath { temporary: true }
        ));
        assert!(matches!(
            analyze("SET ROLE app"),
            Analysis::SearchPath { .. }
        ));
        assert!(matches!(
            analyze("SELECT now()"),
            Analysis::Other {
                tableless: true,
                ..
            }
        ));
        assert!(matches!(
            analyze("SELECT * FROM local_table UNION SELECT 1"),
            Analysis::Other {
                tableless: false,
                ..
            }
        ));
        assert!(matches!(
            analyze("DISCARD ALL"),
            Analysis::Other {
                keeps_state: true,
                ..
            }
        ));
        for kept in [
            "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
            "SELECT pg_advisory_lock(7)",
            "SELECT set_config('work_mem', '9MB', false)",
        ] {
            assert!(
                matches!(
                    analyze(kept),
                    Analysis::Other {
                        keeps_state: true,
                        ..
                    }
                ),
                "{kept}"
            );
        }
        assert!(matches!(
            analyze("DECLARE c CURSOR FOR SELECT 1"),
            Analysis::Other {
                keeps_state: false,
                ..
            }
        ));
        assert!(matches!(analyze("SELEC 1"), Analysis::Unparsed));
    }

    #[test]
    fn values_that_could_change_are_not_routed() {
        for sql in [
            // a short row leaves a filled column (mtime) to its default
            "INSERT INTO history VALUES (1, 1)",
            // column alias lists rename columns
            "SELECT * FROM accounts AS a(bid, aid) WHERE a.aid = 5",
            // constraint names differ on shard tables
            "INSERT INTO accounts VALUES (1, 1, 0) ON CONFLICT ON CONSTRAINT accounts_pkey DO NOTHING",
            // casts that change the value or its type
            "SELECT * FROM accounts WHERE aid = '05'::int::bigint",
            "SELECT * FROM accounts WHERE aid = 1e2",
            "SELECT * FROM accounts WHERE aid = 5::numeric::int",
        ] {
            assert_eq!(route_text(sql), Route::Metadata, "{sql}");
        }
    }

    #[test]
    fn text_keys_take_literals_as_written_only() {
        let mut map = cluster();
        let shards = match &map.tables[&("public".to_string(), "accounts".to_string())].kind {
            TableKind::Distributed { shards, .. } => shards.clone(),
            _ => unreachable!(),
        };
        map.tables.insert(
            ("public".into(), "names".into()),
            Arc::new(Table {
                schema: "public".into(),
                name: "names".into(),
                colocation_id: 3,
                kind: TableKind::Distributed {
                    column: "k".into(),
                    encoding: KeyEncoding::Text,
                    shards,
                },
                columns: vec!["k".into()],
                filled_columns: HashSet::new(),
            }),
        );
        let path = default_path("app");
        let session = Session {
            search_path: Some(&path),
        };
        let route_of = |sql: &str| {
            let normalized = crate::lexer::normalize(sql);
            match analyze(&normalized.key) {
                Analysis::Routable(shape) => route(&shape, sql, &normalized, &map, &session, None),
                _ => Route::Metadata,
            }
        };
        for sql in [
            "SELECT * FROM names WHERE k = 007::text",
            "SELECT * FROM names WHERE k = 1e2::text",
            "SELECT * FROM names WHERE k = 'abcd'::varchar(2)",
            "SELECT * FROM names WHERE k = 42",
        ] {
            assert_eq!(route_of(sql), Route::Metadata, "{sql}");
        }
        for sql in [
            "SELECT * FROM names WHERE k = 'abc'",
            "SELECT * FROM names WHERE k = 'abc'::text",
            "SELECT * FROM names WHERE k = '007'::varchar",
        ] {
            assert!(matches!(route_of(sql), Route::Worker { .. }), "{sql}");
        }
    }

    #[test]
    fn a_relation_in_the_users_schema_shadows_public() {
        let mut map = cluster();
        map.same_names.insert(("app".into(), "accounts".into()));
        let sql = "SELECT * FROM accounts WHERE aid = 1";
        let normalized = crate::lexer::normalize(sql);
        let Analysis::Routable(shape) = analyze(&normalized.key) else {
            panic!()
        };
        let (app_path, other_path) = (default_path("app"), default_path("other"));
        let as_app = Session {
            search_path: Some(&app_path),
        };
        let as_other = Session {
            search_path: Some(&other_path),
        };
        assert_eq!(
            route(&shape, sql, &normalized, &map, &as_app, None),
            Route::Metadata
        );
        assert!(matches!(
            route(&shape, sql, &normalized, &map, &as_other, None),
            Route::Worker { .. }
        ));
    }

    fn default_path(user: &str) -> Vec<String> {
        crate::search_path::schemas("\"$user\", public", user).unwrap()
    }

    #[test]
    fn names_resolve_along_the_sessions_search_path() {
        let mut map = cluster();
        // tenant_x.accounts: a table of its own (history's shards stand in).
        let tenant = map.tables[&("public".to_string(), "history".to_string())].clone();
        map.tables
            .insert(("tenant_x".into(), "accounts".into()), tenant);
        map.same_names
            .insert(("tenant_y".into(), "accounts".into()));
        let sql = "SELECT * FROM accounts WHERE aid = 1";
        let normalized = crate::lexer::normalize(sql);
        let Analysis::Routable(shape) = analyze(&normalized.key) else {
            panic!()
        };
        let routes = |path: Option<&[String]>| {
            route(
                &shape,
                sql,
                &normalized,
                &map,
                &Session { search_path: path },
                None,
            )
        };
        let path = |value: &str| crate::search_path::schemas(value, "app").unwrap();
        // tenant_y.accounts is an ordinary table: the node reads that one.
        assert_eq!(routes(Some(&path("tenant_y, public"))), Route::Metadata);
        let shard_table = |route: Route| match route {
            Route::Worker { sql, .. } => sql,
            other => panic!("not routed to a worker: {other:?}"),
        };
        // No relation of that name in "empty": public's is found.
        assert!(shard_table(routes(Some(&path("empty, public")))).contains("\"accounts_"));
        assert!(shard_table(routes(Some(&path("tenant_x, public")))).contains("\"history_"));
        assert!(shard_table(routes(Some(&path("public, tenant_x")))).contains("\"accounts_"));
        // Not on the path at all, or the path unknown.
        assert_eq!(routes(Some(&path("empty"))), Route::Metadata);
        assert_eq!(routes(None), Route::Metadata);
    }
}
