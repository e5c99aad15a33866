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
//!   any message (its removal tells nobody) — but never on the reader's path: the reader's
//!   fetch or ack publishes its receipts once, all together, and a receipt its sender's full
//!   goal refused waits in a bounded queue of this replica (`Backlog`) that makes the room
//!   and stores it after the reply (issue 37: a sender that kept its own goal full made each
//!   of its receipts make room there while the reader waited, 612 ms for a fetch and ack of
//!   64);
//! - a receipt goes only to a goal its sender still owns: one closed since the send (whose id
//!   someone else may have opened since) is told nothing.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::future::join_all;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use switchboard_proto::receipt::{
    PendingRead, ReceiptLevel, ReceiptState, SendStatusReply, SendStatusRequest,
};

use switchboard_delivery::receipts;
use switchboard_proto::{AgentId, GoalId};
use uuid::Uuid;

use crate::error::FanoutError;

/// Most receipts waiting for room in one sender goal: as many as the goal holds (more could
/// only push each other out). Past it the oldest waiting one is dropped for the new one.
const QUEUED_PER_GOAL: usize = switchboard_proto::INBOX_STORED_PER_GOAL.unsigned_abs() as usize;
/// Most receipts waiting for room in full goals on one replica, all goals together. Past it a
/// new receipt takes the place of its goal's oldest waiting one, or is dropped.
const QUEUED_MAX: usize = 8_192;
/// Full goals this replica makes room in for receipts at once.
const MAKING_ROOM_AT_ONCE: usize = 8;

/// One receipt as published: `(subject, Nats-Msg-Id, payload)`.
type Receipt = (String, String, Bytes);

/// Receipts their senders' full goals refused, waiting for this replica to make room there,
/// per goal in the order they were told (issue 37). A goal with an entry has a task storing
/// its receipts one by one; the task removes the entry once the goal's queue is empty. While
/// a goal has an entry, its next receipts join the queue instead of being published at once,
/// so a goal's receipts are stored in the order they were told (a `delivered` before its
/// `read`).
#[derive(Debug, Default)]
struct Backlog {
    queued: HashMap<GoalId, VecDeque<Receipt>>,
    total: usize,
}

/// The receipts waiting for room, shared by the clones of [`Receipts`].
#[derive(Debug)]
struct Waiting {
    backlog: Mutex<Backlog>,
    /// Receipts dropped because too many were waiting (see [`QUEUED_PER_GOAL`]).
    dropped: AtomicU64,
    /// Turns at making room, so a replica works on a few full goals at once.
    making_room: tokio::sync::Semaphore,
}

impl Default for Waiting {
    fn default() -> Self {
        Self {
            backlog: Mutex::default(),
            dropped: AtomicU64::new(0),
            making_room: tokio::sync::Semaphore::new(MAKING_ROOM_AT_ONCE),
        }
    }
}

/// The receipt side of the inbox service: records and receipt messages.
#[derive(Debug, Clone)]
pub struct Receipts {
    js: jetstream::Context,
    kv: kv::Store,
    /// `agent_cursors`: whether a sender still owns the goal its receipts go to.
    cursors: kv::Store,
    /// Receipts waiting for room in full sender goals, stored off the reader's path.
    waiting: Arc<Waiting>,
}

impl Receipts {
    /// Receipts written through `js` into the `agent_receipts` bucket `kv`, told only to goals
    /// their senders still own (by their cursors in `cursors`).
    pub fn new(js: jetstream::Context, kv: kv::Store, cursors: kv::Store) -> Self {
        Self {
            js,
            kv,
            cursors,
            waiting: Arc::default(),
        }
    }

    /// How many receipts this replica dropped because too many were waiting for room in full
    /// sender goals (for tests and diagnostics).
    pub fn dropped(&self) -> u64 {
        self.waiting.dropped.load(Ordering::Relaxed)
    }

    /// How many receipts wait for room in full sender goals on this replica right now (for
    /// tests and diagnostics).
    pub fn queued(&self) -> usize {
        self.waiting
            .backlog
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
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

    /// The `agent_receipts` bucket the records are in (the door writes a send's `stored`).
    pub fn bucket(&self) -> kv::Store {
        self.kv.clone()
    }

    /// Tells each sender in `owed` that `reader`'s `goal` got to `state` with its message, and
    /// records it. The receipt messages are published all together and their acks awaited, so
    /// a `delivered` is stored before the fetch that caused it is answered (and so before any
    /// `read` of the same message) — except one its sender's goal refused as full: making room
    /// there is the sender's problem, not the reader's, so that one (and every later one for
    /// that goal, to keep their order) is handed to this replica's queue (`Receipts::queue`)
    /// and stored after the reply. The records are written off the request's path too (a
    /// state only moves forward, so their order does not matter). A reader's fetch or ack
    /// costs one round of publishes, whatever the senders' goals hold.
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
        // says so).
        let wanted: Vec<&PendingRead> = owed
            .iter()
            .filter(|pending| state != ReceiptState::Read || pending.level == ReceiptLevel::Read)
            .collect();
        let owned = self.owned_sender_goals(&wanted).await;
        // Published at once, unless the goal already has receipts waiting for room.
        let mut now: Vec<(GoalId, Uuid, Receipt)> = Vec::new();
        for pending in wanted {
            if !owned.contains(&(pending.to_goal, pending.to_agent.clone())) {
                continue;
            }
            let Some(receipt) =
                switchboard_delivery::deliver::receipt_message(reader, goal, pending, state)
            else {
                continue;
            };
            if !self.queue_behind(pending.to_goal, &receipt) {
                now.push((pending.to_goal, pending.id, receipt));
            }
        }
        if now.is_empty() {
            return;
        }
        let batch: Vec<Receipt> = now.iter().map(|(_, _, receipt)| receipt.clone()).collect();
        let results = switchboard_runtime::publish::publish_all(&self.js, &batch).await;
        for ((to_goal, id, receipt), result) in now.into_iter().zip(results) {
            match result {
                Ok(_) => {}
                // The sender's goal is full: room is made there after the reply.
                Err(failed) if failed.full => self.queue(to_goal, receipt),
                Err(err) => {
                    tracing::warn!(message_id = %id, error = %err, "receipt not stored");
                }
            }
        }
    }

    /// The goals the senders of `wanted` sent from that they still own: one that no longer owns
    /// the goal it sent from is told nothing. Each sender goal is checked once, all at once.
    async fn owned_sender_goals(&self, wanted: &[&PendingRead]) -> HashSet<(GoalId, AgentId)> {
        let mut goals: Vec<(GoalId, AgentId)> = Vec::new();
        for pending in wanted {
            if !goals.iter().any(|(to_goal, to_agent)| {
                *to_goal == pending.to_goal && *to_agent == pending.to_agent
            }) {
                goals.push((pending.to_goal, pending.to_agent.clone()));
            }
        }
        let owns = join_all(
            goals
                .iter()
                .map(|(to_goal, to_agent)| self.still_owns(to_agent, to_goal)),
        )
        .await;
        goals
            .into_iter()
            .zip(owns)
            .filter_map(|(key, owns)| owns.then_some(key))
            .collect()
    }

    /// Queues `receipt` for `goal` when receipts for that goal are waiting already (its
    /// order kept); returns whether it did.
    fn queue_behind(&self, goal: GoalId, receipt: &Receipt) -> bool {
        let waiting = self
            .waiting
            .backlog
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .queued
            .contains_key(&goal);
        if waiting {
            self.queue(goal, receipt.clone());
        }
        waiting
    }

    /// Hands `receipt`, refused by its sender's full goal `goal`, to this replica's queue: a
    /// task per goal makes room there and stores the goal's receipts one by one, in order,
    /// off every request's path. Bounded: past [`QUEUED_PER_GOAL`] for one goal, or
    /// [`QUEUED_MAX`] in all, the goal's oldest waiting receipt is dropped for the new one
    /// (a full goal keeps its newest messages anyway), or the new one is dropped; each drop is
    /// counted ([`Receipts::dropped`]) and logged now and then.
    fn queue(&self, goal: GoalId, receipt: Receipt) {
        let (start, dropped) = {
            let mut guard = self
                .waiting
                .backlog
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let backlog = &mut *guard;
            let full = backlog.total >= QUEUED_MAX;
            let start = !backlog.queued.contains_key(&goal);
            let queue = backlog.queued.entry(goal).or_default();
            let mut dropped = false;
            if queue.len() >= QUEUED_PER_GOAL || (full && !queue.is_empty()) {
                queue.pop_front();
                queue.push_back(receipt);
                dropped = true;
            } else if full {
                dropped = true;
            } else {
                queue.push_back(receipt);
                backlog.total += 1;
            }
            if start && backlog.queued.get(&goal).is_some_and(VecDeque::is_empty) {
                // Nothing was queued for it after all.
                backlog.queued.remove(&goal);
                (false, dropped)
            } else {
                (start, dropped)
            }
        };
        if dropped {
            let count = self.waiting.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if count.is_power_of_two() {
                tracing::warn!(
                    goal_id = %goal,
                    dropped = count,
                    "receipts dropped: too many wait for room in their senders' full goals"
                );
            }
        }
        if start {
            tokio::spawn(store_queued(
                self.js.clone(),
                Arc::clone(&self.waiting),
                goal,
            ));
        }
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

/// Stores `goal`'s waiting receipts one by one, in order, each making room in the full goal
/// as any message does ([`switchboard_delivery::deliver::deliver`]); ends once none waits,
/// removing the goal's entry (under the same lock a new receipt is queued under, so none is
/// left behind).
async fn store_queued(js: jetstream::Context, waiting: Arc<Waiting>, goal: GoalId) {
    loop {
        // A few goals at a time; the semaphore is never closed. The turn comes first, so a
        // receipt leaves the queue (and its count) only when it is about to be stored: the
        // queue's bounds count every receipt this replica holds.
        let _turn = waiting.making_room.acquire().await.ok();
        let batch: Vec<Receipt> = {
            let mut backlog = waiting
                .backlog
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let batch: Vec<Receipt> = backlog
                .queued
                .get_mut(&goal)
                .map(|queue| queue.drain(..).collect())
                .unwrap_or_default();
            if batch.is_empty() {
                backlog.queued.remove(&goal);
                return;
            }
            backlog.total = backlog.total.saturating_sub(batch.len());
            batch
        };
        store_in_order(&js, &goal, &batch).await;
    }
}

/// Stores a goal's waiting receipts, oldest first: the first makes room as any message does
/// (a purge of what its reader read makes room for many), the rest go in one round of
/// publishes; from the first the goal refused again, the same once more. A receipt stored
/// twice is stored once (its `Nats-Msg-Id`).
async fn store_in_order(js: &jetstream::Context, goal: &GoalId, batch: &[Receipt]) {
    let mut rest = batch;
    while let Some(((subject, msg_id, payload), after)) = rest.split_first() {
        if let Err(err) =
            switchboard_delivery::deliver::deliver(js, subject, msg_id, payload.clone()).await
        {
            tracing::warn!(goal_id = %goal, error = %err, "receipt not stored");
        }
        if after.is_empty() {
            return;
        }
        let results = switchboard_runtime::publish::publish_all(js, after).await;
        let refused = results
            .iter()
            .position(|result| matches!(result, Err(failed) if failed.full));
        for result in &results {
            if let Err(err) = result
                && !err.full
            {
                tracing::warn!(goal_id = %goal, error = %err, "receipt not stored");
            }
        }
        match refused {
            Some(at) => rest = &after[at..],
            None => return,
        }
    }
}
