//! The one door into every inbox (docs/protocol.md §7, "One door"). Every message a goal's
//! reader is handed — an agent's send, a call's request and its answer or timeout notice, a
//! task and its updates, a person's reply — is put there by [`Door::deliver`]. The
//! [`Origin`] says which rules apply, and [`copy_key`] gives every copy its `Nats-Msg-Id`, so
//! the services agree on ownership, anti-loop and de-duplication because they run the same
//! code, not because each wrote it again.
//!
//! What the door does, in order:
//! 1. for an agent's message, the sender must be registered and own the goal it names;
//! 2. the address becomes peers: one agent (unknown is unreachable), one with a skill (the
//!    directory picks it), everyone the sender may reach (bounded), or goals a service chose;
//! 3. for an agent's message, each peer passes the ACL and the anti-loop rules; a peer
//!    without a live goal is unreachable;
//! 4. attachments: the one passing them on may read each, and each is as uploaded; every
//!    peer planned gets a grant to read them ([`crate::files`]);
//! 5. one copy per goal, each at most [`MAX_INBOX_MESSAGE_BYTES`] with its headers, published
//!    all at once with room made in a full goal ([`crate::deliver::deliver_all`]); the receipt
//!    record of a receipted send is written beside the publishes.
//!
//! What it never does: check a request's own fields (the gates of
//! [`switchboard_proto::send`] run first, in the service that took the request) or decide
//! who a service's word is for (the service names the goals).

use std::sync::Arc;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::future::BoxFuture;
use switchboard_proto::receipt::ReceiptState;
use switchboard_proto::send::{DeliveryReport, Target, next_hop, no_live_goals, unknown_agent};
use switchboard_proto::{
    AgentCard, AgentId, GoalId, INBOX_HEADER_ALLOWANCE, InboxMessage, MAX_INBOX_MESSAGE_BYTES, acl,
    new_id, subject,
};
use switchboard_request::request::route_by_skill;
use switchboard_runtime::config::JetStreamConfig;
use switchboard_runtime::publish::{PublishFailure, Published};
use switchboard_runtime::resources::{self, ResourceError};
use uuid::Uuid;

use crate::deliver::deliver_all;
use crate::files::Files;
use crate::receipts;
use crate::registry_view::{Peer, RegistryView};

/// Where inbox copies are published: production publishes to JetStream, making room in full
/// goals; a test can wrap it to make one goal's publish fail.
pub trait InboxPublisher: Send + Sync + 'static {
    /// Publishes `(subject, Nats-Msg-Id, payload)` triples, acks awaited together; results in
    /// input order.
    fn publish_all<'a>(
        &'a self,
        messages: &'a [(String, String, Bytes)],
    ) -> BoxFuture<'a, Vec<Result<Published, PublishFailure>>>;
}

/// The production publisher: JetStream with retries and room made in full goals.
#[derive(Debug, Clone)]
pub struct JetStreamPublisher(pub jetstream::Context);

impl InboxPublisher for JetStreamPublisher {
    fn publish_all<'a>(
        &'a self,
        messages: &'a [(String, String, Bytes)],
    ) -> BoxFuture<'a, Vec<Result<Published, PublishFailure>>> {
        Box::pin(deliver_all(&self.0, messages))
    }
}

/// Who puts a message into an inbox; it decides which rules apply and how copies are keyed.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    /// An agent's own message (a send, a call's request): the sender must be registered and
    /// own the goal it names; each peer must pass the ACL and the anti-loop rules. Copies are
    /// keyed `<sender>:<message id>:<goal>`.
    Agent(&'a AgentId),
    /// The fabric's word to goals its rules already chose (a call's answer or timeout notice,
    /// a task and its updates, a person's reply): no ACL, no anti-loop. Copies are keyed
    /// `<purpose>:<goal>`; the purpose names the occasion once (`answer:<call id>`).
    Service {
        /// What the message is for, unique per occasion: the copy's de-duplication key.
        purpose: &'a str,
    },
}

/// The `Nats-Msg-Id` of one copy in `goal`: the one set of keys every writer uses. An agent's
/// copies include the sender, so another agent that learned a message id cannot make its own
/// message a "duplicate" of it; a service's include the occasion.
pub fn copy_key(origin: Origin<'_>, message_id: Uuid, goal: &GoalId) -> String {
    match origin {
        Origin::Agent(sender) => format!("{sender}:{message_id}:{goal}"),
        Origin::Service { purpose } => format!("{purpose}:{goal}"),
    }
}

/// Who a message is for.
#[derive(Debug, Clone)]
pub enum Address {
    /// Every live goal of one agent, by id text (an id that cannot exist is unknown).
    Agent(String),
    /// One agent with this skill, picked by the directory.
    Skill(String),
    /// Every agent the sender may reach, at most the door's broadcast cap.
    Broadcast,
    /// These goals of this agent, chosen by the service.
    Goals(AgentId, Vec<GoalId>),
}

impl From<Target> for Address {
    fn from(target: Target) -> Self {
        match target {
            Target::Peer(to) => Self::Agent(to),
            Target::Skill(skill) => Self::Skill(skill),
            Target::Broadcast => Self::Broadcast,
        }
    }
}

/// A message on its way: the copy every peer gets, which the door completes per peer
/// (`to_agent_id`, `id`, `sent_at`, and for an agent's message `ttl` and `trace`).
#[derive(Debug, Clone)]
pub struct Letter {
    /// Who it is for.
    pub to: Address,
    /// The goal it comes from when the sender named one (answers and receipts go there);
    /// an agent must own it.
    pub from_goal: Option<GoalId>,
    /// The message; its `from_goal_id` is [`Letter::from_goal`] when that is set.
    pub message: InboxMessage,
}

pub use crate::error::DoorError;

/// The door: the registry view that resolves addresses, the publisher, and the receipt
/// records. Cheap to clone; run [`RegistryView::watch`] on the view while it is used.
#[derive(Clone)]
pub struct Door {
    view: RegistryView,
    publisher: Arc<dyn InboxPublisher>,
    js: jetstream::Context,
    receipts: kv::Store,
    broadcast_cap: usize,
    files: Option<Files>,
}

impl std::fmt::Debug for Door {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Door")
            .field("broadcast_cap", &self.broadcast_cap)
            .finish_non_exhaustive()
    }
}

/// One peer's copies, waiting to be published.
struct Planned {
    to: AgentId,
    goals: Vec<GoalId>,
    /// The anti-loop values the copy carries (`None`: a service's word keeps the message's).
    hop: Option<(u8, Vec<AgentId>)>,
}

impl Door {
    /// A door resolving through `view`, publishing through `publisher`, writing receipt records
    /// into KV `agent_receipts` (`receipts`); a broadcast reaches at most `broadcast_cap` peers.
    pub fn new(
        view: RegistryView,
        publisher: Arc<dyn InboxPublisher>,
        js: jetstream::Context,
        receipts: kv::Store,
        broadcast_cap: usize,
    ) -> Self {
        Self {
            view,
            publisher,
            js,
            receipts,
            broadcast_cap,
            files: None,
        }
    }

    /// The same door taking attachments: it checks them and grants their readers through
    /// `files` (a door without refuses every attachment as not found).
    pub fn with_files(mut self, files: Files) -> Self {
        self.files = Some(files);
        self
    }

    /// Applies what a door reads and writes — the inbox stream, the registry and goal buckets,
    /// the receipt records (whichever service starts first creates them; applying them again
    /// is a no-op) — and opens a door on them with a registry view of its own, publishing to
    /// JetStream. A service that never broadcasts passes a `broadcast_cap` of 0.
    pub async fn open(
        js: &jetstream::Context,
        settings: &JetStreamConfig,
        broadcast_cap: usize,
    ) -> Result<Self, ResourceError> {
        resources::ensure_stream(js, resources::inbox_stream(settings)).await?;
        let agents = resources::ensure_bucket(js, resources::registry_bucket(settings)).await?;
        let goals = resources::ensure_bucket(js, resources::goals_bucket(settings)).await?;
        let receipts = resources::ensure_bucket(js, resources::receipts_bucket(settings)).await?;
        let files = resources::ensure_bucket(js, resources::files_index_bucket(settings)).await?;
        Ok(Self::new(
            RegistryView::new(js.clone(), agents, goals),
            Arc::new(JetStreamPublisher(js.clone())),
            js.clone(),
            receipts,
            broadcast_cap,
        )
        .with_files(Files::new(
            files,
            std::time::Duration::from_secs(settings.files_retention_secs),
        )))
    }

    /// The files the door checks attachments against and grants readers of (`None`: a door
    /// that takes no attachments).
    pub fn files(&self) -> Option<&Files> {
        self.files.as_ref()
    }

    /// The registry view the door resolves through (it answers goal ownership without a read).
    pub fn view(&self) -> &RegistryView {
        &self.view
    }

    /// Puts `letter` into the inboxes it is addressed to, by the rules `origin` calls for.
    /// The report names the goals that stored it and why each peer or goal did not; a message
    /// for one agent whose every goal refused it as full is [`DoorError::InboxFull`].
    pub async fn deliver(
        &self,
        origin: Origin<'_>,
        letter: Letter,
    ) -> Result<DeliveryReport, DoorError> {
        let sender = self.check_sender(origin, letter.from_goal).await?;
        let passer = match origin {
            Origin::Agent(agent) => agent,
            Origin::Service { .. } => &letter.message.from_agent_id,
        };
        let attachments = letter.message.attachments.clone();
        Files::check_on(self.files.as_ref(), passer, &attachments).await?;
        let mut report = DeliveryReport::default();
        let planned: Vec<Planned> = match (&letter.to, origin) {
            // A service's word goes where the service says, registered or not (a task's
            // update reaches its requester's goal even while its card is being replaced).
            (Address::Goals(agent, goals), Origin::Service { .. }) if !goals.is_empty() => {
                vec![Planned {
                    to: agent.clone(),
                    goals: goals.clone(),
                    hop: None,
                }]
            }
            _ => self
                .peers(origin, &letter.to, &mut report)
                .await?
                .into_iter()
                .filter_map(|peer| plan(sender.as_ref(), &letter.message, peer, &mut report))
                .collect(),
        };
        if planned.is_empty() {
            return Ok(report);
        }
        // Before the copies: a reader may read what it is handed at once.
        let readers: Vec<AgentId> = planned.iter().map(|plan| plan.to.clone()).collect();
        Files::grant_on(self.files.as_ref(), passer, &attachments, &readers).await?;
        let message_id = letter.message.id.unwrap_or_else(new_id);
        report.message_id = Some(message_id);
        let one_peer = (planned.len() == 1).then(|| planned[0].to.clone());
        let refused_full = self
            .publish(origin, letter, message_id, planned, &mut report)
            .await?;
        // A message to one peer that every goal refused as full is the sender's to back off
        // from: an error it can act on, not a report that merely lists reasons.
        if let Some(agent) = one_peer
            && report.delivered_to.is_empty()
            && refused_full
        {
            return Err(DoorError::InboxFull { agent });
        }
        Ok(report)
    }

    /// Step 1: an agent's card (registered, owning the goal it names); none for a service.
    async fn check_sender(
        &self,
        origin: Origin<'_>,
        from_goal: Option<GoalId>,
    ) -> Result<Option<AgentCard>, DoorError> {
        let Origin::Agent(caller) = origin else {
            return Ok(None);
        };
        let Some(card) = self.view.card(caller).await? else {
            return Err(DoorError::SenderNotRegistered(caller.clone()));
        };
        if let Some(goal) = from_goal
            && !self.view.owns_goal(caller, &goal).await?
        {
            return Err(DoorError::NotYourGoal(goal));
        }
        Ok(Some(card))
    }

    /// Step 2: the peers an address names; who it cannot name is an unreachable reason.
    async fn peers(
        &self,
        origin: Origin<'_>,
        to: &Address,
        report: &mut DeliveryReport,
    ) -> Result<Vec<Peer>, DoorError> {
        let found = match (to, origin) {
            (Address::Goals(agent, goals), Origin::Agent(_)) => {
                match self.view.resolve(agent).await? {
                    Some(mut peer) => {
                        peer.goals = goals.clone();
                        Ok(peer)
                    }
                    None => Err(unknown_agent(agent.as_str())),
                }
            }
            (Address::Goals(agent, _), Origin::Service { .. }) => {
                report.unreachable_reasons.push(no_live_goals(agent));
                return Ok(Vec::new());
            }
            (Address::Skill(_) | Address::Broadcast, Origin::Service { .. }) => {
                report
                    .unreachable_reasons
                    .push("a service names the goals it writes to".to_owned());
                return Ok(Vec::new());
            }
            (Address::Broadcast, Origin::Agent(caller)) => return self.everyone(caller).await,
            (Address::Agent(to), _) => match AgentId::parse(to) {
                Ok(id) => self
                    .view
                    .resolve(&id)
                    .await?
                    .ok_or_else(|| unknown_agent(to)),
                Err(_) => Err(unknown_agent(to)),
            },
            (Address::Skill(skill), Origin::Agent(caller)) => {
                match route_by_skill(&self.js.client(), caller, skill, false).await {
                    Ok(agent) => match self.view.resolve(&agent).await? {
                        None => Err(unknown_agent(agent.as_str())),
                        Some(peer) => {
                            report.routed_to = Some(agent);
                            Ok(peer)
                        }
                    },
                    Err(reason) => Err(reason),
                }
            }
        };
        Ok(match found {
            Ok(peer) => vec![peer],
            Err(reason) => {
                report.unreachable_reasons.push(reason);
                Vec::new()
            }
        })
    }

    /// A broadcast's peers: every other agent with a live goal the sender may reach.
    async fn everyone(&self, caller: &AgentId) -> Result<Vec<Peer>, DoorError> {
        let Some(me) = self.view.card(caller).await? else {
            return Err(DoorError::SenderNotRegistered(caller.clone()));
        };
        let reachable: Vec<Peer> = self
            .view
            .all_fresh()
            .await?
            .into_iter()
            .filter(|peer| {
                peer.record.card.agent_id != *caller
                    && !peer.goals.is_empty()
                    && acl::check(&me, &peer.record.card).is_ok()
            })
            .collect();
        if reachable.len() > self.broadcast_cap {
            return Err(DoorError::BroadcastTooLarge {
                peers: reachable.len(),
                cap: self.broadcast_cap,
            });
        }
        Ok(reachable)
    }

    /// Step 4: builds every copy, publishes them all and records per-goal outcomes; true when
    /// some goal refused its copy as full.
    async fn publish(
        &self,
        origin: Origin<'_>,
        letter: Letter,
        message_id: Uuid,
        planned: Vec<Planned>,
        report: &mut DeliveryReport,
    ) -> Result<bool, DoorError> {
        let mut template = letter.message;
        template.id = Some(message_id);
        if let Some(goal) = letter.from_goal {
            template.from_goal_id = goal;
        }
        let mut batch = Vec::new();
        let mut owners = Vec::new();
        for Planned { to, goals, hop } in planned {
            let mut message = template.clone();
            message.to_agent_id = to.clone();
            if let Some((ttl, trace)) = hop {
                message.ttl = Some(ttl);
                message.trace = trace;
            }
            let payload = encode(&message)?;
            for goal in goals {
                batch.push((
                    subject::inbox(&goal),
                    copy_key(origin, message_id, &goal),
                    payload.clone(),
                ));
                owners.push((to.clone(), goal));
            }
        }
        // The receipt record of an agent's receipted message is written beside the publishes,
        // not after them: a receipted send costs about what a plain one does. A copy that then
        // fails is taken out again.
        let record = match origin {
            Origin::Agent(sender) if template.receipt.is_some() => Some(sender),
            _ => None,
        };
        let results = match record {
            Some(sender) => {
                let (results, ()) = tokio::join!(
                    self.publisher.publish_all(&batch),
                    receipts::advance_logged(
                        &self.receipts,
                        message_id,
                        sender,
                        &owners,
                        ReceiptState::Stored
                    )
                );
                results
            }
            None => self.publisher.publish_all(&batch).await,
        };
        let (failed, refused_full) = tally(owners, results, report);
        if let Some(sender) = record
            && !failed.is_empty()
            && let Err(err) = receipts::forget(&self.receipts, message_id, sender, &failed).await
        {
            tracing::warn!(%message_id, error = %err, "receipt record keeps goals that were never stored");
        }
        tracing::debug!(
            %message_id,
            delivered = report.delivered_to.len(),
            unreachable = report.unreachable_reasons.len(),
            "delivered"
        );
        Ok(refused_full)
    }
}

/// Step 3 for one peer: the ACL and anti-loop rules for an agent's message (`sender`), a live
/// goal for any. What passes is planned for delivery; what does not is a reason in `report`.
fn plan(
    sender: Option<&AgentCard>,
    message: &InboxMessage,
    peer: Peer,
    report: &mut DeliveryReport,
) -> Option<Planned> {
    let to = peer.record.card.agent_id.clone();
    let hop = match sender {
        Some(me) => {
            if let Err(denial) = acl::check(me, &peer.record.card) {
                let reason = denial.reason(me.agent_id.as_str(), to.as_str());
                report.unreachable_reasons.push(reason);
                return None;
            }
            match next_hop(&me.agent_id, &to, message.ttl, &message.trace) {
                Ok(hop) => Some((hop.ttl, hop.trace)),
                Err(refusal) => {
                    report.unreachable_reasons.push(refusal.reason(&to));
                    return None;
                }
            }
        }
        None => None,
    };
    if peer.goals.is_empty() {
        report.unreachable_reasons.push(no_live_goals(&to));
        return None;
    }
    Some(Planned {
        to,
        goals: peer.goals,
        hop,
    })
}

/// One copy's payload, at most what the inbox stream stores with its headers.
fn encode(message: &InboxMessage) -> Result<Bytes, DoorError> {
    let payload = serde_json::to_vec(message).map_err(|err| DoorError::Encode(err.to_string()))?;
    // The stream counts headers too; keep room for them.
    let limit = MAX_INBOX_MESSAGE_BYTES - INBOX_HEADER_ALLOWANCE;
    if payload.len() > limit {
        return Err(DoorError::EnvelopeTooLarge {
            size: payload.len(),
            limit,
        });
    }
    Ok(Bytes::from(payload))
}

/// Records each goal's outcome in `report`; returns the goals that did not store their copy
/// and whether one refused it as full.
fn tally(
    owners: Vec<(AgentId, GoalId)>,
    results: Vec<Result<Published, PublishFailure>>,
    report: &mut DeliveryReport,
) -> (Vec<GoalId>, bool) {
    let mut failed = Vec::new();
    let mut refused_full = false;
    for ((to, goal), result) in owners.into_iter().zip(results) {
        match result {
            Ok(_) => report.delivered_to.push(goal),
            Err(err) if err.full => {
                failed.push(goal);
                refused_full = true;
                report.unreachable_reasons.push(format!(
                    "goal `{goal}` of `{to}` is full and refuses new messages (inbox_full)"
                ));
            }
            Err(err) => {
                failed.push(goal);
                tracing::warn!(%goal, agent_id = %to, error = %err, "delivery to a goal failed");
                report.unreachable_reasons.push(format!(
                    "delivery to goal `{goal}` of `{to}` failed: {}",
                    err.last
                ));
            }
        }
    }
    (failed, refused_full)
}
