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

/// Run `work` printing values under [`PORTABLE_TEXT`], setting only when
/// the session's own settings would print otherwise (the common session's
/// do not: a statement's parameters are printed on every run, and four
/// settings changed and put back cost more than the rest of it).
pub(crate) fn with_portable_text<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    if prints_portable_text() {
        return work();
    }
    with_settings(PORTABLE_TEXT, work)
}

/// Whether the session prints values as [`PORTABLE_TEXT`] would: ISO
/// dates (in either field order, which ISO output does not use),
/// `postgres` intervals, shortest-exact floats (any extra_float_digits
/// above 0), hex bytea.
fn prints_portable_text() -> bool {
    let setting = |name: &std::ffi::CStr| {
        // SAFETY: reads the current value of a known setting (a static
        // string, or NULL).
        unsafe {
            let value = pgrx::pg_sys::GetConfigOption(name.as_ptr(), true, false);
            (!value.is_null()).then(|| {
                std::ffi::CStr::from_ptr(value)
                    .to_string_lossy()
                    .into_owned()
            })
        }
    };
    setting(c"DateStyle").is_some_and(|v| v.starts_with("ISO,"))
        && setting(c"IntervalStyle").as_deref() == Some("postgres")
        && setting(c"extra_float_digits")
            .and_then(|v| v.parse::<i32>().ok())
            .is_some_and(|digits| digits > 0)
        && setting(c"bytea_output").as_deref() == Some("hex")
}
