//! A multi-row `INSERT … VALUES` whose rows go to several shard groups, in
//! the multi-shard DML class ([`super::modify`]): each shard group's
//! statement is the INSERT with that group's rows only, picked by the
//! keyspace id of each row's key, a constant (a custom plan's parameters
//! are constants by then). The rows are picked again from the statement
//! whenever its shard groups are found again after a move or split.

use super::conditions::same_key_types;
use super::partition_key::{only_from_entry, partition_key, range_table_entry, strip_relabel};
use super::router::constant_keyspace_id;
use pgrx::prelude::*;
use pgrx::PgList;

/// The VALUES entry an INSERT reads its rows from, and the (1-based)
/// column of those rows that goes into the target's key column.
///
/// # Safety
/// `query` is a valid Query.
unsafe fn values_entry(query: *mut pg_sys::Query) -> Option<(*mut pg_sys::RangeTblEntry, usize)> {
    // SAFETY: a valid INSERT Query: its FROM names the VALUES entry, its
    // target list the target's columns by resno.
    unsafe {
        if (*query).commandType != pg_sys::CmdType::CMD_INSERT {
            return None;
        }
        let target = range_table_entry(query, (*query).resultRelation)?;
        let (_, key_attno) = partition_key((*target).relid)?;
        let (index, values) = only_from_entry(query)?;
        if (*values).rtekind != pg_sys::RTEKind::RTE_VALUES {
            return None;
        }
        let column = inserted_key_column(query, target, key_attno, index)?;
        if column < 1 {
            return None;
        }
        Some((values, column as usize))
    }
}

/// The keyspace id of each row of a multi-row `INSERT … VALUES`, in order;
/// None when the statement is not one, or a row's key is not a constant.
///
/// # Safety
/// `query` is a valid Query.
pub(super) unsafe fn row_keyspace_ids(query: *mut pg_sys::Query) -> Option<Vec<i64>> {
    // SAFETY: as this function's; the VALUES lists are lists of expression lists.
    unsafe {
        let (values, column) = values_entry(query)?;
        let rows = PgList::<pg_sys::List>::from_pg((*values).values_lists);
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows.iter_ptr() {
            let row = PgList::<pg_sys::Node>::from_pg(row);
            ids.push(constant_keyspace_id(row.get_ptr(column - 1)?)?);
        }
        Some(ids)
    }
}

/// Keeps in a multi-row `INSERT … VALUES` only the rows whose keyspace id
/// lies in one of `ranges` (inclusive), and gives their positions (from 0)
/// in the statement; nothing changes in other statements (None).
///
/// # Safety
/// `query` is a valid Query the caller owns (a copy made for this).
pub(super) unsafe fn keep_rows_in(
    query: *mut pg_sys::Query,
    ranges: &[(i64, i64)],
) -> Option<Vec<usize>> {
    // SAFETY: as this function's; the kept lists are the query's own.
    unsafe {
        let (values, column) = values_entry(query)?;
        let rows = PgList::<pg_sys::List>::from_pg((*values).values_lists);
        let mut kept = PgList::<pg_sys::List>::new();
        let mut positions = Vec::new();
        for (position, row) in rows.iter_ptr().enumerate() {
            let id = PgList::<pg_sys::Node>::from_pg(row)
                .get_ptr(column - 1)
                .and_then(|key| constant_keyspace_id(key));
            if id.is_some_and(|id| {
                ranges
                    .iter()
                    .any(|(start, end)| (*start..=*end).contains(&id))
            }) {
                kept.push(row);
                positions.push(position);
            }
        }
        (*values).values_lists = kept.into_pg();
        Some(positions)
    }
}

/// The column of range table entry `index` (an INSERT's FROM) that the
/// INSERT puts into its target's key column `key_attno`, when it is one
/// as it is (of a type whose keyspace ids are alike).
///
/// # Safety
/// `query` is a valid INSERT Query; `target` its target's entry.
pub(super) unsafe fn inserted_key_column(
    query: *mut pg_sys::Query,
    target: *mut pg_sys::RangeTblEntry,
    key_attno: i16,
    index: i32,
) -> Option<i16> {
    // SAFETY: an INSERT's target list names the target's columns by resno.
    unsafe {
        let key_entry = PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList)
            .iter_ptr()
            .find(|t| !(**t).resjunk && (**t).resno == key_attno)?;
        let value = strip_relabel((*key_entry).expr as *mut pg_sys::Node);
        if value.is_null() || (*value).type_ != pg_sys::NodeTag::T_Var {
            return None;
        }
        let var = value as *mut pg_sys::Var;
        if (*var).varno != index || (*var).varlevelsup != 0 {
            return None;
        }
        let key_type = pg_sys::get_atttype((*target).relid, key_attno);
        same_key_types(pg_sys::exprType(value), key_type).then_some((*var).varattno)
    }
}

/// Puts an INSERT's source (its VALUES, or its SELECT) in the order of
/// the target's columns, with the values the INSERT gives columns its
/// source does not name (the defaults the rewriter filled in, `now()`,
/// `nextval(…)`) moved into it: into every row of the VALUES, or the
/// SELECT's output. The rewriter orders an INSERT's target list by the
/// target's columns and adds the defaults there, but PostgreSQL's
/// deparser prints the column list from the target list and the source
/// as it is; the worker's text needs both alike. Each row's `nextval` is
/// then a value of its own, as it is when PostgreSQL inserts the rows.
/// False when that cannot be done (a value reads the source's rows, or
/// the SELECT's output cannot change): the statement then takes another
/// path.
///
/// # Safety
/// `query` is a valid Query the caller owns (a copy made for planning).
pub(super) unsafe fn source_in_target_order(query: *mut pg_sys::Query) -> bool {
    // SAFETY: a valid INSERT Query: its target list names the target's
    // columns, its FROM the source entry; new nodes in the planner's
    // context.
    unsafe {
        if (*query).commandType != pg_sys::CmdType::CMD_INSERT {
            return true;
        }
        let Some((index, source)) = only_from_entry(query) else {
            return true;
        };
        let is_values = (*source).rtekind == pg_sys::RTEKind::RTE_VALUES;
        let subquery = (*source).subquery;
        if !is_values && ((*source).rtekind != pg_sys::RTEKind::RTE_SUBQUERY || subquery.is_null())
        {
            return true;
        }
        let entries: Vec<*mut pg_sys::TargetEntry> =
            PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList)
                .iter_ptr()
                .filter(|t| !(**t).resjunk)
                .collect();
        // Each entry: the source column it reads, or the value it gives.
        let mut picks: Vec<Pick> = Vec::with_capacity(entries.len());
        for &entry in &entries {
            let expr = (*entry).expr as *mut pg_sys::Node;
            match source_column(expr, index) {
                Some(var) => picks.push(Pick::Column(var)),
                None if crate::parse_tree::row_free::reads_row(expr) => return false,
                None => picks.push(Pick::Value(expr)),
            }
        }
        let in_order = picks.iter().enumerate().all(
            |(i, pick)| matches!(pick, Pick::Column(var) if (**var).varattno as usize == i + 1),
        );
        if in_order {
            return true;
        }
        if !is_values
            && (!(*subquery).setOperations.is_null() || !(*subquery).distinctClause.is_null())
        {
            return false;
        }
        // (The alias may be the caller's tree's: a custom plan's copy of
        // the range table shares it.)
        (*source).eref =
            pg_sys::copyObjectImpl((*source).eref as *const std::ffi::c_void) as *mut pg_sys::Alias;
        let old_names = PgList::<pg_sys::Node>::from_pg((*(*source).eref).colnames);
        let mut names = PgList::<pg_sys::Node>::new();
        for (i, pick) in picks.iter().enumerate() {
            names.push(match pick {
                Pick::Column(var) => old_names
                    .get_ptr((**var).varattno as usize - 1)
                    .unwrap_or(std::ptr::null_mut()),
                Pick::Value(_) => {
                    let name =
                        std::ffi::CString::new(format!("column{}", i + 1)).unwrap_or_default();
                    pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())).cast()
                }
            });
        }
        if is_values {
            reorder_values(source, &picks);
        } else {
            reorder_select(subquery, &picks);
        }
        (*(*source).eref).colnames = names.into_pg();
        // The entries read the source's columns in order.
        for (i, (&entry, pick)) in entries.iter().zip(&picks).enumerate() {
            match *pick {
                Pick::Column(var) => (*var).varattno = (i + 1) as i16,
                Pick::Value(expr) => {
                    (*entry).expr = pg_sys::makeVar(
                        index,
                        (i + 1) as i16,
                        pg_sys::exprType(expr),
                        pg_sys::exprTypmod(expr),
                        pg_sys::exprCollation(expr),
                        0,
                    )
                    .cast()
                }
            }
        }
        true
    }
}

/// What an INSERT's target entry takes from its source.
enum Pick {
    /// A column of the source (the Var, in the target entry).
    Column(*mut pg_sys::Var),
    /// A value of its own, reading no row.
    Value(*mut pg_sys::Node),
}

/// The VALUES rows with one cell per pick, in the picks' order.
unsafe fn reorder_values(values: *mut pg_sys::RangeTblEntry, picks: &[Pick]) {
    // SAFETY: a VALUES entry whose lists have a cell per column; the
    // columns' type lists alike.
    unsafe {
        let rows = PgList::<pg_sys::List>::from_pg((*values).values_lists);
        let mut reordered = PgList::<pg_sys::List>::new();
        for row in rows.iter_ptr() {
            let cells = PgList::<pg_sys::Node>::from_pg(row);
            let mut cells_now = PgList::<pg_sys::Node>::new();
            for pick in picks {
                cells_now.push(match *pick {
                    Pick::Column(var) => cells
                        .get_ptr((*var).varattno as usize - 1)
                        .unwrap_or(std::ptr::null_mut()),
                    Pick::Value(expr) => {
                        pg_sys::copyObjectImpl(expr as *const std::ffi::c_void).cast()
                    }
                });
            }
            reordered.push(cells_now.into_pg());
        }
        (*values).values_lists = reordered.into_pg();
        let types = PgList::<pg_sys::Oid>::from_pg((*values).coltypes);
        let typmods = PgList::<i32>::from_pg((*values).coltypmods);
        let collations = PgList::<pg_sys::Oid>::from_pg((*values).colcollations);
        let (mut new_types, mut new_typmods, mut new_collations) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        for pick in picks {
            let (ty, typmod, collation) = match *pick {
                Pick::Column(var) => {
                    let at = (*var).varattno as usize - 1;
                    (
                        types.get_oid(at).unwrap_or(pg_sys::InvalidOid),
                        typmods.get_int(at).unwrap_or(-1),
                        collations.get_oid(at).unwrap_or(pg_sys::InvalidOid),
                    )
                }
                Pick::Value(expr) => (
                    pg_sys::exprType(expr),
                    pg_sys::exprTypmod(expr),
                    pg_sys::exprCollation(expr),
                ),
            };
            new_types = pg_sys::lappend_oid(new_types, ty);
            new_typmods = pg_sys::lappend_int(new_typmods, typmod);
            new_collations = pg_sys::lappend_oid(new_collations, collation);
        }
        (*values).coltypes = new_types;
        (*values).coltypmods = new_typmods;
        (*values).colcollations = new_collations;
    }
}

/// The SELECT's output with one column per pick, in the picks' order (its
/// junk columns after them).
unsafe fn reorder_select(select: *mut pg_sys::Query, picks: &[Pick]) {
    // SAFETY: a SELECT whose non-junk outputs are numbered from 1.
    unsafe {
        let outputs: Vec<*mut pg_sys::TargetEntry> =
            PgList::<pg_sys::TargetEntry>::from_pg((*select).targetList)
                .iter_ptr()
                .collect();
        let mut reordered = PgList::<pg_sys::TargetEntry>::new();
        for (i, pick) in picks.iter().enumerate() {
            let resno = (i + 1) as i16;
            match *pick {
                Pick::Column(var) => {
                    if let Some(&output) = outputs
                        .iter()
                        .find(|t| !(***t).resjunk && (***t).resno == (*var).varattno)
                    {
                        let copy = pg_sys::flatCopyTargetEntry(output);
                        (*copy).resno = resno;
                        reordered.push(copy);
                    }
                }
                Pick::Value(expr) => {
                    let name = std::ffi::CString::new(format!("column{resno}")).unwrap_or_default();
                    reordered.push(pg_sys::makeTargetEntry(
                        expr as *mut pg_sys::Expr,
                        resno,
                        pg_sys::pstrdup(name.as_ptr()),
                        false,
                    ));
                }
            }
        }
        let mut next = picks.len() as i16;
        for &output in outputs.iter().filter(|t| (***t).resjunk) {
            next += 1;
            let copy = pg_sys::flatCopyTargetEntry(output);
            (*copy).resno = next;
            reordered.push(copy);
        }
        (*select).targetList = reordered.into_pg();
    }
}

/// The Var of source entry `index` that `expr` is, or assigns through
/// the implicit casts an INSERT adds to fit the column (the worker's own
/// INSERT adds them again).
unsafe fn source_column(expr: *mut pg_sys::Node, index: i32) -> Option<*mut pg_sys::Var> {
    // SAFETY: a valid expression.
    unsafe {
        let mut node = expr;
        loop {
            if node.is_null() {
                return None;
            }
            use pg_sys::NodeTag::*;
            node = match (*node).type_ {
                T_Var => {
                    let var = node as *mut pg_sys::Var;
                    return ((*var).varno == index && (*var).varlevelsup == 0).then_some(var);
                }
                T_RelabelType => (*(node as *mut pg_sys::RelabelType)).arg.cast(),
                T_CoerceToDomain => (*(node as *mut pg_sys::CoerceToDomain)).arg.cast(),
                T_CoerceViaIO
                    if (*(node as *mut pg_sys::CoerceViaIO)).coerceformat
                        == pg_sys::CoercionForm::COERCE_IMPLICIT_CAST =>
                {
                    (*(node as *mut pg_sys::CoerceViaIO)).arg.cast()
                }
                T_ArrayCoerceExpr
                    if (*(node as *mut pg_sys::ArrayCoerceExpr)).coerceformat
                        == pg_sys::CoercionForm::COERCE_IMPLICIT_CAST =>
                {
                    (*(node as *mut pg_sys::ArrayCoerceExpr)).arg.cast()
                }
                T_FuncExpr
                    if (*(node as *mut pg_sys::FuncExpr)).funcformat
                        == pg_sys::CoercionForm::COERCE_IMPLICIT_CAST =>
                {
                    PgList::<pg_sys::Node>::from_pg((*(node as *mut pg_sys::FuncExpr)).args)
                        .get_ptr(0)
                        .unwrap_or(std::ptr::null_mut())
                }
                _ => return None,
            };
        }
    }
}
