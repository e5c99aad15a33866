//! The call timeout sweep, and what follows a call's expiry wherever it is noticed.
//!
//! Every replica sweeps on its own timer: each open call past its deadline is expired with
//! compare-and-set, so across replicas exactly one expires it and tells a parked caller. A
//! reply that finds its call past the deadline expires it the same way ([`crate::calls`]); a
//! waiting caller's own replica answers it `timeout` when its wait ends.

use switchboard_proto::call::{CallEventKind, CallState, PendingCall};
use switchboard_proto::{ErrorReply, GoalId, InboxMessage, MessageKind, new_id, timestamp};
use time::OffsetDateTime;
use tracing::Instrument as _;

use crate::Correlator;
use crate::error::CorrelatorError;
use crate::store::CallEntry;

impl Correlator {
    /// One deadline sweep: every open call past its deadline is expired with compare-and-set,
    /// so across replicas exactly one does it (and sends the parked caller its notice).
    /// Returns how many this sweep expired.
    pub async fn sweep(&self, now: OffsetDateTime) -> Result<usize, CorrelatorError> {
        let mut expired = 0;
        for stored in self.store.open().await? {
            if stored.call.state != CallState::Open || stored.call.deadline > now {
                continue;
            }
            // In the trace the call was made in: its timeout notice joins the conversation.
            let span = switchboard_runtime::telemetry::span_for_record(
                "reply-correlator.deadline",
                crate::SPEC.name,
                stored.call.traceparent.as_deref(),
            );
            span.record(
                "switchboard.correlation_id",
                stored.call.correlation_id.to_string().as_str(),
            );
            let ended = async {
                match self.expire(&stored, true).await {
                    Ok(ended) => ended,
                    Err(err) => {
                        tracing::warn!(correlation_id = %stored.call.correlation_id, error = %err, "expiring a call failed");
                        false
                    }
                }
            }
            .instrument(span)
            .await;
            if ended {
                expired += 1;
            }
        }
        Ok(expired)
    }

    /// Ends `stored` as expired by compare-and-set (`indexed`: it may be in the open-call
    /// index) and, when this replica won the transition, tells its parties ([`Self::on_expired`]).
    /// False when the call changed meanwhile (answered, or expired by someone else).
    pub(crate) async fn expire(
        &self,
        stored: &CallEntry,
        indexed: bool,
    ) -> Result<bool, CorrelatorError> {
        if self
            .store
            .end(stored, CallState::Expired, indexed)
            .await?
            .is_none()
        {
            return Ok(false);
        }
        self.on_expired(&stored.call).await;
        Ok(true)
    }

    /// After a call expired (this replica won the transition): a parked caller is told in its
    /// inbox; a waiting caller's own replica answers it with `timeout`.
    pub(crate) async fn on_expired(&self, call: &PendingCall) {
        tracing::info!(correlation_id = %call.correlation_id, callee = %call.callee, "call expired");
        self.emit(CallEventKind::Expired, call, None).await;
        if call.wait {
            return;
        }
        let mut notice = InboxMessage::new(
            call.callee.clone(),
            GoalId::new(),
            call.caller.clone(),
            format!(
                "call {} to `{}` timed out at {} without an answer",
                call.correlation_id,
                call.callee,
                timestamp::format(call.deadline)
            ),
        );
        notice.id = Some(new_id());
        notice.kind = MessageKind::Notify;
        notice.correlation_id = Some(call.correlation_id);
        notice.in_reply_to = Some(call.request_id);
        notice
            .metadata
            .insert("switchboard".to_owned(), "call_timeout".into());
        if let Err(err) = self.to_caller_inbox(call, &notice, "timeout").await {
            // Logged in its wire form: kind, code and message.
            let err = ErrorReply::from(err);
            tracing::error!(correlation_id = %call.correlation_id, error = %err, "timeout notice not delivered");
        }
    }
}
