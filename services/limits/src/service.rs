//! What agents and operators ask of the limits service (docs/protocol.md §15): the checks
//! on each request, then one op for the key's keeper.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use switchboard_proto::AgentId;
use switchboard_proto::limits::{
    ACQUIRE_WAIT_MAX_MS, AcquireRequest, LIMITS_MAX, Lease, LeaseHeld, LimitList, LimitQuery,
    LimitSpec, LimitView, ReleaseRequest, Released, RenewRequest, TOKENS_MAX, check_key,
};
use time::OffsetDateTime;

use crate::config::LimitsConfig;
use crate::error::LimitsError;
use crate::keeper::{Forward, Forwarded, Keepers, now_ms};
use crate::ledger::{Held, Ledger, Op, Outcome};
use crate::store::{LimitStore, hashed};

/// The limits service of one replica.
#[derive(Debug)]
pub struct Limits {
    pub(crate) store: LimitStore,
    pub(crate) keepers: Keepers,
    pub(crate) specs: Specs,
    config: LimitsConfig,
    /// Acquires each agent has waiting at this replica.
    waiting: Arc<Mutex<HashMap<AgentId, usize>>>,
}

/// The declared limits this replica knows, by hashed key: filled by the bucket's watch and
/// by reads of a key not seen yet.
#[derive(Debug, Clone, Default)]
pub(crate) struct Specs(Arc<Mutex<HashMap<String, LimitSpec>>>);

impl Specs {
    fn get(&self, key: &str) -> Option<LimitSpec> {
        let specs = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        specs.get(&hashed(key)).filter(|s| s.key == key).cloned()
    }

    /// Remembers a declared limit.
    pub(crate) fn put(&self, spec: &LimitSpec) {
        let mut specs = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        specs.insert(hashed(&spec.key), spec.clone());
    }

    /// Forgets a removed limit (by hashed key).
    pub(crate) fn forget(&self, hashed_key: &str) {
        let mut specs = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        specs.remove(hashed_key);
    }
}

/// One waiting acquire counted against its agent until dropped.
struct WaitSlot {
    waiting: Arc<Mutex<HashMap<AgentId, usize>>>,
    agent: AgentId,
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = waiting.get_mut(&self.agent) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&self.agent);
            }
        }
    }
}

fn at(ms: u64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn lease(key: &str, held: &Held) -> Lease {
    Lease {
        lease_id: held.id,
        key: key.to_owned(),
        tokens: held.tokens,
        expires_at: at(held.expires_ms),
        waited_ms: held.waited_ms,
    }
}

impl Limits {
    /// The service over `store`; `client` carries contended keys' batches between replicas.
    pub fn new(store: LimitStore, client: async_nats::Client, config: LimitsConfig) -> Self {
        Self {
            keepers: Keepers::new(store.clone(), client),
            specs: Specs::default(),
            store,
            config,
            waiting: Arc::default(),
        }
    }

    /// The declared limit of `key` (as this replica's watch last saw it, else read), or
    /// `not_found`.
    async fn spec(&self, key: &str) -> Result<LimitSpec, LimitsError> {
        check_key(key).map_err(LimitsError::BadRequest)?;
        if let Some(spec) = self.specs.get(key) {
            return Ok(spec);
        }
        let spec =
            self.store.spec(key).await?.ok_or_else(|| {
                LimitsError::NotFound(format!("no limit is declared for `{key}`"))
            })?;
        self.specs.put(&spec);
        Ok(spec)
    }

    fn hold(spec: &LimitSpec, asked: Option<u64>) -> Result<u64, LimitsError> {
        let max = spec.max_hold();
        match asked {
            None => Ok(max),
            Some(ms) if (1..=max).contains(&ms) => Ok(ms),
            Some(ms) => Err(LimitsError::BadRequest(format!(
                "`hold_ms` is {ms}; `{}` allows 1..={max}",
                spec.key
            ))),
        }
    }

    /// `acquire`: a lease, at once or within `wait_ms`.
    pub async fn acquire(
        &self,
        caller: &AgentId,
        request: AcquireRequest,
    ) -> Result<Lease, LimitsError> {
        if request.tokens > TOKENS_MAX {
            return Err(LimitsError::BadRequest(format!(
                "`tokens` is {}; at most {TOKENS_MAX}",
                request.tokens
            )));
        }
        if request.wait_ms > ACQUIRE_WAIT_MAX_MS {
            return Err(LimitsError::BadRequest(format!(
                "`wait_ms` is {}; at most {ACQUIRE_WAIT_MAX_MS}",
                request.wait_ms
            )));
        }
        let spec = self.spec(&request.key).await?;
        let hold_ms = Self::hold(&spec, request.hold_ms)?;
        let (_slot, wait_ms) = match request.wait_ms {
            0 => (None, 0),
            wait => match self.wait_slot(caller) {
                Some(slot) => (Some(slot), wait),
                None => (None, 0),
            },
        };
        let now = now_ms();
        let op = Op::Acquire {
            id: request.lease_id.unwrap_or_else(switchboard_proto::new_id),
            agent: caller.clone(),
            tokens: request.tokens,
            hold_ms,
            at_ms: now,
            deadline_ms: now + wait_ms,
        };
        match self.keepers.submit(spec, op).await? {
            Outcome::Granted(held) => Ok(lease(&request.key, &held)),
            Outcome::Limited {
                why,
                retry_after_ms,
            } => Err(LimitsError::Limited {
                why,
                retry_after_ms,
            }),
            Outcome::Gone => Err(LimitsError::BadRequest(
                "`lease_id` names another agent's lease; choose a fresh one".to_owned(),
            )),
            other => Err(LimitsError::Unavailable(format!(
                "the acquire ended without a lease ({other:?}); retry"
            ))),
        }
    }

    fn wait_slot(&self, caller: &AgentId) -> Option<WaitSlot> {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let count = waiting.entry(caller.clone()).or_default();
        if *count >= self.config.max_waiting_per_agent {
            return None;
        }
        *count += 1;
        Some(WaitSlot {
            waiting: Arc::clone(&self.waiting),
            agent: caller.clone(),
        })
    }

    /// `release`: the lease back, the tokens corrected by what was used. Safe to repeat.
    pub async fn release(
        &self,
        caller: &AgentId,
        request: ReleaseRequest,
    ) -> Result<Released, LimitsError> {
        if request.tokens_used.is_some_and(|used| used > TOKENS_MAX) {
            return Err(LimitsError::BadRequest(format!(
                "`tokens_used` is above {TOKENS_MAX}"
            )));
        }
        let spec = self.spec(&request.key).await?;
        let op = Op::Release {
            id: request.lease_id,
            agent: caller.clone(),
            used: request.tokens_used,
        };
        match self.keepers.submit(spec, op).await? {
            Outcome::Released(released) => Ok(Released {
                lease_id: request.lease_id,
                released,
            }),
            other => Err(LimitsError::Unavailable(format!(
                "the release came to {other:?}; retry"
            ))),
        }
    }

    /// `renew`: the lease held `hold_ms` more from now.
    pub async fn renew(
        &self,
        caller: &AgentId,
        request: RenewRequest,
    ) -> Result<Lease, LimitsError> {
        let spec = self.spec(&request.key).await?;
        let hold_ms = Self::hold(&spec, request.hold_ms)?;
        let op = Op::Renew {
            id: request.lease_id,
            agent: caller.clone(),
            hold_ms,
        };
        match self.keepers.submit(spec, op).await? {
            Outcome::Granted(held) => Ok(lease(&request.key, &held)),
            _ => Err(LimitsError::NotFound(format!(
                "no lease {} of yours on `{}` (released, expired, or never yours)",
                request.lease_id, request.key
            ))),
        }
    }

    /// `_SB.limits.keeper.<this replica>`: another replica's batch for a key it found
    /// contended, applied and written here. Only services can publish there under the
    /// generated accounts; the ops are bounded again all the same.
    pub async fn forwarded(&self, forward: Forward) -> Result<Forwarded, LimitsError> {
        if forward.ops.is_empty() || forward.ops.len() > crate::keeper::BATCH_MAX {
            return Err(LimitsError::BadRequest(format!(
                "a forwarded batch holds 1..={} ops",
                crate::keeper::BATCH_MAX
            )));
        }
        let spec = self.spec(&forward.key).await?;
        let now = now_ms();
        let max_hold = spec.max_hold();
        for op in &forward.ops {
            let fits = match op {
                Op::Acquire {
                    tokens,
                    hold_ms,
                    at_ms,
                    deadline_ms,
                    ..
                } => {
                    // `at_ms` orders the queue: a made-up old arrival would jump it.
                    *tokens <= TOKENS_MAX
                        && (1..=max_hold).contains(hold_ms)
                        && (now.saturating_sub(10_000)..=now.saturating_add(1_000)).contains(at_ms)
                        && *deadline_ms <= now.saturating_add(ACQUIRE_WAIT_MAX_MS + 5_000)
                }
                Op::Release { used, .. } => used.is_none_or(|used| used <= TOKENS_MAX),
                Op::Renew { hold_ms, .. } => (1..=max_hold).contains(hold_ms),
                Op::Withdraw { .. } => true,
            };
            if !fits {
                return Err(LimitsError::BadRequest(format!(
                    "a forwarded op is out of bounds: {op:?}"
                )));
            }
        }
        self.keepers
            .submit_forwarded(&spec, forward.ops, forward.not_after_ms)
            .await
    }

    /// The subject this replica takes forwarded batches on.
    pub(crate) fn keeper_subject(&self) -> String {
        self.keepers.subject()
    }

    /// `get`: the limit and what is in use, with the caller's own leases.
    pub async fn get(
        &self,
        caller: &AgentId,
        request: LimitQuery,
    ) -> Result<LimitView, LimitsError> {
        let spec = self.spec(&request.key).await?;
        let (ledger, _) = self.store.state(&spec.key).await?;
        Ok(view(spec, ledger, Some(caller)))
    }

    /// `_SB.ops.limits.set`: declares or changes a limit; applies to the next request.
    pub async fn set(&self, spec: LimitSpec) -> Result<LimitView, LimitsError> {
        spec.validate().map_err(LimitsError::BadRequest)?;
        if self.store.spec(&spec.key).await?.is_none() {
            let count = self.store.specs().await?.len();
            if count >= LIMITS_MAX {
                return Err(LimitsError::TooMany(format!(
                    "{count} limits are declared, the most allowed; delete one first"
                )));
            }
        }
        self.store.put_spec(&spec).await?;
        self.specs.put(&spec);
        let (ledger, _) = self.store.state(&spec.key).await?;
        Ok(view(spec, ledger, None))
    }

    /// `_SB.ops.limits.delete`: removes a limit and its leases.
    pub async fn delete(&self, request: LimitQuery) -> Result<LimitView, LimitsError> {
        let spec = self.spec(&request.key).await?;
        let (ledger, _) = self.store.state(&spec.key).await?;
        self.store.delete(&spec.key).await?;
        self.specs.forget(&hashed(&spec.key));
        Ok(view(spec, ledger, None))
    }

    /// `_SB.ops.limits.list`: every limit and its leases.
    pub async fn list(&self) -> Result<LimitList, LimitsError> {
        let mut limits = Vec::new();
        for spec in self.store.specs().await? {
            let (ledger, _) = self.store.state(&spec.key).await?;
            limits.push(view(spec, ledger, None));
        }
        Ok(LimitList { limits })
    }
}

/// A limit as shown: leases past their expiry and waits past their deadline left out, the
/// buckets as of now. `only` shows one agent's leases (an agent sees its own).
fn view(spec: LimitSpec, mut ledger: Ledger, only: Option<&AgentId>) -> LimitView {
    let now = now_ms();
    ledger.advance(&spec, now);
    let leases = ledger
        .leases
        .iter()
        .filter(|l| only.is_none_or(|agent| l.agent == *agent))
        .map(|l| LeaseHeld {
            lease_id: l.id,
            agent_id: l.agent.clone(),
            tokens: l.tokens,
            expires_at: at(l.expires_ms),
        })
        .collect();
    LimitView {
        in_use: u32::try_from(ledger.leases.len()).unwrap_or(u32::MAX),
        waiting: u32::try_from(ledger.queue.len()).unwrap_or(u32::MAX),
        requests_available: ledger.requests.map(|b| b.level),
        tokens_available: ledger.tokens.map(|b| b.level),
        leases,
        spec,
    }
}
