//! Which of PostgreSQL's aggregates a pushed-down statement merges from
//! the workers' partial results, and how (facts read from the catalog),
//! and the aggregate and operator expressions [`super::combine`] builds for
//! the worker and final queries.

use pgrx::prelude::*;
use pgrx::PgList;
use std::ffi::{c_void, CStr, CString};

pub(super) const INT8: u32 = 20;
pub(super) const FLOAT8: u32 = 701;
/// `count("any")`.
pub(super) const COUNT_ANY: u32 = 2147;
/// pg_aggregate.aggkind of a plain aggregate.
const AGGKIND_NORMAL: std::ffi::c_char = b'n' as std::ffi::c_char;

/// The aggregate's name, when it is one of PostgreSQL's own plain ones
/// (no ORDER BY inside, no direct arguments).
pub(super) unsafe fn builtin_name(aggregate: *mut pg_sys::Aggref) -> Option<String> {
    // SAFETY: a valid Aggref; syscache lookups.
    unsafe {
        if (*aggregate).aggfnoid.to_u32() >= pg_sys::FirstNormalObjectId
            || (*aggregate).aggkind != AGGKIND_NORMAL
            || !(*aggregate).aggorder.is_null()
            || !(*aggregate).aggdirectargs.is_null()
            || (*aggregate).aggvariadic
        {
            return None;
        }
        let name = pg_sys::get_func_name((*aggregate).aggfnoid);
        if name.is_null() {
            return None;
        }
        Some(
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned(),
        )
    }
}

pub(super) const SAME_AGGREGATE: [&str; 5] = ["min", "max", "bool_and", "bool_or", "every"];

/// Whether the aggregate merges from partial results (or, with DISTINCT,
/// from its distinct values).
pub(super) unsafe fn splittable(aggregate: *mut pg_sys::Aggref) -> bool {
    // SAFETY: a valid Aggref.
    unsafe {
        let Some(name) = builtin_name(aggregate) else {
            return false;
        };
        if !(*aggregate).aggdistinct.is_null() {
            return (*aggregate).aggfilter.is_null();
        }
        match name.as_str() {
            "count" | "sum" => true,
            "string_agg" => delimiter_is_fixed(aggregate),
            "array_agg" => array_cat_aggregate(aggregate).is_some(),
            n if SAME_AGGREGATE.contains(&n) => true,
            "avg" => {
                state_aggregates(aggregate).is_some() || avg_accumulates_in(aggregate).is_some()
            }
            n if STATE_AGGREGATES.contains(&n) => state_aggregates(aggregate).is_some(),
            _ => false,
        }
    }
}

/// Whether string_agg's delimiter is the same for every row (no column,
/// nothing volatile): the workers' strings can then be joined by it.
pub(super) unsafe fn delimiter_is_fixed(aggregate: *mut pg_sys::Aggref) -> bool {
    // SAFETY: a valid Aggref.
    unsafe {
        let args = PgList::<pg_sys::TargetEntry>::from_pg((*aggregate).args);
        let Some(delimiter) = args.get_ptr(1) else {
            return false;
        };
        let delimiter = (*delimiter).expr as *mut pg_sys::Node;
        !pg_sys::contain_vars_of_level(delimiter, 0)
            && !pg_sys::contain_volatile_functions(delimiter)
            && !pg_sys::contain_subplans(delimiter)
    }
}

/// For array_agg of a non-array value: `pg_shard.array_cat_agg`, which
/// concatenates the workers' arrays.
pub(super) unsafe fn array_cat_aggregate(aggregate: *mut pg_sys::Aggref) -> Option<pg_sys::Oid> {
    // SAFETY: a valid Aggref; catalog lookups.
    unsafe {
        let types = PgList::<pg_sys::Oid>::from_pg((*aggregate).aggargtypes);
        let element = types.iter_oid().next()?;
        if pg_sys::get_element_type(element) != pg_sys::InvalidOid {
            return None;
        }
        function_named("pg_shard", "array_cat_agg", pg_sys::ANYCOMPATIBLEARRAYOID)
    }
}

/// Aggregates merged from their transition states.
pub(super) const STATE_AGGREGATES: [&str; 6] = [
    "variance",
    "var_samp",
    "var_pop",
    "stddev",
    "stddev_samp",
    "stddev_pop",
];

/// For an aggregate merged from transition states: the workers' aggregate
/// returning its state (`pg_shard.<transition function>_state`) and the
/// final query's combining it (`pg_shard.<final function>_combine`), as
/// sql/pg_shard_api.sql declares them; None when either is missing.
pub(super) unsafe fn state_aggregates(
    aggregate: *mut pg_sys::Aggref,
) -> Option<(pg_sys::Oid, pg_sys::Oid)> {
    // pg_aggregate's aggtransfn and aggfinalfn.
    const ANUM_AGGTRANSFN: pg_sys::AttrNumber = 4;
    const ANUM_AGGFINALFN: pg_sys::AttrNumber = 5;
    // SAFETY: a valid Aggref; a syscache lookup released before returning.
    unsafe {
        let types = PgList::<pg_sys::Oid>::from_pg((*aggregate).aggargtypes);
        let argument_type = types.iter_oid().next()?;
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::AGGFNOID as i32,
            pg_sys::Datum::from((*aggregate).aggfnoid),
        );
        if tuple.is_null() {
            return None;
        }
        let function = |attribute| {
            let mut is_null = false;
            let value = pg_sys::SysCacheGetAttr(
                pg_sys::SysCacheIdentifier::AGGFNOID as i32,
                tuple,
                attribute,
                &mut is_null,
            );
            (!is_null).then(|| pg_sys::Oid::from(value.value() as u32))
        };
        let (transition, finish) = (function(ANUM_AGGTRANSFN), function(ANUM_AGGFINALFN));
        pg_sys::ReleaseSysCache(tuple);
        let name_of = |function: pg_sys::Oid| -> Option<String> {
            let name = pg_sys::get_func_name(function);
            (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
        };
        let worker = function_named(
            "pg_shard",
            &format!("{}_state", name_of(transition?)?),
            argument_type,
        )?;
        let state_type = pg_sys::get_func_rettype(worker);
        let combine = function_named(
            "pg_shard",
            &format!("{}_combine", name_of(finish?)?),
            state_type,
        )?;
        (pg_sys::get_func_rettype(combine) == (*aggregate).aggtype).then_some((worker, combine))
    }
}

/// `schema.name(argument_type)`, if it exists (exactly that argument type).
pub(super) unsafe fn function_named(
    schema: &str,
    name: &str,
    argument_type: pg_sys::Oid,
) -> Option<pg_sys::Oid> {
    // SAFETY: a catalog lookup of a qualified name with one argument type.
    unsafe {
        let schema = CString::new(schema).ok()?;
        let name = CString::new(name).ok()?;
        let mut names = PgList::<pg_sys::Node>::new();
        names.push(pg_sys::makeString(pg_sys::pstrdup(schema.as_ptr())) as *mut pg_sys::Node);
        names.push(pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())) as *mut pg_sys::Node);
        let function = pg_sys::LookupFuncName(names.into_pg(), 1, &argument_type, true);
        (function != pg_sys::InvalidOid).then_some(function)
    }
}

/// The type avg(x) sums in: x's own for integers and numeric (sum's
/// result), float8 for floats; None for other types.
pub(super) unsafe fn avg_accumulates_in(aggregate: *mut pg_sys::Aggref) -> Option<u32> {
    // SAFETY: a valid Aggref.
    unsafe {
        let types = PgList::<pg_sys::Oid>::from_pg((*aggregate).aggargtypes);
        let ty = types.iter_oid().next()?.to_u32();
        match ty {
            20 | 21 | 23 | 1700 => Some(ty),
            700 | 701 => Some(FLOAT8),
            _ => None,
        }
    }
}

/// `pg_catalog.sum(value)`.
pub(super) unsafe fn sum_of(value: *mut pg_sys::Node) -> Option<*mut pg_sys::Node> {
    // SAFETY: a valid expression.
    unsafe { aggregate_call("sum", value, std::ptr::null_mut()) }
}

/// `pg_catalog.<name>(value) FILTER (WHERE filter)`, for value's type.
pub(super) unsafe fn aggregate_call(
    name: &str,
    value: *mut pg_sys::Node,
    filter: *mut pg_sys::Expr,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: a catalog lookup and a new node.
    unsafe {
        let function = function_named("pg_catalog", name, pg_sys::exprType(value))?;
        aggregate_of(function, value, filter)
    }
}

/// An Aggref of aggregate `function` over one argument.
pub(super) unsafe fn aggregate_of(
    function: pg_sys::Oid,
    value: *mut pg_sys::Node,
    filter: *mut pg_sys::Expr,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: a new node; syscache lookups.
    unsafe {
        let result = pg_sys::get_func_rettype(function);
        if result == pg_sys::InvalidOid {
            return None;
        }
        let mut aggregate = PgBox::<pg_sys::Aggref>::alloc_node(pg_sys::NodeTag::T_Aggref);
        aggregate.aggfnoid = function;
        aggregate.aggtype = result;
        let collation = pg_sys::exprCollation(value);
        aggregate.aggcollid = if pg_sys::type_is_collatable(result) {
            collation
        } else {
            pg_sys::InvalidOid
        };
        aggregate.inputcollid = collation;
        aggregate.aggargtypes = oid_list(pg_sys::exprType(value));
        aggregate.args = single_argument(value);
        aggregate.aggfilter = if filter.is_null() {
            filter
        } else {
            pg_sys::copyObjectImpl(filter as *const c_void) as *mut pg_sys::Expr
        };
        aggregate.aggkind = AGGKIND_NORMAL;
        aggregate.aggsplit = pg_sys::AggSplit::AGGSPLIT_SIMPLE;
        aggregate.aggno = -1;
        aggregate.aggtransno = -1;
        aggregate.location = -1;
        Some(aggregate.into_pg() as *mut pg_sys::Node)
    }
}

pub(super) unsafe fn single_argument(value: *mut pg_sys::Node) -> *mut pg_sys::List {
    // SAFETY: a one-entry list of a new target entry.
    unsafe {
        let mut args = PgList::<pg_sys::TargetEntry>::new();
        args.push(pg_sys::makeTargetEntry(
            value as *mut pg_sys::Expr,
            1,
            std::ptr::null_mut(),
            false,
        ));
        args.into_pg()
    }
}

pub(super) unsafe fn oid_list(oid: pg_sys::Oid) -> *mut pg_sys::List {
    // SAFETY: a new list.
    unsafe { pg_sys::lappend_oid(std::ptr::null_mut(), oid) }
}

/// `value` as type `ty` (an explicit cast), itself when it has that type.
pub(super) unsafe fn coerce(value: *mut pg_sys::Node, ty: u32) -> Option<*mut pg_sys::Node> {
    // SAFETY: a valid expression; the cast lookup reads the catalog.
    unsafe {
        let from = pg_sys::exprType(value);
        if from.to_u32() == ty {
            return Some(value);
        }
        let cast = pg_sys::coerce_to_target_type(
            std::ptr::null_mut(),
            value,
            from,
            pg_sys::Oid::from(ty),
            -1,
            pg_sys::CoercionContext::COERCION_EXPLICIT,
            pg_sys::CoercionForm::COERCE_EXPLICIT_CAST,
            -1,
        );
        (!cast.is_null()).then_some(cast)
    }
}

/// `a OPERATOR(pg_catalog./) b`.
pub(super) unsafe fn divide(a: *mut pg_sys::Node, b: *mut pg_sys::Node) -> *mut pg_sys::Node {
    // SAFETY: operator lookup and a new node; both have the same type.
    unsafe {
        let state = pg_sys::make_parsestate(std::ptr::null_mut());
        let mut names = PgList::<pg_sys::Node>::new();
        names
            .push(pg_sys::makeString(pg_sys::pstrdup(c"pg_catalog".as_ptr())) as *mut pg_sys::Node);
        names.push(pg_sys::makeString(pg_sys::pstrdup(c"/".as_ptr())) as *mut pg_sys::Node);
        pg_sys::make_op(state, names.into_pg(), a, b, std::ptr::null_mut(), -1) as *mut pg_sys::Node
    }
}
