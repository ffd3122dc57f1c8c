//! Deadlocks across nodes. Each node finds the wait cycles among its own
//! backends, but not a cycle through two nodes (transaction 1 waits on
//! node A for transaction 2, which waits on node B for transaction 1). The
//! coordinator's detector is a timeout: a statement of a transaction on
//! several nodes still waiting for a lock after
//! `--distributed-deadlock-timeout` is canceled, and the client gets
//! 40P01, as from a node's own detector (a long wait that is not a cycle
//! ends the same way; see docs/coordinator.md).

use super::*;
use crate::backend::pool::Pool;

/// Watches one statement while it runs; stops when dropped.
pub(super) struct Watchdog {
    task: tokio::task::JoinHandle<()>,
    /// The statement was canceled as a deadlock.
    pub(super) fired: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Session {
    /// A watchdog for a statement about to run on `target` in `lease`,
    /// when the transaction is (or becomes) one on several nodes.
    pub(super) fn watchdog(
        &self,
        target: Target,
        lease: &mut Lease,
        side_connection: bool,
    ) -> Option<Watchdog> {
        let timeout = self.shared.config.distributed_deadlock_timeout;
        let nodes = self.tx.members.len() + usize::from(!self.tx.has_begun_on(target));
        if timeout == 0 || side_connection || self.tx.state != TxState::Open || nodes < 2 {
            return None;
        }
        let pool = lease.pool().clone();
        let connection = lease.connection();
        let (address, process_id, secret_key) = (
            connection.address.clone(),
            connection.process_id,
            connection.secret_key,
        );
        let cancels_in_flight = connection.cancels_in_flight.clone();
        let shared = self.shared.clone();
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = fired.clone();
        // Transactions of a cycle that started waiting together would all
        // be canceled at once: each looks again after a pause of its own,
        // and by then the first one canceled has broken the cycle (its
        // session rolls its other branches back at once, connections.rs).
        // Both are canceled only when the pauses end closer together than
        // that takes (a few ms): the wider the range, the rarer.
        let second_look =
            Duration::from_millis(rand::Rng::gen_range(&mut rand::thread_rng(), 1..=timeout));
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(timeout)).await;
                if !waits_for_lock(&shared, &pool, process_id).await {
                    continue;
                }
                tokio::time::sleep(second_look).await;
                if waits_for_lock(&shared, &pool, process_id).await {
                    flag.store(true, Ordering::Release);
                    // (Counted: the connection is not pooled while a cancel
                    // may still reach it.)
                    cancels_in_flight.fetch_add(1, Ordering::AcqRel);
                    ServerConnection::cancel(address, process_id, secret_key).await;
                    cancels_in_flight.fetch_sub(1, Ordering::AcqRel);
                    tracing::info!(
                        process_id,
                        "canceled a lock wait of a transaction on several nodes (deadlock timeout)"
                    );
                    return;
                }
            }
        });
        Some(Watchdog { task, fired })
    }
}

/// Whether the backend `process_id` waits for a lock (asked on another
/// connection of the same pool: the same role sees its backends' waits).
async fn waits_for_lock(shared: &Shared, pool: &Arc<Pool>, process_id: i32) -> bool {
    let Ok(mut lease) = shared.pools.checkout_from(pool.clone(), 0).await else {
        return false;
    };
    let connection = lease.connection();
    let sql = format!(
        "SELECT wait_event_type = 'Lock' FROM pg_catalog.pg_stat_activity WHERE pid = {process_id}"
    );
    // Until its answer is read: the task may be stopped at any await (the
    // statement ended), and the connection must not go back to the pool
    // with an answer due.
    connection.broken = true;
    if connection.send_query(&sql).await.is_err() {
        return false;
    }
    match connection.read_answer().await {
        Ok(answer) => {
            connection.broken = false;
            answer.first_values.first() == Some(&Some("t".to_string()))
        }
        Err(_) => false,
    }
}

/// What the client hears of a statement canceled as a deadlock.
pub(super) fn deadlock_error(timeout_ms: u64) -> ServerError {
    ServerError::new("40P01", "deadlock detected")
        .with_detail(format!(
            "pg_shard coordinator: in a transaction on several nodes, this statement waited for a lock for more than {timeout_ms} ms (--distributed-deadlock-timeout); a wait across nodes may be a deadlock no node can see."
        ))
        .with_hint("Retry the transaction. Taking rows in the same order in every transaction avoids such waits.")
}
