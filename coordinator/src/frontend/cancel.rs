//! Cancel requests: the cancel key each client was given, the server
//! statement it points at while one runs, and a cancel that comes while the
//! client waits for a server connection.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;

/// The server and cancel key of the statement a client is running, if any,
/// and whether the client asked to cancel it.
#[derive(Default)]
struct CancelTarget {
    server: Option<ServerStatement>,
    requested: bool,
}

/// Where a running statement's cancel request goes: the server, its
/// process and key, and the connection's count of cancels in flight.
#[derive(Clone)]
struct ServerStatement {
    address: Arc<ServerAddress>,
    process_id: i32,
    secret_key: i32,
    cancels_in_flight: Arc<AtomicUsize>,
}

/// One client's cancel state, shared with the registry.
#[derive(Default)]
pub(super) struct CancelSlot {
    target: Mutex<CancelTarget>,
    /// Wakes a client waiting for a server connection when it is canceled.
    requested: Notify,
}

/// Cancel keys of running statements, by the key the client was given.
#[derive(Default)]
pub struct CancelRegistry {
    slots: Mutex<HashMap<(i32, i32), Arc<CancelSlot>>>,
}

impl CancelRegistry {
    pub(super) fn register(&self, key: (i32, i32)) -> Arc<CancelSlot> {
        let slot = Arc::new(CancelSlot::default());
        if let Ok(mut slots) = self.slots.lock() {
            slots.insert(key, slot.clone());
        }
        slot
    }

    pub(super) fn unregister(&self, key: (i32, i32)) {
        if let Ok(mut slots) = self.slots.lock() {
            slots.remove(&key);
        }
    }

    pub(super) async fn cancel(&self, key: (i32, i32)) {
        let Some(slot) = self
            .slots
            .lock()
            .ok()
            .and_then(|slots| slots.get(&key).cloned())
        else {
            return;
        };
        // Counted under the lock the statement's end takes to stop
        // watching (`unwatch`): the connection goes back to its pool only
        // after that, and not while the count is above zero.
        let server = slot.target.lock().ok().and_then(|mut target| {
            target.requested = true;
            let server = target.server.clone()?;
            server.cancels_in_flight.fetch_add(1, Ordering::AcqRel);
            Some(server)
        });
        slot.requested.notify_waiters();
        if let Some(server) = server {
            ServerConnection::cancel(server.address, server.process_id, server.secret_key).await;
            server.cancels_in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl CancelSlot {
    /// Cancel requests go to `connection`'s server statement.
    pub(super) fn watch(&self, connection: &ServerConnection) {
        if let Ok(mut target) = self.target.lock() {
            target.server = Some(ServerStatement {
                address: connection.address.clone(),
                process_id: connection.process_id,
                secret_key: connection.secret_key,
                cancels_in_flight: connection.cancels_in_flight.clone(),
            });
        }
    }

    fn requested(&self) -> bool {
        self.target.lock().is_ok_and(|target| target.requested)
    }

    /// Returns once the client has asked to cancel (at once if it has).
    async fn until_requested(&self) {
        loop {
            let notified = self.requested.notified();
            tokio::pin!(notified);
            // Registered before the check: a cancel between the two wakes it.
            notified.as_mut().enable();
            if self.requested() {
                return;
            }
            notified.await;
        }
    }
}

impl Session {
    /// Cancel requests of this client go to `connection` until
    /// [`Self::unwatch_cancel`].
    pub(super) fn watch_cancel(&self, connection: &ServerConnection) {
        self.cancel_slot.watch(connection)
    }

    /// A new request of the client begins: a cancel request that came
    /// before it does not apply to it (a server drops one that comes while
    /// it is idle too).
    pub(super) fn forget_cancel(&self) {
        if let Ok(mut target) = self.cancel_slot.target.lock() {
            target.requested = false;
        }
    }

    pub(super) fn unwatch_cancel(&self) {
        if let Ok(mut target) = self.cancel_slot.target.lock() {
            target.server = None;
        }
    }

    pub(super) fn cancel_requested(&self) -> bool {
        self.cancel_slot.requested()
    }

    /// Returns once the client asks to cancel what it is waiting for.
    pub(super) async fn until_cancel_requested(&self) {
        self.cancel_slot.until_requested().await
    }
}
