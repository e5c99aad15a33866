//! Opening a call: its record (or a retry joined to its first attempt) and its request
//! through the one door into the callee's inboxes — the record first, or both at once for a
//! waiting call whose id was made moments ago (docs/protocol.md §9, "Call ids").

use std::time::Duration;

use serde::Serialize;
use switchboard_delivery::door::{Address, Letter, Origin};
use switchboard_proto::call::{CallAnswer, CallParked, CallRequest, CallState, PendingCall};
use switchboard_proto::send::DeliveryReport;
use switchboard_proto::{AgentId, InboxMessage, MessageKind, timestamp};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::correlator::{Correlator, LocalAnswer, WaitingGuard, hold};
use crate::error::CorrelatorError;
use crate::store::{CallEntry, Created};

/// The reply to a call: the answer (wait) or where it will land (park).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum CallOutcome {
    /// The callee's answer.
    Answered(CallAnswer),
    /// Parked: the answer comes to the caller goal's inbox.
    Parked(CallParked),
}

/// A call about to be opened: its record, how long the caller waits, and whether the parent's
/// deadline shortened it.
pub(crate) struct Opening {
    pub(crate) call: PendingCall,
    pub(crate) timeout_ms: u64,
    pub(crate) clamped: bool,
}

/// A retried call (named by its `correlation_id`) re-delivers its request only while it is
/// younger than this: half the streams' duplicate window, so the copy is stored once.
const REDELIVER_WITHIN: time::Duration = time::Duration::seconds(60);

/// The pauses before a record made beside its request is tried again (see
/// [`Correlator::record_call_persistently`]).
const RECORD_RETRY_PAUSES: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(500),
];

/// How long a delivery to the fan-out may take.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// What opening a call's record found.
enum Opened {
    /// A new call.
    New(CallEntry),
    /// A retry of an open call, joined to it.
    Joined(CallEntry),
    /// A retry of a call that has ended: its outcome.
    Ended(Result<CallOutcome, CorrelatorError>),
}

/// A call opened and its request sent: the record, whether it joined an earlier attempt, where
/// the request went, and (a waiting call) its place among the calls this replica holds.
pub(crate) enum Sent<'c> {
    /// Open, its request delivered (or, a joined retry, delivered before).
    Out {
        stored: Box<CallEntry>,
        joined: bool,
        report: DeliveryReport,
        _held: Option<WaitingGuard<'c>>,
    },
    /// A retry of a call that has ended: its outcome.
    Ended(Result<CallOutcome, CorrelatorError>),
}

impl Correlator {
    /// Opens the call's record. A call the caller named may exist: then this request is a
    /// retry of it (or names another caller's call, which is refused) and joins it instead of
    /// opening another — or ends here, when the call already has its answer or timed out. A
    /// parked call is counted in the open-call index (a waiting one by the replica holding
    /// it): one past the cap, or racing others past it, steps back.
    async fn record_call(
        &self,
        caller: &AgentId,
        opening: &Opening,
    ) -> Result<Opened, CorrelatorError> {
        let fresh = &opening.call;
        let stored = match self.store.create(fresh).await? {
            Created::New(stored, open) => {
                if open > self.config.max_open_calls {
                    // Nobody else knows of it yet: the forget cannot find it moved on.
                    self.store.forget(&stored).await?;
                    return Err(self.too_many(caller));
                }
                return Ok(Opened::New(stored));
            }
            Created::Exists(existing) => existing,
        };
        if stored.call.caller != *caller {
            return Err(CorrelatorError::CallIdTaken(fresh.correlation_id));
        }
        Ok(match stored.call.state {
            // Its first attempt may have died between the record and the index.
            CallState::Open => {
                self.store.reindex(&stored.call).await?;
                Opened::Joined(stored)
            }
            // Answered already: the answer is on the record (kept for this), unless it went to
            // the caller goal's inbox (a parked call, or no replica took it).
            CallState::Answered => Opened::Ended(match (&stored.call.answer, stored.call.wait) {
                (Some(answer), true) => Ok(CallOutcome::Answered(answer.clone())),
                _ => Err(CorrelatorError::AnsweredToInbox(fresh.correlation_id)),
            }),
            CallState::Expired => Opened::Ended(Err(CorrelatorError::Timeout {
                callee: stored.call.callee.clone(),
                timeout_ms: opening.timeout_ms,
                correlation_id: fresh.correlation_id,
                clamped: opening.clamped,
            })),
        })
    }

    /// [`Self::record_call`] beside a request already on its way: a store that failed is tried
    /// again a few times (the request may reach the callee, whose answer needs the record to
    /// claim), the same call each time, so a create that did land is found and joined.
    async fn record_call_persistently(
        &self,
        caller: &AgentId,
        opening: &Opening,
    ) -> Result<Opened, CorrelatorError> {
        for pause in RECORD_RETRY_PAUSES {
            match self.record_call(caller, opening).await {
                Err(CorrelatorError::Store(err)) => {
                    tracing::debug!(correlation_id = %opening.call.correlation_id, error = %err, "a call's record beside its request failed; trying again");
                    tokio::time::sleep(pause).await;
                }
                opened => return Ok(own_record(opened?, opening)),
            }
        }
        Ok(own_record(
            self.record_call(caller, opening).await?,
            opening,
        ))
    }

    /// The record first, then the request: a parked call (its record counts it against the
    /// cap) or one whose id is not fresh (a retry may come after the duplicate window).
    pub(crate) async fn open_then_send(
        &self,
        caller: &AgentId,
        opening: &Opening,
        body: &str,
        request: &CallRequest,
        answer_to: mpsc::Sender<LocalAnswer>,
    ) -> Result<Sent<'_>, CorrelatorError> {
        let (stored, joined) = match self.record_call(caller, opening).await? {
            Opened::New(stored) => (stored, false),
            Opened::Joined(stored) => (stored, true),
            Opened::Ended(outcome) => return Ok(Sent::Ended(outcome)),
        };
        let held = stored
            .call
            .wait
            .then(|| hold(&self.waiting, &stored, answer_to));
        let report = self.send_request(&stored, joined, body, request).await?;
        Ok(Sent::Out {
            stored: Box::new(stored),
            joined,
            report,
            _held: held,
        })
    }

    /// The record and the request at once: a waiting call whose id was made moments ago, so
    /// every attempt of it delivers inside the duplicate window and the inbox stores the
    /// request once, whichever finishes first (docs/protocol.md §9, "Call ids"). A record that
    /// could not be made fails the call (the caller's retry makes it); a request that went
    /// nowhere takes back a new record.
    pub(crate) async fn open_beside(
        &self,
        caller: &AgentId,
        opening: &Opening,
        body: &str,
        request: &CallRequest,
        answer_to: mpsc::Sender<LocalAnswer>,
    ) -> Result<Sent<'_>, CorrelatorError> {
        // Held from the start (as on the record-first path), so the callee that reads the
        // request finds the call among its pending ones; the record's revision comes after.
        let provisional = CallEntry {
            call: opening.call.clone(),
            revision: 0,
        };
        let mut held = Some(hold(&self.waiting, &provisional, answer_to));
        let (opened, delivered) = tokio::join!(
            self.record_call_persistently(caller, opening),
            self.deliver_request(&opening.call, body, request)
        );
        let opened = opened.inspect_err(|err| {
            tracing::debug!(correlation_id = %opening.call.correlation_id, error = %err, "a call's record failed beside its request");
        })?;
        let (stored, joined) = match opened {
            Opened::New(stored) => (stored, false),
            Opened::Joined(stored) => (stored, true),
            Opened::Ended(outcome) => return Ok(Sent::Ended(outcome)),
        };
        let report = self.kept(&stored, joined, delivered).await?;
        // A retry may join a parked call of the same id: its answer goes to the inbox.
        if stored.call.wait {
            self.hold_record(&stored);
        } else {
            held = None;
        }
        Ok(Sent::Out {
            stored: Box::new(stored),
            joined,
            report,
            _held: held,
        })
    }

    /// Delivers the call's request, or for a retry delivers it again with the same message id
    /// — so it reaches the callee even if the first attempt died before delivering it — but
    /// only while the stream's duplicate window (120 s) still stores it once: a call older than
    /// [`REDELIVER_WITHIN`] was delivered long ago (or its first attempt failed and forgot
    /// it), and a copy then would be a second request. A new call nobody took is forgotten.
    async fn send_request(
        &self,
        stored: &CallEntry,
        joined: bool,
        body: &str,
        request: &CallRequest,
    ) -> Result<DeliveryReport, CorrelatorError> {
        let record = &stored.call;
        if joined && timestamp::now() - record.created_at >= REDELIVER_WITHIN {
            return Ok(DeliveryReport::default());
        }
        let delivered = self.deliver_request(record, body, request).await;
        self.kept(stored, joined, delivered).await
    }

    /// What a delivery of the call's request leaves. A retry's failed copy is no matter: the
    /// call exists and may have reached the callee (it keeps waiting for it). A new call's
    /// delivery that failed on its way (timed out, the store unavailable) may still have stored
    /// the request, so its record stays for the answer to claim and a retry to join (an answer
    /// nobody waits for goes to the caller goal's inbox). A new call nobody took is forgotten
    /// and refused — unless its record moved on meanwhile (a retry's copy reached the callee,
    /// who answered), which the forget leaves alone.
    async fn kept(
        &self,
        stored: &CallEntry,
        joined: bool,
        delivered: Result<DeliveryReport, CorrelatorError>,
    ) -> Result<DeliveryReport, CorrelatorError> {
        let refusal = match delivered {
            Ok(report) if !report.delivered_to.is_empty() || joined => return Ok(report),
            Ok(report) => CorrelatorError::Unreachable(report.unreachable_reasons.join("; ")),
            Err(err) if joined => {
                tracing::debug!(correlation_id = %stored.call.correlation_id, error = %err, "a retried call's request was not delivered again");
                return Ok(DeliveryReport::default());
            }
            Err(err) if err.may_have_delivered() => {
                // Nobody waits for it here now: in the open-call index, a sweep expires it at
                // its deadline (a parked call is there already).
                if stored.call.wait
                    && let Err(index) = self.store.reindex(&stored.call).await
                {
                    tracing::warn!(correlation_id = %stored.call.correlation_id, error = %index, "a call kept after a failed delivery was not indexed");
                }
                return Err(CorrelatorError::DeliverRequest(err.to_string().into()));
            }
            Err(err) => err,
        };
        if self.store.forget(stored).await? {
            Err(refusal)
        } else {
            Ok(DeliveryReport::default())
        }
    }

    /// The call's request into the callee's inboxes, through the one door as the caller's
    /// message (ACL and anti-loop apply), in a span of its own under the call's.
    async fn deliver_request(
        &self,
        record: &PendingCall,
        body: &str,
        request: &CallRequest,
    ) -> Result<DeliveryReport, CorrelatorError> {
        let mut metadata = request.metadata.clone();
        // Only the correlator says what budget a call has (docs/protocol.md §16).
        metadata.remove(switchboard_proto::budget::BUDGET_METADATA_KEY);
        if let Some(budget) = &record.budget {
            metadata.insert(
                switchboard_proto::budget::BUDGET_METADATA_KEY.to_owned(),
                serde_json::to_value(budget).unwrap_or_default(),
            );
        }
        metadata.insert(
            "call_chain".to_owned(),
            serde_json::to_value(&record.chain).unwrap_or_default(),
        );
        metadata.insert(
            "call_deadline".to_owned(),
            timestamp::format(record.deadline).into(),
        );
        let message = InboxMessage {
            from_agent_id: record.caller.clone(),
            // Without a goal the caller named, `caller_goal` is a fresh id no goal holds.
            from_goal_id: record.caller_goal,
            to_agent_id: record.callee.clone(),
            body: body.to_owned(),
            sent_at: timestamp::now(),
            correlation_id: Some(record.correlation_id),
            id: Some(record.request_id),
            kind: MessageKind::Request,
            in_reply_to: request.in_reply_to,
            expects_reply: true,
            ttl: None,
            trace: Vec::new(),
            parts: request.parts.clone(),
            task: None,
            callback: None,
            metadata,
            receipt: request.receipt,
            from_person: None,
            attachments: request.attachments.clone(),
        };
        let letter = Letter {
            to: Address::Agent(record.callee.to_string()),
            from_goal: request.from_goal_id,
            message,
        };
        let span = tracing::info_span!(
            "deliver",
            otel.name = %format!("{}.deliver", crate::SPEC.name),
            otel.kind = "internal",
            messaging.system = "nats",
            messaging.operation.type = "process",
            messaging.operation.name = "deliver",
            switchboard.agent_id = %record.caller,
            otel.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let delivery = self.door.deliver(Origin::Agent(&record.caller), letter);
        match tokio::time::timeout(DELIVERY_TIMEOUT, delivery.instrument(span.clone())).await {
            Ok(Ok(report)) => Ok(report),
            Ok(Err(err)) => {
                span.record("error.type", err.kind().as_str());
                span.record("otel.status_code", "ERROR");
                Err(CorrelatorError::FanoutRefused(err.into()))
            }
            Err(_) => Err(CorrelatorError::DeliverRequest(
                format!(
                    "delivering the request took more than {} s",
                    DELIVERY_TIMEOUT.as_secs()
                )
                .into(),
            )),
        }
    }
}

/// A record found existing where this attempt's own create may have landed (its
/// acknowledgement lost, the create tried again) is this attempt's own new record, not a
/// retry's: the same moment of opening names it.
fn own_record(opened: Opened, opening: &Opening) -> Opened {
    match opened {
        Opened::Joined(stored) if stored.call.created_at == opening.call.created_at => {
            Opened::New(stored)
        }
        opened => opened,
    }
}
