//! Running a piece of work under fixed settings, restored afterwards.
//!
//! Catalog text the extension ships to workers must not depend on the
//! caller's session: `search_path` decides which names pg_get_*def and
//! format_type qualify, and DateStyle, IntervalStyle and extra_float_digits
//! decide how values print.

use crate::error::Result;
use pgrx::prelude::*;

/// Settings for reading DDL text: qualify every name outside pg_catalog.
pub const QUALIFIED_NAMES: &[(&str, &str)] = &[("search_path", "pg_catalog")];

/// Settings for work done with the extension owner's rights: only
/// pg_catalog's functions, temporary relations after the catalog's.
pub const CATALOG_ONLY: &[(&str, &str)] = &[("search_path", "pg_catalog, pg_temp")];

/// Settings under which every value's text form reads back the same anywhere.
pub const PORTABLE_TEXT: &[(&str, &str)] = &[
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
];

/// Run `work` with `settings` in force (transaction-local), then put the
/// previous values back. On error the transaction aborts, which undoes them.
pub fn with_settings<T>(settings: &[(&str, &str)], work: impl FnOnce() -> Result<T>) -> Result<T> {
    let mut previous = Vec::with_capacity(settings.len());
    for (name, value) in settings {
        let old = set(name, value)?;
        previous.push((*name, old));
    }
    let result = work();
    for (name, old) in previous.into_iter().rev() {
        set(name, &old)?;
    }
    result
}

/// Set `name` to `value` for the transaction and return the old value.
fn set(name: &str, value: &str) -> Result<String> {
    let old = crate::catalog::query_one::<String>("SELECT current_setting($1)", &[name.into()])?
        .unwrap_or_default();
    Spi::run_with_args(
        "SELECT pg_catalog.set_config($1, $2, true)",
        &[name.into(), value.into()],
    )?;
    Ok(old)
}
