//! A statement's plan: what the metadata node runs itself, and what is left
//! to do on the shards once it has.

use crate::error::Result;
use pgrx::prelude::*;

/// What is left to do once the metadata node ran (or skipped) its part.
pub(super) type AfterLocal = Box<dyn FnOnce() -> Result<()>>;

/// A statement's plan: the metadata node's part, and the shards' part.
pub(crate) struct Planned {
    pub(super) local: Local,
    pub(super) after: Option<AfterLocal>,
}

/// What the metadata node does with the statement itself.
pub(crate) enum Local {
    Run,
    /// Its part is done by the plan (or there is none).
    Skip,
    /// Run this statement instead (a copy, changed).
    Replace(*mut pg_sys::PlannedStmt),
}

impl Planned {
    pub(super) fn new(local: Local, after: impl FnOnce() -> Result<()> + 'static) -> Planned {
        Planned {
            local,
            after: Some(Box::new(after)),
        }
    }
}
