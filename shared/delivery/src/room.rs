//! Room in a full goal inbox (docs/protocol.md, "The inbox cap"). `AGENT_INBOX` keeps at most
//! 128 messages per goal (`INBOX_STORED_PER_GOAL`) and refuses the next
//! (`discard_new_per_subject`) instead of dropping the oldest unseen, so the publisher removes
//! the goal's oldest message *not yet handed out* itself and knows which one went — or, when
//! the goal's owner chose `overflow: refuse`, removes nothing and refuses the new one. When the goal's owner had not read it, the message's sender gets a `kind: notify`
//! in its goal (`metadata.reason: "expired_unread"`, `in_reply_to` the message) and the goal's
//! cursor counts it for the owner's next fetch. Every publish into an inbox goes through
//! [`crate::deliver`], which calls [`make_room`] when the stream refuses one as full.

use async_nats::jetstream;
use async_nats::jetstream::stream::DirectGetErrorKind;
use bytes::Bytes;
use serde_json::{Map, Value};
use switchboard_proto::inbox::{CursorRecord, EXPIRED_UNREAD, Overflow, cursor_key};
use switchboard_proto::{GoalId, InboxMessage, MessageKind, subject, timestamp};

use switchboard_runtime::publish::is_full;
use switchboard_runtime::telemetry;

/// The goal an inbox subject (`agent.inbox.<goal_id>`) belongs to.
pub fn goal_of(inbox_subject: &str) -> Option<GoalId> {
    let goal = inbox_subject.strip_prefix(subject::INBOX_SUBJECT_PREFIX)?;
    GoalId::parse(goal.strip_prefix('.')?).ok()
}

/// What [`make_room`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Read messages were purged (this many; 0: none was left to purge).
    Purged(u64),
    /// The oldest unread message was removed.
    Evicted,
    /// The goal's owner chose `overflow: refuse`: nothing was removed, the new message must
    /// not be stored.
    Refused,
}

/// Makes room in the full inbox `inbox_subject`. The goal's read messages go first, all at
/// once (one purge of what its cursor has passed: a reader that keeps up pays this once per
/// 128 messages, not per message). Only with `evict` (the publisher found the inbox still full
/// after a purge that found nothing) does one message go: the oldest read one a consumer held
/// back from the purge (logged: the audit, behind, will miss it), else the oldest not yet
/// handed out, else the oldest — or, under the goal's `overflow: refuse`, none
/// ([`Room::Refused`]). An unread one is counted on the goal's cursor and, when `notify`, its
/// sender is told (a notice that itself finds a full inbox makes room there without a further
/// notice).
pub async fn make_room(
    js: &jetstream::Context,
    inbox_subject: &str,
    evict: bool,
    notify: bool,
) -> Result<Room, async_nats::Error> {
    let goal =
        goal_of(inbox_subject).ok_or_else(|| format!("{inbox_subject} is not a goal inbox"))?;
    let stream = js
        .get_stream_no_info(switchboard_proto::INBOX_STREAM)
        .await
        .map_err(async_nats::Error::from)?;
    let cursors = js
        .get_key_value(switchboard_proto::CURSORS_BUCKET)
        .await
        .map_err(async_nats::Error::from)?;
    let record = match cursors.get(cursor_key(&goal)).await {
        Ok(Some(value)) => serde_json::from_slice::<CursorRecord>(&value).ok(),
        _ => None,
    };
    let cursor = record.as_ref().map_or(0, |record| record.cursor);
    if !evict {
        // Read, and seen by every consumer of the stream (the audit's): a message the audit
        // has not recorded yet is never purged.
        let through = cursor.min(consumers_floor(&stream, inbox_subject).await?);
        if through == 0 {
            return Ok(Room::Purged(0));
        }
        let purged = stream
            .purge()
            .filter(inbox_subject)
            .sequence(through.saturating_add(1))
            .await
            .map_err(async_nats::Error::from)?;
        return Ok(Room::Purged(purged.purged));
    }
    // Nothing left to purge: the goal's owner decides whether a message goes or the new one is
    // refused.
    if record
        .as_ref()
        .is_some_and(|record| record.overflow == Overflow::Refuse)
    {
        return Ok(Room::Refused);
    }
    // What goes, in this order: the oldest message the reader has read (one the purge kept for
    // a consumer that has not seen it yet) — silently; else the oldest message not yet handed
    // out — what the reader holds from its last fetch is its own until it acks, so a reader
    // that keeps up loses nothing to a burst; only when every stored message has been handed
    // out (a reader hoarding with `after`) does the oldest handed-out one go.
    let handed = record
        .as_ref()
        .map_or(0, |record| record.handed.max(record.cursor));
    let mut removed = None;
    for _ in 0..16 {
        let oldest = stream
            .direct_get_next_for_subject(inbox_subject, None)
            .await
            .map_err(async_nats::Error::from)?;
        let victim = if oldest.sequence <= cursor || oldest.sequence > handed {
            oldest
        } else {
            match stream
                .direct_get_next_for_subject(inbox_subject, Some(handed.saturating_add(1)))
                .await
            {
                Ok(waiting) => waiting,
                Err(err) if err.kind() == DirectGetErrorKind::NotFound => oldest,
                Err(err) => return Err(err.into()),
            }
        };
        if stream
            .delete_message(victim.sequence)
            .await
            .unwrap_or(false)
        {
            removed = Some(victim);
            break;
        }
    }
    let Some(oldest) = removed else {
        return Ok(Room::Evicted);
    };
    // A read message (one the audit still holds back from the purge) goes without a word, as
    // the stream's own limit used to drop it.
    if oldest.sequence <= cursor {
        // The purge kept it: a consumer of the stream (the audit) had not taken it yet, and
        // now never will.
        tracing::warn!(goal_id = %goal, seq = oldest.sequence, "a full goal removed a read message the audit had not recorded");
        return Ok(Room::Evicted);
    }
    telemetry::metrics::instruments().inbox_evicted.add(1, &[]);
    let message: Option<InboxMessage> = serde_json::from_slice(&oldest.payload).ok();
    // Chosen as not handed out yet: a fetch that handed it out meanwhile (its cursor write
    // came first) gave it to the reader, who has it — not removed unread.
    let unhanded = oldest.sequence > handed;
    let Some(owner) = count_unread(&cursors, &goal, oldest.sequence, unhanded, &message).await?
    else {
        return Ok(Room::Evicted);
    };
    // A receipted message's status says it went unread.
    if let Some(message) = &message
        && let Some(pending) = crate::receipts::owed(message, oldest.sequence)
        && let Ok(receipts) = crate::receipts::bucket(js).await
    {
        crate::receipts::advance_logged(
            &receipts,
            pending.id,
            &pending.to_agent,
            &[(owner.clone(), goal)],
            switchboard_proto::receipt::ReceiptState::ExpiredUnread,
        )
        .await;
    }
    tracing::info!(goal_id = %goal, seq = oldest.sequence, "a full goal inbox dropped its oldest unread message");
    if let Some(message) = &message {
        call_dropped(
            js,
            message,
            &format!("its request was removed unread from a full inbox (goal {goal} of `{owner}`)"),
        )
        .await;
    }
    // The sender is told in the goal it sent from, while that goal is open and still the
    // sender's (a closed one's inbox is read by nobody; one closed and reopened under the same
    // id by another agent is that agent's, and the notice is none of its business).
    if let Some(message) = message
        && notify
        && !is_expiry_notice(&message)
        && goal_still_owned(&cursors, &message.from_goal_id, &message.from_agent_id)
            .await
            .unwrap_or(false)
    {
        notify_sender(js, &goal, &owner, &message).await;
    }
    Ok(Room::Evicted)
}

/// When `message` is a call's request, tells the replica holding the call (if it is a waiting
/// one) that the request will never be read, so the caller fails at once with `reason`
/// (core NATS, best effort: a parked call still ends at its deadline).
pub async fn call_dropped(js: &jetstream::Context, message: &InboxMessage, reason: &str) {
    let (MessageKind::Request, Some(correlation_id)) = (message.kind, message.correlation_id)
    else {
        return;
    };
    let dropped = switchboard_proto::call::CallDropped {
        correlation_id,
        dropped: reason.to_owned(),
    };
    let Ok(payload) = serde_json::to_vec(&dropped) else {
        return;
    };
    if let Err(err) = js
        .client()
        .publish(subject::call_answer(&correlation_id), payload.into())
        .await
    {
        tracing::debug!(%correlation_id, error = %err, "dropped call request not told");
    }
}

/// The lowest sequence every durable consumer of the inbox stream that reads `inbox_subject`
/// has acknowledged through (`u64::MAX` when none does). A consumer filtered to other
/// subjects never reads this goal's messages: its floor would hold this goal's purge back
/// forever (one filtered to a single goal would stop every other goal's purges).
async fn consumers_floor(
    stream: &jetstream::stream::Stream<()>,
    inbox_subject: &str,
) -> Result<u64, async_nats::Error> {
    use futures::TryStreamExt;
    let consumers: Vec<_> = stream
        .consumers()
        .try_collect()
        .await
        .map_err(async_nats::Error::from)?;
    Ok(consumers
        .iter()
        .filter(|info| reads(&info.config, inbox_subject))
        .map(|info| info.ack_floor.stream_sequence)
        .min()
        .unwrap_or(u64::MAX))
}

/// Whether a consumer with `config` is delivered messages on `subject`.
fn reads(config: &jetstream::consumer::Config, subject: &str) -> bool {
    let filters: Vec<&str> = std::iter::once(config.filter_subject.as_str())
        .filter(|filter| !filter.is_empty())
        .chain(config.filter_subjects.iter().map(String::as_str))
        .collect();
    filters.is_empty() || filters.iter().any(|filter| matches(filter, subject))
}

/// NATS subject matching: `*` is one token, `>` the rest (one token or more).
fn matches(filter: &str, subject: &str) -> bool {
    let mut wanted = filter.split('.');
    let mut got = subject.split('.');
    loop {
        match (wanted.next(), got.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(token), Some(actual)) if token == actual => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Counts message `seq` as removed unread on `goal`'s cursor when the owner had not read it;
/// returns the owner then (`None`: it had been read, handed out since it was chosen as
/// `unhanded`, or the goal has closed). The compare-and-set orders this against a fetch
/// handing it out: whichever writes the cursor first wins (a fetch that loses reads the stream
/// again and no longer finds it). When racing
/// writers win every compare-and-set, the count is left short but the owner is returned, so
/// the sender is still told.
async fn count_unread(
    cursors: &jetstream::kv::Store,
    goal: &GoalId,
    seq: u64,
    unhanded: bool,
    message: &Option<InboxMessage>,
) -> Result<Option<switchboard_proto::AgentId>, async_nats::Error> {
    let key = cursor_key(goal);
    let mut owner = None;
    for _ in 0..5 {
        let Some(entry) = cursors.entry(&key).await.map_err(async_nats::Error::from)? else {
            return Ok(None);
        };
        let Ok(mut record) = serde_json::from_slice::<CursorRecord>(&entry.value) else {
            return Ok(None);
        };
        if seq <= record.cursor || (unhanded && seq <= record.handed) {
            return Ok(None);
        }
        owner = Some(record.agent_id.clone());
        record.expired(message.as_ref().and_then(|message| message.id));
        // Never read: no `read` receipt is owed for it any more.
        record.forget_read(seq);
        let value = serde_json::to_vec(&record).map_err(async_nats::Error::from)?;
        if cursors
            .update(&key, value.into(), entry.revision)
            .await
            .is_ok()
        {
            return Ok(Some(record.agent_id));
        }
    }
    // Racing writers kept winning: the reader's count falls one short, but the message was
    // unread and its sender is still told.
    tracing::warn!(goal_id = %goal, seq, "removed unread message not counted for the reader: its cursor keeps changing");
    Ok(owner)
}

/// Whether `goal` is open and its cursor record names `owner`, read now: the check before
/// the service writes its own words (an expiry notice here, a receipt in inbox-fanout) into a
/// goal a message named as its sender's. Goal ids are addresses, not secrets: a goal closed
/// since (and perhaps opened again by another agent under the same id) gets nothing.
pub async fn goal_still_owned(
    cursors: &jetstream::kv::Store,
    goal: &GoalId,
    owner: &switchboard_proto::AgentId,
) -> Result<bool, jetstream::kv::EntryError> {
    Ok(cursors.get(cursor_key(goal)).await?.is_some_and(|value| {
        serde_json::from_slice::<CursorRecord>(&value).is_ok_and(|record| record.agent_id == *owner)
    }))
}

/// Whether `message` is itself a notice that a message expired, or a receipt: the service's
/// own words about other messages, never notified about again (no notice loops between two
/// goals that both stopped reading).
fn is_expiry_notice(message: &InboxMessage) -> bool {
    message.kind == MessageKind::Receipt
        || (message.kind == MessageKind::Notify
            && message.metadata.get("reason").and_then(Value::as_str) == Some(EXPIRED_UNREAD))
}

/// Tells the sender of `message` (in the goal it sent from) that it was removed unread from
/// `goal` of `owner`. Best effort: a failure is logged.
async fn notify_sender(
    js: &jetstream::Context,
    goal: &GoalId,
    owner: &switchboard_proto::AgentId,
    message: &InboxMessage,
) {
    let id = message.id.map(|id| id.to_string()).unwrap_or_default();
    let mut notice = InboxMessage::new(
        owner.clone(),
        *goal,
        message.from_agent_id.clone(),
        format!(
            "your message {id} to `{owner}` was removed unread: goal {goal} was full ({} \
             messages, none of them read)",
            switchboard_proto::INBOX_STORED_PER_GOAL
        ),
    );
    notice.id = Some(switchboard_proto::new_id());
    notice.kind = MessageKind::Notify;
    notice.in_reply_to = message.id;
    notice.correlation_id = message.correlation_id;
    notice.sent_at = timestamp::now();
    let mut metadata = Map::new();
    metadata.insert(
        "reason".to_owned(),
        Value::String(EXPIRED_UNREAD.to_owned()),
    );
    metadata.insert("goal_id".to_owned(), Value::String(goal.to_string()));
    metadata.insert(
        "switchboard".to_owned(),
        Value::String(EXPIRED_UNREAD.to_owned()),
    );
    notice.metadata = metadata;
    let Ok(payload) = serde_json::to_vec(&notice) else {
        return;
    };
    let payload = Bytes::from(payload);
    let target = subject::inbox(&message.from_goal_id);
    let msg_id = format!("expired:{id}:{goal}");
    for _ in 0..2 {
        let mut headers = telemetry::traced_headers();
        headers.insert(switchboard_proto::HEADER_MSG_ID, msg_id.as_str());
        let sent = match js
            .publish_with_headers(target.clone(), headers, payload.clone())
            .await
        {
            Ok(ack) => ack.await.map(|_| ()).map_err(|err| err.to_string()),
            Err(err) => Err(err.to_string()),
        };
        match sent {
            Ok(()) => return,
            Err(err) if is_full(&err) => {
                let purged = Box::pin(make_room(js, &target, false, false)).await;
                let made = match purged {
                    Ok(Room::Purged(0)) => Box::pin(make_room(js, &target, true, false)).await,
                    other => other,
                };
                if let Err(err) = made {
                    tracing::warn!(error = %err, "no room for an expiry notice");
                    return;
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "expiry notice not stored");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_consumers_that_read_the_goal_hold_its_purge_back() {
        let goal = "agent.inbox.0193a1b2-0000-7000-8000-000000000001";
        for filter in ["", "agent.inbox.>", "agent.inbox.*", ">", goal] {
            let config = jetstream::consumer::Config {
                filter_subject: filter.to_owned(),
                ..Default::default()
            };
            assert!(reads(&config, goal), "{filter:?}");
        }
        for filter in [
            "agent.inbox.0193a1b2-0000-7000-8000-000000000002",
            "agent.events.>",
            "agent.inbox",
            "agent.inbox.*.x",
        ] {
            let config = jetstream::consumer::Config {
                filter_subject: filter.to_owned(),
                ..Default::default()
            };
            assert!(!reads(&config, goal), "{filter:?}");
        }
        let several = jetstream::consumer::Config {
            filter_subjects: vec!["agent.events.>".to_owned(), goal.to_owned()],
            ..Default::default()
        };
        assert!(reads(&several, goal));
    }

    #[test]
    fn only_goal_inboxes_have_a_goal() {
        let goal = GoalId::default();
        assert_eq!(goal_of(&subject::inbox(&goal)), Some(goal));
        assert_eq!(goal_of("agent.inbox.fetch.alice"), None);
        assert_eq!(goal_of("agent.inboxes.x"), None);
        assert!(is_full(
            "maximum messages per subject exceeded (code 503, 10077)"
        ));
    }
}
