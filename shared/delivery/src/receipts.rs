//! Receipts (see [`switchboard_proto::receipt`]): the record each receipted message keeps in KV
//! `agent_receipts` (the `kind: receipt` messages that tell its sender are delivered by
//! [`crate::deliver::tell`]). Shared by every
//! service that stores a message with `receipt` (send, call, task create: the record starts
//! at `stored`) and by the inbox reader (which moves it to `delivered` and `read`), and by the
//! room-maker (`expired_unread`).
//!
//! Every update is an upsert by compare-and-set that only moves a goal's state forward, so
//! the record's writers need no order among themselves: a `delivered` that lands before the
//! sender's `stored` keeps `delivered`.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use switchboard_proto::receipt::{PendingRead, ReceiptRecord, ReceiptState, SendStatusReply};
use switchboard_proto::{AgentId, GoalId, InboxMessage, MessageKind, timestamp};
use uuid::Uuid;

/// Compare-and-set attempts of one receipt record update before it gives up (logged).
const CAS_ATTEMPTS: u32 = 16;

/// Opens `agent_receipts` (created by the services at start-up, see
/// [`switchboard_runtime::resources::receipts_bucket`]).
pub async fn bucket(js: &jetstream::Context) -> Result<kv::Store, async_nats::Error> {
    js.get_key_value(switchboard_proto::RECEIPTS_BUCKET)
        .await
        .map_err(async_nats::Error::from)
}

/// Moves each of `goals` (receiving agent, goal) of message `id`, sent by `sender`, to
/// `state` in its record, creating the record when it is the first word about the message.
pub async fn advance(
    kv: &kv::Store,
    id: Uuid,
    sender: &AgentId,
    goals: &[(AgentId, GoalId)],
    state: ReceiptState,
) -> Result<(), async_nats::Error> {
    let at = timestamp::now();
    // `stored` is the first word about a message (its sender writes it while publishing it):
    // try to create the record before reading it, one round trip instead of two.
    let fresh = state == ReceiptState::Stored;
    update(kv, id, sender, fresh, |record| {
        let mut changed = false;
        for (agent, goal) in goals {
            changed |= record.advance(*goal, agent, state, at);
        }
        changed
    })
    .await
}

/// Drops `goals` from message `id`'s record: copies recorded as `stored` before their publish
/// failed (the sender's report names them unreachable).
pub async fn forget(
    kv: &kv::Store,
    id: Uuid,
    sender: &AgentId,
    goals: &[GoalId],
) -> Result<(), async_nats::Error> {
    update(kv, id, sender, false, |record| {
        let before = record.goals.len();
        record.goals.retain(|g| !goals.contains(&g.goal_id));
        record.goals.len() != before
    })
    .await
}

/// Applies `change` to message `id`'s record (a new one when there is none) by
/// compare-and-set; `change` returns whether it changed anything. With `fresh`, the first
/// attempt creates the record without reading it first (it is most likely not there yet).
async fn update(
    kv: &kv::Store,
    id: Uuid,
    sender: &AgentId,
    fresh: bool,
    mut change: impl FnMut(&mut ReceiptRecord) -> bool,
) -> Result<(), async_nats::Error> {
    let key = id.to_string();
    for attempt in 1..=CAS_ATTEMPTS {
        let entry = if fresh && attempt == 1 {
            None
        } else {
            kv.entry(&key).await.map_err(async_nats::Error::from)?
        };
        let (mut record, revision) = match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let record: ReceiptRecord =
                    serde_json::from_slice(&entry.value).map_err(async_nats::Error::from)?;
                (record, Some(entry.revision))
            }
            _ => (
                ReceiptRecord {
                    sender: sender.clone(),
                    goals: Vec::new(),
                },
                None,
            ),
        };
        if record.sender != *sender {
            // A message id another sender chose first: its record is not this sender's to move.
            return Err(format!("receipt record {id} belongs to another sender").into());
        }
        if !change(&mut record) {
            return Ok(());
        }
        let value = Bytes::from(serde_json::to_vec(&record).map_err(async_nats::Error::from)?);
        let written = match revision {
            Some(revision) => kv.update(&key, value, revision).await.is_ok(),
            None => kv.create(&key, value).await.is_ok(),
        };
        if written {
            return Ok(());
        }
        // A lost create is a record someone else wrote a moment ago: read it at once.
        if revision.is_some() {
            switchboard_runtime::store::cas_backoff(attempt).await;
        }
    }
    Err(format!("receipt record {id}: its goals keep changing").into())
}

/// [`advance`], logged instead of returned: a receipt record is what the status request
/// reads, never a reason to fail the delivery it describes.
pub async fn advance_logged(
    kv: &kv::Store,
    id: Uuid,
    sender: &AgentId,
    goals: &[(AgentId, GoalId)],
    state: ReceiptState,
) {
    if let Err(err) = advance(kv, id, sender, goals, state).await {
        tracing::warn!(message_id = %id, state = state.as_str(), error = %err, "receipt record not updated");
    }
}

/// What `caller` may learn about message `id`: its record, when `caller` sent it (`None`
/// otherwise, so a message id learnt elsewhere opens nothing).
pub async fn status(
    kv: &kv::Store,
    caller: &AgentId,
    id: Uuid,
) -> Result<Option<SendStatusReply>, async_nats::Error> {
    let Some(value): Option<Bytes> = kv
        .get(id.to_string())
        .await
        .map_err(async_nats::Error::from)?
    else {
        return Ok(None);
    };
    let record: ReceiptRecord = serde_json::from_slice(&value).map_err(async_nats::Error::from)?;
    Ok((record.sender == *caller).then_some(SendStatusReply {
        message_id: id,
        goals: record.goals,
    }))
}

/// The receipt owed for `message` at `seq` when it asks for one (and is not itself a
/// receipt): who to tell, and where.
pub fn owed(message: &InboxMessage, seq: u64) -> Option<PendingRead> {
    let level = message.receipt?;
    if message.kind == MessageKind::Receipt {
        return None;
    }
    Some(PendingRead {
        seq,
        id: message.id?,
        to_agent: message.from_agent_id.clone(),
        to_goal: message.from_goal_id,
        correlation_id: message.correlation_id,
        level,
    })
}
