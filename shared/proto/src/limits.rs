//! Provider limits held by the fabric for the fleet (docs/protocol.md §15): an operator
//! declares a limit per key (`openai:gpt-4.1`: concurrent requests, requests and tokens per
//! minute); an agent takes a **lease** before it calls its provider and gives it back with the
//! tokens it used. A lease whose holder dies or goes silent returns by itself at its expiry.
//!
//! Agent side: `agent.limits.<op>.<agent_id>` ([`LimitsOp`]). Operator side (the services'
//! account only): `_SB.ops.limits.<op>` ([`LimitsOpsOp`]).

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::ids::AgentId;

/// Longest limit key, in characters.
pub const LIMIT_KEY_MAX: usize = 128;
/// Longest an acquire may wait for its lease (`wait_ms`), in ms.
pub const ACQUIRE_WAIT_MAX_MS: u64 = 60_000;
/// Longest a lease may be held without renewal when its limit names none, in ms.
pub const HOLD_DEFAULT_MS: u64 = 120_000;
/// Longest hold any limit may allow (`max_hold_ms`), in ms: one hour.
pub const HOLD_MAX_MS: u64 = 3_600_000;
/// Most concurrent leases one limit may allow (every lease lives in one stored record).
pub const CONCURRENT_MAX: u32 = 1_000;
/// Most acquires that may wait on one key, all agents together.
pub const WAITING_MAX: usize = 1_024;
/// Most acquires one agent may have waiting on one key.
pub const WAITING_PER_AGENT_MAX: usize = 32;
/// Largest token count an acquire may estimate or a release report (10^9).
pub const TOKENS_MAX: u64 = 1_000_000_000;
/// Largest rate a limit may declare, per minute (10^9).
pub const PER_MINUTE_MAX: u64 = 1_000_000_000;
/// The burst of a limit's rates when it names none, in ms of each rate: a second's worth.
pub const BURST_DEFAULT_MS: u64 = 1_000;
/// Most limits an operator may declare.
pub const LIMITS_MAX: usize = 1_000;
/// Prefix of the subjects `limits` replicas send a contended key's batches on (services only;
/// docs/protocol.md §15, "How leases are kept"): `_SB.limits.keeper.<replica>`.
pub const KEEPER_PREFIX: &str = "_SB.limits.keeper";

/// An agent-facing limits request: `agent.limits.<op>.<agent_id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitsOp {
    /// Take a lease ([`AcquireRequest`] → [`Lease`]), waiting up to `wait_ms` for one.
    Acquire,
    /// Give a lease back ([`ReleaseRequest`] → [`Released`]).
    Release,
    /// Hold a lease longer ([`RenewRequest`] → [`Lease`]).
    Renew,
    /// Read a limit and what is in use ([`LimitQuery`] → [`LimitView`]).
    Get,
}

impl LimitsOp {
    /// Every op, for the endpoint table and the NATS exports.
    pub const ALL: [Self; 4] = [Self::Acquire, Self::Release, Self::Renew, Self::Get];

    /// The op's token after `agent.limits`.
    pub fn token(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Release => "release",
            Self::Renew => "renew",
            Self::Get => "get",
        }
    }

    /// `agent.limits.<op>`.
    pub fn prefix(self) -> String {
        format!("{}.{}", crate::subject::LIMITS_PREFIX, self.token())
    }

    /// `agent.limits.<op>.<agent>`.
    pub fn subject(self, agent: &AgentId) -> String {
        format!("{}.{agent}", self.prefix())
    }
}

/// An operator's limits request: `_SB.ops.limits.<op>` (the services' account only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitsOpsOp {
    /// Declare or change a limit ([`LimitSpec`] → [`LimitView`]); applies at once.
    Set,
    /// Remove a limit ([`LimitQuery`] → [`LimitView`] as it was).
    Delete,
    /// Every limit ([`LimitList`]).
    List,
}

impl LimitsOpsOp {
    /// `_SB.ops.limits.<op>`.
    pub fn subject(self) -> String {
        let op = match self {
            Self::Set => "set",
            Self::Delete => "delete",
            Self::List => "list",
        };
        crate::subject::ops("limits", op)
    }
}

/// A limit an operator declares for one key. Each bound it leaves out does not bind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    /// What is limited, e.g. `openai:gpt-4.1`: 1–128 characters of `[A-Za-z0-9._:/@+-]`.
    pub key: String,
    /// Most leases out at once (1–1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<u32>,
    /// Requests granted per minute, enforced continuously: a sixtieth of it each second,
    /// after a burst of `burst_ms` of it (1–10^9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// Tokens per minute, enforced like the requests; an acquire draws its estimate, its
    /// release corrects it by what was used (1–10^9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    /// Most leases one agent holds at once; default half of `concurrent` (at least 1), so no
    /// agent holds every lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_agent: Option<u32>,
    /// Longest a lease is held before it returns by itself, unless renewed, in ms (1000 to
    /// 3600000; default 120000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hold_ms: Option<u64>,
    /// How much of the rates may go at once after a quiet spell, in ms of each rate (1–60000;
    /// default 1000: a second's worth, at least one request). Below the provider's own burst,
    /// it leaves a margin for the time between a grant and the provider call's arrival.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_ms: Option<u64>,
}

impl LimitSpec {
    /// A limit of `concurrent` leases out at once on `key`, every other bound left out (set
    /// them with struct update syntax).
    pub fn concurrent(key: &str, concurrent: u32) -> Self {
        Self {
            key: key.to_owned(),
            concurrent: Some(concurrent),
            requests_per_minute: None,
            tokens_per_minute: None,
            per_agent: None,
            max_hold_ms: None,
            burst_ms: None,
        }
    }

    /// The burst of the rates, in ms of each rate.
    pub fn burst(&self) -> u64 {
        self.burst_ms.unwrap_or(BURST_DEFAULT_MS)
    }

    /// The hold a lease of this limit gets at most.
    pub fn max_hold(&self) -> u64 {
        self.max_hold_ms.unwrap_or(HOLD_DEFAULT_MS)
    }

    /// The most leases one agent may hold (`None`: no concurrency bound).
    pub fn agent_share(&self) -> Option<u32> {
        self.per_agent
            .or_else(|| self.concurrent.map(|c| c.div_ceil(2).max(1)))
    }

    /// Checks every bound; the error says which is wrong.
    pub fn validate(&self) -> Result<(), String> {
        check_key(&self.key)?;
        if let Some(c) = self.concurrent
            && !(1..=CONCURRENT_MAX).contains(&c)
        {
            return Err(format!("`concurrent` must be 1..={CONCURRENT_MAX}"));
        }
        for (name, value) in [
            ("requests_per_minute", self.requests_per_minute),
            ("tokens_per_minute", self.tokens_per_minute),
        ] {
            if let Some(v) = value
                && !(1..=PER_MINUTE_MAX).contains(&v)
            {
                return Err(format!("`{name}` must be 1..={PER_MINUTE_MAX}"));
            }
        }
        if let Some(p) = self.per_agent
            && !(1..=CONCURRENT_MAX).contains(&p)
        {
            return Err(format!("`per_agent` must be 1..={CONCURRENT_MAX}"));
        }
        if let Some(b) = self.burst_ms
            && !(1..=60_000).contains(&b)
        {
            return Err("`burst_ms` must be 1..=60000".to_owned());
        }
        if let Some(h) = self.max_hold_ms
            && !(1_000..=HOLD_MAX_MS).contains(&h)
        {
            return Err(format!("`max_hold_ms` must be 1000..={HOLD_MAX_MS}"));
        }
        if self.concurrent.is_none()
            && self.requests_per_minute.is_none()
            && self.tokens_per_minute.is_none()
        {
            return Err(
                "a limit binds nothing without `concurrent`, `requests_per_minute` or `tokens_per_minute`"
                    .to_owned(),
            );
        }
        Ok(())
    }
}

/// Checks a limit key: 1–[`LIMIT_KEY_MAX`] characters of `[A-Za-z0-9._:/@+-]`.
pub fn check_key(key: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "._:/@+-".contains(c);
    if key.is_empty() || key.len() > LIMIT_KEY_MAX || !key.chars().all(ok) {
        let shown: String = key.chars().take(40).collect();
        return Err(format!(
            "limit key `{}` is invalid: use 1-{LIMIT_KEY_MAX} characters of [A-Za-z0-9._:/@+-]",
            shown.escape_debug()
        ));
    }
    Ok(())
}

/// `agent.limits.acquire.<agent_id>`: take a lease on `key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// The limit's key.
    pub key: String,
    /// Tokens the provider call is expected to use (drawn from `tokens_per_minute`;
    /// 0–10^9, default 0).
    #[serde(default)]
    pub tokens: u64,
    /// How long to wait for a lease, in ms (0–60000, default 0: answer at once). A waiting
    /// acquire holds its place in a queue that is fair across agents.
    #[serde(default)]
    pub wait_ms: u64,
    /// How long the lease is held before it returns by itself, in ms (at most the limit's
    /// `max_hold_ms`, which is also the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
    /// The lease's id, chosen by the agent so a retried acquire gets the same lease (a fresh
    /// one when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<Uuid>,
}

/// A lease: what an acquire or a renew answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Lease {
    /// The lease's id (release and renew name it).
    pub lease_id: Uuid,
    /// The limit's key.
    pub key: String,
    /// The tokens drawn for it.
    pub tokens: u64,
    /// When it returns by itself unless released or renewed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "String")]
    pub expires_at: OffsetDateTime,
    /// How long the acquire waited for it, in ms.
    pub waited_ms: u64,
}

/// `agent.limits.release.<agent_id>`: give a lease back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The limit's key.
    pub key: String,
    /// The lease (or a waiting acquire's `lease_id`, which withdraws it).
    pub lease_id: Uuid,
    /// The tokens the call used (0–10^9; default: the estimate). The limit's token bucket
    /// is corrected by the difference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_used: Option<u64>,
}

/// What a release answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Released {
    /// The lease.
    pub lease_id: Uuid,
    /// Whether it was still held (false: it had expired and returned by itself already, or
    /// was released before — a release is safe to repeat).
    pub released: bool,
}

/// `agent.limits.renew.<agent_id>`: hold a lease longer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    /// The limit's key.
    pub key: String,
    /// The lease.
    pub lease_id: Uuid,
    /// The new hold from now, in ms (at most the limit's `max_hold_ms`, the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
}

/// `agent.limits.get.<agent_id>` and `_SB.ops.limits.delete`: one limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitQuery {
    /// The limit's key.
    pub key: String,
}

/// A limit and what is in use now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LimitView {
    /// The limit as declared.
    pub spec: LimitSpec,
    /// Leases out.
    pub in_use: u32,
    /// Acquires waiting.
    pub waiting: u32,
    /// Requests that could be granted now by the rate (absent without `requests_per_minute`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_available: Option<f64>,
    /// Tokens that could be drawn now (absent without `tokens_per_minute`; negative while a
    /// call that used more than its estimate is paid back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_available: Option<f64>,
    /// The caller's own leases on it (operators: every lease).
    #[serde(default)]
    pub leases: Vec<LeaseHeld>,
}

/// One lease out, as [`LimitView`] shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LeaseHeld {
    /// The lease.
    pub lease_id: Uuid,
    /// Its holder.
    pub agent_id: AgentId,
    /// The tokens drawn for it.
    pub tokens: u64,
    /// When it returns by itself (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "String")]
    pub expires_at: OffsetDateTime,
}

/// `_SB.ops.limits.list`: every limit declared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LimitList {
    /// The limits, by key.
    pub limits: Vec<LimitView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(key: &str) -> LimitSpec {
        LimitSpec::concurrent(key, 10)
    }

    #[test]
    fn keys_are_checked_and_bounds_validated() {
        assert!(spec("openai:gpt-4.1").validate().is_ok());
        assert!(spec("anthropic/claude@eu+batch").validate().is_ok());
        for bad in ["", "a b", "a*", "a>", "é", &"k".repeat(LIMIT_KEY_MAX + 1)] {
            assert!(spec(bad).validate().is_err(), "{bad:?}");
        }
        let none = LimitSpec {
            concurrent: None,
            ..spec("k")
        };
        assert!(none.validate().is_err());
        let huge = LimitSpec {
            concurrent: Some(CONCURRENT_MAX + 1),
            ..spec("k")
        };
        assert!(huge.validate().is_err());
        assert_eq!(spec("k").agent_share(), Some(5));
        let one = LimitSpec {
            concurrent: Some(1),
            ..spec("k")
        };
        assert_eq!(one.agent_share(), Some(1));
    }
}
