//! The router class: a statement whose distributed tables each come down to
//! one shard, all on one node, runs whole on that node in one round trip
//! ([`crate::executor::router_scan`]), rewritten onto the shard tables
//! ([`super::worker_query`]).
//!
//! A statement qualifies when, at every query level, each distributed
//! table's distribution column is equal to a constant (in WHERE or an inner
//! join's ON) or, through `a.key = b.key`, to another table's that is; for
//! an INSERT, the key it inserts is a constant. Parameters count as
//! constants in custom plans (their values are inlined; the plan cache
//! plans such statements for each execution's values). Everything else in
//! it must mean the same on the worker: only distributed and reference
//! tables, built-in functions and operators, nothing volatile and nothing
//! that reads the metadata node's session or clock (`now()`, `CURRENT_USER`,
//! sequences) — except where such a part reads no row: the metadata node
//! computes it once and sends it as a parameter ([`super::computed_values`]).
//! What does not qualify takes the postgres_fdw path, as before.

use super::computed_values::{computed_here, Computed};
use super::conditions::{deterministic, is_key_equality, same_key_types};
use super::partition_key::{partition_key, strip_relabel, Busy};
use super::worker_query::{qualified_name, worker_query, ShardRelation};
use crate::error::Result;
use crate::executor::moved_shards::ShardTarget;
use crate::executor::router_scan::RouterTask;
use crate::metadata::shard_lookup::{
    any_shard, at_version, is_reference_table, reference_copy, shard_of,
};
use crate::parse_tree::{contents, highest_parameter, with_parameter_values, TreeContents};
use pg_shard_core::UnionFind;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, PgList};
use std::collections::HashMap;
use std::ffi::CStr;

static ENABLE_ROUTER: GucSetting<bool> = GucSetting::<bool>::new(true);

pub(crate) fn register_gucs() {
    GucRegistry::define_bool_guc(
        c"pg_shard.enable_router_executor",
        c"Runs statements that touch one shard group whole on its worker.",
        c"Off, they run over postgres_fdw as statements on several shards do.",
        &ENABLE_ROUTER,
        GucContext::Userset,
        GucFlags::default(),
    );
}

/// The router task for `parse`, or None when it does not qualify.
///
/// # Safety
/// `parse` is the rewritten tree about to be planned; it is not modified.
pub(super) unsafe fn plan(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: i32,
    bound_params: pg_sys::ParamListInfo,
) -> Result<Option<RouterTask>> {
    // SAFETY: reads the transaction state and the statement texts.
    if !ENABLE_ROUTER.get()
        || unsafe { !client_statement(query_string) }
        || crate::transaction::paths::did_fdw_write()
    {
        return Ok(None);
    }
    // SAFETY: reading fields of a valid Query.
    unsafe {
        use pg_sys::CmdType::*;
        if !matches!(
            (*parse).commandType,
            CMD_SELECT | CMD_INSERT | CMD_UPDATE | CMD_DELETE
        ) || !(*parse).utilityStmt.is_null()
            // A scrollable cursor reads backwards; the router's result is a
            // forward-only stream.
            || cursor_options & pg_sys::CURSOR_OPT_SCROLL as i32 != 0
        {
            return Ok(None);
        }
        // A generic plan keeps its parameters (the key's picks the shard
        // when the plan runs); a custom plan's are inlined.
        let query = if bound_params.is_null() {
            pg_sys::copyObjectImpl(parse as *const std::ffi::c_void) as *mut pg_sys::Query
        } else {
            match with_parameter_values(parse, bound_params) {
                Some(query) => query,
                None => return Ok(None),
            }
        };
        // A generic plan sends its parameters along; the values computed
        // here are sent after them.
        let own_parameters = if bound_params.is_null() {
            let found = contents(query);
            // (The node infers a user type's parameter from where it
            // stands, which a computed value may take away.)
            if found
                .calls
                .iter()
                .any(|&node| is_user_typed_parameter(node))
            {
                return Ok(None);
            }
            highest_parameter(&found)
        } else {
            0
        };
        let Computed {
            query,
            values: computed,
        } = computed_here(query, own_parameters + 1);
        let found = contents(query);
        if !calls_are_portable(&found) {
            return Ok(None);
        }
        let _busy = Busy::start();
        let map_version = crate::metadata::catalog::current_map_version()?;
        at_version(map_version);
        let Some(kinds) = relation_kinds(&found)? else {
            return Ok(None);
        };
        if !kinds.values().any(|k| *k == Kind::Distributed) {
            return Ok(None);
        }
        let mut keys: Vec<(*mut pg_sys::RangeTblEntry, KeyValue)> = Vec::new();
        for &level in &found.queries {
            let Some(level_keys) = level_keyspace_ids(level) else {
                return Ok(None);
            };
            keys.extend(level_keys);
        }
        // A parameter's shard is known only when the plan runs: then every
        // table's key must be that parameter, and the tables co-located.
        let parameter = keys.iter().find_map(|(_, value)| match value {
            KeyValue::Parameter(id, ty) => Some((*id, *ty)),
            KeyValue::Fixed(_) => None,
        });
        if parameter.is_some() && !one_parameter_one_group(&keys)? {
            return Ok(None);
        }
        let mut shards: Vec<ShardRelation> = Vec::new();
        let mut targets: Vec<ShardTarget> = Vec::new();
        for (rte, value) in keys {
            let shard = match value {
                KeyValue::Fixed(keyspace_id) => shard_of((*rte).relid, keyspace_id)?,
                // Any of the table's shards stands in for the one the
                // parameter picks; its name is replaced when the plan runs.
                KeyValue::Parameter(..) => any_shard((*rte).relid)?,
            };
            let Some(shard) = shard else {
                return Ok(None);
            };
            let target = ShardTarget {
                name: shard.qualified.clone(),
                relid: (*rte).relid,
                keyspace_id: match value {
                    KeyValue::Fixed(keyspace_id) => Some(keyspace_id),
                    KeyValue::Parameter(..) => None,
                },
            };
            if !targets.contains(&target) {
                targets.push(target);
            }
            shards.push(ShardRelation { rte, shard });
        }
        let node = shards[0].shard.node.clone();
        if shards.iter().any(|s| s.shard.node != node) {
            return Ok(None);
        }
        // The tables' own names (as the deparser prints a reference
        // table, or a row type) become the names of their tables on the
        // node.
        let mut renames: Vec<(String, String)> = Vec::new();
        for (&relid, kind) in &kinds {
            let on_node = match kind {
                Kind::Reference => match reference_copy(relid, node.node_id)? {
                    Some(copy) => copy,
                    None => return Ok(None),
                },
                Kind::Distributed => match shards.iter().find(|s| (*s.rte).relid == relid) {
                    Some(shard) => shard.shard.qualified.clone(),
                    None => continue,
                },
            };
            renames.push((qualified_name(relid), on_node));
        }
        let Some(text) = worker_query(query, &shards, renames)? else {
            return Ok(None);
        };
        let mut names: Vec<String> = shards.iter().map(|s| s.shard.qualified.clone()).collect();
        names.sort();
        names.dedup();
        let mut relation_oids: Vec<pg_sys::Oid> = kinds.keys().copied().collect();
        relation_oids.extend(
            shards
                .iter()
                .map(|s| s.shard.partition)
                .filter(|p| *p != pg_sys::InvalidOid),
        );
        Ok(Some(RouterTask {
            query: text,
            node,
            shards: names,
            map_version,
            writes: (*parse).commandType != CMD_SELECT || (*parse).hasModifyingCTE,
            plain_read: (*parse).commandType == CMD_SELECT
                && !(*parse).hasModifyingCTE
                && found
                    .queries
                    .iter()
                    .all(|&level| (*level).rowMarks.is_null()),
            by_parameter: parameter,
            targets,
            relation_oids,
            own_parameters,
            computed,
        }))
    }
}

/// Whether the statement is the client's own, not one a function runs
/// (those take the postgres_fdw path, as the statement around them may).
/// In a transaction block, its statements run in the transaction's remote
/// transactions, and see what the ones before them wrote; once one of them
/// wrote over postgres_fdw, whose connections these would not see, the
/// rest take that path too ([`crate::transaction::paths`]).
/// An intermediate result's statement counts as the client's: pg_shard
/// runs it at once, on the client statement's behalf, in its transaction
/// ([`crate::planner::intermediate::Running`]).
pub(super) unsafe fn client_statement(query_string: *const std::ffi::c_char) -> bool {
    // SAFETY: both strings are NUL-terminated when not NULL.
    unsafe {
        let top = pg_sys::debug_query_string;
        !query_string.is_null()
            && ((!top.is_null()
                && (top == query_string || CStr::from_ptr(top) == CStr::from_ptr(query_string)))
                || super::intermediate::is_running(CStr::from_ptr(query_string)))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    Distributed,
    Reference,
}

/// The kind of every table the statement names; None if one is neither a
/// distributed nor a reference table (a local table, a catalog), or an
/// entry the node cannot read the same way.
pub(super) unsafe fn relation_kinds(
    found: &TreeContents,
) -> Result<Option<HashMap<pg_sys::Oid, Kind>>> {
    let mut kinds = HashMap::new();
    for &rte in &found.range_entries {
        // SAFETY: valid range table entries.
        unsafe {
            use pg_sys::RTEKind::*;
            match (*rte).rtekind {
                RTE_RELATION => {}
                RTE_SUBQUERY | RTE_JOIN | RTE_FUNCTION | RTE_VALUES | RTE_CTE | RTE_RESULT
                | RTE_TABLEFUNC => continue,
                _ => return Ok(None),
            }
            let relid = (*rte).relid;
            // A view's own entry (kept for its privilege check) is not
            // read; the view's query is another level of the tree.
            if (*rte).relkind == pg_sys::RELKIND_VIEW as std::ffi::c_char {
                continue;
            }
            if kinds.contains_key(&relid) {
                continue;
            }
            let kind = if (*rte).relkind == pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char
                && partition_key(relid).is_some()
            {
                Kind::Distributed
            } else if is_reference_table(relid)? {
                Kind::Reference
            } else {
                return Ok(None);
            };
            kinds.insert(relid, kind);
        }
    }
    Ok(Some(kinds))
}

/// Built-in functions that read what differs between the metadata node's
/// session and the worker's: the clock of the transaction, settings,
/// the backend, the connection.
const SESSION_FUNCTIONS: [&str; 20] = [
    "now",
    "transaction_timestamp",
    "statement_timestamp",
    "current_setting",
    "pg_backend_pid",
    "current_schema",
    "current_schemas",
    "current_database",
    "inet_client_addr",
    "inet_client_port",
    "inet_server_addr",
    "inet_server_port",
    "pg_my_temp_schema",
    "pg_conf_load_time",
    "pg_postmaster_start_time",
    "pg_current_xact_id_if_assigned",
    "txid_current_if_assigned",
    "version",
    "current_query",
    "pg_trigger_depth",
];

/// Whether every call means the same on the worker.
pub(super) unsafe fn calls_are_portable(found: &TreeContents) -> bool {
    found.calls.iter().all(|&node| {
        // SAFETY: valid expression nodes of the tree.
        unsafe {
            use pg_sys::NodeTag::*;
            let functions: Vec<pg_sys::Oid> = match (*node).type_ {
                T_FuncExpr => vec![(*(node as *mut pg_sys::FuncExpr)).funcid],
                T_OpExpr | T_DistinctExpr | T_NullIfExpr => {
                    let opno = (*(node as *mut pg_sys::OpExpr)).opno;
                    if opno.to_u32() >= pg_sys::FirstNormalObjectId {
                        return false;
                    }
                    vec![pg_sys::get_opcode(opno)]
                }
                T_ScalarArrayOpExpr => {
                    let opno = (*(node as *mut pg_sys::ScalarArrayOpExpr)).opno;
                    if opno.to_u32() >= pg_sys::FirstNormalObjectId {
                        return false;
                    }
                    vec![pg_sys::get_opcode(opno)]
                }
                T_RowCompareExpr => {
                    let opnos = PgList::<pg_sys::Oid>::from_pg(
                        (*(node as *mut pg_sys::RowCompareExpr)).opnos,
                    );
                    let opnos: Vec<pg_sys::Oid> = opnos.iter_oid().collect();
                    if opnos
                        .iter()
                        .any(|o| o.to_u32() >= pg_sys::FirstNormalObjectId)
                    {
                        return false;
                    }
                    opnos.into_iter().map(|o| pg_sys::get_opcode(o)).collect()
                }
                T_Aggref => vec![(*(node as *mut pg_sys::Aggref)).aggfnoid],
                T_WindowFunc => vec![(*(node as *mut pg_sys::WindowFunc)).winfnoid],
                // Domains check their constraints on the worker: only
                // built-in ones are known to be there alike.
                T_CoerceToDomain => {
                    return (*(node as *mut pg_sys::CoerceToDomain)).resulttype.to_u32()
                        < pg_sys::FirstNormalObjectId
                }
                // A generic plan's parameters travel with the statement
                // (built-in types: a user type's oid differs on the node).
                // A sublink's (`x IN (SELECT …)`) is part of the statement's
                // text.
                T_Param => {
                    let param = node as *mut pg_sys::Param;
                    return match (*param).paramkind {
                        pg_sys::ParamKind::PARAM_EXTERN => {
                            (*param).paramtype.to_u32() < pg_sys::FirstNormalObjectId
                        }
                        pg_sys::ParamKind::PARAM_SUBLINK => true,
                        _ => false,
                    };
                }
                // (CURRENT_USER, sequences, WHERE CURRENT OF, XML functions
                // stay local.)
                _ => return false,
            };
            functions.into_iter().all(|function| {
                function.to_u32() < pg_sys::FirstNormalObjectId
                    && pg_sys::func_volatile(function)
                        != pg_sys::PROVOLATILE_VOLATILE as std::ffi::c_char
                    && !is_session_function(function)
            })
        }
    })
}

/// Whether `node` is an external parameter of a user's type.
unsafe fn is_user_typed_parameter(node: *mut pg_sys::Node) -> bool {
    // SAFETY: a valid expression node.
    unsafe {
        (*node).type_ == pg_sys::NodeTag::T_Param
            && (*(node as *mut pg_sys::Param)).paramkind == pg_sys::ParamKind::PARAM_EXTERN
            && (*(node as *mut pg_sys::Param)).paramtype.to_u32() >= pg_sys::FirstNormalObjectId
    }
}

fn is_session_function(function: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup; NULL for an unknown function.
    let name = unsafe { pg_sys::get_func_name(function) };
    if name.is_null() {
        return true;
    }
    // SAFETY: a palloc'd NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    SESSION_FUNCTIONS.contains(&name.as_ref())
}

/// For each distributed table of this query level (its own range table),
/// the keyspace id its rows are restricted to; None if one is not
/// restricted to one.
unsafe fn level_keyspace_ids(
    query: *mut pg_sys::Query,
) -> Option<Vec<(*mut pg_sys::RangeTblEntry, KeyValue)>> {
    // SAFETY: a valid Query of the tree.
    unsafe {
        let rtable = PgList::<pg_sys::RangeTblEntry>::from_pg((*query).rtable);
        let distributed: Vec<(usize, *mut pg_sys::RangeTblEntry, i16)> = rtable
            .iter_ptr()
            .enumerate()
            .filter(|(_, rte)| {
                (**rte).rtekind == pg_sys::RTEKind::RTE_RELATION
                    && (**rte).relkind == pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char
            })
            .filter_map(|(i, rte)| {
                partition_key((*rte).relid).map(|(_, attno)| (i + 1, rte, attno))
            })
            .collect();
        if distributed.is_empty() {
            return Some(Vec::new());
        }
        let mut facts = KeyFacts::default();
        if !(*query).jointree.is_null() {
            facts.read_expression(query, (*(*query).jointree).quals, true);
            for item in PgList::<pg_sys::Node>::from_pg((*(*query).jointree).fromlist).iter_ptr() {
                facts.read_join_tree(query, item, true);
            }
        }
        let result_relation = (*query).resultRelation as usize;
        match (*query).commandType {
            pg_sys::CmdType::CMD_INSERT => {
                let (_, _, attno) = distributed.iter().find(|(i, _, _)| *i == result_relation)?;
                let targets = PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList);
                let entry = targets.iter_ptr().find(|t| (**t).resno == *attno)?;
                let id = key_value((*entry).expr as *mut pg_sys::Node)?;
                facts.constant(result_relation, id)?;
                // Changing the key of a row that exists moves it.
                if let Some(conflict) = (*query).onConflict.as_ref() {
                    if assigns(conflict.onConflictSet, *attno) {
                        return None;
                    }
                }
            }
            pg_sys::CmdType::CMD_UPDATE => {
                let (_, _, attno) = distributed.iter().find(|(i, _, _)| *i == result_relation)?;
                if assigns((*query).targetList, *attno) {
                    return None;
                }
            }
            _ => {}
        }
        distributed
            .iter()
            .map(|(index, rte, _)| facts.keyspace_id(*index).map(|id| (*rte, id)))
            .collect()
    }
}

/// Whether a target list assigns column `attno`.
unsafe fn assigns(targets: *mut pg_sys::List, attno: i16) -> bool {
    // SAFETY: a list of TargetEntry.
    unsafe {
        PgList::<pg_sys::TargetEntry>::from_pg(targets)
            .iter_ptr()
            .any(|t| !(*t).resjunk && (*t).resno == attno)
    }
}

/// What a level's conditions say about its distribution columns: classes
/// of range table indexes whose keys are equal, and constants.
#[derive(Default)]
struct KeyFacts {
    /// Classes of range table indexes whose keys are equal.
    classes: UnionFind,
    /// The value of a class's key (by its root); None once two differ.
    constants: HashMap<usize, Option<KeyValue>>,
}

impl KeyFacts {
    fn root(&mut self, index: usize) -> usize {
        self.classes.root(index)
    }

    fn join(&mut self, a: usize, b: usize) {
        let Some((merged, kept)) = self.classes.join(a, b) else {
            return;
        };
        if let Some(constant) = self.constants.remove(&merged) {
            self.merge(kept, constant);
        }
    }

    fn merge(&mut self, root: usize, constant: Option<KeyValue>) {
        let merged = match (self.constants.get(&root), constant) {
            (None, c) => c,
            (Some(Some(x)), Some(y)) if *x == y => Some(y),
            _ => None,
        };
        self.constants.insert(root, merged);
    }

    fn constant(&mut self, index: usize, value: KeyValue) -> Option<()> {
        let root = self.root(index);
        self.merge(root, Some(value));
        Some(())
    }

    fn keyspace_id(&mut self, index: usize) -> Option<KeyValue> {
        let root = self.root(index);
        self.constants.get(&root).copied().flatten()
    }

    /// Conditions of a join tree item. Constants restrict rows only where
    /// the condition filters the item's rows (WHERE, inner joins);
    /// equalities of keys also hold for the rows an outer join keeps
    /// with a match, and the unmatched ones carry NULLs.
    unsafe fn read_join_tree(
        &mut self,
        query: *mut pg_sys::Query,
        node: *mut pg_sys::Node,
        filters: bool,
    ) {
        // SAFETY: join tree nodes of a valid Query.
        unsafe {
            match (*node).type_ {
                pg_sys::NodeTag::T_JoinExpr => {
                    let join = node as *mut pg_sys::JoinExpr;
                    let inner = filters && (*join).jointype == pg_sys::JoinType::JOIN_INNER;
                    self.read_expression(query, (*join).quals, inner);
                    self.read_join_tree(query, (*join).larg, inner);
                    self.read_join_tree(query, (*join).rarg, inner);
                }
                pg_sys::NodeTag::T_FromExpr => {
                    let from = node as *mut pg_sys::FromExpr;
                    self.read_expression(query, (*from).quals, filters);
                    for item in PgList::<pg_sys::Node>::from_pg((*from).fromlist).iter_ptr() {
                        self.read_join_tree(query, item, filters);
                    }
                }
                _ => {}
            }
        }
    }

    unsafe fn read_expression(
        &mut self,
        query: *mut pg_sys::Query,
        node: *mut pg_sys::Node,
        filters: bool,
    ) {
        if node.is_null() {
            return;
        }
        // SAFETY: expression nodes of a valid Query.
        unsafe {
            match (*node).type_ {
                pg_sys::NodeTag::T_List => {
                    for item in
                        PgList::<pg_sys::Node>::from_pg(node as *mut pg_sys::List).iter_ptr()
                    {
                        self.read_expression(query, item, filters);
                    }
                }
                pg_sys::NodeTag::T_BoolExpr
                    if (*(node as *mut pg_sys::BoolExpr)).boolop
                        == pg_sys::BoolExprType::AND_EXPR =>
                {
                    let args = (*(node as *mut pg_sys::BoolExpr)).args;
                    for item in PgList::<pg_sys::Node>::from_pg(args).iter_ptr() {
                        self.read_expression(query, item, filters);
                    }
                }
                pg_sys::NodeTag::T_OpExpr => {
                    self.read_equality(query, node as *mut pg_sys::OpExpr, filters)
                }
                _ => {}
            }
        }
    }

    unsafe fn read_equality(
        &mut self,
        query: *mut pg_sys::Query,
        op: *mut pg_sys::OpExpr,
        filters: bool,
    ) {
        // SAFETY: a valid OpExpr of the Query.
        unsafe {
            let args = PgList::<pg_sys::Node>::from_pg((*op).args);
            if args.len() != 2 || !is_key_equality((*op).opno, (*op).inputcollid) {
                return;
            }
            let (Some(left), Some(right)) = (args.get_ptr(0), args.get_ptr(1)) else {
                return;
            };
            match (key_column(query, left), key_column(query, right)) {
                (Some(a), Some(b))
                    if same_key_types(pg_sys::exprType(left), pg_sys::exprType(right)) =>
                {
                    self.join(a, b);
                }
                (Some(column), None) | (None, Some(column)) if filters => {
                    let value = if key_column(query, left).is_some() {
                        right
                    } else {
                        left
                    };
                    if !same_key_types(pg_sys::exprType(left), pg_sys::exprType(right)) {
                        return;
                    }
                    if let Some(id) = key_value(value) {
                        self.constant(column, id);
                    }
                }
                _ => {}
            }
        }
    }
}

/// The range table index of a distribution column reference of this level.
unsafe fn key_column(query: *mut pg_sys::Query, node: *mut pg_sys::Node) -> Option<usize> {
    // SAFETY: a valid expression of the Query.
    unsafe {
        if !super::partition_key::is_distribution_column(query, node) {
            return None;
        }
        let var = strip_relabel(node) as *mut pg_sys::Var;
        deterministic((*var).varcollid).then_some((*var).varno as usize)
    }
}

/// What a distribution column is equal to: a constant's keyspace id, or
/// an external parameter of a generic plan (its value known when the plan
/// runs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum KeyValue {
    Fixed(i64),
    Parameter(i32, pg_sys::Oid),
}

/// The key value of an expression: a parameter (possibly relabelled), or
/// an expression that folds to a non-null constant.
unsafe fn key_value(expr: *mut pg_sys::Node) -> Option<KeyValue> {
    // SAFETY: a valid expression.
    unsafe {
        let bare = strip_widening(strip_relabel(expr));
        if !bare.is_null() && (*bare).type_ == pg_sys::NodeTag::T_Param {
            let param = bare as *mut pg_sys::Param;
            return ((*param).paramkind == pg_sys::ParamKind::PARAM_EXTERN)
                .then(|| KeyValue::Parameter((*param).paramid, (*param).paramtype));
        }
        constant_keyspace_id(expr).map(KeyValue::Fixed)
    }
}

/// The argument of an integer widening cast (`int8($1::int2)`, as a
/// driver's small integer parameter meets a bigint column): integers of
/// every width hash alike, so the argument's value is the key's.
unsafe fn strip_widening(node: *mut pg_sys::Node) -> *mut pg_sys::Node {
    // int2 → int4 (313), int2 → int8 (754), int4 → int8 (481).
    const WIDENING_CASTS: [u32; 3] = [313, 754, 481];
    // SAFETY: a valid expression node.
    unsafe {
        if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_FuncExpr {
            return node;
        }
        let call = node as *mut pg_sys::FuncExpr;
        let args = PgList::<pg_sys::Node>::from_pg((*call).args);
        match (
            WIDENING_CASTS.contains(&(*call).funcid.to_u32()),
            args.len(),
            args.get_ptr(0),
        ) {
            (true, 1, Some(arg)) => strip_widening(strip_relabel(arg)),
            _ => node,
        }
    }
}

/// The keyspace id (signed form) of an expression that folds to a non-null
/// constant.
pub(super) unsafe fn constant_keyspace_id(expr: *mut pg_sys::Node) -> Option<i64> {
    // SAFETY: a valid expression; folding works on a copy and evaluates
    // only immutable functions of constants.
    unsafe {
        if expr.is_null()
            || pg_sys::contain_vars_of_level(expr, 0)
            || pg_sys::contain_volatile_functions(expr)
            || pg_sys::contain_subplans(expr)
        {
            return None;
        }
        let copy = pg_sys::copyObjectImpl(expr as *const std::ffi::c_void) as *mut pg_sys::Node;
        let folded = strip_relabel(pg_sys::eval_const_expressions(std::ptr::null_mut(), copy));
        if (*folded).type_ != pg_sys::NodeTag::T_Const {
            return None;
        }
        let constant = folded as *mut pg_sys::Const;
        if (*constant).constisnull {
            return None;
        }
        crate::keyspace::key_to_keyspace_id((*constant).constvalue, (*constant).consttype)
            .ok()
            .map(|id| id.to_sql())
    }
}

/// Whether every distributed table's key is the same parameter and all the
/// tables are co-located (so the parameter's value picks one shard group,
/// on one node, for all of them).
fn one_parameter_one_group(keys: &[(*mut pg_sys::RangeTblEntry, KeyValue)]) -> Result<bool> {
    let Some((_, first)) = keys.first() else {
        return Ok(false);
    };
    if keys.iter().any(|(_, value)| value != first) {
        return Ok(false);
    }
    // SAFETY: valid range table entries.
    let relids: Vec<pg_sys::Oid> = keys
        .iter()
        .map(|(rte, _)| unsafe { (**rte).relid })
        .collect();
    Ok(crate::spi::query_one::<bool>(
        "SELECT count(DISTINCT colocation_id) = 1 AND count(*) = \
                (SELECT count(DISTINCT r) FROM unnest($1::oid[]) r) \
         FROM pg_shard.logical_table WHERE table_rel::oid = ANY ($1::oid[])",
        &[relids.into()],
    )?
    .unwrap_or(false))
}
