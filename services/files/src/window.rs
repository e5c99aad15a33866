//! The chunks of uploads this replica is storing, so a client may send a chunk before the
//! previous one's reply (the Rust client keeps three in flight, docs/protocol.md §17): a chunk
//! that follows one in flight here — stored now, or waiting itself — waits for it instead of
//! being refused out of order. A chunk that follows one
//! stored by another replica finds nothing to wait for and is refused `conflict` as before;
//! the client sends it again once the previous one is answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use uuid::Uuid;

/// The longest a chunk waits for the one before it.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Chunks in flight, by file and the offset each ends at.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    chunks: Mutex<HashMap<(Uuid, u64), Arc<Notify>>>,
}

/// A chunk in flight; dropped when it is stored or refused, which wakes the chunk after it.
pub(crate) struct Flight<'a> {
    in_flight: &'a InFlight,
    key: (Uuid, u64),
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Uuid, u64), Arc<Notify>>> {
        self.chunks
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Waits (at most `wait`) for the chunk of `file` in flight here that ends at `offset`, if
    /// there is one.
    pub(crate) async fn after(&self, file: Uuid, offset: u64, wait: Duration) {
        let notify = match self.lock().get(&(file, offset)) {
            Some(notify) => Arc::clone(notify),
            None => return,
        };
        let done = notify.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        // Finished between the look-up and the enable: nothing to wait for.
        if !self.lock().contains_key(&(file, offset)) {
            return;
        }
        let _ = tokio::time::timeout(wait, done).await;
    }

    /// Marks the chunk of `file` ending at `end` in flight until the returned guard drops.
    pub(crate) fn start(&self, file: Uuid, end: u64) -> Flight<'_> {
        self.lock()
            .entry((file, end))
            .or_insert_with(|| Arc::new(Notify::new()));
        Flight {
            in_flight: self,
            key: (file, end),
        }
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if let Some(notify) = self.in_flight.lock().remove(&self.key) {
            notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_chunk_waits_for_the_one_before_it_and_only_that_one() {
        let in_flight = Arc::new(InFlight::default());
        let file = Uuid::nil();
        // Nothing in flight: no wait.
        tokio::time::timeout(Duration::from_millis(50), in_flight.after(file, 10, WAIT))
            .await
            .unwrap();
        let flight = in_flight.start(file, 10);
        let waiting = {
            let in_flight = Arc::clone(&in_flight);
            tokio::spawn(async move { in_flight.after(file, 10, WAIT).await })
        };
        // Another offset does not wait for it.
        tokio::time::timeout(Duration::from_millis(50), in_flight.after(file, 20, WAIT))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        drop(flight);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .unwrap()
            .unwrap();
        assert!(in_flight.lock().is_empty());
    }
}
