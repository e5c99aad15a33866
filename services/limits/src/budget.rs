//! Cost budgets (docs/protocol.md §16): each tree is one value `budget.<root>` in the
//! `agent_limits` bucket, changed by compare-and-set ([`crate::tree`] holds the rules). The
//! correlator and task-lifecycle reserve a node when work starts and close it when it ends
//! (`_SB.budget.reserve|close`); owners report spend (`agent.budget.spend.<me>`). Every change
//! is published as an event into `AGENT_EVENTS`, where the audit keeps the cost tree. When a
//! spend exhausts a tree, its root's requester and every running owner get one notice.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use switchboard_delivery::door::{Address, Door, Letter, Origin};
use switchboard_proto::budget::{
    Amounts, BUDGET_METADATA_KEY, BudgetEvent, BudgetGrant, BudgetQuery, BudgetView, CloseRequest,
    ReserveRequest, SpendRequest,
};
use switchboard_proto::{AgentId, GoalId, InboxMessage, MessageKind, new_id, timestamp};
use switchboard_runtime::config::BudgetsConfig;
use switchboard_runtime::publish::{json_payload, publish_durable};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::error::LimitsError;
use crate::keeper::now_ms;
use crate::tree::{Node, Refusal, Tree};

/// How often one change is tried against writers racing on the same tree.
const ATTEMPTS: u32 = 32;
/// The pauses, in ms, before a tree not stored yet is read again (250 ms in all).
const OPENING_READS: [u64; 5] = [10, 20, 40, 80, 100];
/// Events a replica holds for its publisher before a change waits for it.
const EVENTS_QUEUED: usize = 10_000;

/// Publishes budget events into `AGENT_EVENTS` one after another, each retried with its own
/// message id (a crash loses the events still queued: the trees in KV stay right, the audit's
/// cost tree misses them).
async fn publisher(js: jetstream::Context, mut events: mpsc::Receiver<BudgetEvent>) {
    while let Some(event) = events.recv().await {
        let subject = event.subject();
        let msg_id = format!(
            "budget:{}:{}:{}:{}",
            event.root,
            event.work,
            event.event,
            new_id()
        );
        let Ok(payload) = json_payload(&subject, &event) else {
            continue;
        };
        if let Err(err) = publish_durable(&js, &subject, &msg_id, payload).await {
            tracing::warn!(%subject, error = %err, "budget event not stored");
        }
    }
}

/// The budgets of one replica.
#[derive(Debug)]
pub struct Budgets {
    kv: kv::Store,
    js: jetstream::Context,
    events: mpsc::Sender<BudgetEvent>,
    door: Door,
    config: BudgetsConfig,
}

impl From<Refusal> for LimitsError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Unknown(why) => Self::NotFound(why),
            Refusal::NotYours(why) => Self::NotAllowed(why),
            Refusal::Ended(why) | Refusal::Taken(why) => Self::Refused(why),
            Refusal::Exhausted(why) => Self::Exhausted(why),
            Refusal::Full => Self::Exhausted(format!(
                "the budget tree holds {} pieces of work, the most allowed",
                switchboard_proto::budget::BUDGET_NODES_MAX
            )),
            Refusal::Bad(why) => Self::BadRequest(why),
        }
    }
}

fn key(root: Uuid) -> String {
    format!("budget.{root}")
}

fn deadline_ms(at: Option<time::OffsetDateTime>) -> Option<u64> {
    at.map(|at| u64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0))
}

/// What one change did, for the events.
struct Changed<T> {
    out: T,
    tree: Tree,
}

impl Budgets {
    /// Budgets over the `agent_limits` bucket, telling through `door`, publishing events
    /// through `js` (a task of the runtime this is called in).
    pub fn new(kv: kv::Store, js: jetstream::Context, door: Door, config: BudgetsConfig) -> Self {
        let (events, queued) = mpsc::channel(EVENTS_QUEUED);
        tokio::spawn(publisher(js.clone(), queued));
        Self {
            kv,
            js,
            events,
            door,
            config,
        }
    }

    /// Removes every tree whose work has all ended with no change since to remove it (work
    /// that ended by its deadline alone): one snapshot of `budget.*`, then a delete at the
    /// revision read for each (a tree changed meanwhile is left to its change). How many it
    /// removed.
    pub async fn sweep(&self) -> Result<usize, LimitsError> {
        let entries = switchboard_request::kv::snapshot(&self.js, &self.kv, "budget.*")
            .await
            .map_err(|err| LimitsError::Store(format!("listing budget trees: {err}")))?;
        let now = now_ms();
        let mut removed = 0;
        for entry in entries {
            let Ok(tree) = serde_json::from_slice::<Tree>(&entry.value) else {
                continue;
            };
            if tree.finished(now) && self.store(&tree, entry.revision, true).await? {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The door (its registry view is watched by the service's run loop).
    pub fn door(&self) -> &Door {
        &self.door
    }

    async fn load(&self, root: Uuid) -> Result<(Option<Tree>, u64), LimitsError> {
        match self.kv.entry(key(root)).await {
            Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                let tree = serde_json::from_slice(&entry.value)
                    .map_err(|_| LimitsError::Store(format!("budget tree {root} is corrupt")))?;
                Ok((Some(tree), entry.revision))
            }
            Ok(Some(entry)) => Ok((None, entry.revision)),
            Ok(None) => Ok((None, 0)),
            Err(err) => Err(LimitsError::Store(format!(
                "reading budget tree {root}: {err}"
            ))),
        }
    }

    /// Writes `tree` at `revision` (0: new), or removes it; `false` when another writer came
    /// first.
    async fn store(&self, tree: &Tree, revision: u64, remove: bool) -> Result<bool, LimitsError> {
        let name = key(tree.root);
        let fail = |err: String| LimitsError::Store(format!("writing budget tree: {err}"));
        if remove {
            return self.remove(&name, revision).await;
        }
        let value: Bytes = serde_json::to_vec(tree)
            .map_err(|err| fail(err.to_string()))?
            .into();
        let written = match revision {
            0 => self.kv.create(name, value).await.map_err(|err| {
                (
                    switchboard_request::kv::already_exists(&err),
                    err.to_string(),
                )
            }),
            _ => self.kv.update(name, value, revision).await.map_err(|err| {
                (
                    switchboard_request::kv::lost_revision(&err),
                    err.to_string(),
                )
            }),
        };
        match written {
            Ok(_) => Ok(true),
            Err((true, _)) => Ok(false),
            Err((false, err)) => Err(fail(err)),
        }
    }

    /// Removes a tree read at `revision`: one purge of its subject below `revision + 1`, which
    /// leaves no delete marker for listings (the sweep's snapshot) to read. The bucket keeps
    /// one revision per key, so the purge removes the tree only while `revision` is still its
    /// last; `false` (nothing purged) when another writer came first. A tree opened again
    /// under the same id later is newer and stays.
    async fn remove(&self, name: &str, revision: u64) -> Result<bool, LimitsError> {
        let subject = format!("{}{name}", self.kv.prefix);
        let purged = self
            .kv
            .stream
            .purge()
            .filter(subject)
            .sequence(revision.saturating_add(1))
            .await
            .map_err(|err| LimitsError::Store(format!("removing budget tree: {err}")))?;
        Ok(purged.purged > 0)
    }

    /// Reads the tree, applies `rule`, writes it back if it changed; again when another
    /// writer came first. The rule returns its output, the events, and whether it changed.
    async fn change<T>(
        &self,
        root: Uuid,
        fresh: bool,
        mut rule: impl FnMut(
            Option<Tree>,
            u64,
        ) -> Result<(T, Option<Tree>, Vec<BudgetEvent>), LimitsError>,
    ) -> Result<Changed<T>, LimitsError> {
        for attempt in 0..ATTEMPTS {
            // A new tree is created without reading first; a lost create reads it.
            let (found, revision) = match fresh && attempt == 0 {
                true => (None, 0),
                false => self.load(root).await?,
            };
            // A root is opened beside its call's delivery (§16), so its callee's first spend
            // or sub-call may come first: a tree not there yet is read again for a while.
            if found.is_none() && !fresh && attempt < OPENING_READS.len() as u32 {
                tokio::time::sleep(Duration::from_millis(OPENING_READS[attempt as usize])).await;
                continue;
            }
            let existed = found.is_some();
            let (out, changed, events) = rule(found.clone(), now_ms())?;
            let Some(tree) = changed else {
                let tree =
                    found.ok_or_else(|| LimitsError::NotFound(format!("no budget tree {root}")))?;
                return Ok(Changed { out, tree });
            };
            let remove = existed && tree.finished(now_ms());
            let revision = if existed { revision } else { 0 };
            if self.store(&tree, revision, remove).await? {
                self.publish(events).await;
                return Ok(Changed { out, tree });
            }
            tokio::time::sleep(Duration::from_millis(u64::from(attempt.min(10)) * 2)).await;
        }
        Err(LimitsError::Conflict(format!("budget tree {root}")))
    }

    /// Hands the events of a change to this replica's publisher, in order, off the request's
    /// path (it waits only when the publisher is [`EVENTS_QUEUED`] behind).
    async fn publish(&self, events: Vec<BudgetEvent>) {
        for event in events {
            if let Err(mpsc::error::TrySendError::Full(event)) = self.events.try_send(event) {
                let _ = self.events.send(event).await;
            }
        }
    }

    /// `_SB.budget.reserve`: opens a root, or reserves a child from its parent.
    pub async fn reserve(&self, request: ReserveRequest) -> Result<BudgetGrant, LimitsError> {
        let ask = switchboard_proto::budget::BudgetAsk {
            tokens: request.tokens,
            cost: request.cost,
            ..Default::default()
        };
        ask.check().map_err(LimitsError::BadRequest)?;
        let mut node = Node {
            p: None,
            o: request.owner.clone(),
            r: request.requester.clone(),
            t: request.tokens,
            c: request.cost,
            st: 0,
            sc: 0,
            ot: 0,
            oc: 0,
            kt: 0,
            kc: 0,
            x: false,
            d: deadline_ms(request.deadline),
        };
        let (root, work) = (request.root, request.work);
        let event =
            |name: &str, parent: Option<Uuid>, t: Option<u64>, c: Option<u64>| BudgetEvent {
                event: name.to_owned(),
                root,
                work,
                parent,
                agent_id: request.owner.clone(),
                requester: Some(request.requester.clone()),
                tokens: t,
                cost: c,
                over: Amounts::default(),
                at: timestamp::now(),
            };
        let Some(parent) = request.parent else {
            if root != work {
                return Err(LimitsError::BadRequest(
                    "a root budget's `root` is its `work`".to_owned(),
                ));
            }
            if request.tokens.is_none()
                && request.cost.is_none()
                && self.config.cap_tokens.is_none()
                && self.config.cap_cost.is_none()
            {
                return Err(LimitsError::BadRequest(
                    "a budget names `tokens` or `cost`".to_owned(),
                ));
            }
            let (tokens, cost, cut) = self.config.root_grant(node.t, node.c);
            (node.t, node.c) = (tokens, cost);
            let goal = request.requester_goal;
            let changed = self
                .change(root, true, |found, _| match found {
                    Some(tree) => match tree.n.get(&work) {
                        Some(n)
                            if n.p.is_none()
                                && n.r == request.requester
                                && n.o == request.owner =>
                        {
                            Ok(((n.t, n.c), None, Vec::new()))
                        }
                        _ => Err(LimitsError::Refused(format!(
                            "work {work} has a budget already"
                        ))),
                    },
                    None => Ok((
                        (node.t, node.c),
                        Some(Tree::new(work, node.clone(), goal)),
                        vec![event("opened", None, node.t, node.c)],
                    )),
                })
                .await?;
            let (tokens, cost) = changed.out;
            return Ok(BudgetGrant {
                root,
                work,
                tokens,
                cost,
                cut,
            });
        };
        let changed = self
            .change(root, false, |found, now| {
                let mut tree =
                    found.ok_or_else(|| LimitsError::NotFound(format!("no budget tree {root}")))?;
                let granted = tree.reserve(work, parent, &request.requester, node.clone(), now)?;
                if granted.again {
                    return Ok((granted, None, Vec::new()));
                }
                let events = vec![event(
                    "reserved",
                    Some(parent),
                    granted.tokens,
                    granted.cost,
                )];
                Ok((granted, Some(tree), events))
            })
            .await?;
        let granted = changed.out;
        Ok(BudgetGrant {
            root,
            work,
            tokens: granted.tokens,
            cost: granted.cost,
            cut: granted.cut,
        })
    }

    /// `_SB.budget.close`: the work ended; its unspent share returns to its parent.
    pub async fn close(&self, request: CloseRequest) -> Result<serde_json::Value, LimitsError> {
        let (root, work) = (request.root, request.work);
        let result = self
            .change(root, false, |found, _| {
                let Some(mut tree) = found else {
                    return Ok(((), None, Vec::new()));
                };
                if !tree.close(work) {
                    return Ok(((), None, Vec::new()));
                }
                // No event: the work's own records (the call's answer or expiry, the task's
                // last transition) say when it ended (docs/protocol.md §16).
                Ok(((), Some(tree), Vec::new()))
            })
            .await;
        match result {
            Ok(_) | Err(LimitsError::NotFound(_)) => Ok(serde_json::json!({"closed": true})),
            Err(err) => Err(err),
        }
    }

    /// `agent.budget.spend.<me>`: charges what the caller spent on work it owns.
    pub async fn spend(
        &self,
        caller: &AgentId,
        request: SpendRequest,
    ) -> Result<BudgetView, LimitsError> {
        let (root, work) = (request.root, request.work);
        let amounts = Amounts {
            tokens: request.tokens,
            cost: request.cost,
        };
        let changed = self
            .change(root, false, |found, now| {
                let mut tree =
                    found.ok_or_else(|| LimitsError::NotFound(format!("no budget tree {root}")))?;
                let charged = tree.spend(work, caller, amounts, now)?;
                let mut events = vec![BudgetEvent {
                    event: "spent".to_owned(),
                    root,
                    work,
                    parent: tree.n.get(&work).and_then(|n| n.p),
                    agent_id: caller.clone(),
                    requester: None,
                    tokens: Some(charged.charged.tokens),
                    cost: Some(charged.charged.cost),
                    over: charged.over,
                    at: timestamp::now(),
                }];
                if charged.tell {
                    let mut exhausted = events[0].clone();
                    exhausted.event = "exhausted".to_owned();
                    exhausted.tokens = None;
                    exhausted.cost = None;
                    exhausted.over = Amounts::default();
                    events.push(exhausted);
                }
                Ok((charged.tell, Some(tree), events))
            })
            .await?;
        let now = now_ms();
        if changed.out {
            self.tell(&changed.tree, caller, now).await;
        }
        changed
            .tree
            .view(work, now)
            .ok_or_else(|| LimitsError::NotFound(format!("no work {work} in budget tree {root}")))
    }

    /// `agent.budget.get.<me>`: a node, for its owner or its requester.
    pub async fn get(
        &self,
        caller: &AgentId,
        query: BudgetQuery,
    ) -> Result<BudgetView, LimitsError> {
        let (found, _) = self.load(query.root).await?;
        let tree = found.ok_or_else(|| {
            LimitsError::NotFound(format!(
                "no budget tree {} (it ended, or never was)",
                query.root
            ))
        })?;
        let node = tree.n.get(&query.work).ok_or_else(|| {
            LimitsError::NotFound(format!(
                "no work {} in budget tree {}",
                query.work, query.root
            ))
        })?;
        if node.o != *caller && node.r != *caller {
            return Err(LimitsError::NotAllowed(format!(
                "work {} is neither yours nor asked for by you",
                query.work
            )));
        }
        tree.view(query.work, now_ms())
            .ok_or_else(|| LimitsError::NotFound(format!("no work {}", query.work)))
    }

    /// One notice that the tree ran out: to the root's requester (its goal, else every live
    /// goal) and to every owner of work still running.
    async fn tell(&self, tree: &Tree, by: &AgentId, now_ms: u64) {
        let Some(root) = tree.n.get(&tree.root) else {
            return;
        };
        let spent = tree.spent_total();
        let text = format!(
            "the budget of {} is spent ({} tokens, {} micro-units of cost); new work under it is refused with budget_exhausted",
            tree.root, spent.tokens, spent.cost
        );
        let mut told = vec![root.r.clone()];
        let first = match tree.g {
            Some(goal) => Address::Goals(root.r.clone(), vec![goal]),
            None => Address::Agent(root.r.to_string()),
        };
        self.notice(tree.root, by, first, &text).await;
        for owner in tree.running_owners(now_ms) {
            if told.contains(&owner) {
                continue;
            }
            self.notice(tree.root, by, Address::Agent(owner.to_string()), &text)
                .await;
            told.push(owner);
        }
    }

    async fn notice(&self, root: Uuid, by: &AgentId, to: Address, text: &str) {
        let who = match &to {
            Address::Goals(agent, _) => agent.clone(),
            Address::Agent(agent) => match AgentId::parse(agent) {
                Ok(agent) => agent,
                Err(_) => return,
            },
            _ => return,
        };
        let mut message = InboxMessage::new(by.clone(), GoalId::new(), who.clone(), text);
        message.id = Some(new_id());
        message.kind = MessageKind::Notify;
        message
            .metadata
            .insert("switchboard".to_owned(), "budget_exhausted".into());
        message.metadata.insert(
            BUDGET_METADATA_KEY.to_owned(),
            serde_json::json!({"root": root}),
        );
        let purpose = format!("budget_exhausted:{root}:{who}");
        let letter = Letter {
            to,
            from_goal: None,
            message,
        };
        if let Err(err) = self
            .door
            .deliver(Origin::Service { purpose: &purpose }, letter)
            .await
        {
            tracing::warn!(%root, to = %who, error = %err, "budget notice not delivered");
        }
    }
}
