//! Answering a call: `agent.reply.<callee>` claims the call by compare-and-set and delivers
//! the answer exactly once, to the waiting caller or into the caller goal's inbox; a partial
//! reply goes to [`crate::parts`] instead. The final answer joins the text of every part sent
//! before it.

use switchboard_delivery::door::DoorError;
use switchboard_delivery::files::Files;
use switchboard_proto::call::{
    AnswerRoute, CallAnswer, CallEventKind, CallState, PendingCall, ReplyAck, ReplyRequest,
};
use switchboard_proto::files::Attachment;
use switchboard_proto::send::{check_attachments, check_body, check_content_fits};
use switchboard_proto::{
    AgentId, ErrorKind, ErrorReply, GoalId, InboxMessage, MessageKind, new_id, subject, timestamp,
};
use uuid::Uuid;

/// A reply refused as malformed (`bad_request`).
fn bad_request(message: String) -> CorrelatorError {
    CorrelatorError::Gate(ErrorReply::new(ErrorKind::BadRequest, message))
}

use crate::correlator::{Correlator, HANDOVER_TIMEOUT, check_callee, expired};
use crate::error::CorrelatorError;
use crate::store::{CallEntry, may_be_indexed};

/// Compare-and-set retries on one call.
const CAS_ATTEMPTS: usize = 8;
/// A final reply, checked: who answers, its text, and whether it carries nothing at all.
struct Reply<'r> {
    callee: &'r AgentId,
    body: &'r str,
    bare: bool,
    request: &'r ReplyRequest,
}

/// The checks a reply passes before any call is read: a `correlation_id`; an `error` only on
/// its own (final, no text or parts); the body check of a send unless the final reply is bare
/// (which may only end a streamed answer, checked once the call is read); and an answer that
/// fits a stored message. Returns the call's id, the body and whether the reply is bare.
fn check_reply(request: &ReplyRequest) -> Result<(Uuid, &str, bool), CorrelatorError> {
    let Some(correlation_id) = request.correlation_id else {
        return Err(CorrelatorError::MissingCorrelationId);
    };
    let text = request.message.as_deref().unwrap_or("");
    let bare = text.is_empty() && request.parts.is_empty();
    check_attachments(&request.attachments).map_err(CorrelatorError::Gate)?;
    if !request.attachments.is_empty() && request.error.is_some() {
        return Err(bad_request(
            "attachments go on an answer or a part of one, not on a reply with `error`".to_owned(),
        ));
    }
    if let Some(error) = &request.error {
        error.check().map_err(bad_request)?;
        if request.partial || !bare {
            return Err(bad_request(
                "a reply with `error` is final and carries no `message` or `parts`".to_owned(),
            ));
        }
    }
    let body = if bare && !request.partial {
        ""
    } else {
        check_body(Some(text)).map_err(CorrelatorError::Gate)?
    };
    // An answer that could not be stored must be refused before the call is claimed.
    check_content_fits("the answer with its parts", body, &request.parts, &[])
        .map_err(CorrelatorError::Gate)?;
    Ok((correlation_id, body, bare))
}

/// A claim younger than this is a delivery in progress, not a failed one: a second reply
/// must not deliver again.
const CLAIM_IN_PROGRESS: time::Duration = time::Duration::seconds(10);

impl Correlator {
    /// reply_to_peer: answers the call named by `correlation_id`; only its callee may. The
    /// reply is checked, then the call is read (or, held by this replica, taken as it was
    /// stored) and answered by the rule its state calls for, read again on a lost race.
    pub async fn reply(
        &self,
        callee: &AgentId,
        request: ReplyRequest,
    ) -> Result<ReplyAck, CorrelatorError> {
        let (correlation_id, body, bare) = check_reply(&request)?;
        if request.partial {
            return self
                .reply_part(callee, correlation_id, body, &request)
                .await;
        }
        let reply = Reply {
            callee,
            body,
            bare,
            request: &request,
        };
        // A call this replica holds is claimed on the revision it stored first (no read); if
        // it changed since, the claim fails and the call is read as usual.
        let mut held = self.held_record(&correlation_id);
        let mut granted = request.attachments.is_empty();
        for _ in 0..CAS_ATTEMPTS {
            let stored = self.record_of(callee, held.take(), correlation_id).await?;
            check_callee(&stored.call, callee)?;
            if !granted {
                self.pass_files(callee, &stored.call.caller, &request.attachments)
                    .await?;
                granted = true;
            }
            if let Some(ack) = self.reply_to(&stored, &reply).await? {
                return Ok(ack);
            }
        }
        Err(CorrelatorError::Contention(correlation_id))
    }

    /// Answers `stored` by the rule its state calls for; `None` when another writer changed
    /// it first (read it again).
    async fn reply_to(
        &self,
        stored: &CallEntry,
        reply: &Reply<'_>,
    ) -> Result<Option<ReplyAck>, CorrelatorError> {
        let call = &stored.call;
        let ack = |delivered, duplicate| ReplyAck {
            correlation_id: call.correlation_id,
            delivered,
            duplicate,
            part: None,
        };
        match (call.state, call.answered_via) {
            (CallState::Expired, _) => {
                self.emit(CallEventKind::LateAnswer, call, Some(reply.body))
                    .await;
                Err(expired(call))
            }
            (CallState::Answered, Some(via)) => {
                // A retry of a reply whose first attempt may have died before its event was
                // stored: send it again (stored once by its message id).
                self.emit_answered(call, reply.body).await;
                Ok(Some(ack(via, true)))
            }
            (CallState::Answered, None)
                if call
                    .claimed_at
                    .is_some_and(|at| timestamp::now() - at < CLAIM_IN_PROGRESS) =>
            {
                // Another reply claimed it a moment ago and is delivering right now.
                Err(CorrelatorError::AnswerInProgress(call.correlation_id))
            }
            (CallState::Answered, None) => Ok(self
                .deliver_again(stored, reply)
                .await?
                .map(|via| ack(via, false))),
            (CallState::Open, _) if call.deadline <= timestamp::now() => {
                if self.expire(stored, may_be_indexed(call)).await? {
                    return Err(expired(call));
                }
                Ok(None)
            }
            (CallState::Open, _) => Ok(self
                .answer_open(stored, reply)
                .await?
                .map(|via| ack(via, false))),
        }
    }

    /// A call claimed by an attempt that did not finish delivering: claimed anew (so
    /// concurrent retries cannot both deliver), then delivered again (an inbox copy is
    /// de-duplicated by its message id).
    async fn deliver_again(
        &self,
        stored: &CallEntry,
        reply: &Reply<'_>,
    ) -> Result<Option<AnswerRoute>, CorrelatorError> {
        let call = &stored.call;
        let Some(reclaimed) = self
            .store
            .transition(stored, CallState::Answered, None)
            .await?
        else {
            return Ok(None);
        };
        let (callee, body, request) = (reply.callee, reply.body, reply.request);
        let via = self.deliver_answer(call, callee, body, request).await?;
        let kept = self.kept_answer(call, callee, body, request);
        self.store.answered(&reclaimed, via, kept).await?;
        self.emit_answered(call, body).await;
        Ok(Some(via))
    }

    /// An open call's answer: the whole answer must fit a message, then the winner of the
    /// claim delivers it, exactly once, and the trail's `answered` event is stored before the
    /// callee hears the reply went through (killed before it, the callee retries and the retry
    /// sends it; the caller already has its answer, so this is off the caller's path).
    async fn answer_open(
        &self,
        stored: &CallEntry,
        reply: &Reply<'_>,
    ) -> Result<Option<AnswerRoute>, CorrelatorError> {
        let call = &stored.call;
        let (body, request) = (reply.body, reply.request);
        if reply.bare && request.error.is_none() && call.streamed.is_empty() {
            return Err(CorrelatorError::Gate(ErrorReply::new(
                ErrorKind::EmptyMessage,
                "`message` is required and must not be empty (an empty final reply only ends \
                 a streamed answer)",
            )));
        }
        // The whole answer (every part, then this reply) must fit a message: it may be
        // written into an inbox.
        if !call.streamed.is_empty() {
            let joined = call.streamed_text() + body;
            check_content_fits(
                "the streamed answer with this final reply",
                &joined,
                &request.parts,
                &[],
            )
            .map_err(CorrelatorError::Gate)?;
        }
        let via = if self.holds(&call.correlation_id) {
            self.answer_here(stored, reply).await?
        } else {
            self.answer_there(stored, reply).await?
        };
        let Some(via) = via else {
            return Ok(None);
        };
        tracing::info!(correlation_id = %call.correlation_id, ?via, "call answered");
        self.emit_answered(call, body).await;
        Ok(Some(via))
    }

    /// Held by this replica (its caller waits here): claimed and recorded as answered to the
    /// caller in one write, then handed over in process (the wait takes the call out of the
    /// index, if it put it there) — or, when the wait ended meanwhile, delivered the NATS way
    /// or into the inbox, and the route recorded.
    async fn answer_here(
        &self,
        stored: &CallEntry,
        reply: &Reply<'_>,
    ) -> Result<Option<AnswerRoute>, CorrelatorError> {
        let call = &stored.call;
        let answer = Self::final_answer(call, reply.callee, reply.body, reply.request);
        let Some(claimed) = self.store.answered_here(stored, answer.clone()).await? else {
            return Ok(None);
        };
        if self.hand_over_here(&answer).await {
            return Ok(Some(AnswerRoute::Caller));
        }
        let via = self
            .deliver_answer(call, reply.callee, reply.body, reply.request)
            .await?;
        self.store.answered(&claimed, via, Some(answer)).await?;
        Ok(Some(via))
    }

    /// Held elsewhere (or by nobody): claimed, delivered with the index entry removed
    /// meanwhile, and the route recorded.
    async fn answer_there(
        &self,
        stored: &CallEntry,
        reply: &Reply<'_>,
    ) -> Result<Option<AnswerRoute>, CorrelatorError> {
        let call = &stored.call;
        let Some(claimed) = self
            .store
            .transition(stored, CallState::Answered, None)
            .await?
        else {
            return Ok(None);
        };
        let unindex = async {
            if may_be_indexed(call) {
                self.store.unindex(&call.correlation_id).await;
            }
        };
        let (callee, body, request) = (reply.callee, reply.body, reply.request);
        let (via, ()) = tokio::join!(self.deliver_answer(call, callee, body, request), unindex);
        let via = via?;
        let kept = self.kept_answer(call, callee, body, request);
        self.store.answered(&claimed, via, kept).await?;
        Ok(Some(via))
    }

    /// The callee may pass each of `attachments` on, and the caller may read them from now on
    /// (before the answer or the part reaches it, by either route).
    pub(crate) async fn pass_files(
        &self,
        callee: &AgentId,
        caller: &AgentId,
        attachments: &[Attachment],
    ) -> Result<(), CorrelatorError> {
        let files = self.door.files();
        let refused = |err| CorrelatorError::Gate(DoorError::from(err).into());
        Files::check_on(files, callee, attachments)
            .await
            .map_err(refused)?;
        Files::grant_on(files, callee, attachments, std::slice::from_ref(caller))
            .await
            .map_err(refused)
    }

    /// The final answer: every part's text so far, then the final reply's.
    fn final_answer(
        call: &PendingCall,
        callee: &AgentId,
        body: &str,
        request: &ReplyRequest,
    ) -> CallAnswer {
        CallAnswer {
            correlation_id: call.correlation_id,
            from_agent_id: callee.clone(),
            body: call.streamed_text() + body,
            parts: request.parts.clone(),
            answered_at: timestamp::now(),
            clamped: false,
            streamed: u32::try_from(call.streamed.len()).unwrap_or(u32::MAX),
            error: request.error.clone(),
            attachments: request.attachments.clone(),
        }
    }

    /// The final answer a streamed call keeps on its record (for `agent.calls.parts`).
    fn kept_answer(
        &self,
        call: &PendingCall,
        callee: &AgentId,
        body: &str,
        request: &ReplyRequest,
    ) -> Option<CallAnswer> {
        // A waiting call keeps it too: a caller that retries the call by its id (the replica
        // that held it went away) is given the answer from the record.
        (call.wait || call.stream || !call.streamed.is_empty())
            .then(|| Self::final_answer(call, callee, body, request))
    }

    async fn deliver_answer(
        &self,
        call: &PendingCall,
        callee: &AgentId,
        body: &str,
        request: &ReplyRequest,
    ) -> Result<AnswerRoute, CorrelatorError> {
        let answer = Self::final_answer(call, callee, body, request);
        if call.wait {
            if self.hand_over_here(&answer).await {
                return Ok(AnswerRoute::Caller);
            }
            let payload = serde_json::to_vec(&answer)
                .map_err(|err| CorrelatorError::EncodeAnswer(err.into()))?;
            let handed = tokio::time::timeout(
                HANDOVER_TIMEOUT,
                self.client
                    .request(subject::call_answer(&call.correlation_id), payload.into()),
            )
            .await;
            if matches!(handed, Ok(Ok(_))) {
                return Ok(AnswerRoute::Caller);
            }
            tracing::info!(correlation_id = %call.correlation_id, "no waiting caller took the answer; delivering it to the inbox");
        }
        let mut message = InboxMessage::new(
            callee.clone(),
            GoalId::new(),
            call.caller.clone(),
            answer.body,
        );
        message.id = Some(new_id());
        message.kind = MessageKind::Response;
        message.correlation_id = Some(call.correlation_id);
        message.in_reply_to = Some(call.request_id);
        message.parts = request.parts.clone();
        message.attachments = request.attachments.clone();
        if answer.streamed > 0 {
            message
                .metadata
                .insert("streamed".to_owned(), answer.streamed.into());
        }
        // A failure reaches a parked caller as the response's `metadata.error`.
        if let Some(error) = &answer.error
            && let Ok(error) = serde_json::to_value(error)
        {
            message.metadata.insert("error".to_owned(), error);
        }
        self.to_caller_inbox(call, &message, "response").await?;
        Ok(AnswerRoute::Inbox)
    }
}
