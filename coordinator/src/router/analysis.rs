//! Statement analysis: a statement's text parsed once (pg_query) into an
//! [`Analysis`] that does not depend on the shard map — the tables it
//! names, the equalities that fix their keys, and whether anything in it
//! needs the metadata node.

use super::*;

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
            let name = t.savepoint_name.clone();
            match T::try_from(t.kind) {
                Ok(T::TransStmtSavepoint) => return Analysis::Savepoint(Savepoint::Define(name)),
                Ok(T::TransStmtRelease) => return Analysis::Savepoint(Savepoint::Release(name)),
                Ok(T::TransStmtRollbackTo) => {
                    return Analysis::Savepoint(Savepoint::RollbackTo(name))
                }
                _ => {}
            }
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
        N::DeallocateStmt(deallocate) => Analysis::Deallocate {
            name: (!deallocate.isall && !deallocate.name.is_empty())
                .then(|| deallocate.name.clone()),
        },
        N::PrepareStmt(_) | N::ListenStmt(_) | N::DiscardStmt(_) => Analysis::Other {
            tableless: false,
            keeps_state: true,
        },
        N::VariableShowStmt(show) => match show.name.as_str() {
            "pools" => Analysis::Admin(AdminCommand::Pools),
            "clients" => Analysis::Admin(AdminCommand::Clients),
            "stats" => Analysis::Admin(AdminCommand::Stats),
            "shards" => Analysis::Admin(AdminCommand::Shards),
            "hot_keys" => Analysis::Admin(AdminCommand::HotKeys),
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
                    // (pg_shard's functions are the metadata node's.)
                    tableless: matches!(statement, N::SelectStmt(_))
                        && !tree.is_empty()
                        && !tree.contains("\"RangeVar\"")
                        && !tree.contains("\"sval\":\"pg_shard\""),
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
pub(super) const SESSION_FUNCTIONS: [&str; 8] = [
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
