//! The send handler: send_to_peer and broadcast. The send gates on the request, then the one
//! door into every inbox (`switchboard_delivery::door`) as the agent: resolution, ACL,
//! anti-loop, one durable publish per live goal; the peers a send could not reach are
//! published as refusals for the audit.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use switchboard_delivery::door::{Door, Letter, Origin};
use switchboard_proto::send::{DeliveryReport, SendRequest, check_gates};
use switchboard_proto::{
    AgentId, ErrorKind, ErrorReply, GoalId, INBOX_CAP_PER_GOAL, InboxMessage, subject, timestamp,
};
use switchboard_runtime::micro::AgentRequest;
use switchboard_runtime::publish::publish_refusal;

use crate::config::FanoutConfig;
use crate::store::InboxStore;

/// The fan-out: the door it delivers through, the store it watches backlogs in, settings.
pub struct Fanout {
    door: Door,
    store: InboxStore,
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

impl Fanout {
    /// Wires the parts together.
    pub fn new(
        door: Door,
        store: InboxStore,
        js: jetstream::Context,
        config: FanoutConfig,
    ) -> Self {
        Self {
            door,
            store,
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
        let report = self.send(&req.caller, req.body).await?;
        if !report.unreachable_reasons.is_empty() {
            publish_refusal(
                &self.js,
                crate::SPEC.name,
                &subject::send(&req.caller),
                Some(&req.caller),
                ErrorKind::Unreachable,
                &report.unreachable_reasons.join("; "),
            );
        }
        Ok(report)
    }

    /// send_to_peer / broadcast for `caller`: gates 1–4, then the door.
    pub async fn send(
        &self,
        caller: &AgentId,
        request: SendRequest,
    ) -> Result<DeliveryReport, ErrorReply> {
        let (target, body) = check_gates(caller, &request)?;
        let message = InboxMessage {
            from_agent_id: caller.clone(),
            from_goal_id: GoalId::default(),
            // Each copy names its own receiver (the door fills it in).
            to_agent_id: caller.clone(),
            body: body.to_owned(),
            sent_at: timestamp::now(),
            correlation_id: request.correlation_id,
            id: request.id,
            kind: request.kind.unwrap_or_default(),
            in_reply_to: request.in_reply_to,
            expects_reply: request.expects_reply,
            ttl: request.ttl,
            trace: request.trace,
            parts: request.parts,
            task: None,
            callback: request.callback,
            metadata: request.metadata,
            receipt: request.receipt,
            from_person: None,
            attachments: request.attachments,
        };
        let letter = Letter {
            to: target.into(),
            from_goal: request.from_goal_id,
            message,
        };
        let report = self.door.deliver(Origin::Agent(caller), letter).await?;
        for goal in &report.delivered_to {
            self.check_backlog(*goal);
        }
        Ok(report)
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
