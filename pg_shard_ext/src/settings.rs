//! Running a piece of work under fixed settings, restored afterwards.
//!
//! Catalog text the extension ships to workers must not depend on the
//! caller's session: `search_path` decides which names pg_get_*def and
//! format_type qualify, and DateStyle, IntervalStyle and extra_float_digits
//! decide how values print.

use crate::error::Result;
use pgrx::prelude::*;
use std::ffi::CString;

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

/// Run `work` with `settings` in force, then put the previous values back
/// (also when it fails).
pub fn with_settings<T>(settings: &[(&str, &str)], work: impl FnOnce() -> Result<T>) -> Result<T> {
    // A search_path set here is not the caller's: names the user wrote are
    // still looked up in the caller's (crate::spi).
    let _caller = crate::spi::CallerPath::remember();
    let _scope = GucScope::set(settings);
    work()
}

/// While alive, settings made by [`GucScope::set`] are in force; dropped,
/// the previous values are back, as for a function's `SET` clause (a
/// plain `SET` of another setting meanwhile stays). An error's abort
/// restores them as well.
pub struct GucScope {
    level: i32,
}

impl GucScope {
    pub fn set(settings: &[(&str, &str)]) -> GucScope {
        // SAFETY: opens a GUC nest level, closed in Drop.
        let scope = GucScope {
            level: unsafe { pg_sys::NewGUCNestLevel() },
        };
        for (name, value) in settings {
            set_saved(name, value);
        }
        scope
    }

    pub fn set_one(name: &str, value: &str) -> GucScope {
        GucScope::set(&[(name, value)])
    }
}

impl Drop for GucScope {
    fn drop(&mut self) {
        // SAFETY: closes the nest level opened in `set` (and any opened
        // since, as a function's exit does); restores without erroring.
        unsafe { pg_sys::AtEOXact_GUC(true, self.level) };
    }
}

/// Sets `name` to `value` at the current nest level, to be restored when it
/// closes (GUC_ACTION_SAVE). Names and values are the extension's own
/// constants or values read back from the server, so never hold a NUL.
fn set_saved(name: &str, value: &str) {
    let (Ok(name), Ok(value)) = (CString::new(name), CString::new(value)) else {
        pgrx::error!("pg_shard: a setting's name or value holds a NUL byte");
    };
    // SAFETY: plain GUC API use with NUL-terminated strings that outlive
    // the call; an invalid value raises an ERROR (elevel 0 = ERROR here).
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
    }
}
