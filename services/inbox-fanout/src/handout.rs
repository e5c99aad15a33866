//! Recording hand-outs (docs/protocol.md §7, "Hand-out is at least once"): the receipts a
//! first hand-out makes due, and the bookkeeping a held fetch woken by a new message writes
//! after its reply — the record the fetch prepared, or on a lost compare-and-set the same
//! changes applied again to the leader's record (each only moves forward).

use switchboard_proto::inbox::{CursorRecord, FetchedMessage, owned_by};
use switchboard_proto::receipt::{PendingRead, ReceiptState};
use switchboard_proto::{AgentId, GoalId};

use crate::receipts::Receipts;
use crate::store::{Cas, InboxStore};

/// Compare-and-set attempts of one hand-out's bookkeeping before it gives up (logged: the
/// reader is handed the messages again and drops the repeats).
const CAS_ATTEMPTS: u32 = 64;

/// A hand-out answered before it was recorded.
pub(crate) struct HandedOut {
    pub(crate) goal: GoalId,
    /// The fetch's `ack_through`, applied with it.
    pub(crate) through: Option<u64>,
    pub(crate) first: u64,
    pub(crate) last: u64,
    /// It did not start at the oldest unread message (`after`).
    pub(crate) past_head: bool,
    pub(crate) messages: Vec<FetchedMessage>,
}

/// Writes a hand-out's bookkeeping after its reply: the record the fetch prepared, or on a
/// lost compare-and-set the same changes applied to the leader's record again (each only
/// moves forward), then the receipts they make due.
pub(crate) struct Bookkeeping {
    pub(crate) store: InboxStore,
    pub(crate) receipts: Receipts,
    pub(crate) caller: AgentId,
}

impl Bookkeeping {
    pub(crate) async fn write(
        self,
        handed: HandedOut,
        record: CursorRecord,
        revision: u64,
        delivered: Vec<PendingRead>,
        reads: Vec<PendingRead>,
    ) {
        let goal = handed.goal;
        let (mut record, mut revision, mut delivered, mut reads) =
            (record, revision, delivered, reads);
        let mut attempts = 0;
        loop {
            match self.store.put_cursor(&goal, &record, revision).await {
                Ok(Cas::Done(_)) => break,
                Ok(Cas::Conflict) => {}
                Err(err) => {
                    // The reader is handed these messages again (it drops the repeats).
                    tracing::warn!(goal_id = %goal, error = %err, "a hand-out was not recorded");
                    return;
                }
            }
            attempts += 1;
            if attempts >= CAS_ATTEMPTS {
                tracing::warn!(goal_id = %goal, "a hand-out was not recorded: the cursor kept changing");
                return;
            }
            switchboard_runtime::store::cas_backoff(attempts).await;
            let fresh = self.store.cursor_from_leader(&goal).await;
            let Ok(Some((fresh, fresh_revision))) = fresh else {
                // The goal closed meanwhile (or cannot be read): nothing to record.
                return;
            };
            if owned_by(Some(&fresh), &self.caller).is_none() {
                return;
            }
            (record, revision) = (fresh, fresh_revision);
            (delivered, reads) = handed.apply(&mut record);
        }
        let receipts = &self.receipts;
        receipts
            .tell(&self.caller, &goal, &delivered, ReceiptState::Delivered)
            .await;
        receipts
            .tell(&self.caller, &goal, &reads, ReceiptState::Read)
            .await;
    }
}

impl HandedOut {
    /// Applies the hand-out (and its `ack_through`) to `record` again; returns the `delivered`
    /// receipts of first hand-outs and the `read` receipts now due.
    fn apply(&self, record: &mut CursorRecord) -> (Vec<PendingRead>, Vec<PendingRead>) {
        if let Some(through) = self.through {
            record.advance(through);
        }
        let handed_before = record.handed;
        if self.past_head || record.cursor >= self.first {
            record.hand_out_later(self.last);
        } else {
            record.hand_out(self.first, self.last);
        }
        let delivered = first_hand_outs(record, &self.messages, handed_before);
        (delivered, record.reads_due())
    }
}

/// The receipts owed for `messages` handed out for the first time (above `handed_before`):
/// returned, to send `delivered` now, and owed on `record` until the cursor passes them.
pub(crate) fn first_hand_outs(
    record: &mut CursorRecord,
    messages: &[FetchedMessage],
    handed_before: u64,
) -> Vec<PendingRead> {
    let mut delivered = Vec::new();
    for fetched in messages.iter().filter(|m| m.seq > handed_before) {
        let Some(pending) = switchboard_delivery::receipts::owed(&fetched.message, fetched.seq)
        else {
            continue;
        };
        record.owe_read(pending.clone());
        delivered.push(pending);
    }
    delivered
}
