//! Delivering into a goal inbox (docs/protocol.md §7, "The inbox cap"): a durable publish
//! that, when the goal is full, makes room in it first ([`crate::room`]) — purging what its
//! reader has read, else evicting the oldest waiting message of the sender holding the most of
//! the goal with a notice to its sender, or refusing a sender holding its share under the
//! owner's `overflow: refuse` — and the receipts owed to senders.
//!
//! Publishers to one goal from one process take turns at making room, so a burst does not
//! evict more than it needs.

use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use serde_json::{Map, Value};
use switchboard_proto::receipt::{PendingRead, RECEIPT_MARK, ReceiptState};
use switchboard_proto::{AgentId, GoalId, InboxMessage, MessageKind, subject, timestamp};
use switchboard_runtime::publish::{
    PublishFailure, Published, json_payload, publish_all, publish_durable,
};

use crate::room::{self, Room};

/// How many times one publish makes room in a full goal inbox before it gives up (publishers
/// racing for the same goal may each lose a few rounds).
const ROOM_ROUNDS: u32 = 32;
/// How long a publisher waits for its turn to make room in a goal before it goes ahead
/// without (publishers in one process take turns per goal; see [`with_room`]).
const TURN_WAIT: Duration = Duration::from_millis(500);
/// Turns for making room, by goal (striped: goals that share a stripe take turns too).
const ROOM_TURNS: usize = 64;

/// The turn publishers to `goal` from this process take to make room in it.
fn room_turn(goal: &GoalId) -> &'static tokio::sync::Mutex<()> {
    static TURNS: std::sync::LazyLock<Vec<tokio::sync::Mutex<()>>> =
        std::sync::LazyLock::new(|| {
            (0..ROOM_TURNS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect()
        });
    let stripe = usize::from(goal.uuid().as_bytes()[15]) % ROOM_TURNS;
    &TURNS[stripe]
}

/// Publishes `payload` into the goal inbox `subject` with `Nats-Msg-Id: msg_id`, as
/// [`publish_durable`] does, making room when the goal is full. A failure with
/// [`PublishFailure::full`] means the goal's owner refuses new messages while full.
/// Any other subject is published to as [`publish_durable`] would.
pub async fn deliver(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: Bytes,
) -> Result<Published, PublishFailure> {
    let first = publish_durable(js, subject, msg_id, payload.clone()).await;
    with_room(js, subject, msg_id, payload, first).await
}

/// Encodes `value` as JSON and delivers it as [`deliver`] does.
pub async fn deliver_json<T: serde::Serialize>(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    value: &T,
) -> Result<Published, PublishFailure> {
    deliver(js, subject, msg_id, json_payload(subject, value)?).await
}

/// Delivers several messages (subject, `Nats-Msg-Id`, payload) at once: every publish is sent
/// before any ack is awaited ([`publish_all`]), then each one refused by a full goal is
/// delivered as [`deliver`] would. Results come back in input order.
pub async fn deliver_all(
    js: &jetstream::Context,
    messages: &[(String, String, Bytes)],
) -> Vec<Result<Published, PublishFailure>> {
    let first = publish_all(js, messages).await;
    let outcomes = messages
        .iter()
        .zip(first)
        .map(|((subject, msg_id, payload), outcome)| {
            with_room(js, subject, msg_id, payload.clone(), outcome)
        });
    futures::future::join_all(outcomes).await
}

/// The failure of a publish into a full goal that refuses its sender (`overflow: refuse`).
fn refused(subject: &str, rounds: u32) -> PublishFailure {
    PublishFailure {
        subject: subject.to_owned(),
        attempts: rounds as usize,
        last: format!(
            "the goal's inbox is full ({} messages) and refuses new ones from a sender holding \
             its share of it (overflow: refuse)",
            switchboard_proto::INBOX_STORED_PER_GOAL
        ),
        full: true,
    }
}

/// After a publish's `outcome`: while the goal was full, makes room and publishes again.
async fn with_room(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: Bytes,
    outcome: Result<Published, PublishFailure>,
) -> Result<Published, PublishFailure> {
    let Some(goal) = room::goal_of(subject) else {
        return outcome;
    };
    if !matches!(&outcome, Err(failed) if failed.full) {
        // Stored at once (room made before, perhaps by a first attempt of this very message
        // whose ack was lost): a remembered full goal counts it too, or its holders' counts
        // fall behind and the fair choice leans on the wrong sender.
        if let Ok(published) = &outcome
            && !published.duplicate
            && crate::holders::remembers(subject)
        {
            crate::holders::stored(subject, published.sequence, room::sender_of(&payload));
        }
        return outcome;
    }
    // Whose message it is: a full goal takes room from the sender holding the most of it, and
    // under `overflow: refuse` refuses a sender holding its share already.
    let incoming = room::sender_of(&payload);
    let mut outcome = outcome;
    let mut room_made = 0;
    let mut last_room = None;
    loop {
        match &outcome {
            Err(failed) if failed.full && room_made < ROOM_ROUNDS => {}
            Ok(published) => {
                // Room was made: the goal is full again now, and what this process remembers
                // of its holders (the next send's choice) counts this message too.
                if !published.duplicate {
                    crate::holders::stored(subject, published.sequence, incoming.clone());
                }
                return outcome;
            }
            Err(_) => return outcome,
        }
        room_made += 1;
        // Publishers to one goal from this process take turns: one that finds the inbox full
        // waits for the turn, then first tries again — the publisher before it may have made
        // room (a purge makes room for many) — and makes room only if it is still full.
        // Racing without turns, each evicted one message for room another had already made:
        // 27 of 64 new messages went unread under load. The turn is waited for only so long:
        // a publisher stalled on a stream that is electing a leader must not hold every other
        // publisher to that goal behind it.
        let _turn = tokio::time::timeout(TURN_WAIT, room_turn(&goal).lock())
            .await
            .ok();
        if room_made > 1 {
            let again = publish_durable(js, subject, msg_id, payload.clone()).await;
            if !matches!(&again, Err(failed) if failed.full) {
                outcome = again;
                continue;
            }
        }
        // Read messages go first; only when a purge found none to remove and the inbox is
        // still full does one go. Once a purge found nothing, the goal is full of messages it
        // cannot purge: every further round evicts.
        let evict = matches!(last_room, Some(Room::Purged(0) | Room::Evicted));
        match room::make_room(js, subject, evict, true, incoming.as_ref()).await {
            Ok(Room::Refused) => return Err(refused(subject, room_made)),
            Ok(made) => last_room = Some(made),
            Err(err) => {
                tracing::warn!(%subject, error = %err, "could not make room in a full inbox");
            }
        }
        outcome = publish_durable(js, subject, msg_id, payload.clone()).await;
    }
}

/// The receipt for `pending` (a message `reader` was handed in `goal`), now in `state`: a
/// `kind: receipt` message to the sender's goal, `in_reply_to` the message, with `goal_id`,
/// `state` and `at` in its metadata. Stored once per (copy, state) whatever the retries
/// (`Nats-Msg-Id: receipt:<sequence>:<state>`), and never itself receipted.
pub async fn tell(
    js: &jetstream::Context,
    reader: &AgentId,
    goal: &GoalId,
    pending: &PendingRead,
    state: ReceiptState,
) {
    let Some((subject, msg_id, payload)) = receipt_message(reader, goal, pending, state) else {
        return;
    };
    if let Err(err) = deliver(js, &subject, &msg_id, payload).await {
        tracing::warn!(message_id = %pending.id, error = %err, "receipt not stored");
    }
}

/// The receipt [`tell`] stores, as `(subject, Nats-Msg-Id, payload)` for [`deliver`] or a
/// batch publish: for a caller that publishes many receipts at once and makes room in full
/// goals off its own path (the inbox service's reader). `None` when it does not encode.
pub fn receipt_message(
    reader: &AgentId,
    goal: &GoalId,
    pending: &PendingRead,
    state: ReceiptState,
) -> Option<(String, String, Bytes)> {
    let at = timestamp::now();
    let mut receipt = InboxMessage::new(
        reader.clone(),
        *goal,
        pending.to_agent.clone(),
        format!(
            "your message {} to `{reader}` was {} (goal {goal})",
            pending.id,
            state.as_str().replace('_', " ")
        ),
    );
    receipt.id = Some(switchboard_proto::new_id());
    receipt.kind = MessageKind::Receipt;
    receipt.in_reply_to = Some(pending.id);
    receipt.correlation_id = pending.correlation_id;
    receipt.sent_at = at;
    let mut metadata = Map::new();
    metadata.insert(
        "switchboard".to_owned(),
        Value::String(RECEIPT_MARK.to_owned()),
    );
    metadata.insert("goal_id".to_owned(), Value::String(goal.to_string()));
    metadata.insert("state".to_owned(), Value::String(state.as_str().to_owned()));
    metadata.insert("at".to_owned(), Value::String(timestamp::format(at)));
    receipt.metadata = metadata;
    let payload = serde_json::to_vec(&receipt).ok()?;
    // Keyed on the copy's stream sequence, not the message id a sender may choose: another
    // sender reusing an id cannot make this receipt a duplicate of its own.
    let msg_id = format!("receipt:{}:{}", pending.seq, state.as_str());
    Some((
        subject::inbox(&pending.to_goal),
        msg_id,
        Bytes::from(payload),
    ))
}
