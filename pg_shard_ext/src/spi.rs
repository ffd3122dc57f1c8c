//! Every query the extension runs goes through here, under a search_path of
//! `pg_catalog, pg_temp`: no function, operator, type or cast that a role
//! planted in a schema on the caller's search_path is ever found by a name
//! pg_shard wrote, though the caller may be a superuser (or the job runner).
//! Names the *user* wrote (a table in `colocate_with`, in a `COMMENT ON`)
//! are looked up in the caller's own search_path by the functions below,
//! without running SQL.
//!
//! The wrappers have the signatures of pgrx's [`Spi`] functions; nothing else
//! in the extension calls `Spi` directly.

use crate::error::Result;
use crate::guc::GucScope;
use pgrx::prelude::*;
use pgrx::spi::{SpiClient, SpiResult};
use std::cell::{Cell, RefCell};
use std::ffi::CStr;

/// The search_path of every statement pg_shard runs.
pub(crate) const SAFE_SEARCH_PATH: &str = "pg_catalog, pg_temp";

thread_local! {
    /// How many [`CallerPath`]s are alive.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The search_path of the statement that called into pg_shard, while
    /// a [`CallerPath`] is alive.
    static CALLER_PATH: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Keeps the caller's search_path for [`in_caller_path`] while the extension
/// runs under another one.
pub(crate) struct CallerPath(());

impl CallerPath {
    pub(crate) fn remember() -> CallerPath {
        let depth = DEPTH.get();
        if depth == 0 {
            CALLER_PATH.set(Some(current_search_path()));
        }
        DEPTH.set(depth + 1);
        CallerPath(())
    }
}

impl Drop for CallerPath {
    fn drop(&mut self) {
        let depth = DEPTH.get().saturating_sub(1);
        DEPTH.set(depth);
        if depth == 0 {
            CALLER_PATH.set(None);
        }
    }
}

/// While alive, the search_path is [`SAFE_SEARCH_PATH`] (or already as safe).
struct SafePath {
    // Field order: the setting goes back before the caller's path is let go.
    _scope: Option<GucScope>,
    _caller: CallerPath,
}

impl SafePath {
    fn enter() -> SafePath {
        let caller = CallerPath::remember();
        let scope = (!is_safe(&current_search_path()))
            .then(|| GucScope::set_one("search_path", SAFE_SEARCH_PATH));
        SafePath {
            _scope: scope,
            _caller: caller,
        }
    }
}

/// `search_path` names nothing a role other than a superuser can create
/// objects in: pg_catalog, and temporary relations (never functions or
/// operators) of this session.
fn is_safe(path: &str) -> bool {
    let normalized: String = path.chars().filter(|c| !c.is_whitespace()).collect();
    matches!(normalized.as_str(), "pg_catalog" | "pg_catalog,pg_temp")
}

fn current_search_path() -> String {
    // SAFETY: the GUC's current string value, owned by guc.c and never
    // freed while it is current; copied at once.
    unsafe {
        let value = pg_sys::namespace_search_path;
        if value.is_null() {
            String::new()
        } else {
            CStr::from_ptr(value).to_string_lossy().into_owned()
        }
    }
}

/// [`Spi::connect`] under the safe search_path.
pub(crate) fn connect<R, F>(f: F) -> R
where
    F: FnOnce(&SpiClient<'_>) -> R,
{
    let _path = SafePath::enter();
    Spi::connect(f)
}

/// [`Spi::connect_mut`] under the safe search_path.
pub(crate) fn connect_mut<R, F>(f: F) -> R
where
    F: FnOnce(&mut SpiClient<'_>) -> R,
{
    let _path = SafePath::enter();
    Spi::connect_mut(f)
}

/// [`Spi::run`] under the safe search_path.
pub(crate) fn run(query: &str) -> SpiResult<()> {
    let _path = SafePath::enter();
    Spi::run(query)
}

/// [`Spi::run_with_args`] under the safe search_path.
pub(crate) fn run_with_args(query: &str, args: &[pgrx::datum::DatumWithOid<'_>]) -> SpiResult<()> {
    let _path = SafePath::enter();
    Spi::run_with_args(query, args)
}

/// [`Spi::get_one`] under the safe search_path.
pub(crate) fn get_one<A: FromDatum + IntoDatum>(query: &str) -> SpiResult<Option<A>> {
    let _path = SafePath::enter();
    Spi::get_one(query)
}

/// The first column of the first row of a read-only `query`, or None when it
/// returns no row or NULL (pgrx's get_one treats "no row" as an error).
/// Read-only: no transaction id is assigned, so it also works in parallel
/// plans and on standbys.
pub(crate) fn query_one<T: FromDatum + IntoDatum>(
    query: &str,
    args: &[pgrx::datum::DatumWithOid<'_>],
) -> Result<Option<T>> {
    connect(|client| {
        let mut rows = client.select(query, Some(1), args)?;
        match rows.next() {
            None => Ok(None),
            Some(row) => Ok(row.get::<T>(1)?),
        }
    })
}

/// [`query_one`] without parameters.
pub(crate) fn query_value<T: FromDatum + IntoDatum>(query: &str) -> Result<Option<T>> {
    query_one(query, &[])
}

/// Like [`query_one`] for a statement that writes (`INSERT … RETURNING`,
/// `nextval`): runs with a fresh snapshot per statement. As the current
/// role: catalog writes go through `metadata::catalog::write_returning`,
/// which switches to the extension's owner first.
pub(crate) fn update_one<T: FromDatum + IntoDatum>(
    query: &str,
    args: &[pgrx::datum::DatumWithOid<'_>],
) -> Result<Option<T>> {
    connect_mut(|client| {
        let mut rows = client.update(query, Some(1), args)?;
        match rows.next() {
            None => Ok(None),
            Some(row) => Ok(row.get::<T>(1)?),
        }
    })
}

/// `work`'s reads see what committed up to now, not the statement's (or
/// a REPEATABLE READ transaction's) snapshot: for waits that look again
/// and again (a statement waiting for a shard move to publish its map, a
/// job waiting for its marker). Read-only queries in `work` take no
/// transaction id.
pub(crate) fn with_latest_snapshot<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: a fresh snapshot, pushed here and popped below whatever
    // `work` returns (an error raised inside unwinds past both, and the
    // transaction's abort pops it).
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot()) };
    let result = work();
    // SAFETY: the snapshot pushed above.
    unsafe { pg_sys::PopActiveSnapshot() };
    result
}

/// Runs `work` under the safe search_path: for raw SPI (the shard guard's
/// kept plan) and anything else that plans a query.
pub(crate) fn under_safe_path<T>(work: impl FnOnce() -> T) -> T {
    let _path = SafePath::enter();
    work()
}

/// Runs `work` with the caller's search_path back in force, for lookups of
/// names the user wrote. `work` must not run SQL text (no [`Spi`]): only
/// catalog lookups in C, which call no user code.
fn in_caller_path<T>(work: impl FnOnce() -> T) -> T {
    let caller = CALLER_PATH.with_borrow(|path| path.clone());
    match caller {
        Some(path) if DEPTH.get() > 0 && path != current_search_path() => {
            let _scope = GucScope::set_one("search_path", &path);
            work()
        }
        _ => work(),
    }
}

/// The relation a name the user wrote (`t`, `s.t`, `"T"`) means in the
/// caller's search_path, as `'…'::regclass` would; None if there is none.
pub(crate) fn caller_relation(name: &str) -> Option<pg_sys::Oid> {
    in_caller_path(|| {
        // SAFETY: to_regclass reads its text argument and looks the name up
        // in the syscache; NULL (None) when there is no such relation.
        unsafe {
            pgrx::direct_function_call::<pg_sys::Oid>(pg_sys::to_regclass, &[name.into_datum()])
        }
    })
    .filter(|oid| *oid != pg_sys::InvalidOid)
}

/// How the caller would see `relid` printed (`t` when `t` is on its
/// search_path, else `s.t`), as `relid::regclass::text` would, for messages.
pub(crate) fn caller_relation_name(relid: pg_sys::Oid) -> String {
    in_caller_path(|| {
        // SAFETY: regclassout prints an oid (a number if no relation has it).
        unsafe {
            pgrx::direct_function_call::<&CStr>(pg_sys::regclassout, &[relid.into_datum()])
                .map(|name| name.to_string_lossy().into_owned())
        }
    })
    .unwrap_or_else(|| relid.to_u32().to_string())
}

/// `text` with each relation oid marked in SQL as
/// `chr(1) || oid::text || chr(1)` replaced by [`caller_relation_name`]:
/// for messages listing relations, put together by a query that runs under
/// the safe search_path (where `oid::regclass` would print `public.t`).
pub(crate) fn caller_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut parts = text.split('\u{1}');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    while let Some(marked) = parts.next() {
        match marked.parse::<u32>() {
            Ok(oid) => out.push_str(&caller_relation_name(pg_sys::Oid::from(oid))),
            Err(_) => out.push_str(marked),
        }
        if let Some(after) = parts.next() {
            out.push_str(after);
        }
    }
    out
}

/// The schemas of the caller's search_path in order, implicit ones
/// included, as `current_schemas(true)` would give them.
pub(crate) fn caller_schemas() -> Vec<String> {
    in_caller_path(|| {
        // SAFETY: fetch_search_path copies the active path into a List of
        // namespace oids in the current memory context; read, then freed.
        unsafe {
            let list = pg_sys::fetch_search_path(true);
            let mut names = Vec::new();
            if !list.is_null() {
                for index in 0..(*list).length as usize {
                    let oid = (*(*list).elements.add(index)).oid_value;
                    let name = pg_sys::get_namespace_name(oid);
                    if !name.is_null() {
                        names.push(CStr::from_ptr(name).to_string_lossy().into_owned());
                    }
                }
                pg_sys::list_free(list);
            }
            names
        }
    })
}

/// A relation's schema and name.
pub(crate) fn schema_and_name(relid: pg_sys::Oid) -> crate::error::Result<(String, String)> {
    connect(|client| {
        let row = client
            .select(
                "SELECT n.nspname::text, c.relname::text FROM pg_catalog.pg_class c \
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
                Some(1),
                &[relid.into()],
            )?
            .first();
        Ok::<_, crate::error::ShardError>((
            row.get::<String>(1)?.unwrap_or_default(),
            row.get::<String>(2)?.unwrap_or_default(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::is_safe;

    #[test]
    fn only_catalog_paths_are_safe() {
        assert!(is_safe("pg_catalog, pg_temp"));
        assert!(is_safe("pg_catalog"));
        assert!(!is_safe("\"$user\", public"));
        assert!(!is_safe("public, pg_catalog"));
        assert!(!is_safe("pg_catalog, public"));
    }
}
