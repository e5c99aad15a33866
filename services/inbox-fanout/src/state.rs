//! The fan-out's local view of the registry: agent cards and live goals, fed by KV watches on
//! `agent_registry` and `agent_goals`, so a send costs no registry round trip.
//!
//! Freshness: the view is eventually consistent with KV, so on a *miss* (target unknown, or
//! known with no live goals) the send reads KV directly — a brand-new agent or its first goal
//! is visible to the very next send after `goal.open` returns. What a read finds is merged
//! into the view only when it is newer than everything the watch has applied, so a read can
//! never resurrect a key the watch already saw deleted.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use switchboard_proto::{AgentCard, AgentId, AgentRecord, GoalId};
use switchboard_runtime::CancellationToken;
use switchboard_runtime::kv::snapshot;

use crate::error::FanoutError;

/// What the fan-out knows about one peer.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    /// Its card.
    pub card: AgentCard,
    /// Its live goals.
    pub goals: Vec<GoalId>,
}

#[derive(Debug, Default)]
struct Inner {
    /// agent id → (card, revision).
    cards: HashMap<String, (AgentCard, u64)>,
    /// agent id → goal → revision.
    goals: HashMap<String, BTreeMap<GoalId, u64>>,
    /// Highest revision each watch has applied (registry, goals).
    cards_seen: u64,
    goals_seen: u64,
}

impl Inner {
    fn peer(&self, agent: &str) -> Option<Peer> {
        let (card, _) = self.cards.get(agent)?;
        Some(Peer {
            card: card.clone(),
            goals: self
                .goals
                .get(agent)
                .map(|goals| goals.keys().copied().collect())
                .unwrap_or_default(),
        })
    }
}

/// The view; cheap to clone.
#[derive(Debug, Clone)]
pub struct PeerView {
    js: jetstream::Context,
    agents: kv::Store,
    goals: kv::Store,
    inner: Arc<RwLock<Inner>>,
}

fn split_goal_key(key: &str) -> Option<(&str, GoalId)> {
    let (agent, goal) = key.split_once('.')?;
    Some((agent, GoalId::parse(goal).ok()?))
}

fn card_of(value: &[u8]) -> Option<AgentCard> {
    serde_json::from_slice::<AgentRecord>(value)
        .map(|record| record.card)
        .ok()
}

impl PeerView {
    /// An empty view over the two buckets; [`PeerView::watch`] fills it.
    pub fn new(js: jetstream::Context, agents: kv::Store, goals: kv::Store) -> Self {
        Self {
            js,
            agents,
            goals,
            inner: Arc::default(),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters (every update is a single insert/remove), so recover from poisoning.
        self.inner
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn apply_card(&self, entry: &kv::Entry) {
        let mut inner = self.write();
        inner.cards_seen = inner.cards_seen.max(entry.revision);
        match entry.operation {
            kv::Operation::Put => match card_of(&entry.value) {
                Some(card) => {
                    inner
                        .cards
                        .insert(entry.key.clone(), (card, entry.revision));
                }
                None => {
                    tracing::warn!(key = %entry.key, "undecodable agent record in the registry")
                }
            },
            kv::Operation::Delete | kv::Operation::Purge => {
                inner.cards.remove(&entry.key);
            }
        }
    }

    fn apply_goal(&self, entry: &kv::Entry) {
        let Some((agent, goal)) = split_goal_key(&entry.key) else {
            return;
        };
        let mut inner = self.write();
        inner.goals_seen = inner.goals_seen.max(entry.revision);
        match entry.operation {
            kv::Operation::Put => {
                inner
                    .goals
                    .entry(agent.to_owned())
                    .or_default()
                    .insert(goal, entry.revision);
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                if let Some(goals) = inner.goals.get_mut(agent) {
                    goals.remove(&goal);
                    if goals.is_empty() {
                        inner.goals.remove(agent);
                    }
                }
            }
        }
    }

    /// Keeps the view in step with both buckets until `shutdown`; a broken watch is
    /// re-established after a short pause (it replays the latest value of every key).
    pub async fn watch(self, shutdown: CancellationToken) {
        let cards = self.clone().watch_bucket(true, shutdown.clone());
        let goals = self.watch_bucket(false, shutdown);
        tokio::join!(cards, goals);
    }

    async fn watch_bucket(self, cards: bool, shutdown: CancellationToken) {
        let store = if cards { &self.agents } else { &self.goals };
        loop {
            match store.watch_with_history(">").await {
                Ok(mut watch) => loop {
                    let next = tokio::select! {
                        next = watch.next() => next,
                        () = shutdown.cancelled() => return,
                    };
                    match next {
                        Some(Ok(entry)) if cards => self.apply_card(&entry),
                        Some(Ok(entry)) => self.apply_goal(&entry),
                        Some(Err(err)) => {
                            tracing::warn!(bucket = %store.name, error = %err, "registry watch error");
                            break;
                        }
                        None => break,
                    }
                },
                Err(err) => {
                    tracing::warn!(bucket = %store.name, error = %err, "cannot watch the registry")
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// An agent's card (the sender's ACL rules): from the view, read through on a miss.
    pub async fn card(&self, agent: &AgentId) -> Result<Option<AgentCard>, FanoutError> {
        if let Some((card, _)) = self.read().cards.get(agent.as_str()) {
            return Ok(Some(card.clone()));
        }
        Ok(self.read_through(agent).await?.map(|peer| peer.card))
    }

    /// The peer as the view knows it, falling back to KV when the view has no card or no
    /// live goal for it. `None` when the agent is not registered.
    pub async fn resolve(&self, agent: &AgentId) -> Result<Option<Peer>, FanoutError> {
        if let Some(peer) = self.read().peer(agent.as_str())
            && !peer.goals.is_empty()
        {
            return Ok(Some(peer));
        }
        self.read_through(agent).await
    }

    /// Reads one agent's card and goals from KV and merges what is newer than the watches.
    async fn read_through(&self, agent: &AgentId) -> Result<Option<Peer>, FanoutError> {
        let entry = self
            .agents
            .entry(agent.as_str())
            .await
            .map_err(|err| FanoutError::store("reading agent record", err))?
            .filter(|entry| entry.operation == kv::Operation::Put);
        let Some(entry) = entry else {
            return Ok(None);
        };
        let Some(card) = card_of(&entry.value) else {
            return Err(FanoutError::CorruptRecord(entry.key));
        };
        let goal_entries = snapshot(&self.js, &self.goals, &format!("{agent}.*"))
            .await
            .map_err(|err| FanoutError::store("listing goals", err))?;
        let mut goals = Vec::new();
        {
            let mut inner = self.write();
            if entry.revision > inner.cards_seen {
                inner
                    .cards
                    .insert(entry.key.clone(), (card.clone(), entry.revision));
            }
            let goals_seen = inner.goals_seen;
            for goal_entry in &goal_entries {
                if let Some((_, goal)) = split_goal_key(&goal_entry.key) {
                    goals.push(goal);
                    if goal_entry.revision > goals_seen {
                        inner
                            .goals
                            .entry(agent.to_string())
                            .or_default()
                            .insert(goal, goal_entry.revision);
                    }
                }
            }
        }
        Ok(Some(Peer { card, goals }))
    }

    /// Every registered agent with its live goals, read fresh from KV (broadcast uses this:
    /// it is rare and must not miss a peer that just joined).
    pub async fn all_fresh(&self) -> Result<Vec<Peer>, FanoutError> {
        let records = snapshot(&self.js, &self.agents, ">")
            .await
            .map_err(|err| FanoutError::store("listing agents", err))?;
        let goal_entries = snapshot(&self.js, &self.goals, ">")
            .await
            .map_err(|err| FanoutError::store("listing goals", err))?;
        let mut goals: HashMap<&str, Vec<GoalId>> = HashMap::new();
        for entry in &goal_entries {
            if let Some((agent, goal)) = split_goal_key(&entry.key) {
                goals.entry(agent).or_default().push(goal);
            }
        }
        let mut peers: Vec<Peer> = records
            .iter()
            .filter_map(|entry| {
                let Some(card) = card_of(&entry.value) else {
                    tracing::warn!(key = %entry.key, "undecodable agent record skipped by broadcast");
                    return None;
                };
                let goals = goals.get(entry.key.as_str()).cloned().unwrap_or_default();
                Some(Peer { card, goals })
            })
            .collect();
        peers.sort_by(|a, b| a.card.agent_id.cmp(&b.card.agent_id));
        Ok(peers)
    }

    /// How many agents and goals the view holds (for logs and tests).
    pub fn size(&self) -> (usize, usize) {
        let inner = self.read();
        (
            inner.cards.len(),
            inner.goals.values().map(BTreeMap::len).sum(),
        )
    }
}
