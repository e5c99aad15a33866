//! The send handler: send_to_peer and broadcast. Gates, resolution, ACL, anti-loop, then one
//! durable publish per live goal, all goals' acks awaited together; the peers a send could
//! not reach are published as refusals for the audit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::future::BoxFuture;
use switchboard_delivery::deliver::deliver_all;
use switchboard_proto::send::{
    DeliveryReport, SendRequest, Target, check_gates, next_hop, no_live_goals, unknown_agent,
};
use switchboard_proto::{
    AgentCard, AgentId, ErrorKind, ErrorReply, GoalId, INBOX_CAP_PER_GOAL, INBOX_HEADER_ALLOWANCE,
    InboxMessage, MAX_INBOX_MESSAGE_BYTES, acl, new_id, subject, timestamp,
};
use switchboard_request::request::route_by_skill;
use switchboard_runtime::micro::AgentRequest;
use switchboard_runtime::publish::{PublishFailure, Published, publish_refusal};
use tracing::Instrument;

use crate::config::FanoutConfig;
use crate::error::FanoutError;
use crate::receipts::Receipts;
use crate::store::InboxStore;
use switchboard_delivery::registry_view::{Peer, RegistryView};

/// Where inbox messages are published. The one seam of the service: production publishes to
/// JetStream; a test can wrap it to make one goal's publish fail.
pub trait InboxPublisher: Send + Sync + 'static {
    /// Publishes `(subject, Nats-Msg-Id, payload)` triples, acks awaited together; results in
    /// input order.
    fn publish_all<'a>(
        &'a self,
        messages: &'a [(String, String, Bytes)],
    ) -> BoxFuture<'a, Vec<Result<Published, PublishFailure>>>;
}

/// The production publisher: JetStream with retries and room made in full goals (see
/// `switchboard_delivery::deliver`).
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

/// The fan-out: view, publisher, settings.
pub struct Fanout {
    view: RegistryView,
    publisher: Arc<dyn InboxPublisher>,
    store: InboxStore,
    receipts: Receipts,
    js: jetstream::Context,
    config: FanoutConfig,
    backlog_checked: Mutex<HashMap<GoalId, Instant>>,
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One peer's copies, waiting to be published.
struct Planned {
    to: AgentId,
    goals: Vec<GoalId>,
}

impl Fanout {
    /// Wires the parts together.
    pub fn new(
        view: RegistryView,
        publisher: Arc<dyn InboxPublisher>,
        store: InboxStore,
        receipts: Receipts,
        js: jetstream::Context,
        config: FanoutConfig,
    ) -> Self {
        Self {
            view,
            publisher,
            store,
            receipts,
            js,
            config,
            backlog_checked: Mutex::default(),
        }
    }

    /// What the send endpoint answers: [`Fanout::send`] for the request's caller, after which
    /// the peers it could not reach (unknown, ACL, no goal, anti-loop) are published as
    /// refusals too, so the audit records them.
    pub(crate) async fn send_request(
        &self,
        req: AgentRequest<SendRequest>,
    ) -> Result<DeliveryReport, ErrorReply> {
        self.send_recorded(&req.caller, req.body).await
    }

    /// [`Fanout::send`], then the peers it could not reach are published as refusals (as the
    /// send endpoint does): what a service delivering for an agent in process calls.
    pub async fn send_recorded(
        &self,
        caller: &AgentId,
        request: SendRequest,
    ) -> Result<DeliveryReport, ErrorReply> {
        let report = self.send(caller, request).await?;
        self.record_unreachable(caller, &report);
        Ok(report)
    }

    /// [`Fanout::send_recorded`] run in another service's process (the correlator delivering
    /// a call's request): in a span of its own, `inbox-fanout.send` as if the request had come
    /// over NATS, so the stored copies' trace context names the send as their parent and a
    /// call's trace keeps its shape.
    pub async fn send_in_process(
        &self,
        caller: &AgentId,
        request: SendRequest,
    ) -> Result<DeliveryReport, ErrorReply> {
        let span = tracing::info_span!(
            "request",
            otel.name = %format!("{}.send", crate::SPEC.name),
            otel.kind = "internal",
            messaging.system = "nats",
            messaging.operation.type = "process",
            messaging.operation.name = "send",
            messaging.destination.name = %subject::send(caller),
            switchboard.agent_id = %caller,
            otel.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let outcome = self
            .send_recorded(caller, request)
            .instrument(span.clone())
            .await;
        if let Err(err) = &outcome {
            span.record("error.type", err.kind().as_str());
            span.record("otel.status_code", "ERROR");
        }
        outcome
    }

    /// Publishes the peers a send could not reach as refusals, so the audit records them.
    fn record_unreachable(&self, caller: &AgentId, report: &DeliveryReport) {
        if !report.unreachable_reasons.is_empty() {
            publish_refusal(
                &self.js,
                crate::SPEC.name,
                &subject::send(caller),
                Some(caller),
                ErrorKind::Unreachable,
                &report.unreachable_reasons.join("; "),
            );
        }
    }

    /// send_to_peer / broadcast for `caller`.
    pub async fn send(
        &self,
        caller: &AgentId,
        request: SendRequest,
    ) -> Result<DeliveryReport, ErrorReply> {
        // Gates 1–4: error replies.
        let (target, body) = check_gates(caller, &request)?;
        let me = match self.view.card(caller).await? {
            Some(card) => card,
            None => return Err(FanoutError::SenderNotRegistered(caller.clone()).into()),
        };
        if let Some(goal) = request.from_goal_id
            && !self.view.owns_goal(caller, &goal).await?
        {
            return Err(FanoutError::NotYourGoal(goal).into());
        }
        let mut report = DeliveryReport::default();
        let mut planned = Vec::new();
        match target {
            Target::Peer(to) => {
                // Gate 5: unknown agent, answered before any publish (an id that cannot exist
                // is unknown too).
                let peer = match AgentId::parse(&to) {
                    Ok(id) => self.view.resolve(&id).await?,
                    Err(_) => None,
                };
                match peer {
                    None => report.unreachable_reasons.push(unknown_agent(&to)),
                    Some(peer) => self.plan(&me, &request, peer, &mut report, &mut planned),
                }
            }
            Target::Skill(skill) => {
                match route_by_skill(&self.js.client(), caller, &skill, false).await {
                    Ok(agent) => match self.view.resolve(&agent).await? {
                        None => report
                            .unreachable_reasons
                            .push(unknown_agent(agent.as_str())),
                        Some(peer) => {
                            report.routed_to = Some(agent);
                            self.plan(&me, &request, peer, &mut report, &mut planned);
                        }
                    },
                    Err(reason) => report.unreachable_reasons.push(reason),
                }
            }
            Target::Broadcast => {
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
                if reachable.len() > self.config.broadcast_cap {
                    return Err(FanoutError::BroadcastTooLarge {
                        peers: reachable.len(),
                        cap: self.config.broadcast_cap,
                    }
                    .into());
                }
                for peer in reachable {
                    self.plan(&me, &request, peer, &mut report, &mut planned);
                }
            }
        }
        if planned.is_empty() {
            return Ok(report);
        }
        let message_id = request.id.unwrap_or_else(new_id);
        report.message_id = Some(message_id);
        let one_peer = (planned.len() == 1).then(|| planned[0].to.clone());
        let refused_full = self
            .deliver(caller, &request, body, message_id, planned, &mut report)
            .await?;
        // A message to one peer that every goal refused as full is the sender's to back off
        // from: an error it can act on, not a report that merely lists reasons.
        if let Some(agent) = one_peer
            && report.delivered_to.is_empty()
            && refused_full
        {
            return Err(FanoutError::InboxFull { agent }.into());
        }
        Ok(report)
    }

    /// ACL, anti-loop and gate 6 for one peer; what passes is planned for delivery.
    fn plan(
        &self,
        me: &AgentCard,
        request: &SendRequest,
        peer: Peer,
        report: &mut DeliveryReport,
        planned: &mut Vec<Planned>,
    ) {
        let (from, to) = (&me.agent_id, &peer.record.card.agent_id);
        if let Err(denial) = acl::check(me, &peer.record.card) {
            report
                .unreachable_reasons
                .push(denial.reason(from.as_str(), to.as_str()));
            return;
        }
        if let Err(refusal) = next_hop(from, to, request.ttl, &request.trace) {
            report.unreachable_reasons.push(refusal.reason(to));
            return;
        }
        if peer.goals.is_empty() {
            report.unreachable_reasons.push(no_live_goals(to));
            return;
        }
        planned.push(Planned {
            to: to.clone(),
            goals: peer.goals,
        });
    }

    /// Builds every copy, publishes them all, and records per-goal outcomes; true when some
    /// goal refused its copy as full.
    async fn deliver(
        &self,
        caller: &AgentId,
        request: &SendRequest,
        body: &str,
        message_id: uuid::Uuid,
        planned: Vec<Planned>,
        report: &mut DeliveryReport,
    ) -> Result<bool, FanoutError> {
        let from_goal = request.from_goal_id.unwrap_or_default();
        let sent_at = timestamp::now();
        let mut batch = Vec::new();
        let mut owners = Vec::new();
        for Planned { to, goals } in planned {
            // Checked in `plan`; recomputed here for the values the copy carries.
            let hop = next_hop(caller, &to, request.ttl, &request.trace)
                .map_err(|_| FanoutError::Encode("anti-loop state changed".into()))?;
            let message = InboxMessage {
                from_agent_id: caller.clone(),
                from_goal_id: from_goal,
                to_agent_id: to.clone(),
                body: body.to_owned(),
                sent_at,
                correlation_id: request.correlation_id,
                id: Some(message_id),
                kind: request.kind.unwrap_or_default(),
                in_reply_to: request.in_reply_to,
                expects_reply: request.expects_reply,
                ttl: Some(hop.ttl),
                trace: hop.trace,
                parts: request.parts.clone(),
                task: None,
                callback: request.callback.clone(),
                metadata: request.metadata.clone(),
                receipt: request.receipt,
                from_person: None,
            };
            let payload =
                serde_json::to_vec(&message).map_err(|err| FanoutError::Encode(err.into()))?;
            // The stream counts headers too; keep room for them.
            let limit = MAX_INBOX_MESSAGE_BYTES - INBOX_HEADER_ALLOWANCE;
            if payload.len() > limit {
                return Err(FanoutError::EnvelopeTooLarge {
                    size: payload.len(),
                    limit,
                });
            }
            let payload = Bytes::from(payload);
            for goal in goals {
                // The sender is part of the key: another agent that learned this id first
                // cannot make this message a "duplicate" of its own (docs/protocol.md §7).
                batch.push((
                    subject::inbox(&goal),
                    format!("{caller}:{message_id}:{goal}"),
                    payload.clone(),
                ));
                owners.push((to.clone(), goal));
            }
        }
        // The receipt record is written beside the publishes, not after them: a receipted
        // send costs about what a plain one does. A copy that then fails is taken out again.
        let results = if request.receipt.is_some() {
            let (results, ()) = tokio::join!(
                self.publisher.publish_all(&batch),
                self.receipts.stored(message_id, caller, &owners)
            );
            results
        } else {
            self.publisher.publish_all(&batch).await
        };
        let mut failed = Vec::new();
        let mut refused_full = false;
        for ((to, goal), result) in owners.into_iter().zip(results) {
            match result {
                Ok(_) => {
                    report.delivered_to.push(goal);
                    self.check_backlog(goal);
                }
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
        if request.receipt.is_some() && !failed.is_empty() {
            self.receipts.not_stored(message_id, caller, &failed).await;
        }
        tracing::debug!(
            %message_id,
            delivered = report.delivered_to.len(),
            unreachable = report.unreachable_reasons.len(),
            "send done"
        );
        Ok(refused_full)
    }

    /// At most once per interval per goal, off the reply path: warn when a goal's unread
    /// backlog is at the inbox cap (older messages are being evicted unread).
    fn check_backlog(&self, goal: GoalId) {
        let every = Duration::from_millis(self.config.backlog_check_interval_ms);
        {
            let Ok(mut checked) = self.backlog_checked.lock() else {
                return;
            };
            let now = Instant::now();
            if checked
                .get(&goal)
                .is_some_and(|last| now.duration_since(*last) < every)
            {
                return;
            }
            checked.insert(goal, now);
            if checked.len() > 100_000 {
                checked.retain(|_, last| now.duration_since(*last) < every);
            }
        }
        let store = self.store.clone();
        tokio::spawn(async move {
            let Ok(Some((cursor, _))) = store.cursor(&goal).await else {
                return;
            };
            if let Ok(unread) = store.unread(&goal, cursor.cursor, 1).await {
                let unread = unread.total;
                if unread >= INBOX_CAP_PER_GOAL.unsigned_abs() {
                    tracing::warn!(
                        goal_id = %goal,
                        unread,
                        cap = INBOX_CAP_PER_GOAL,
                        "goal inbox is at its cap; the oldest unread messages are being evicted"
                    );
                }
            }
        });
    }
}
