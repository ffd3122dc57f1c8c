//! Running a piece of work under fixed settings, restored afterwards.
//!
//! Catalog text the extension ships to workers must not depend on the
//! caller's session: `search_path` decides which names pg_get_*def and
//! format_type qualify, and DateStyle, IntervalStyle and extra_float_digits
//! decide how values print.

use crate::error::Result;
use crate::guc::GucScope;

/// Settings for reading DDL text: qualify every name outside pg_catalog.
pub(crate) const QUALIFIED_NAMES: &[(&str, &str)] = &[("search_path", "pg_catalog")];

/// Settings for work done with the extension owner's rights: only
/// pg_catalog's functions, temporary relations after the catalog's.
pub(crate) const CATALOG_ONLY: &[(&str, &str)] = &[("search_path", "pg_catalog, pg_temp")];

/// Settings under which every value's text form reads back the same anywhere.
pub(crate) const PORTABLE_TEXT: &[(&str, &str)] = &[
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
];

/// Run `work` with `settings` in force, then put the previous values back
/// (also when it fails).
pub(crate) fn with_settings<T>(
    settings: &[(&str, &str)],
    work: impl FnOnce() -> Result<T>,
) -> Result<T> {
    // A search_path set here is not the caller's: names the user wrote are
    // still looked up in the caller's (crate::spi).
    let _caller = crate::spi::CallerPath::remember();
    let _scope = GucScope::set(settings);
    work()
}
