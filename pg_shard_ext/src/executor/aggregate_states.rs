//! The transition functions of the aggregates that combine workers'
//! serialized partial states on the metadata node (declared in
//! sql/pg_shard_api.sql, planned by `planner::combine`): each deserializes
//! one worker's state and combines it into the running one, with
//! PostgreSQL's own deserialization and combine functions, as a parallel
//! aggregate's leader does with its workers' states.

use pgrx::pg_sys;

// (pgrx wraps the builtins in Rust functions that guard the FFI boundary.)
type Builtin = unsafe fn(pg_sys::FunctionCallInfo) -> pg_sys::Datum;

/// A C transition function `pg_shard.$name(internal, bytea)` that
/// deserializes a worker's state with `$deserialize` and combines it with
/// `$combine`, and its function-manager info.
macro_rules! state_combine {
    ($name:ident, $finfo:ident, $deserialize:path, $combine:path, $doc:literal) => {
        #[no_mangle]
        pub extern "C" fn $finfo() -> &'static pg_sys::Pg_finfo_record {
            const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        #[doc = $doc]
        ///
        /// # Safety
        /// Called by the function manager, as an aggregate's transition
        /// function.
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
            // SAFETY: as this function's; the builtins take the same kind
            // of call.
            unsafe {
                pg_sys::panic::pgrx_extern_c_guard(|| {
                    combine_serialized(fcinfo, $deserialize, $combine)
                })
            }
        }
    };
}

state_combine!(
    numeric_state_combine,
    pg_finfo_numeric_state_combine,
    pg_sys::numeric_deserialize,
    pg_sys::numeric_combine,
    "States of numeric_accum / int8_accum (variance and stddev of numeric and bigint)."
);
state_combine!(
    numeric_poly_state_combine,
    pg_finfo_numeric_poly_state_combine,
    pg_sys::numeric_poly_deserialize,
    pg_sys::numeric_poly_combine,
    "States of int2_accum / int4_accum (variance and stddev of smallint and integer)."
);
state_combine!(
    numeric_avg_state_combine,
    pg_finfo_numeric_avg_state_combine,
    pg_sys::numeric_avg_deserialize,
    pg_sys::numeric_avg_combine,
    "States of numeric_avg_accum (avg of numeric)."
);
state_combine!(
    int8_avg_state_combine,
    pg_finfo_int8_avg_state_combine,
    pg_sys::int8_avg_deserialize,
    pg_sys::int8_avg_combine,
    "States of int8_avg_accum (avg of bigint)."
);

/// The running state (argument 0, NULL before the first) combined with the
/// deserialized argument 1 (NULL: a worker group without rows).
///
/// # Safety
/// `fcinfo` is a valid two-argument call from an aggregate; `deserialize`
/// and `combine` are the state type's own functions.
unsafe fn combine_serialized(
    fcinfo: pg_sys::FunctionCallInfo,
    deserialize: Builtin,
    combine: Builtin,
) -> pg_sys::Datum {
    // SAFETY: as this function's; the arguments array holds nargs entries.
    unsafe {
        let args = (*fcinfo).args.as_slice(2);
        let (state, serialized) = (args[0], args[1]);
        if serialized.isnull {
            (*fcinfo).isnull = state.isnull;
            return state.value;
        }
        let unused = pg_sys::NullableDatum {
            value: pg_sys::Datum::from(0usize),
            isnull: false,
        };
        let (partial, _) = call(fcinfo, deserialize, [serialized, unused]);
        let partial = pg_sys::NullableDatum {
            value: partial,
            isnull: false,
        };
        let (combined, isnull) = call(fcinfo, combine, [state, partial]);
        (*fcinfo).isnull = isnull;
        combined
    }
}

/// Calls `function` with two arguments in the aggregate's context (the
/// builtins check they are called by an aggregate, and keep the state in
/// its memory context).
///
/// # Safety
/// `outer` is the aggregate's valid call; `function` takes these arguments.
unsafe fn call(
    outer: pg_sys::FunctionCallInfo,
    function: Builtin,
    args: [pg_sys::NullableDatum; 2],
) -> (pg_sys::Datum, bool) {
    // SAFETY: a zeroed call frame sized for two arguments, filled as
    // InitFunctionCallInfoData does, in the current (per-call) context.
    unsafe {
        let size = std::mem::size_of::<pg_sys::FunctionCallInfoBaseData>()
            + 2 * std::mem::size_of::<pg_sys::NullableDatum>();
        let inner = pg_sys::palloc0(size) as pg_sys::FunctionCallInfo;
        (*inner).flinfo = (*outer).flinfo;
        (*inner).context = (*outer).context;
        (*inner).fncollation = (*outer).fncollation;
        (*inner).nargs = 2;
        let slots = (*inner).args.as_mut_slice(2);
        slots.copy_from_slice(&args);
        let result = function(inner);
        let isnull = (*inner).isnull;
        pg_sys::pfree(inner as *mut std::ffi::c_void);
        (result, isnull)
    }
}
