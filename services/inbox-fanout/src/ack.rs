//! Acknowledging (docs/protocol.md §7, `ack`): `agent.inbox.ack.<agent_id>` moves the goal's
//! cursor through a sequence, or rejects one message into the dead letters and moves the
//! cursor through it. Owner-only, cumulative, only forward, never past the goal's newest
//! message (an ack may name a message whose hand-out is not recorded yet).

use switchboard_proto::AgentId;
use switchboard_proto::inbox::{AckOp, AckReply, AckRequest};
use switchboard_proto::receipt::ReceiptState;

use crate::error::FanoutError;
use crate::reader::Reader;
use crate::store::Cas;

impl Reader {
    /// ack: move the cursor through `through`, or dead-letter `seq` with a reason and move the
    /// cursor through it.
    pub async fn ack(
        &self,
        caller: &AgentId,
        request: &AckRequest,
    ) -> Result<AckReply, FanoutError> {
        let op = request.op().map_err(FanoutError::BadRead)?;
        let goal = request.goal_id;
        let mut attempts = 0;
        let through = match &op {
            AckOp::Through(through) | AckOp::Reject { seq: through, .. } => *through,
        };
        // The first attempt may start from the cursor this replica saw a moment ago: a move is a
        // compare-and-set, and one at or below a stale cursor is at or below the real one.
        let mut recent = self.recent_owned(caller, &goal);
        loop {
            let from_recent = recent.is_some();
            let (mut record, mut revision) = match recent.take() {
                Some(known) => known,
                None => self.owned(caller, &goal).await?,
            };
            if through > record.handed {
                (record, revision) = self.owned_from_leader(caller, &goal).await?;
            }
            self.within_stored(&goal, through, &record, "sequence")
                .await?;
            if through <= record.cursor && from_recent {
                // Answered only from a cursor read now (the goal may have closed).
                continue;
            }
            if through <= record.cursor {
                // Done already (a retried ack or reject): nothing to do.
                return Ok(AckReply {
                    goal_id: goal,
                    cursor: record.cursor,
                });
            }
            if let AckOp::Reject { seq, reason } = &op {
                // Decided on the leader's cursor (a lagging replica's could letter a message
                // already acknowledged), and only for a message of this goal still stored: a
                // sequence of another goal's message, or one evicted, writes no letter.
                (record, revision) = self.owned_from_leader(caller, &goal).await?;
                if through <= record.cursor {
                    return Ok(AckReply {
                        goal_id: goal,
                        cursor: record.cursor,
                    });
                }
                if let Some(message) = self.store.message(&goal, *seq).await? {
                    let deliveries = if record.head == *seq {
                        record.head_deliveries
                    } else {
                        1
                    };
                    self.store
                        .dead_letter(&goal, message, reason, deliveries)
                        .await?;
                } else {
                    tracing::debug!(goal_id = %goal, seq, "rejected sequence is not a stored message of the goal; no letter");
                }
                // Rejected, not read: no `read` receipt for it.
                record.forget_read(*seq);
            }
            record.advance(through);
            let reads = record.reads_due();
            if let Cas::Done(_) = self.store.put_cursor(&goal, &record, revision).await? {
                self.receipts
                    .tell(caller, &goal, &reads, ReceiptState::Read)
                    .await;
                return Ok(AckReply {
                    goal_id: goal,
                    cursor: record.cursor,
                });
            }
            self.conflict(&goal, &mut attempts).await?;
        }
    }
}
