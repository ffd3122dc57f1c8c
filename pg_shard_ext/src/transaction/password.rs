//! The password of a connection the `postgres` crate makes, found as libpq
//! finds one: `PGPASSWORD`, then the password file (`PGPASSFILE`, else
//! `.pgpass` in the server user's home folder) unless others can read it.
//! Without this, moves and splits failed on nodes that ask for a password
//! while the libpq connections of the same transaction logged in.

use std::ffi::CStr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// The password for `user` at `host:port`, database `database`, if any.
pub(crate) fn password_for(host: &str, port: u16, database: &str, user: &str) -> Option<String> {
    if let Ok(password) = std::env::var("PGPASSWORD") {
        if !password.is_empty() {
            return Some(password);
        }
    }
    let path = password_file()?;
    let metadata = std::fs::metadata(&path).ok()?;
    // libpq ignores a file others may read (and says so); so do we, silently,
    // since its own connections already warn.
    if !metadata.is_file() || metadata.permissions().mode() & 0o077 != 0 {
        return None;
    }
    let contents = std::fs::read_to_string(&path).ok()?;
    pg_shard_core::passfile::find_password(&contents, host, port, database, user)
}

fn password_file() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PGPASSFILE") {
        return Some(PathBuf::from(path));
    }
    let mut home = [0 as std::ffi::c_char; pgrx::pg_sys::MAXPGPATH as usize];
    // SAFETY: get_home_path writes a NUL-terminated path of at most
    // MAXPGPATH bytes into the buffer, which is that long.
    let found = unsafe { pgrx::pg_sys::get_home_path(home.as_mut_ptr()) };
    if !found {
        return None;
    }
    // SAFETY: NUL-terminated by get_home_path (the buffer was zeroed).
    let home = unsafe { CStr::from_ptr(home.as_ptr()) };
    Some(PathBuf::from(home.to_string_lossy().into_owned()).join(".pgpass"))
}
