//! The state of one limit key and the rules that change it (docs/protocol.md §15), pure: no
//! I/O, no clock. A keeper applies a batch of operations to the state it read, settles the
//! queue, and writes the result by compare-and-set; on a lost race it reads again and applies
//! the same batch to the newer state, so every replica's outcome follows from what is stored.
//!
//! Invariants, after every [`Ledger::apply`]: no more leases than `concurrent`; no agent holds
//! more than its share; no grant while the rate buckets are empty; waiting acquires are
//! granted in a fair order (the agent holding the fewest leases first, then the oldest).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use switchboard_proto::AgentId;
use switchboard_proto::limits::{LimitSpec, WAITING_MAX, WAITING_PER_AGENT_MAX};
use uuid::Uuid;

/// A lease out (stored with one-letter field names: a key's state holds up to 1,000 leases
/// and 1,024 waiting acquires, written on every change).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Held {
    /// Its id.
    #[serde(rename = "i")]
    pub id: Uuid,
    /// Its holder.
    #[serde(rename = "a")]
    pub agent: AgentId,
    /// Tokens drawn for it.
    #[serde(rename = "t")]
    pub tokens: u64,
    /// When it returns by itself (ms since the Unix epoch).
    #[serde(rename = "e")]
    pub expires_ms: u64,
    /// How long its acquire waited, in ms.
    #[serde(rename = "w")]
    pub waited_ms: u64,
}

/// An acquire waiting for a lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ticket {
    /// The lease id it will become.
    #[serde(rename = "i")]
    pub id: Uuid,
    /// Who waits.
    #[serde(rename = "a")]
    pub agent: AgentId,
    /// Tokens it will draw.
    #[serde(rename = "t")]
    pub tokens: u64,
    /// The hold its lease gets, in ms.
    #[serde(rename = "h")]
    pub hold_ms: u64,
    /// When it started waiting (ms since the epoch).
    #[serde(rename = "q")]
    pub queued_ms: u64,
    /// When it stops waiting (ms since the epoch).
    #[serde(rename = "d")]
    pub deadline_ms: u64,
}

/// A rate bucket: how much may be drawn now, as of `at_ms`. It refills at a sixtieth of the
/// per-minute rate each second, up to the limit's burst (`burst_ms` of the rate; at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Available now (negative: paying back a call that used more than its estimate).
    pub level: f64,
    /// When `level` was computed (ms since the epoch).
    pub at_ms: u64,
}

impl Bucket {
    fn capacity(per_minute: u64, burst_ms: u64) -> f64 {
        (per_minute as f64 * burst_ms as f64 / 60_000.0).max(1.0)
    }

    fn full(per_minute: u64, burst_ms: u64, now: u64) -> Self {
        Self {
            level: Self::capacity(per_minute, burst_ms),
            at_ms: now,
        }
    }

    fn refill(&mut self, per_minute: u64, burst_ms: u64, now: u64) {
        let elapsed = now.saturating_sub(self.at_ms) as f64;
        let capacity = Self::capacity(per_minute, burst_ms);
        self.level = (self.level + elapsed * per_minute as f64 / 60_000.0).min(capacity);
        self.at_ms = self.at_ms.max(now);
    }

    /// Ms until `need` (capped at the capacity) is available.
    fn wait_for(&self, per_minute: u64, burst_ms: u64, need: f64) -> u64 {
        let need = need.min(Self::capacity(per_minute, burst_ms));
        if self.level >= need {
            return 0;
        }
        ((need - self.level) * 60_000.0 / per_minute as f64).ceil() as u64
    }
}

/// The stored state of one key (`state.<h>` in `agent_limits`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// Leases out.
    #[serde(default)]
    pub leases: Vec<Held>,
    /// Acquires waiting, in arrival order.
    #[serde(default)]
    pub queue: Vec<Ticket>,
    /// The requests-per-minute bucket (absent until the limit has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<Bucket>,
    /// The tokens-per-minute bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Bucket>,
    /// The replica that wrote this state: where the other replicas send their requests for
    /// the key while they find it contended (see `keeper.rs`).
    #[serde(rename = "by", default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
}

/// One change a keeper applies (sent between replicas when one forwards a key's requests to
/// its writer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum Op {
    /// Take a lease; wait until `deadline_ms` (no wait when it is now).
    Acquire {
        /// The lease id.
        id: Uuid,
        /// Who asks.
        agent: AgentId,
        /// Tokens estimated.
        tokens: u64,
        /// The hold asked for, in ms (already bounded by the spec).
        hold_ms: u64,
        /// When the acquire arrived (ms since the epoch).
        at_ms: u64,
        /// When it stops waiting.
        deadline_ms: u64,
    },
    /// Give a lease back (or withdraw a waiting acquire).
    Release {
        /// The lease id.
        id: Uuid,
        /// Who asks.
        agent: AgentId,
        /// Tokens used (`None`: the estimate).
        used: Option<u64>,
    },
    /// Hold a lease longer.
    Renew {
        /// The lease id.
        id: Uuid,
        /// Who asks.
        agent: AgentId,
        /// The new hold from now, in ms (bounded by the spec).
        hold_ms: u64,
    },
    /// A waiting acquire's holder gives up at its deadline: withdrawn unless granted.
    Withdraw {
        /// The lease id.
        id: Uuid,
        /// Who waits.
        agent: AgentId,
    },
}

/// What an op came to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The lease (granted now or before).
    Granted(Held),
    /// Waiting in the queue.
    Waiting,
    /// Not granted: why, and when trying again may succeed (ms from now).
    Limited {
        /// What binds, in words.
        why: String,
        /// A hint for the retry.
        retry_after_ms: u64,
    },
    /// A release: whether the lease was still held.
    Released(bool),
    /// A renew of a lease the agent does not hold (expired, released, or never its own).
    Gone,
}

impl Ledger {
    /// Applies `ops` at `now` under `spec`, settles the queue, and says what each op came to.
    pub fn apply(&mut self, spec: &LimitSpec, ops: &[Op], now: u64) -> Vec<Outcome> {
        self.advance(spec, now);
        let mut outcomes: Vec<Outcome> = ops.iter().map(|op| self.one(spec, op, now)).collect();
        self.settle(spec, now);
        for (op, outcome) in ops.iter().zip(outcomes.iter_mut()) {
            if let (Op::Acquire { id, .. } | Op::Withdraw { id, .. }, Outcome::Waiting) =
                (op, &*outcome)
            {
                *outcome = self.after_settle(spec, op, *id, now);
            }
        }
        outcomes
    }

    /// Expired leases and waits pruned, buckets refilled to `now`, buckets made or dropped to
    /// follow the spec.
    pub fn advance(&mut self, spec: &LimitSpec, now: u64) {
        self.leases.retain(|lease| lease.expires_ms > now);
        self.queue.retain(|ticket| ticket.deadline_ms > now);
        self.requests = spec.requests_per_minute.map(|rpm| {
            let mut bucket = self
                .requests
                .unwrap_or_else(|| Bucket::full(rpm, spec.burst(), now));
            bucket.refill(rpm, spec.burst(), now);
            bucket
        });
        self.tokens = spec.tokens_per_minute.map(|tpm| {
            let mut bucket = self
                .tokens
                .unwrap_or_else(|| Bucket::full(tpm, spec.burst(), now));
            bucket.refill(tpm, spec.burst(), now);
            bucket
        });
    }

    fn one(&mut self, spec: &LimitSpec, op: &Op, now: u64) -> Outcome {
        match op {
            Op::Acquire {
                id,
                agent,
                tokens,
                hold_ms,
                at_ms,
                deadline_ms,
            } => {
                if let Some(lease) = self.leases.iter().find(|l| l.id == *id) {
                    return match lease.agent == *agent {
                        true => Outcome::Granted(lease.clone()),
                        false => Outcome::Gone,
                    };
                }
                if let Some(ticket) = self.queue.iter().find(|t| t.id == *id) {
                    return match ticket.agent == *agent {
                        true => Outcome::Waiting,
                        false => Outcome::Gone,
                    };
                }
                // Grants what fits first, so the caps count only acquires that truly wait (a
                // batch of acquires that all fit must not trip them).
                self.settle(spec, now);
                let mine = self.queue.iter().filter(|t| t.agent == *agent).count();
                if mine >= WAITING_PER_AGENT_MAX || self.queue.len() >= WAITING_MAX {
                    return Outcome::Limited {
                        why: format!(
                            "too many acquires wait on `{}` ({mine} of yours, {} in all; at most {WAITING_PER_AGENT_MAX} per agent and {WAITING_MAX} in all)",
                            spec.key,
                            self.queue.len()
                        ),
                        retry_after_ms: self.next_change(spec, now).unwrap_or(1_000),
                    };
                }
                self.queue.push(Ticket {
                    id: *id,
                    agent: agent.clone(),
                    tokens: *tokens,
                    hold_ms: *hold_ms,
                    queued_ms: *at_ms,
                    deadline_ms: (*deadline_ms).max(now + 1),
                });
                Outcome::Waiting
            }
            Op::Release { id, agent, used } => {
                if let Some(at) = self.leases.iter().position(|l| l.id == *id) {
                    if self.leases[at].agent != *agent {
                        return Outcome::Released(false);
                    }
                    let lease = self.leases.remove(at);
                    if let (Some(bucket), Some(used)) = (self.tokens.as_mut(), used) {
                        bucket.level += lease.tokens as f64 - *used as f64;
                        if let Some(tpm) = spec.tokens_per_minute {
                            bucket.level = bucket.level.min(Bucket::capacity(tpm, spec.burst()));
                        }
                    }
                    return Outcome::Released(true);
                }
                self.queue.retain(|t| !(t.id == *id && t.agent == *agent));
                Outcome::Released(false)
            }
            Op::Renew { id, agent, hold_ms } => {
                match self
                    .leases
                    .iter_mut()
                    .find(|l| l.id == *id && l.agent == *agent)
                {
                    Some(lease) => {
                        lease.expires_ms = now + hold_ms;
                        Outcome::Granted(lease.clone())
                    }
                    None => Outcome::Gone,
                }
            }
            Op::Withdraw { id, agent } => {
                match self
                    .leases
                    .iter()
                    .find(|l| l.id == *id && l.agent == *agent)
                {
                    Some(lease) => Outcome::Granted(lease.clone()),
                    None => Outcome::Waiting,
                }
            }
        }
    }

    /// An acquire or withdraw that was waiting before the settle: granted, still waiting, or
    /// (no wait left) refused and taken out of the queue.
    fn after_settle(&mut self, spec: &LimitSpec, op: &Op, id: Uuid, now: u64) -> Outcome {
        let agent = match op {
            Op::Acquire { agent, .. } | Op::Withdraw { agent, .. } => agent.clone(),
            Op::Release { agent, .. } | Op::Renew { agent, .. } => agent.clone(),
        };
        if let Some(lease) = self.leases.iter().find(|l| l.id == id && l.agent == agent) {
            return Outcome::Granted(lease.clone());
        }
        // A copy of an acquire (sent again by its client while the first waits) never ends the
        // wait it copies: the stored ticket's deadline decides; the first, its own.
        let keeps_waiting = match op {
            Op::Acquire {
                deadline_ms, at_ms, ..
            } => self.queue.iter().any(|t| {
                let created_here =
                    t.queued_ms == *at_ms && t.deadline_ms == (*deadline_ms).max(now + 1);
                t.id == id && t.deadline_ms > now && (!created_here || *deadline_ms > now)
            }),
            _ => false,
        };
        if keeps_waiting {
            return Outcome::Waiting;
        }
        let why = self.what_binds(spec, op);
        // Only the op's own agent's wait ends (a withdraw naming another's id ends nothing).
        self.queue.retain(|t| !(t.id == id && t.agent == agent));
        Outcome::Limited {
            why,
            retry_after_ms: self.next_change(spec, now).unwrap_or(1_000),
        }
    }

    /// Grants waiting acquires while the limit allows, in the fair order: among the agents
    /// below their share, the one holding the fewest leases, then the oldest acquire. A head
    /// that the rate cannot serve yet holds the others back (no starvation of large ones).
    fn settle(&mut self, spec: &LimitSpec, now: u64) {
        // Called for every acquire of a batch: when every lease is out (the common case under
        // load) nothing can be granted, and the agents' counts are not worth building.
        if self.queue.is_empty()
            || spec
                .concurrent
                .is_some_and(|c| self.leases.len() >= c as usize)
        {
            return;
        }
        let mut held: HashMap<AgentId, u32> = HashMap::new();
        for lease in &self.leases {
            *held.entry(lease.agent.clone()).or_default() += 1;
        }
        let share = spec.agent_share();
        loop {
            let best = self
                .queue
                .iter()
                .enumerate()
                .filter(|(_, t)| {
                    share.is_none_or(|share| held.get(&t.agent).copied().unwrap_or(0) < share)
                })
                .min_by_key(|(at, t)| (held.get(&t.agent).copied().unwrap_or(0), t.queued_ms, *at))
                .map(|(at, _)| at);
            let Some(at) = best else { return };
            if !self.fits(spec, self.queue[at].tokens) {
                return;
            }
            let ticket = self.queue.remove(at);
            if let Some(bucket) = self.requests.as_mut() {
                bucket.level -= 1.0;
            }
            if let Some(bucket) = self.tokens.as_mut() {
                bucket.level -= ticket.tokens as f64;
            }
            *held.entry(ticket.agent.clone()).or_default() += 1;
            self.leases.push(Held {
                id: ticket.id,
                agent: ticket.agent,
                tokens: ticket.tokens,
                expires_ms: now + ticket.hold_ms,
                waited_ms: now.saturating_sub(ticket.queued_ms),
            });
        }
    }

    /// Whether one more lease drawing `tokens` fits now (a draw larger than the token bucket
    /// can ever hold waits for a full bucket, then leaves it in debt).
    fn fits(&self, spec: &LimitSpec, tokens: u64) -> bool {
        let concurrent = spec
            .concurrent
            .is_none_or(|c| self.leases.len() < c as usize);
        let requests = self.requests.is_none_or(|b| b.level >= 1.0 - 1e-9);
        let tokens_ok = match (self.tokens, spec.tokens_per_minute) {
            (Some(bucket), Some(tpm)) => {
                bucket.level >= (tokens as f64).min(Bucket::capacity(tpm, spec.burst())) - 1e-9
            }
            _ => true,
        };
        concurrent && requests && tokens_ok
    }

    /// What keeps `op`'s acquire from a lease, in words.
    fn what_binds(&self, spec: &LimitSpec, op: &Op) -> String {
        let (agent, tokens) = match op {
            Op::Acquire { agent, tokens, .. } => (agent, *tokens),
            Op::Withdraw { agent, .. } => (agent, 0),
            _ => return format!("no lease on `{}`", spec.key),
        };
        let mine = self.leases.iter().filter(|l| l.agent == *agent).count();
        if let Some(share) = spec.agent_share()
            && mine >= share as usize
        {
            return format!(
                "`{agent}` holds {mine} leases on `{}`, its share (per_agent {share})",
                spec.key
            );
        }
        if let Some(c) = spec.concurrent
            && self.leases.len() >= c as usize
        {
            return format!("`{}` has {c} of {c} leases out (concurrent)", spec.key);
        }
        if self.requests.is_some_and(|b| b.level < 1.0) {
            return format!("`{}` is at its requests_per_minute", spec.key);
        }
        if !self.fits(spec, tokens) {
            return format!("`{}` is at its tokens_per_minute", spec.key);
        }
        format!(
            "acquires of agents holding fewer leases wait ahead on `{}`",
            spec.key
        )
    }

    /// Ms from `now` until the state can change by time alone (a lease expiring, a bucket
    /// refilling for the queue's head, a wait ending); `None` when nothing waits.
    pub fn next_change(&self, spec: &LimitSpec, now: u64) -> Option<u64> {
        let head_tokens = self.queue.iter().map(|t| t.tokens).min().unwrap_or(0);
        let mut soonest: Vec<u64> = Vec::new();
        soonest.extend(self.leases.iter().map(|l| l.expires_ms.saturating_sub(now)));
        soonest.extend(self.queue.iter().map(|t| t.deadline_ms.saturating_sub(now)));
        if let (Some(b), Some(rpm)) = (self.requests, spec.requests_per_minute) {
            soonest.push(b.wait_for(rpm, spec.burst(), 1.0));
        }
        if let (Some(b), Some(tpm)) = (self.tokens, spec.tokens_per_minute) {
            soonest.push(b.wait_for(tpm, spec.burst(), head_tokens as f64));
        }
        soonest.into_iter().filter(|ms| *ms > 0).min()
    }
}

#[cfg(test)]
mod tests;
