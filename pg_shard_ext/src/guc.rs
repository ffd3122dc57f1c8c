//! GUC nest levels: settings made for a piece of work and put back after
//! it, as a function's `SET` clause does. The lowest layer: it runs no SQL.

use pgrx::prelude::*;
use std::ffi::CString;

/// While alive, settings made by [`GucScope::set`] are in force; dropped,
/// the previous values are back, as for a function's `SET` clause (a
/// plain `SET` of another setting meanwhile stays). An error's abort
/// restores them as well.
pub(crate) struct GucScope {
    level: i32,
}

impl GucScope {
    pub(crate) fn set(settings: &[(&str, &str)]) -> GucScope {
        // SAFETY: opens a GUC nest level, closed in Drop.
        let scope = GucScope {
            level: unsafe { pg_sys::NewGUCNestLevel() },
        };
        for (name, value) in settings {
            set_saved(name, value);
        }
        scope
    }

    pub(crate) fn set_one(name: &str, value: &str) -> GucScope {
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
