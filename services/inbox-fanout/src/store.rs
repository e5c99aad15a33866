//! The reading side's JetStream I/O: goal cursors in KV `agent_cursors` (read, compare-and-set),
//! a goal's unread messages by one batched direct get, and dead letters into `AGENT_DLQ`.
//!
//! No consumer is involved anywhere: a read is a batched direct get (ADR-31, nats-server ≥ 2.11,
//! [`switchboard_request::kv::direct_batch`]) of `agent.inbox.<goal_id>` from the sequence after
//! the cursor, so it costs the server nothing between reads and any replica can answer it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::kv;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use switchboard_proto::inbox::{CursorRecord, FETCH_REPLY_BYTES, cursor_key};
use switchboard_proto::{
    GoalId, HEADER_DLQ_CONSUMER, HEADER_DLQ_DELIVERIES, HEADER_DLQ_REASON, HEADER_DLQ_SEQ,
    HEADER_DLQ_STREAM, HEADER_DLQ_SUBJECT, HEADER_MSG_ID, INBOX_STREAM, inbox_consumer, subject,
};
use switchboard_request::kv::{BatchEnd, direct_batch, direct_sequence, leader_entry};
use switchboard_runtime::store::StoreError;

/// How long one batched read may take to arrive in full.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One stored inbox message as read: its sequence, headers and payload.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    /// Its `AGENT_INBOX` sequence.
    pub seq: u64,
    /// The headers it was published with (trace context, `Nats-Msg-Id`).
    pub headers: HeaderMap,
    /// The `InboxMessage` JSON.
    pub payload: Bytes,
}

/// What one read found: up to `max` messages after the cursor, and how many were unread.
#[derive(Debug, Default)]
pub struct Unread {
    /// The messages, oldest first.
    pub messages: Vec<StoredMessage>,
    /// Unread messages in all (`messages` included).
    pub total: u64,
}

/// Outcome of a compare-and-set on a cursor.
#[derive(Debug, PartialEq, Eq)]
pub enum Cas {
    /// Written, at this revision.
    Done(u64),
    /// Someone else wrote first: read again.
    Conflict,
}

/// The reading side's handle on JetStream.
#[derive(Debug, Clone)]
pub struct InboxStore {
    js: jetstream::Context,
    cursors: kv::Store,
    inbox: stream::Stream,
    recent: Recent,
}

/// How long a cursor this replica read or wrote may stand in for a read.
const RECENT_FOR: Duration = Duration::from_secs(2);
/// Most cursors remembered (past it the memory is emptied; a miss only costs a read).
const RECENT_MAX: usize = 100_000;

/// Cursors this replica read or wrote in the last [`RECENT_FOR`], with their revisions: a
/// reader's next request skips reading the cursor. Safe because a cursor only moves forward
/// and every change is a compare-and-set on the revision: a request that would change a stale
/// cursor (hand out messages, move it) fails its write and reads afresh, and one that changes
/// nothing answers what it would have answered a moment earlier.
#[derive(Debug, Clone, Default)]
struct Recent(Arc<Mutex<HashMap<GoalId, Seen>>>);

/// A cursor, its revision, and when this replica saw it.
type Seen = (CursorRecord, u64, Instant);

impl Recent {
    fn get(&self, goal: &GoalId) -> Option<(CursorRecord, u64)> {
        let recent = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        recent
            .get(goal)
            .filter(|(_, _, at)| at.elapsed() < RECENT_FOR)
            .map(|(record, revision, _)| (record.clone(), *revision))
    }

    fn put(&self, goal: &GoalId, record: &CursorRecord, revision: u64) {
        let mut recent = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.len() >= RECENT_MAX {
            recent.clear();
        }
        recent.insert(*goal, (record.clone(), revision, Instant::now()));
    }

    fn forget(&self, goal: &GoalId) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(goal);
    }
}

fn decode_cursor(key: &str, value: &[u8]) -> Result<CursorRecord, StoreError> {
    serde_json::from_slice(value).map_err(|_| StoreError::Corrupt(format!("cursor {key}")))
}

/// Room kept under the server's `max_payload` for a fetch reply's JSON around the stored
/// messages (`seq`, trace context, the reply's own fields).
const REPLY_FRAMING: usize = 32 * 1024;

/// The headers a message was published with: a direct get adds `Nats-*` headers of its own
/// (sequence, subject, time, pending), which a dead letter must not carry back on replay.
pub(crate) fn published_headers(read: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for (name, values) in read.iter() {
        let name: &str = name.as_ref();
        if name.starts_with(switchboard_proto::NATS_HEADER_PREFIX) {
            continue;
        }
        for value in values {
            kept.append(name, value.as_str());
        }
    }
    kept
}

/// Roughly what a message's headers add to a fetch reply.
fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, values)| {
            let name: &str = name.as_ref();
            values
                .iter()
                .map(|v| name.len() + v.as_str().len() + 8)
                .sum::<usize>()
        })
        .sum()
}

impl InboxStore {
    /// Wraps the applied bucket and stream.
    pub fn new(js: jetstream::Context, cursors: kv::Store, inbox: stream::Stream) -> Self {
        Self {
            js,
            cursors,
            inbox,
            recent: Recent::default(),
        }
    }

    /// A goal's cursor and its revision, or `None` when the goal is not live.
    ///
    /// The cursor is read by direct get, which any replica of the bucket may answer; one that
    /// has not applied a cursor created a moment ago says "none", so "none" is confirmed
    /// through the stream leader before it is believed ([`InboxStore::cursor_from_leader`]).
    pub async fn cursor(&self, goal: &GoalId) -> Result<Option<(CursorRecord, u64)>, StoreError> {
        let key = cursor_key(goal);
        let entry = self
            .cursors
            .entry(key.as_str())
            .await
            .map_err(|err| StoreError::store("reading a goal cursor", err))?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let record = decode_cursor(&key, &entry.value)?;
                self.recent.put(goal, &record, entry.revision);
                Ok(Some((record, entry.revision)))
            }
            _ => self.cursor_from_leader(goal).await,
        }
    }

    /// The cursor as this replica read or wrote it a moment ago, if it did (see [`Recent`]):
    /// for a request whose every change is a compare-and-set. Never for a decision made without
    /// a write (a peek, a refusal).
    pub fn recent_cursor(&self, goal: &GoalId) -> Option<(CursorRecord, u64)> {
        self.recent.get(goal)
    }

    /// A goal's cursor as the bucket's leader has it: for a decision a replica that lags must
    /// not make (the goal is unknown; an ack names a sequence the cursor says was never
    /// handed out, when the fetch that handed it out wrote the cursor a moment ago).
    pub async fn cursor_from_leader(
        &self,
        goal: &GoalId,
    ) -> Result<Option<(CursorRecord, u64)>, StoreError> {
        let key = cursor_key(goal);
        match leader_entry(&self.cursors, &key).await {
            Ok(Some((value, revision))) => {
                let record = decode_cursor(&key, &value)?;
                self.recent.put(goal, &record, revision);
                Ok(Some((record, revision)))
            }
            Ok(None) => {
                self.recent.forget(goal);
                Ok(None)
            }
            Err(err) => Err(StoreError::store("reading a goal cursor", err)),
        }
    }

    /// Writes `record` if the cursor is still at `revision`.
    pub async fn put_cursor(
        &self,
        goal: &GoalId,
        record: &CursorRecord,
        revision: u64,
    ) -> Result<Cas, StoreError> {
        let value = serde_json::to_vec(record)
            .map_err(|err| StoreError::store("encoding a goal cursor", err))?;
        match self
            .cursors
            .update(cursor_key(goal), value.into(), revision)
            .await
        {
            Ok(revision) => {
                self.recent.put(goal, record, revision);
                Ok(Cas::Done(revision))
            }
            Err(err) if switchboard_request::kv::lost_revision(&err) => {
                self.recent.forget(goal);
                Ok(Cas::Conflict)
            }
            Err(err) => Err(StoreError::store("moving a goal cursor", err)),
        }
    }

    /// Up to `max` messages of `goal` with a sequence after `cursor`, oldest first, within
    /// [`FETCH_REPLY_BYTES`] of payload — less when the server's `max_payload` is smaller, so
    /// the reply always fits — (at least one when any is unread), and the unread count.
    pub async fn unread(&self, goal: &GoalId, cursor: u64, max: u32) -> Result<Unread, StoreError> {
        let fail = |message: String| StoreError::store("reading a goal inbox", message);
        let client = self.js.client();
        let budget = FETCH_REPLY_BYTES.min(
            client
                .server_info()
                .max_payload
                .saturating_sub(REPLY_FRAMING),
        );
        let request = serde_json::json!({
            "seq": cursor.saturating_add(1),
            "next_by_subj": subject::inbox(goal),
            "batch": max,
            "max_bytes": budget,
        });
        let mut unread = Unread::default();
        let mut bytes = 0;
        let mut skipped = 0u64;
        let end = direct_batch(&self.js, INBOX_STREAM, &request, READ_TIMEOUT, |message| {
            let seq = direct_sequence(&message)?;
            let headers = published_headers(&message.headers.unwrap_or_default());
            bytes += message.payload.len() + header_bytes(&headers);
            if unread.messages.is_empty() || bytes <= budget {
                unread.messages.push(StoredMessage {
                    seq,
                    headers,
                    payload: message.payload,
                });
            } else {
                skipped += 1;
            }
            Ok(())
        })
        .await
        .map_err(fail)?;
        match end {
            // What matched but did not fit counts as unread too.
            BatchEnd::Done { pending } => {
                unread.total = unread.messages.len() as u64 + skipped + pending;
            }
            BatchEnd::NotFound => {}
            BatchEnd::TooLarge | BatchEnd::NotReady => {
                return Err(fail(format!(
                    "the replica answering reads was not ready ({end:?}); retry"
                )));
            }
        }
        unread.total = unread.total.max(unread.messages.len() as u64);
        Ok(unread)
    }

    /// The sequence of the newest message stored in `goal` (0 when none is): how far a reader
    /// may acknowledge before the hand-out that gave it the message is recorded.
    pub async fn last_seq(&self, goal: &GoalId) -> Result<u64, StoreError> {
        match self
            .inbox
            .get_last_raw_message_by_subject(subject::inbox(goal).as_str())
            .await
        {
            Ok(message) => Ok(message.sequence),
            Err(err) if err.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Err(err) => Err(StoreError::store("reading the goal's newest message", err)),
        }
    }

    /// The message at `seq` if it is still stored and belongs to `goal` (a sequence of another
    /// goal's message reads as gone: a reader names only its own messages).
    pub async fn message(
        &self,
        goal: &GoalId,
        seq: u64,
    ) -> Result<Option<StoredMessage>, StoreError> {
        match self.inbox.get_raw_message(seq).await {
            Ok(message) if message.subject.as_str() == subject::inbox(goal) => {
                Ok(Some(StoredMessage {
                    seq,
                    headers: published_headers(&message.headers),
                    payload: message.payload,
                }))
            }
            Ok(_) => Ok(None),
            Err(err) if err.kind() == stream::RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(err) => Err(StoreError::store("reading an inbox message", err)),
        }
    }

    /// Copies a goal's message into `AGENT_DLQ` with `reason` and how often it was handed out,
    /// keeping its headers and payload; `Nats-Msg-Id` `AGENT_INBOX:<seq>:inbox-<goal_id>` makes a
    /// retried move one letter.
    pub async fn dead_letter(
        &self,
        goal: &GoalId,
        message: StoredMessage,
        reason: &str,
        deliveries: u32,
    ) -> Result<(), StoreError> {
        let reader = inbox_consumer(goal);
        let seq = message.seq;
        let mut headers = message.headers;
        headers.insert(
            HEADER_MSG_ID,
            format!("{INBOX_STREAM}:{seq}:{reader}").as_str(),
        );
        headers.insert(
            HEADER_DLQ_REASON,
            switchboard_request::headers::safe_value(reason),
        );
        headers.insert(HEADER_DLQ_STREAM, INBOX_STREAM);
        headers.insert(HEADER_DLQ_SEQ, seq.to_string().as_str());
        headers.insert(HEADER_DLQ_SUBJECT, subject::inbox(goal).as_str());
        headers.insert(HEADER_DLQ_CONSUMER, reader.as_str());
        headers.insert(HEADER_DLQ_DELIVERIES, deliveries.to_string().as_str());
        let letter = switchboard_proto::subject::dead_letter(goal);
        let request: Option<switchboard_proto::InboxMessage> =
            serde_json::from_slice(&message.payload).ok();
        self.js
            .publish_with_headers(letter, headers, message.payload)
            .await
            .map_err(|err| StoreError::store("publishing a dead letter", err))?
            .await
            .map_err(|err| StoreError::store("storing a dead letter", err))?;
        tracing::info!(goal_id = %goal, seq, %reason, deliveries, "inbox message moved to the dead letters");
        switchboard_runtime::telemetry::metrics::instruments()
            .dead_lettered
            .add(
                1,
                &[switchboard_runtime::telemetry::metrics::service(
                    crate::SPEC.name,
                )],
            );
        // A waiting call whose request went to the dead letters ends now, not at its deadline.
        if let Some(request) = request {
            switchboard_delivery::room::call_dropped(
                &self.js,
                &request,
                &format!("its request went to the dead letters ({reason})"),
            )
            .await;
        }
        Ok(())
    }
}
