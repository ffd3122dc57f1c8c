//! Which client last ran a statement on each metadata-node backend, so that
//! a notification's sender reads as the client that sent it: PostgreSQL
//! names the NOTIFY's backend by its process id, and clients compare that
//! with the process id of their BackendKeyData, which through the
//! coordinator is the coordinator's own (that is how cancel works).

use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::Mutex;

/// Backends remembered (older ones are forgotten first).
const REMEMBERED: usize = 65_536;

pub struct Notifiers {
    clients: Mutex<LruCache<i32, i32>>,
}

impl Default for Notifiers {
    fn default() -> Notifiers {
        Notifiers {
            clients: Mutex::new(LruCache::new(
                NonZeroUsize::new(REMEMBERED).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }
}

impl Notifiers {
    /// `client` (its BackendKeyData process id) now uses `backend`.
    pub fn note(&self, backend: i32, client: i32) {
        if let Ok(mut clients) = self.clients.lock() {
            clients.put(backend, client);
        }
    }

    /// A NotificationResponse body with the sender's backend replaced by
    /// the client that last used it; None when it is not known.
    pub fn as_client(&self, body: &[u8]) -> Option<Vec<u8>> {
        let backend = i32::from_be_bytes(body.get(..4)?.try_into().ok()?);
        let client = *self.clients.lock().ok()?.get(&backend)?;
        let mut rewritten = body.to_vec();
        rewritten[..4].copy_from_slice(&client.to_be_bytes());
        Some(rewritten)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn senders_read_as_their_clients() {
        let notifiers = Notifiers::default();
        let mut body = 4242i32.to_be_bytes().to_vec();
        body.extend_from_slice(b"channel\0payload\0");
        assert_eq!(notifiers.as_client(&body), None);
        notifiers.note(4242, 7);
        let rewritten = notifiers.as_client(&body).unwrap();
        assert_eq!(&rewritten[..4], &7i32.to_be_bytes());
        assert_eq!(&rewritten[4..], &body[4..]);
        assert_eq!(notifiers.as_client(&[0, 1]), None);
    }
}
