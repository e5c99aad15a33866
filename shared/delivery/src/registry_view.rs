//! A service's local view of the registry: every agent record and live goal, fed by KV
//! watches on `agent_registry` and `agent_goals`, so resolving a peer or listing peers costs
//! no registry round trip. The fan-out resolves send targets with it; the directory answers
//! list_peers and finds silent agents with it.
//!
//! Freshness: the view is eventually consistent with KV. Two ways to read it consistently:
//! - [`RegistryView::resolve`] and [`RegistryView::record`] read one agent through to KV on a
//!   miss, so a brand-new agent or its first goal is visible to the very next request after
//!   `register`/`goal.open` returns. What a read finds is merged only when it is newer than
//!   everything the watch has applied, so a read can never resurrect a key the watch already
//!   saw deleted.
//! - [`RegistryView::caught_up`] asks both buckets' streams for their last sequence (one
//!   round trip each, in parallel) and waits until the watches have applied that far: after
//!   it, the view holds every write acknowledged before the call, whichever replica made it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use switchboard_proto::{AgentCard, AgentId, AgentRecord, GoalId};
use tokio_util::sync::CancellationToken;

use switchboard_request::kv::snapshot;
use switchboard_runtime::store::StoreError;

/// What the view knows about one agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    /// Its record (card, status, heartbeats).
    pub record: AgentRecord,
    /// The record's KV revision (for compare-and-set).
    pub revision: u64,
    /// Its live goals, sorted by id: a send reaches each one, and none means unreachable.
    pub goals: Vec<GoalId>,
}

impl Peer {
    /// Its card as last registered: the ACL globs, `max_concurrent_tasks` and description.
    pub fn card(&self) -> &AgentCard {
        &self.record.card
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// agent id → (record, revision), ordered by agent id (list_peers pages in this order).
    records: BTreeMap<String, (AgentRecord, u64)>,
    /// agent id → goal → revision.
    goals: HashMap<String, BTreeMap<GoalId, u64>>,
    /// Highest revision (stream sequence) each watch has applied: registry, goals.
    records_seen: u64,
    goals_seen: u64,
}

impl Inner {
    fn goals_of(&self, agent: &str) -> Vec<GoalId> {
        self.goals
            .get(agent)
            .map(|goals| goals.keys().copied().collect())
            .unwrap_or_default()
    }

    fn peer(&self, agent: &str) -> Option<Peer> {
        let (record, revision) = self.records.get(agent)?;
        Some(Peer {
            record: record.clone(),
            revision: *revision,
            goals: self.goals_of(agent),
        })
    }
}

/// Read access to the whole view at one moment (see [`RegistryView::with`]).
#[derive(Debug)]
pub struct Snapshot<'a> {
    inner: &'a Inner,
}

impl Snapshot<'_> {
    /// Every agent record with its revision, in agent-id order, starting after `after`.
    pub fn records_after<'s>(
        &'s self,
        after: Option<&str>,
    ) -> impl Iterator<Item = (&'s AgentRecord, u64)> + 's {
        let range = match after {
            Some(after) => self
                .inner
                .records
                .range::<str, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded)),
            None => self.inner.records.range::<str, _>(..),
        };
        range.map(|(_, (record, revision))| (record, *revision))
    }

    /// One agent's record as the view holds it (no read-through to KV on a miss).
    pub fn record(&self, agent: &str) -> Option<&AgentRecord> {
        self.inner.records.get(agent).map(|(record, _)| record)
    }

    /// Whether the agent has at least one live goal.
    pub fn has_goal(&self, agent: &str) -> bool {
        self.inner
            .goals
            .get(agent)
            .is_some_and(|goals| !goals.is_empty())
    }

    /// How many agents are registered.
    pub fn len(&self) -> usize {
        self.inner.records.len()
    }

    /// Whether no agent is registered.
    pub fn is_empty(&self) -> bool {
        self.inner.records.is_empty()
    }
}

/// The view; cheap to clone.
#[derive(Debug, Clone)]
pub struct RegistryView {
    js: jetstream::Context,
    agents: kv::Store,
    goals: kv::Store,
    inner: Arc<RwLock<Inner>>,
    /// Bumped after every applied watch entry (wakes [`RegistryView::caught_up`]).
    applied: Arc<tokio::sync::watch::Sender<()>>,
}

fn split_goal_key(key: &str) -> Option<(&str, GoalId)> {
    let (agent, goal) = key.split_once('.')?;
    Some((agent, GoalId::parse(goal).ok()?))
}

fn record_of(value: &[u8]) -> Option<AgentRecord> {
    serde_json::from_slice::<AgentRecord>(value).ok()
}

impl RegistryView {
    /// An empty view over the two buckets; [`RegistryView::watch`] fills it.
    pub fn new(js: jetstream::Context, agents: kv::Store, goals: kv::Store) -> Self {
        Self {
            js,
            agents,
            goals,
            inner: Arc::default(),
            applied: Arc::new(tokio::sync::watch::channel(()).0),
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

    fn apply_record(&self, entry: &kv::Entry) {
        {
            let mut inner = self.write();
            inner.records_seen = inner.records_seen.max(entry.revision);
            match entry.operation {
                kv::Operation::Put => match record_of(&entry.value) {
                    Some(record) => {
                        inner
                            .records
                            .insert(entry.key.clone(), (record, entry.revision));
                    }
                    None => {
                        tracing::warn!(key = %entry.key, "undecodable agent record in the registry")
                    }
                },
                kv::Operation::Delete | kv::Operation::Purge => {
                    inner.records.remove(&entry.key);
                }
            }
        }
        self.applied.send_replace(());
    }

    fn apply_goal(&self, entry: &kv::Entry) {
        {
            let mut inner = self.write();
            inner.goals_seen = inner.goals_seen.max(entry.revision);
            if let Some((agent, goal)) = split_goal_key(&entry.key) {
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
        }
        self.applied.send_replace(());
    }

    /// Keeps the view in step with both buckets until `shutdown`; a broken watch is
    /// re-established after a short pause (it replays the latest value of every key).
    pub async fn watch(self, shutdown: CancellationToken) {
        let records = self.clone().watch_bucket(true, shutdown.clone());
        let goals = self.watch_bucket(false, shutdown);
        tokio::join!(records, goals);
    }

    async fn watch_bucket(self, records: bool, shutdown: CancellationToken) {
        let store = if records { &self.agents } else { &self.goals };
        loop {
            match store.watch_with_history(">").await {
                Ok(mut watch) => loop {
                    let next = tokio::select! {
                        next = watch.next() => next,
                        () = shutdown.cancelled() => return,
                    };
                    match next {
                        Some(Ok(entry)) if records => self.apply_record(&entry),
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

    /// Waits (at most `within`) until the view holds every registry and goal write the
    /// server had stored when this was called. `Ok(false)` when the watches did not get there
    /// in time (the caller should read KV instead).
    pub async fn caught_up(&self, within: Duration) -> Result<bool, StoreError> {
        let last = |store: &kv::Store| {
            let stream = store.stream.clone();
            async move {
                let info = stream
                    .get_info()
                    .await
                    .map_err(|err| StoreError::store("reading the registry's position", err))?;
                Ok::<u64, StoreError>(info.state.last_sequence)
            }
        };
        let (records, goals) = tokio::try_join!(last(&self.agents), last(&self.goals))?;
        let mut applied = self.applied.subscribe();
        let wait = async {
            loop {
                {
                    let inner = self.read();
                    if inner.records_seen >= records && inner.goals_seen >= goals {
                        return;
                    }
                }
                if applied.changed().await.is_err() {
                    // The view is gone; nothing will catch up.
                    std::future::pending::<()>().await;
                }
            }
        };
        Ok(tokio::time::timeout(within, wait).await.is_ok())
    }

    /// Runs `f` over the whole view at one moment (under a read lock: keep `f` short and
    /// synchronous).
    pub fn with<R>(&self, f: impl FnOnce(&Snapshot<'_>) -> R) -> R {
        let inner = self.read();
        f(&Snapshot { inner: &inner })
    }

    /// The agent as the view has it, without reading KV.
    pub fn cached(&self, agent: &str) -> Option<Peer> {
        self.read().peer(agent)
    }

    /// An agent's record: from the view, read through to KV on a miss.
    pub async fn record(&self, agent: &AgentId) -> Result<Option<AgentRecord>, StoreError> {
        if let Some((record, _)) = self.read().records.get(agent.as_str()) {
            return Ok(Some(record.clone()));
        }
        Ok(self.read_through(agent).await?.map(|peer| peer.record))
    }

    /// An agent's card (a sender's ACL rules): from the view, read through on a miss.
    pub async fn card(&self, agent: &AgentId) -> Result<Option<AgentCard>, StoreError> {
        if let Some((record, _)) = self.read().records.get(agent.as_str()) {
            return Ok(Some(record.card.clone()));
        }
        Ok(self.read_through(agent).await?.map(|peer| peer.record.card))
    }

    /// An agent's card as the registry's stream leader has it now, not as the view has it: for
    /// a check that must see a change its caller was already told of (an accept re-checks
    /// `allow_from` after the card's owner re-registered; the view follows by a watch and may
    /// lag under load).
    pub async fn card_now(&self, agent: &AgentId) -> Result<Option<AgentCard>, StoreError> {
        match switchboard_request::kv::leader_entry(&self.agents, agent.as_str())
            .await
            .map_err(|err| StoreError::store("reading agent record", err))?
        {
            None => Ok(None),
            Some((value, _)) => record_of(&value)
                .map(|record| Some(record.card))
                .ok_or_else(|| StoreError::Corrupt(agent.to_string())),
        }
    }

    /// Whether `goal` is a live goal of `agent`: from the view, else the goal's KV entry, else
    /// the stream leader's copy (a goal opened a moment ago on another replica may not have
    /// reached this view or this server yet). A goal id that comes from a request body is
    /// trusted only after this answers true (docs/protocol.md §1, "Limits every agent endpoint enforces").
    pub async fn owns_goal(&self, agent: &AgentId, goal: &GoalId) -> Result<bool, StoreError> {
        if self
            .read()
            .goals
            .get(agent.as_str())
            .is_some_and(|goals| goals.contains_key(goal))
        {
            return Ok(true);
        }
        owns_goal(&self.goals, agent, goal).await
    }

    /// The agent as the view knows it, falling back to KV when the view has no record or no
    /// live goal for it. `None` when the agent is not registered.
    pub async fn resolve(&self, agent: &AgentId) -> Result<Option<Peer>, StoreError> {
        if let Some(peer) = self.read().peer(agent.as_str())
            && !peer.goals.is_empty()
        {
            return Ok(Some(peer));
        }
        self.read_through(agent).await
    }

    /// Reads one agent's record and goals from KV and merges what is newer than the watches.
    async fn read_through(&self, agent: &AgentId) -> Result<Option<Peer>, StoreError> {
        let entry = self
            .agents
            .entry(agent.as_str())
            .await
            .map_err(|err| StoreError::store("reading agent record", err))?
            .filter(|entry| entry.operation == kv::Operation::Put);
        let Some(entry) = entry else {
            return Ok(None);
        };
        let Some(record) = record_of(&entry.value) else {
            return Err(StoreError::Corrupt(entry.key));
        };
        let goal_entries = snapshot(&self.js, &self.goals, &format!("{agent}.*"))
            .await
            .map_err(|err| StoreError::store("listing goals", err))?;
        let mut goals = Vec::new();
        {
            let mut inner = self.write();
            if entry.revision > inner.records_seen {
                inner
                    .records
                    .insert(entry.key.clone(), (record.clone(), entry.revision));
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
        Ok(Some(Peer {
            record,
            revision: entry.revision,
            goals,
        }))
    }

    /// Every registered agent with its live goals, read fresh from KV (broadcast uses this:
    /// it is rare and must not miss a peer that just joined).
    pub async fn all_fresh(&self) -> Result<Vec<Peer>, StoreError> {
        let records = snapshot(&self.js, &self.agents, ">")
            .await
            .map_err(|err| StoreError::store("listing agents", err))?;
        let goal_entries = snapshot(&self.js, &self.goals, ">")
            .await
            .map_err(|err| StoreError::store("listing goals", err))?;
        let mut goals: HashMap<&str, Vec<GoalId>> = HashMap::new();
        for entry in &goal_entries {
            if let Some((agent, goal)) = split_goal_key(&entry.key) {
                goals.entry(agent).or_default().push(goal);
            }
        }
        let mut peers: Vec<Peer> = records
            .iter()
            .filter_map(|entry| {
                let Some(record) = record_of(&entry.value) else {
                    tracing::warn!(key = %entry.key, "undecodable agent record skipped");
                    return None;
                };
                let goals = goals.get(entry.key.as_str()).cloned().unwrap_or_default();
                Some(Peer {
                    record,
                    revision: entry.revision,
                    goals,
                })
            })
            .collect();
        peers.sort_by(|a, b| a.record.card.agent_id.cmp(&b.record.card.agent_id));
        Ok(peers)
    }

    /// How many agents and goals the view holds (for logs and tests).
    pub fn size(&self) -> (usize, usize) {
        let inner = self.read();
        (
            inner.records.len(),
            inner.goals.values().map(BTreeMap::len).sum(),
        )
    }
}

/// Whether `goal` is a live goal of `agent` in the goals bucket: the local entry, else the
/// stream leader's copy (a just-opened goal may not have reached this server's replica).
pub async fn owns_goal(
    goals: &kv::Store,
    agent: &AgentId,
    goal: &GoalId,
) -> Result<bool, StoreError> {
    let key = switchboard_proto::registry::goal_key(agent, goal);
    let entry = goals
        .entry(key.as_str())
        .await
        .map_err(|err| StoreError::store("reading the goal", err))?;
    if entry.is_some_and(|entry| entry.operation == kv::Operation::Put) {
        return Ok(true);
    }
    switchboard_request::kv::leader_entry(goals, &key)
        .await
        .map(|entry| entry.is_some())
        .map_err(|err| StoreError::store("reading the goal", err))
}
