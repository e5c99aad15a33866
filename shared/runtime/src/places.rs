//! A bounded number of places per party, each given back when its guard drops: how a service
//! caps what one agent holds open at once on a replica (the fan-out's held fetches, the
//! correlator's waiting calls, the gateway's open streams), so that however a request ends —
//! answered, failed, cancelled — its place is freed.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The places taken per key; cheap to clone (clones share the counts).
#[derive(Debug)]
pub struct Places<K> {
    counts: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K> Default for Places<K> {
    fn default() -> Self {
        Self {
            counts: Arc::default(),
        }
    }
}

impl<K> Clone for Places<K> {
    fn clone(&self) -> Self {
        Self {
            counts: Arc::clone(&self.counts),
        }
    }
}

/// One place taken for `key`; dropping it gives the place back.
#[derive(Debug)]
pub struct Place<K: Eq + Hash> {
    counts: Arc<Mutex<HashMap<K, usize>>>,
    key: K,
}

impl<K: Eq + Hash + Clone> Places<K> {
    fn counts(&self) -> MutexGuard<'_, HashMap<K, usize>> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for `key`, or `None` when it holds `cap` already.
    pub fn take(&self, key: &K, cap: usize) -> Option<Place<K>> {
        let mut counts = self.counts();
        let count = counts.entry(key.clone()).or_default();
        if *count >= cap {
            if *count == 0 {
                counts.remove(key);
            }
            return None;
        }
        *count += 1;
        Some(Place {
            counts: Arc::clone(&self.counts),
            key: key.clone(),
        })
    }

    /// How many places `key` holds now.
    pub fn held(&self, key: &K) -> usize {
        self.counts().get(key).copied().unwrap_or(0)
    }

    /// How many keys hold a place now (a key that gave every place back is forgotten).
    pub fn keys(&self) -> usize {
        self.counts().len()
    }
}

impl<K: Eq + Hash> Drop for Place<K> {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_stop_at_the_cap_come_back_on_drop_and_leave_nothing_behind() {
        let places = Places::default();
        let taken: Vec<_> = (0..3).map(|_| places.take(&"a", 3).unwrap()).collect();
        assert!(
            places.take(&"a", 3).is_none(),
            "a fourth place past a cap of 3"
        );
        let other = places.take(&"b", 3).unwrap();
        assert_eq!(places.held(&"a"), 3);
        drop(taken);
        assert_eq!(places.held(&"a"), 0);
        assert!(places.take(&"c", 0).is_none());
        assert_eq!(places.keys(), 1, "only b holds a place: {:?}", places);
        drop(other);
        assert_eq!(places.keys(), 0);
    }
}
