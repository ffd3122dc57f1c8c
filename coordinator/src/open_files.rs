//! The process's limit on open files bounds the clients: past it, accepting
//! fails and new clients hang in the listen queue. So `--max-clients` is
//! lowered to what the limit allows, and clients past it are refused
//! cleanly (53300) while the others are served.

/// Descriptors kept for what is not a client: listeners, map listener
/// connections, logs, the pools' idle connections beyond the clients'.
const RESERVED: usize = 64;

/// The soft limit on open files of this process (/proc/self/limits), if it
/// can be read and is not unlimited.
pub fn soft_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_soft_limit(&limits)
}

fn parse_soft_limit(limits: &str) -> Option<usize> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How many clients fit in `open_files` descriptors: each client's socket,
/// and a server connection it may hold (a transaction, a pinned session).
pub fn clients_within(open_files: usize) -> usize {
    (open_files.saturating_sub(RESERVED) / 2).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_soft_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             95000                95000                processes \n\
                      Max open files            256                  524288               files     \n";
        assert_eq!(parse_soft_limit(limits), Some(256));
        assert_eq!(
            parse_soft_limit(
                "Max open files            unlimited            unlimited            files"
            ),
            None
        );
        assert_eq!(clients_within(256), 96);
        assert_eq!(clients_within(10), 1);
    }
}
