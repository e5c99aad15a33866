//! Streamed answers (issue 20): a callee answers in parts, `agent.reply.<id>` with
//! `partial: true`, then a final reply that ends the call.
//!
//! Rules:
//! - parts are numbered 1, 2, 3… by the call record's compare-and-set, so replicas taking parts
//!   of one call concurrently agree on the order; a part naming a number already taken is a
//!   duplicate (nothing sent again), one past the next is `bad_request`;
//! - every part is kept on the call record before it is sent (at most [`CALL_PARTS_MAX`], and
//!   the whole answer at most 64 KiB), so nothing a callee was told was taken can be lost: a
//!   waiting caller that missed one gets it read back, and `agent.calls.parts.<caller>` returns
//!   them to a caller that lost its connection;
//! - a waiting caller that asked for `stream` gets each part on its reply subject, in order,
//!   before the final answer; a parked caller gets each as a `kind: response` message with
//!   `metadata.part`; the final answer's `body` is every part's text joined, then the final's;
//! - only the call's callee sends parts, only while the call is open, and only its caller reads
//!   them back (anyone else is answered `not_found`, as for an unknown call).

use std::collections::BTreeMap;

use async_nats::Subject;
use serde_json::{Map, Value};
use switchboard_proto::call::{
    AnswerRoute, CALL_PARTS_MAX, CallPart, CallParts, CallPartsRequest, CallState, PendingCall,
    ReplyAck, ReplyRequest, StreamedPart, scoped_call_id,
};
use switchboard_proto::{
    AgentId, GoalId, InboxMessage, MAX_BODY_BYTES, MessageKind, new_id, subject, timestamp,
};
use uuid::Uuid;

use crate::correlator::{Correlator, check_callee, expired};
use crate::error::CorrelatorError;
use crate::store::{CallEntry, CallStore, may_be_indexed};

/// Compare-and-set retries of one part on its call.
const CAS_ATTEMPTS: usize = 8;

fn to_wire(call: &PendingCall, part: &StreamedPart) -> CallPart {
    CallPart {
        correlation_id: call.correlation_id,
        from_agent_id: call.callee.clone(),
        part: part.part,
        body: part.body.clone(),
        parts: part.parts.clone(),
        attachments: part.attachments.clone(),
        partial: true,
        at: part.at,
    }
}

/// A part's size as the call record stores it.
fn encoded_len(part: &StreamedPart) -> usize {
    serde_json::to_vec(part).map_or(usize::MAX, |bytes| bytes.len())
}

/// What the parts taken so far weigh, encoded.
pub(crate) fn streamed_bytes(parts: &[StreamedPart]) -> usize {
    parts.iter().map(encoded_len).fold(0, usize::saturating_add)
}

/// Parts a parked caller gets in its goal's inbox; later ones are on the record only
/// (`agent.calls.parts`), and the final response carries the whole answer.
const PARKED_PARTS_IN_INBOX: u32 = 16;

/// Where a call's answers go: straight to a waiting caller, or into the caller goal's inbox.
fn route(call: &PendingCall) -> AnswerRoute {
    if call.wait {
        AnswerRoute::Caller
    } else {
        AnswerRoute::Inbox
    }
}

/// What a partial reply is to its call.
enum NextPart {
    /// A retry of this part, taken already.
    Duplicate(u32),
    /// The next part, to take.
    Take(StreamedPart),
}

impl Correlator {
    /// A partial reply from `callee` (already through the message gates): numbered and kept on
    /// the call record, then sent to the caller.
    pub(crate) async fn reply_part(
        &self,
        callee: &AgentId,
        correlation_id: Uuid,
        body: &str,
        request: &ReplyRequest,
    ) -> Result<ReplyAck, CorrelatorError> {
        // A call this replica holds starts from the record it wrote last (no read).
        let mut held = self.held_record(&correlation_id);
        let mut granted = request.attachments.is_empty();
        for _ in 0..CAS_ATTEMPTS {
            let from_held = held.is_some();
            let stored = self.record_of(callee, held.take(), correlation_id).await?;
            let call = &stored.call;
            check_callee(call, callee)?;
            let taken = u32::try_from(call.streamed.len()).unwrap_or(u32::MAX);
            let next = taken.saturating_add(1);
            // A refusal is decided on a record read now, never on the one held (another
            // replica may have taken parts, or the answer, since).
            let refusing = request.part.is_some_and(|part| part == 0 || part > next)
                || call.state != CallState::Open
                || call.deadline <= timestamp::now()
                || next > CALL_PARTS_MAX;
            if from_held && refusing {
                continue;
            }
            let taken = match self.next_part(&stored, body, request).await? {
                NextPart::Duplicate(part) => {
                    return Ok(ReplyAck {
                        correlation_id,
                        delivered: route(call),
                        duplicate: true,
                        part: Some(part),
                    });
                }
                NextPart::Take(taken) => taken,
            };
            // Only a part that will be taken grants its files.
            if !granted {
                self.pass_files(callee, &call.caller, &request.attachments)
                    .await?;
                granted = true;
            }
            let mut updated = call.clone();
            updated.streamed.push(taken.clone());
            let Some(written) = self.store.replace(&stored, updated).await? else {
                continue;
            };
            self.hold_record(&written);
            let via = self.deliver_part(call, &to_wire(call, &taken)).await?;
            tracing::debug!(%correlation_id, part = next, ?via, "call part taken");
            return Ok(ReplyAck {
                correlation_id,
                delivered: via,
                duplicate: false,
                part: Some(next),
            });
        }
        Err(CorrelatorError::Contention(correlation_id))
    }

    /// What a partial reply is to the call as `stored`: a retry of a part already taken (a
    /// duplicate, also after the final reply), or the next part — refused when out of order,
    /// when the call has its answer or its deadline passed (ending it then), past
    /// [`CALL_PARTS_MAX`] parts, or past 64 KiB for the whole answer counted as stored (text
    /// escaped, structured parts included), so the record and the final answer stay within
    /// what a message may carry.
    async fn next_part(
        &self,
        stored: &CallEntry,
        body: &str,
        request: &ReplyRequest,
    ) -> Result<NextPart, CorrelatorError> {
        let call = &stored.call;
        let correlation_id = call.correlation_id;
        let taken = u32::try_from(call.streamed.len()).unwrap_or(u32::MAX);
        let next = taken.saturating_add(1);
        match request.part {
            Some(part) if part >= 1 && part <= taken => return Ok(NextPart::Duplicate(part)),
            Some(part) if part == 0 || part > next => {
                return Err(CorrelatorError::PartOutOfOrder {
                    correlation_id,
                    got: part,
                    next,
                });
            }
            _ => {}
        }
        match call.state {
            CallState::Answered => return Err(CorrelatorError::AnsweredAlready(correlation_id)),
            CallState::Expired => return Err(expired(call)),
            CallState::Open if call.deadline <= timestamp::now() => {
                self.expire(stored, may_be_indexed(call)).await?;
                return Err(expired(call));
            }
            CallState::Open => {}
        }
        if next > CALL_PARTS_MAX {
            return Err(CorrelatorError::StreamTooLong(format!(
                "call {correlation_id} took {CALL_PARTS_MAX} parts, its most: end it with a final \
                 reply"
            )));
        }
        let taken = StreamedPart {
            part: next,
            body: body.to_owned(),
            parts: request.parts.clone(),
            attachments: request.attachments.clone(),
            at: timestamp::now(),
        };
        let total = streamed_bytes(&call.streamed).saturating_add(encoded_len(&taken));
        if total > MAX_BODY_BYTES {
            return Err(CorrelatorError::StreamTooLong(format!(
                "the streamed answer would be {total} bytes encoded; the whole answer may be at \
                 most {MAX_BODY_BYTES} bytes (64 KiB)"
            )));
        }
        Ok(NextPart::Take(taken))
    }

    /// Sends a part: to the replica holding a waiting caller (which forwards it in order), or
    /// into a parked caller's goal as `kind: response` with `metadata.part`.
    async fn deliver_part(
        &self,
        call: &PendingCall,
        part: &CallPart,
    ) -> Result<AnswerRoute, CorrelatorError> {
        if call.wait {
            let payload = serde_json::to_vec(part)
                .map_err(|err| CorrelatorError::EncodeAnswer(err.into()))?;
            // At most once on the wire; the record is the durable copy the waiting replica
            // reads back when one is missing.
            if let Err(err) = self
                .client
                .publish(subject::call_answer(&call.correlation_id), payload.into())
                .await
            {
                tracing::warn!(correlation_id = %call.correlation_id, part = part.part, error = %err, "call part not sent; the caller reads it back");
            }
            return Ok(AnswerRoute::Caller);
        }
        if part.part > PARKED_PARTS_IN_INBOX {
            return Ok(AnswerRoute::Inbox);
        }
        let mut message = InboxMessage::new(
            call.callee.clone(),
            GoalId::new(),
            call.caller.clone(),
            part.body.as_str(),
        );
        message.id = Some(new_id());
        message.kind = MessageKind::Response;
        message.correlation_id = Some(call.correlation_id);
        message.in_reply_to = Some(call.request_id);
        message.parts = part.parts.clone();
        message.attachments = part.attachments.clone();
        let mut metadata = Map::new();
        metadata.insert("part".to_owned(), Value::from(part.part));
        metadata.insert("partial".to_owned(), Value::Bool(true));
        message.metadata = metadata;
        // Never at the cost of another message: a part that finds the caller's goal full is
        // left on the record (the final response joins it anyway); nor into a goal id that is
        // no longer the caller's.
        if !self.caller_owns_goal(call).await {
            return Ok(AnswerRoute::Inbox);
        }
        let payload = serde_json::to_vec(&message)
            .map_err(|err| CorrelatorError::EncodeAnswer(err.into()))?;
        let msg_id = format!(
            "part{}:{}:{}",
            part.part, call.correlation_id, call.caller_goal
        );
        let mut headers = switchboard_runtime::telemetry::traced_headers();
        headers.insert(switchboard_proto::HEADER_MSG_ID, msg_id.as_str());
        let stored = match self
            .js
            .publish_with_headers(subject::inbox(&call.caller_goal), headers, payload.into())
            .await
        {
            Ok(ack) => ack.await.map(|_| ()).map_err(|err| err.to_string()),
            Err(err) => Err(err.to_string()),
        };
        if let Err(err) = stored {
            tracing::info!(correlation_id = %call.correlation_id, part = part.part, error = %err, "call part not put in the caller's inbox; it is on the call record");
        }
        Ok(AnswerRoute::Inbox)
    }

    /// `agent.calls.parts.<caller>`: the parts after `after` of a call `caller` made, and its
    /// final answer once there is one (kept for streamed calls).
    pub async fn parts(
        &self,
        caller: &AgentId,
        request: &CallPartsRequest,
    ) -> Result<CallParts, CorrelatorError> {
        // The call's id, or the name its caller chose for it (docs/protocol.md §9, "Call ids"):
        // a streaming caller reads parts back before any reply told it the id.
        let named = request.correlation_id;
        let mut found = None;
        for id in [named, scoped_call_id(caller, named)] {
            if let Some(stored) = self.store.find(&id).await?
                && stored.call.caller == *caller
            {
                found = Some(stored.call);
                break;
            }
        }
        // Another agent's call reads as no call at all.
        let Some(call) = found else {
            return Err(CorrelatorError::UnknownCall(named));
        };
        let id = call.correlation_id;
        Ok(CallParts {
            correlation_id: id,
            state: call.state,
            parts: call
                .streamed
                .iter()
                .filter(|part| part.part > request.after)
                .map(|part| to_wire(&call, part))
                .collect(),
            answer: call.answer.clone(),
        })
    }
}

/// Forwards a streamed call's parts to its waiting caller's reply subject, in order, whatever
/// order they arrive in from the replicas that took them.
pub(crate) struct PartForwarder {
    client: async_nats::Client,
    /// The caller's reply subject; `None` when it did not ask for `stream` (parts are then
    /// only joined into the final answer).
    reply: Option<Subject>,
    /// The number of the next part to forward.
    next: u32,
    /// Parts that arrived before the ones ahead of them.
    early: BTreeMap<u32, CallPart>,
}

impl PartForwarder {
    /// A forwarder to `reply` (or none).
    pub(crate) fn new(client: async_nats::Client, reply: Option<Subject>) -> Self {
        Self {
            client,
            reply,
            next: 1,
            early: BTreeMap::new(),
        }
    }

    /// Takes a part that arrived; forwards it and any held behind it.
    pub(crate) async fn take(&mut self, part: CallPart) {
        if self.reply.is_none()
            || part.part < self.next
            || part.part > CALL_PARTS_MAX
            || self.early.len() >= CALL_PARTS_MAX as usize
        {
            return;
        }
        self.early.insert(part.part, part);
        self.flush().await;
    }

    /// Before the final answer of a call that had `streamed` parts: forwards every part not
    /// forwarded yet, read back from the call record when it did not arrive.
    pub(crate) async fn complete(&mut self, store: &CallStore, call: &PendingCall, streamed: u32) {
        if self.reply.is_none() || self.next > streamed {
            return;
        }
        match store.find(&call.correlation_id).await {
            Ok(Some(stored)) => {
                // The record's copy is the one the callee was told was taken.
                for part in &stored.call.streamed {
                    if part.part >= self.next {
                        self.early.insert(part.part, to_wire(&stored.call, part));
                    }
                }
            }
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(correlation_id = %call.correlation_id, error = %err, "missing call parts not read back; the caller can ask agent.calls.parts");
            }
        }
        self.flush().await;
    }

    async fn flush(&mut self) {
        let Some(reply) = self.reply.clone() else {
            return;
        };
        while let Some(part) = self.early.remove(&self.next) {
            match serde_json::to_vec(&part) {
                Ok(payload) => {
                    if let Err(err) = self.client.publish(reply.clone(), payload.into()).await {
                        tracing::warn!(part = part.part, error = %err, "call part not forwarded");
                    }
                }
                Err(err) => tracing::warn!(error = %err, "call part not encodable"),
            }
            self.next += 1;
        }
    }
}
