//! Receipts (docs/protocol.md "Receipts"): the sender of a message with `receipt` learns, per
//! receiving goal, when the goal's reader was first handed it (`delivered`) and when the goal's
//! cursor passed it (`read`), as `kind: receipt` messages in the goal it sent from; and
//! `agent.send.status.<agent_id>` answers where each copy is.
//!
//! Rules:
//! - only the sender may ask about a message: any other caller, and an unknown id, get
//!   `not_found` alike;
//! - each receipt is stored once per (message, goal, state) whatever the retries, and a state
//!   never moves back;
//! - a receipt is never itself receipted, and a full sender goal makes room for it like for
//!   any message (its removal tells nobody);
//! - a receipt goes only to a goal its sender still owns: one closed since the send (whose id
//!   someone else may have opened since) is told nothing.

use async_nats::jetstream::{self, kv};
use futures::future::join_all;
use std::collections::HashMap;
use switchboard_proto::receipt::{
    PendingRead, ReceiptLevel, ReceiptState, SendStatusReply, SendStatusRequest,
};

use switchboard_delivery::receipts;
use switchboard_proto::{AgentId, GoalId};
use uuid::Uuid;

use crate::error::FanoutError;

/// The receipt side of the inbox service: records and receipt messages.
#[derive(Debug, Clone)]
pub struct Receipts {
    js: jetstream::Context,
    kv: kv::Store,
    /// `agent_cursors`: whether a sender still owns the goal its receipts go to.
    cursors: kv::Store,
}

impl Receipts {
    /// Receipts written through `js` into the `agent_receipts` bucket `kv`, told only to goals
    /// their senders still own (by their cursors in `cursors`).
    pub fn new(js: jetstream::Context, kv: kv::Store, cursors: kv::Store) -> Self {
        Self { js, kv, cursors }
    }

    /// Whether `agent` still owns `goal`: a goal closed since the send (and perhaps opened
    /// again by someone else under the same id) gets no receipt.
    async fn still_owns(&self, agent: &AgentId, goal: &GoalId) -> bool {
        match switchboard_delivery::room::goal_still_owned(&self.cursors, goal, agent).await {
            Ok(owned) => owned,
            Err(err) => {
                tracing::warn!(goal_id = %goal, error = %err, "receipt not sent: the sender's goal could not be checked");
                false
            }
        }
    }

    /// Records message `id` from `sender` as stored in each of `goals` (receiving agent, goal).
    pub(crate) async fn stored(&self, id: Uuid, sender: &AgentId, goals: &[(AgentId, GoalId)]) {
        receipts::advance_logged(&self.kv, id, sender, goals, ReceiptState::Stored).await;
    }

    /// Drops `goals` from message `id`'s record: their copies were never stored.
    pub(crate) async fn not_stored(&self, id: Uuid, sender: &AgentId, goals: &[GoalId]) {
        if let Err(err) = receipts::forget(&self.kv, id, sender, goals).await {
            tracing::warn!(message_id = %id, error = %err, "receipt record keeps goals that were never stored");
        }
    }

    /// Tells each sender in `owed` that `reader`'s `goal` got to `state` with its message, and
    /// records it. The receipt messages are awaited, so a `delivered` is stored before the
    /// fetch that caused it is answered (and so before any `read` of the same message); the
    /// records are written off the request's path (a state only moves forward, so their order
    /// does not matter), so a reader's fetch or ack costs one publish per receipt.
    pub(crate) async fn tell(
        &self,
        reader: &AgentId,
        goal: &GoalId,
        owed: &[PendingRead],
        state: ReceiptState,
    ) {
        if owed.is_empty() {
            return;
        }
        let copy = [(reader.clone(), *goal)];
        let records: Vec<(Uuid, AgentId)> = owed
            .iter()
            .map(|pending| (pending.id, pending.to_agent.clone()))
            .collect();
        let kv = self.kv.clone();
        tokio::spawn(async move {
            join_all(
                records
                    .iter()
                    .map(|(id, sender)| receipts::advance_logged(&kv, *id, sender, &copy, state)),
            )
            .await;
        });
        // A sender that asked only for `delivered` is not told of the read (its record still
        // says so), and one that no longer owns the goal it sent from is told nothing.
        let mut owned: HashMap<GoalId, bool> = HashMap::new();
        let mut told = Vec::new();
        for pending in owed {
            if state == ReceiptState::Read && pending.level != ReceiptLevel::Read {
                continue;
            }
            let owns = match owned.get(&pending.to_goal) {
                Some(owns) => *owns,
                None => {
                    let owns = self.still_owns(&pending.to_agent, &pending.to_goal).await;
                    owned.insert(pending.to_goal, owns);
                    owns
                }
            };
            if owns {
                told.push(switchboard_delivery::deliver::tell(
                    &self.js, reader, goal, pending, state,
                ));
            }
        }
        join_all(told).await;
    }

    /// `agent.send.status.<caller>`: every receiving goal's state of a message `caller` sent
    /// with `receipt`.
    pub async fn status(
        &self,
        caller: &AgentId,
        request: &SendStatusRequest,
    ) -> Result<SendStatusReply, FanoutError> {
        receipts::status(&self.kv, caller, request.message_id)
            .await
            .map_err(FanoutError::Receipts)?
            .ok_or(FanoutError::NoReceipt(request.message_id))
    }
}
