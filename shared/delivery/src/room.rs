//! Room in a full goal inbox (docs/protocol.md, "The inbox cap"). `AGENT_INBOX` keeps at most
//! 128 messages per goal (`INBOX_STORED_PER_GOAL`) and refuses the next
//! (`discard_new_per_subject`) instead of dropping the oldest unseen, so the publisher removes
//! a message *not yet handed out* itself and knows which one went — the oldest of the sender
//! holding the most of the goal, so one flood cannot push everyone else's messages out — or,
//! when the goal's owner chose `overflow: refuse`, refuses the new one when its sender already
//! holds its share of the goal. When the goal's owner had not read the message removed, its
//! sender gets a `kind: notify` in its goal (`metadata.reason: "expired_unread"`, `in_reply_to`
//! the message) and the goal's cursor counts it, and whose it was, for the owner's next fetch.
//! Every publish into an inbox goes through [`crate::deliver`], which calls [`make_room`] when
//! the stream refuses one as full.

// Longer than 600 lines because making room is one decision: whether the goal is full of
// what was read (purge), whose waiting message gives way (the fair choice, issue 37) or
// whether the sender is refused, and the notice that says so; the scan, the choice and the
// notice share their types.

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::stream::DirectGetErrorKind;
use bytes::Bytes;
use serde_json::{Map, Value};
use switchboard_proto::inbox::{
    CursorRecord, EXPIRED_UNREAD, FETCH_REPLY_BYTES, Overflow, cursor_key,
};
use switchboard_proto::{
    AgentId, GoalId, INBOX_STREAM, InboxMessage, MessageKind, subject, timestamp,
};
use switchboard_request::kv::{BatchEnd, direct_batch, direct_sequence};

use switchboard_runtime::publish::is_full;
use switchboard_runtime::telemetry;

use crate::holders::{self, Held, Holders};

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

/// Makes room in the full inbox `inbox_subject` for a message from `incoming` (its
/// `from_agent_id`; `None` when it names none). The goal's read messages go first, all at
/// once (one purge of what its cursor has passed: a reader that keeps up pays this once per
/// 128 messages, not per message). Only with `evict` (the publisher found the inbox still full
/// after a purge that found nothing) does one message go, as `victim` chooses: the oldest
/// read one a consumer held back from the purge (logged: the audit, behind, will miss it),
/// else the oldest waiting one of the sender holding the most of the goal, else the oldest —
/// or, under the goal's `overflow: refuse` when `incoming` holds its share already, none
/// ([`Room::Refused`]). An unread one is counted on the goal's cursor (with its sender) and,
/// when `notify`, its sender is told (a notice that itself finds a full inbox makes room there
/// without a further notice).
pub async fn make_room(
    js: &jetstream::Context,
    inbox_subject: &str,
    evict: bool,
    notify: bool,
    incoming: Option<&AgentId>,
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
        return purge_read(&stream, inbox_subject, cursor).await;
    }
    // Nothing left to purge: the goal's owner decides whether a message goes or the new one is
    // refused, and the goal's holders decide whose goes (issue 37: one sender flooding a goal
    // takes room from itself, not from everyone else).
    let refuse = record
        .as_ref()
        .is_some_and(|record| record.overflow == Overflow::Refuse);
    // What the reader holds from its last fetch is its own until it acks, so a reader that
    // keeps up loses nothing to a burst: only when every stored message has been handed out (a
    // reader hoarding with `after`) does the oldest handed-out one go.
    let handed = record
        .as_ref()
        .map_or(0, |record| record.handed.max(record.cursor));
    let full = Full {
        stream: &stream,
        inbox_subject,
        cursor,
        handed,
        refuse,
    };
    let oldest = match remove_one(js, &full, incoming).await? {
        Removed::Refused => return Ok(Room::Refused),
        Removed::Nothing => return Ok(Room::Evicted),
        Removed::Message(oldest) => oldest,
    };
    // A read message (one the audit still holds back from the purge) goes without a word, as
    // the stream's own limit used to drop it.
    if oldest.seq <= cursor {
        // The purge kept it: a consumer of the stream (the audit) had not taken it yet, and
        // now never will.
        tracing::warn!(goal_id = %goal, seq = oldest.seq, "a full goal removed a read message the audit had not recorded");
        return Ok(Room::Evicted);
    }
    telemetry::metrics::instruments().inbox_evicted.add(1, &[]);
    tell_removed(js, &cursors, goal, oldest, handed, notify).await?;
    Ok(Room::Evicted)
}

/// A full goal, as [`make_room`] found it.
struct Full<'a> {
    stream: &'a jetstream::stream::Stream<()>,
    inbox_subject: &'a str,
    cursor: u64,
    handed: u64,
    refuse: bool,
}

/// What [`remove_one`] did.
enum Removed {
    /// The goal refuses the new message (`overflow: refuse`).
    Refused,
    /// Every choice was gone by the time it was removed.
    Nothing,
    /// This message was removed.
    Message(Victim),
}

/// Read messages go first, and only once every consumer of the stream (the audit's) has seen
/// them: a message the audit has not recorded yet is never purged.
async fn purge_read(
    stream: &jetstream::stream::Stream<()>,
    inbox_subject: &str,
    cursor: u64,
) -> Result<Room, async_nats::Error> {
    let through = cursor.min(consumers_floor(stream, inbox_subject).await?);
    if through == 0 {
        return Ok(Room::Purged(0));
    }
    let purged = stream
        .purge()
        .filter(inbox_subject)
        .sequence(through.saturating_add(1))
        .await
        .map_err(async_nats::Error::from)?;
    Ok(Room::Purged(purged.purged))
}

/// Chooses the message to remove ([`victim`]) and removes it; a choice found gone (another
/// publisher removed it, the reader took it) is made again, a few times: each may read the
/// goal.
async fn remove_one(
    js: &jetstream::Context,
    full: &Full<'_>,
    incoming: Option<&AgentId>,
) -> Result<Removed, async_nats::Error> {
    let Full {
        stream,
        inbox_subject,
        cursor,
        handed,
        refuse,
    } = *full;
    for _ in 0..3 {
        let chosen =
            match victim(js, stream, inbox_subject, cursor, handed, refuse, incoming).await? {
                Decision::Refuse => return Ok(Removed::Refused),
                Decision::Again => continue,
                Decision::Remove(chosen) => chosen,
            };
        if remove(js, chosen.seq).await {
            holders::removed(inbox_subject, chosen.seq);
            return Ok(Removed::Message(chosen));
        }
    }
    Ok(Removed::Nothing)
}

/// An unread message was removed from `goal`: counted on the goal's cursor with its sender,
/// its receipt record set to `expired_unread`, a call it carried ended at once, and — when
/// `notify` — its sender told in the goal it sent from, while that goal is open and still the
/// sender's (a closed one's inbox is read by nobody; one closed and reopened under the same id
/// by another agent is that agent's, and the notice is none of its business).
async fn tell_removed(
    js: &jetstream::Context,
    cursors: &jetstream::kv::Store,
    goal: GoalId,
    oldest: Victim,
    handed: u64,
    notify: bool,
) -> Result<(), async_nats::Error> {
    let message: Option<InboxMessage> = serde_json::from_slice(&oldest.payload).ok();
    // Chosen as not handed out yet: a fetch that handed it out meanwhile (its cursor write
    // came first) gave it to the reader, who has it — not removed unread.
    let unhanded = oldest.seq > handed;
    let Some(owner) = count_unread(cursors, &goal, oldest.seq, unhanded, &message).await? else {
        return Ok(());
    };
    if let Some(message) = &message
        && let Some(pending) = crate::receipts::owed(message, oldest.seq)
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
    tracing::info!(
        goal_id = %goal,
        seq = oldest.seq,
        from_agent_id = message.as_ref().map_or("", |message| message.from_agent_id.as_str()),
        "a full goal inbox dropped an unread message of its biggest holder"
    );
    let Some(message) = message else {
        return Ok(());
    };
    call_dropped(
        js,
        &message,
        &format!("its request was removed unread from a full inbox (goal {goal} of `{owner}`)"),
    )
    .await;
    if notify
        && !is_expiry_notice(&message)
        && goal_still_owned(cursors, &message.from_goal_id, &message.from_agent_id)
            .await
            .unwrap_or(false)
    {
        notify_sender(js, &goal, &owner, &message).await;
    }
    Ok(())
}

/// Removes message `seq` from `AGENT_INBOX` without erasing its bytes on disk (`no_erase`):
/// whether it was removed here (`false`: gone already, or the request failed). The server's
/// default delete overwrites the message in its block, and that cost grows with the stream:
/// in the full-goal bench row it was 6 ms, then 11, then 13 ms per removal over three runs on
/// one server, most of a send into a full goal (docs/performance.md, issue 37). The message
/// is gone from the stream either way; its bytes go when the block is compacted or removed.
async fn remove(js: &jetstream::Context, seq: u64) -> bool {
    let request = serde_json::json!({ "seq": seq, "no_erase": true });
    let reply: Result<Value, _> = js
        .request(format!("STREAM.MSG.DELETE.{INBOX_STREAM}"), &request)
        .await;
    match reply {
        Ok(reply) => reply.get("success").and_then(Value::as_bool) == Some(true),
        Err(err) => {
            tracing::debug!(seq, error = %err, "removing a message from a full goal failed");
            false
        }
    }
}

/// How many bytes of a full goal's waiting messages one choice of [`victim`] reads at most:
/// one fetch's worth, so a send into a full goal costs the server no more than a fetch does.
/// That is the whole goal unless its waiting messages average more than 6 KiB; what lies past
/// it counts as one more holder ([`Holders::beyond`]).
const SCAN_BYTES: usize = FETCH_REPLY_BYTES;
/// How long the read of a full goal's waiting messages may take.
const SCAN_TIMEOUT: Duration = Duration::from_secs(5);

/// A message chosen to go: its sequence and payload.
#[derive(Debug, Clone)]
struct Victim {
    seq: u64,
    payload: Bytes,
}

impl From<jetstream::message::StreamMessage> for Victim {
    fn from(message: jetstream::message::StreamMessage) -> Self {
        Self {
            seq: message.sequence,
            payload: message.payload,
        }
    }
}

/// What [`victim`] decided.
#[derive(Debug)]
enum Decision {
    /// Remove this message.
    Remove(Victim),
    /// Refuse the new message (`overflow: refuse`, its sender holds its share).
    Refuse,
    /// What was chosen went meanwhile: choose again.
    Again,
}

/// Which message [`pick`] chose.
#[derive(Debug, PartialEq, Eq)]
enum Pick {
    /// The new message is refused.
    Refuse,
    /// The scanned message at this index goes.
    Seen(usize),
    /// The oldest message past the scan (after this sequence) goes.
    Beyond(u64),
    /// Nothing waits (every stored message was handed out): the oldest goes.
    Oldest,
}

/// The sender (`from_agent_id`) an inbox message's payload names, `None` when it does not
/// decode as one.
pub(crate) fn sender_of(payload: &[u8]) -> Option<AgentId> {
    #[derive(serde::Deserialize)]
    struct Sender {
        from_agent_id: AgentId,
    }
    serde_json::from_slice::<Sender>(payload)
        .ok()
        .map(|sender| sender.from_agent_id)
}

/// One holder of a full goal's waiting messages: who, how many, and the index of its oldest.
struct Holding<'a> {
    from: Option<&'a AgentId>,
    count: u64,
    oldest: usize,
}

/// The fair choice in a full goal (docs/protocol.md §8, "The inbox cap"), for a new message
/// from `incoming`, among the messages `scan` found waiting (those handed out to the reader are
/// not in it: they are the reader's until it acks).
///
/// - `refuse`: with `n` holders (the senders of waiting messages, the new message's sender
///   among them even when it holds none, and everything past the scan as one more) and `m`
///   waiting messages, a sender holding its share already (`held × n ≥ m`) is refused; one
///   holding less takes room from the biggest holder, who then holds more than its share;
/// - either way, what goes is the oldest waiting message of the biggest holder the read saw;
///   on a tie, the new message's own sender's, else the holder whose oldest message is
///   oldest. Messages past the read count in the share but never win the choice while the
///   read saw any (a sender that put a few large messages first would otherwise make what
///   lies past them — everyone else's — go first); only when it saw none does the first past
///   `after` go.
fn pick(scan: &Holders, after: u64, incoming: Option<&AgentId>, refuse: bool) -> Pick {
    let mut holders: Vec<Holding<'_>> = Vec::new();
    for (index, waiting) in scan.seen.iter().enumerate() {
        let from = waiting.from.as_ref();
        match holders.iter_mut().find(|holding| holding.from == from) {
            Some(holding) => holding.count += 1,
            None => holders.push(Holding {
                from,
                count: 1,
                oldest: index,
            }),
        }
    }
    let total = scan.seen.len() as u64 + scan.beyond;
    if refuse {
        let mine = holders
            .iter()
            .find(|holding| holding.from == incoming)
            .map_or(0, |holding| holding.count);
        let newcomer = !holders.iter().any(|holding| holding.from == incoming);
        let senders = holders.len() as u64 + u64::from(scan.beyond > 0) + u64::from(newcomer);
        if total == 0 || mine.saturating_mul(senders) >= total {
            return Pick::Refuse;
        }
    }
    if total == 0 {
        return Pick::Oldest;
    }
    let biggest = holders.iter().max_by_key(|holding| {
        (
            holding.count,
            holding.from == incoming,
            std::cmp::Reverse(holding.oldest),
        )
    });
    match biggest {
        Some(holding) => Pick::Seen(holding.oldest),
        None => Pick::Beyond(after),
    }
}

/// Reads the waiting messages of the goal `inbox_subject` (those after sequence `after`, the
/// highest handed out), at most [`SCAN_BYTES`] of them.
async fn waiting(
    js: &jetstream::Context,
    inbox_subject: &str,
    after: u64,
) -> Result<Holders, async_nats::Error> {
    let request = serde_json::json!({
        "seq": after.saturating_add(1),
        "next_by_subj": inbox_subject,
        "batch": switchboard_proto::INBOX_STORED_PER_GOAL,
        "max_bytes": SCAN_BYTES,
    });
    let mut scan = Holders::default();
    let seen = &mut scan.seen;
    let end = direct_batch(js, INBOX_STREAM, &request, SCAN_TIMEOUT, |message| {
        let seq = direct_sequence(&message)?;
        seen.push(Held {
            seq,
            from: sender_of(&message.payload),
        });
        Ok(())
    })
    .await?;
    match end {
        BatchEnd::Done { pending } => scan.beyond = pending,
        BatchEnd::NotFound => {}
        BatchEnd::TooLarge | BatchEnd::NotReady => {
            return Err(format!(
                "reading a full goal's waiting messages: the replica was not ready ({end:?})"
            )
            .into());
        }
    }
    Ok(scan)
}

/// Which message goes from the full goal `inbox_subject` (nothing was left to purge; its
/// cursor is at `cursor`, messages through `handed` were handed out), or whether the new
/// message from `incoming` is refused:
/// 1. under `evict_oldest`, a read message the purge kept for a consumer (the audit) that is
///    behind, silently;
/// 2. else the oldest waiting message of the biggest holder ([`pick`]) — under `refuse` only
///    when `incoming` holds less than its share, else the new message is refused;
/// 3. else (nothing waits: every stored message was handed out, a reader hoarding with
///    `after`) under `evict_oldest` the oldest message, under `refuse` none.
async fn victim(
    js: &jetstream::Context,
    stream: &jetstream::stream::Stream<()>,
    inbox_subject: &str,
    cursor: u64,
    handed: u64,
    refuse: bool,
    incoming: Option<&AgentId>,
) -> Result<Decision, async_nats::Error> {
    let next_after = |after: Option<u64>| async move {
        match stream
            .direct_get_next_for_subject(inbox_subject, after)
            .await
        {
            Ok(message) => Ok(Decision::Remove(message.into())),
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(Decision::Again),
            Err(err) => Err(async_nats::Error::from(err)),
        }
    };
    if !refuse && cursor > 0 {
        // A read message (one the purge kept for a consumer behind) goes first, silently.
        if let Decision::Remove(oldest) = next_after(None).await?
            && oldest.seq <= cursor
        {
            return Ok(Decision::Remove(oldest));
        }
    }
    // What this process read of the goal a moment ago serves the next choices (the module
    // `holders`): a goal nobody reads needs a choice per send. The pick leaves the memory at
    // once, so publishers racing for room in the goal pick different messages.
    let choose = |scan: &Holders| {
        let after = handed.max(scan.seen.last().map_or(0, |held| held.seq));
        match pick(scan, after, incoming, refuse) {
            Pick::Refuse => (Chosen::Refuse, None),
            Pick::Seen(index) => match scan.seen.get(index) {
                Some(held) => (Chosen::Seq(held.seq), Some(held.seq)),
                None => (Chosen::After(None), None),
            },
            Pick::Beyond(after) => (Chosen::After(Some(after.saturating_add(1))), None),
            Pick::Oldest => (Chosen::After(None), None),
        }
    };
    let chosen = match holders::choose_from(inbox_subject, handed, choose) {
        Some(chosen) => chosen,
        None => {
            let scan = waiting(js, inbox_subject, handed).await?;
            holders::remember(inbox_subject, scan);
            match holders::choose_from(inbox_subject, handed, choose) {
                Some(chosen) => chosen,
                None => return Ok(Decision::Again),
            }
        }
    };
    match chosen {
        Chosen::Refuse => Ok(Decision::Refuse),
        Chosen::Seq(seq) => match stream.direct_get(seq).await {
            Ok(message) if message.subject.as_str() == inbox_subject => {
                Ok(Decision::Remove(message.into()))
            }
            // Gone meanwhile (another publisher removed it, or the reader's purge did).
            Ok(_) => Ok(Decision::Again),
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(Decision::Again),
            Err(err) => Err(async_nats::Error::from(err)),
        },
        Chosen::After(from) => next_after(from).await,
    }
}

/// What [`victim`] settled on, from [`pick`]'s choice.
enum Chosen {
    /// Refuse the new message.
    Refuse,
    /// Remove the message at this sequence.
    Seq(u64),
    /// Remove the goal's first message from this sequence on (`None`: its oldest).
    After(Option<u64>),
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

/// How many times [`count_unread`] tries its compare-and-set: more than the publishers a
/// burst brings to one full goal at once in any test or bench (64), each round letting one in.
const COUNT_ATTEMPTS: u32 = 256;

/// Counts message `seq` as removed unread on `goal`'s cursor when the owner had not read it;
/// returns the owner then (`None`: it had been read, handed out since it was chosen as
/// `unhanded`, or the goal has closed). The compare-and-set orders this against a fetch
/// handing it out: whichever writes the cursor first wins (a fetch that loses reads the stream
/// again and no longer finds it). Every publisher that made room in one burst writes this one
/// record, so a lost compare-and-set is tried again after a short pause spread by `seq` (each
/// round one writer wins: 64 racing publishers settle in 64 rounds); only when racing writers
/// win every one of [`COUNT_ATTEMPTS`] is the count left short — the owner is returned, so the
/// sender is still told.
async fn count_unread(
    cursors: &jetstream::kv::Store,
    goal: &GoalId,
    seq: u64,
    unhanded: bool,
    message: &Option<InboxMessage>,
) -> Result<Option<switchboard_proto::AgentId>, async_nats::Error> {
    let key = cursor_key(goal);
    let mut owner = None;
    for attempt in 0..COUNT_ATTEMPTS {
        if attempt > 0 {
            // Spread the retries of publishers that lost together (their `seq`s differ).
            let pause = 1 + (seq.wrapping_mul(7).wrapping_add(u64::from(attempt)) % 4);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
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
        record.expired_sent_by(
            message.as_ref().and_then(|message| message.id),
            message.as_ref().map(|message| &message.from_agent_id),
        );
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
                let purged = Box::pin(make_room(js, &target, false, false, Some(owner))).await;
                let made = match purged {
                    Ok(Room::Purged(0)) => {
                        Box::pin(make_room(js, &target, true, false, Some(owner))).await
                    }
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

    /// A waiting message `seq` from `from`.
    fn held(seq: u64, from: &str) -> Held {
        Held {
            seq,
            from: Some(AgentId::parse(from).unwrap()),
        }
    }

    /// The choice in a goal whose reader was handed everything through sequence 10.
    fn choose(scan: &Holders, incoming: Option<&AgentId>, refuse: bool) -> Pick {
        pick(scan, 10, incoming, refuse)
    }

    /// A scan of waiting messages after sequence 10, `senders[i]` sent the one at `11 + i`.
    fn scan(senders: &[&str], beyond: u64) -> Holders {
        Holders {
            seen: senders
                .iter()
                .zip(11..)
                .map(|(from, seq)| held(seq, from))
                .collect(),
            beyond,
        }
    }

    fn agent(id: &str) -> AgentId {
        AgentId::parse(id).unwrap()
    }

    #[test]
    fn a_full_goal_takes_room_from_its_biggest_holder() {
        // alice's one message is the oldest; mallory holds the other 127.
        let mut senders = vec!["alice"];
        senders.extend(std::iter::repeat_n("mallory", 127));
        let flooded = scan(&senders, 0);
        for incoming in ["mallory", "alice", "carol"] {
            assert_eq!(
                choose(&flooded, Some(&agent(incoming)), false),
                Pick::Seen(1),
                "{incoming}'s message takes mallory's oldest, never alice's"
            );
        }
        // A tie: the new message's own sender gives way, else the oldest holder.
        let tied = scan(&["alice", "bob", "alice", "bob"], 0);
        assert_eq!(choose(&tied, Some(&agent("bob")), false), Pick::Seen(1));
        assert_eq!(choose(&tied, Some(&agent("alice")), false), Pick::Seen(0));
        assert_eq!(choose(&tied, Some(&agent("carol")), false), Pick::Seen(0));
        assert_eq!(choose(&tied, None, false), Pick::Seen(0));
        // One sender alone: its oldest, as before.
        let alone = scan(&["writer"; 128], 0);
        assert_eq!(choose(&alone, Some(&agent("writer")), false), Pick::Seen(0));
        // Nothing waits (all handed out): the oldest of all.
        assert_eq!(
            choose(&scan(&[], 0), Some(&agent("writer")), false),
            Pick::Oldest
        );
    }

    #[test]
    fn refuse_refuses_a_sender_holding_its_share_and_lets_the_others_in() {
        let mut senders = vec!["alice"];
        senders.extend(std::iter::repeat_n("mallory", 127));
        let flooded = scan(&senders, 0);
        assert_eq!(
            choose(&flooded, Some(&agent("mallory")), true),
            Pick::Refuse
        );
        assert_eq!(choose(&flooded, Some(&agent("alice")), true), Pick::Seen(1));
        assert_eq!(choose(&flooded, Some(&agent("carol")), true), Pick::Seen(1));
        // A sender alone is refused (the reader must see everything), a newcomer is not.
        let alone = scan(&["mallory"; 128], 0);
        assert_eq!(choose(&alone, Some(&agent("mallory")), true), Pick::Refuse);
        assert_eq!(choose(&alone, Some(&agent("alice")), true), Pick::Seen(0));
        // Half each: both hold their share, both are refused.
        let mut halves = vec!["alice"; 64];
        halves.extend(std::iter::repeat_n("mallory", 64));
        let halves = scan(&halves, 0);
        assert_eq!(choose(&halves, Some(&agent("alice")), true), Pick::Refuse);
        assert_eq!(choose(&halves, Some(&agent("mallory")), true), Pick::Refuse);
        // 63 and 65: the one under its share takes room from the other.
        let mut uneven = vec!["alice"; 63];
        uneven.extend(std::iter::repeat_n("mallory", 65));
        let uneven = scan(&uneven, 0);
        assert_eq!(choose(&uneven, Some(&agent("alice")), true), Pick::Seen(63));
        assert_eq!(choose(&uneven, Some(&agent("mallory")), true), Pick::Refuse);
        // Nothing waits: refused, nothing handed out is removed.
        assert_eq!(
            choose(&scan(&[], 0), Some(&agent("alice")), true),
            Pick::Refuse
        );
    }

    #[test]
    fn messages_past_the_scan_count_in_the_share_but_never_win_the_choice() {
        // Big messages: 5 read, 100 more past the budget. What goes is the biggest holder the
        // read saw (alice put three large messages first): never what lies past them, which
        // would be everyone else's (issue 37's review: large messages first, then a flood).
        let big = scan(&["alice", "alice", "alice", "mallory", "mallory"], 100);
        assert_eq!(choose(&big, Some(&agent("mallory")), false), Pick::Seen(0));
        assert_eq!(choose(&big, Some(&agent("alice")), false), Pick::Seen(0));
        // Under `refuse`, past the read counts as one more sender in the share: alice's 3 of
        // 105 with 3 senders is under it, so she takes room from herself.
        assert_eq!(choose(&big, Some(&agent("alice")), true), Pick::Seen(0));
        // As many past the scan as alice holds: alice's (a tie goes to the older holder).
        let even = scan(&["alice", "alice", "alice"], 3);
        assert_eq!(choose(&even, Some(&agent("bob")), false), Pick::Seen(0));
        // Nothing read at all yet more waiting: past the scan's start.
        let none = Holders {
            seen: Vec::new(),
            beyond: 4,
        };
        assert_eq!(choose(&none, Some(&agent("bob")), false), Pick::Beyond(10));
    }

    #[test]
    fn the_sender_of_a_payload_is_its_from_agent_id() {
        let message = InboxMessage::new(agent("alice"), GoalId::default(), agent("bob"), "hi");
        let payload = serde_json::to_vec(&message).unwrap();
        assert_eq!(sender_of(&payload), Some(agent("alice")));
        assert_eq!(sender_of(b"not json"), None);
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
