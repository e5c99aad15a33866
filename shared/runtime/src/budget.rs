//! Per-agent request budgets: one token bucket per caller at each service replica.
//!
//! Buckets live in memory and are cheap (an id, a float, an instant). A bucket that has been
//! idle long enough to be full again says nothing a fresh one would not, so buckets are
//! forgotten then: the map holds only agents active in the last `burst / per_second` seconds.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::config::RequestBudget;

/// How many buckets may pile up before the full ones are swept out.
const SWEEP_ABOVE: usize = 4_096;

/// How many refusals of requests whose sender is not known (a bad or missing reply subject)
/// one replica records in the audit trail per second, and in a burst; the rest are counted.
const REFUSALS_AUDITED_PER_SECOND: f64 = 50.0;
const REFUSALS_AUDITED_BURST: f64 = 100.0;

/// Per-caller request budgets of one service replica: one token bucket per caller.
#[derive(Debug)]
pub struct Limiter {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// The replica's budget for auditing refusals no agent's bucket can pay for.
    refusals: Mutex<Bucket>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refill(&mut self, now: Instant, per_second: f64, burst: f64) {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * per_second;
        self.tokens = (self.tokens + earned).min(burst);
        self.at = now;
    }
}

impl Limiter {
    /// Buckets of `budget.burst` tokens refilled at `budget.per_second`.
    pub fn new(budget: &RequestBudget) -> Self {
        Self {
            per_second: f64::from(budget.per_second.max(1)),
            burst: f64::from(budget.burst.max(1)),
            buckets: Mutex::default(),
            refusals: Mutex::new(Bucket {
                tokens: REFUSALS_AUDITED_BURST,
                at: Instant::now(),
            }),
        }
    }

    /// Takes one token from the replica's refusal-audit bucket (50 per second, bursts of 100):
    /// whether a refusal whose sender is unknown is recorded in the audit trail, or only
    /// counted.
    pub fn allow_refusal(&self) -> bool {
        let mut bucket = self
            .refusals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        bucket.refill(
            Instant::now(),
            REFUSALS_AUDITED_PER_SECOND,
            REFUSALS_AUDITED_BURST,
        );
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Tokens returned per second.
    pub fn per_second(&self) -> f64 {
        self.per_second
    }

    /// Tokens a full bucket holds: the most requests one caller may burst (`[requests]` `burst`).
    pub fn burst(&self) -> f64 {
        self.burst
    }

    /// Takes one token from `caller`'s bucket; false when it is empty.
    pub fn allow(&self, caller: &str) -> bool {
        self.allow_at(caller, Instant::now())
    }

    fn allow_at(&self, caller: &str, now: Instant) -> bool {
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() >= SWEEP_ABOVE && !buckets.contains_key(caller) {
            let (per_second, burst) = (self.per_second, self.burst);
            buckets.retain(|_, bucket| {
                bucket.refill(now, per_second, burst);
                bucket.tokens < burst
            });
        }
        let bucket = buckets.entry(caller.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        bucket.refill(now, self.per_second, self.burst);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How many buckets are held (for tests).
    pub fn tracked(&self) -> usize {
        self.buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limiter(per_second: u32, burst: u32) -> Limiter {
        Limiter::new(&RequestBudget { per_second, burst })
    }

    #[test]
    fn a_burst_then_the_refill_rate() {
        let limiter = limiter(10, 5);
        let start = Instant::now();
        let allowed = (0..20).filter(|_| limiter.allow_at("alice", start)).count();
        assert_eq!(allowed, 5, "the burst, then nothing");
        assert!(limiter.allow_at("bob", start), "bob has his own bucket");
        let later = start + Duration::from_millis(300);
        let allowed = (0..20).filter(|_| limiter.allow_at("alice", later)).count();
        assert_eq!(allowed, 3, "10 per second for 0.3 s");
        let much_later = start + Duration::from_secs(3_600);
        let allowed = (0..20)
            .filter(|_| limiter.allow_at("alice", much_later))
            .count();
        assert_eq!(allowed, 5, "never more than the burst");
    }

    #[test]
    fn idle_buckets_are_forgotten() {
        let limiter = limiter(1_000, 10);
        let start = Instant::now();
        for n in 0..SWEEP_ABOVE {
            assert!(limiter.allow_at(&format!("agent-{n}"), start));
        }
        assert_eq!(limiter.tracked(), SWEEP_ABOVE);
        assert!(limiter.allow_at("newcomer", start + Duration::from_secs(1)));
        assert_eq!(limiter.tracked(), 1, "every full bucket was dropped");
    }
}
