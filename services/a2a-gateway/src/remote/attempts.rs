//! How many times each inbox message was offered to its remote agent: a message that fails
//! [`MAX_ATTEMPTS`] times goes to the dead letters instead of blocking the inbox. Shared by the
//! bridge (which keeps the counts across a carrier's restarts) and the carrier.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// How often one message may fail to reach a remote that answers its card (5xx, 429, reset)
/// before it is given up with a clear answer: below the inbox's 10 hand-outs, so a message is
/// never moved to the dead letters unanswered.
pub(crate) const MAX_ATTEMPTS: u32 = 5;

/// What outlives one session of a carried agent: how often each message failed to reach the
/// remote, and whether the last session carried anything (then the pause before the next
/// starts short again).
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    failed: Mutex<HashMap<u64, u32>>,
    pub(crate) carried: AtomicBool,
}

impl Attempts {
    /// Counts a failure of message `seq`; true when it was the last one allowed.
    pub(crate) fn failed(&self, seq: u64) -> bool {
        let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        let count = failed.entry(seq).or_default();
        *count += 1;
        *count >= MAX_ATTEMPTS
    }

    /// Whether message `seq` has one attempt left.
    pub(crate) fn last(&self, seq: u64) -> bool {
        let failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        failed
            .get(&seq)
            .is_some_and(|count| count + 1 >= MAX_ATTEMPTS)
    }

    pub(crate) fn done(&self, seq: u64) {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&seq);
        self.carried.store(true, Ordering::Relaxed);
    }
}
