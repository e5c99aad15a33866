//! Pending calls in the `agent_calls` bucket.
//!
//! - `call.<correlation_id>`: the record, the compare-and-set target of every state change, so
//!   an answer and a timeout race and exactly one wins, across any number of replicas. Kept
//!   after the call ends (until the bucket's max age) so a retried reply is recognised and a
//!   late one is told `expired`.
//! - `out.<caller>.<correlation_id>` and `in.<callee>.<correlation_id>` in the stream
//!   `AGENT_CALLS_OPEN`: index entries that exist only while the call is open, so counting a
//!   caller's open calls, listing pending calls and the deadline sweep cost what is open, not
//!   everything ever called.
//!
//! A parked call's index keys are written before its record and removed after the record
//! leaves `open`, so a crash in between leaves at worst a stale index entry, which readers skip
//! and the sweep removes; never a parked call nobody sweeps. A waiting call is held (and timed
//! out) by the replica that took it, and indexed by that replica only once it has been open for
//! [`INDEX_WAITING_AFTER`]: the short calls that make up most traffic never touch the index.
//! Should that replica stop before, its caller — which got no reply — retries the call by its
//! id, and the retry indexes it (docs/protocol.md section 9, "The open-call index").
//!
//! Index entries are removed with a subject-filtered stream purge, which is why the index is a
//! plain stream and not KV keys: a KV delete/purge writes a marker as the subject's last
//! message, which a `multi_last` read returns, so every call ever made would stay in the
//! listing and slow every call down. A filtered purge removes both entries of a call in one
//! request, without a marker; a message delete by sequence would need lookups and, by default,
//! erases the data on disk (the figures are in docs/performance.md, "Call round trip").

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use switchboard_proto::call::{
    AnswerRoute, CallAnswer, CallState, PendingCall, call_key, incoming_key, outgoing_key,
};
use switchboard_proto::subject::CALLS_OPEN_INDEX;
use switchboard_proto::{AgentId, timestamp};
use switchboard_request::kv::stream_snapshot;
use switchboard_runtime::publish::{publish_all, send_all};
use switchboard_runtime::store::StoreError;
use uuid::Uuid;

/// An index entry whose call record has not appeared after this long is a crash leftover.
const ORPHAN_AFTER: time::Duration = time::Duration::seconds(30);

/// A waiting call is indexed only once it has been open this long (by the replica holding
/// it): most calls are answered sooner, and an unindexed waiting call costs no index write and
/// no purge. Its own replica answers it `timeout` at its deadline; the index is for the sweep
/// (should that replica stop) and the `pending` listing of a long call.
pub const INDEX_WAITING_AFTER: time::Duration = time::Duration::seconds(5);

/// Whether `call` may have open-call index entries: a parked call always has them, a waiting
/// one once it was open for [`INDEX_WAITING_AFTER`] (less a second for clocks that differ
/// between replicas), or when a retry joined it.
pub fn may_be_indexed(call: &PendingCall) -> bool {
    !call.wait || timestamp::now() - call.created_at >= INDEX_WAITING_AFTER - time::Duration::SECOND
}

/// A call record as read from (or written to) the bucket, with its revision.
#[derive(Debug, Clone)]
pub struct CallEntry {
    /// The record as it was read or written (parties, deadline, state, answer).
    pub call: PendingCall,
    /// The `agent_calls` KV revision of that record; a write naming an older one is refused.
    pub revision: u64,
}

/// A call's two open-call index entries, `(subject, Nats-Msg-Id, payload)`.
fn index_entries(call: &PendingCall) -> Vec<(String, String, Bytes)> {
    [
        outgoing_key(&call.caller, &call.correlation_id),
        incoming_key(&call.callee, &call.correlation_id),
    ]
    .into_iter()
    .map(|key| {
        let subject = CALLS_OPEN_INDEX.entry(&key);
        (subject.clone(), subject, Bytes::new())
    })
    .collect()
}

/// What [`CallStore::create`] found.
#[derive(Debug)]
pub enum Created {
    /// A new call, and how many open calls its caller has now (this one included).
    New(CallEntry, usize),
    /// The id was taken: the call already recorded under it.
    Exists(CallEntry),
}

/// The calls bucket.
#[derive(Debug, Clone)]
pub struct CallStore {
    js: jetstream::Context,
    calls: kv::Store,
    index: stream::Stream,
}

fn encode(call: &PendingCall) -> Result<Bytes, StoreError> {
    serde_json::to_vec(call)
        .map(Bytes::from)
        .map_err(|err| StoreError::Corrupt(err.to_string()))
}

impl CallStore {
    /// Wraps the applied bucket and index stream.
    pub fn new(js: jetstream::Context, calls: kv::Store, index: stream::Stream) -> Self {
        Self { js, calls, index }
    }

    /// A call by correlation id.
    pub async fn find(&self, correlation_id: &Uuid) -> Result<Option<CallEntry>, StoreError> {
        let key = call_key(correlation_id);
        let entry = self
            .calls
            .entry(key.as_str())
            .await
            .map_err(|err| StoreError::store("reading the call", err))?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let call =
                    serde_json::from_slice(&entry.value).map_err(|_| StoreError::Corrupt(key))?;
                Ok(Some(CallEntry {
                    call,
                    revision: entry.revision,
                }))
            }
            _ => Ok(None),
        }
    }

    /// The calls an index filter names (`out.<agent>.*`, `in.<agent>.*`, `out.*.*`), read by
    /// id; stale index entries (call gone or no longer open) are cleaned up on the way.
    async fn indexed(&self, filter: &str) -> Result<Vec<CallEntry>, StoreError> {
        let entries = stream_snapshot(&self.js, &self.index, CALLS_OPEN_INDEX.prefix(), filter)
            .await
            .map_err(|err| StoreError::store("listing calls", err))?;
        let mut calls = Vec::with_capacity(entries.len());
        for entry in entries {
            let Some(id) = entry
                .key
                .rsplit('.')
                .next()
                .and_then(|id| Uuid::parse_str(id).ok())
            else {
                continue;
            };
            let found = match self.find(&id).await {
                Ok(found) => found,
                Err(StoreError::Corrupt(key)) => {
                    // One bad record must not stop listings and the deadline sweep.
                    tracing::warn!(%key, "undecodable call record skipped");
                    continue;
                }
                Err(err) => return Err(err),
            };
            match found {
                Some(stored) if stored.call.state == CallState::Open => calls.push(stored),
                // Stale: the call ended but its index entries stayed.
                Some(_) => self.unindex(&id).await,
                // No record yet is normal while a call is being created (index first); only
                // an old entry without a record is a leftover of a crash.
                None if entry
                    .stored_at
                    .is_some_and(|at| timestamp::now() - at > ORPHAN_AFTER) =>
                {
                    self.unindex(&id).await;
                }
                None => {}
            }
        }
        calls.sort_by_key(|stored| stored.call.created_at);
        Ok(calls)
    }

    /// The index keys of the open calls `agent` has made, without reading the records (an
    /// entry a crash left behind counts until the next sweep removes it).
    pub async fn outgoing_keys(
        &self,
        agent: &AgentId,
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        Ok(stream_snapshot(
            &self.js,
            &self.index,
            CALLS_OPEN_INDEX.prefix(),
            &format!("out.{agent}.*"),
        )
        .await
        .map_err(|err| StoreError::store("counting calls", err))?
        .into_iter()
        .map(|entry| entry.key)
        .collect())
    }

    /// Writes an open call's index entries again (a retry of a call whose first attempt may
    /// have stored the record but not its entries; writing an entry that exists changes
    /// nothing a reader sees).
    pub async fn reindex(&self, call: &PendingCall) -> Result<(), StoreError> {
        for indexed in publish_all(&self.js, &index_entries(call)).await {
            indexed.map_err(|err| StoreError::store("indexing the call", err))?;
        }
        Ok(())
    }

    /// Open calls `agent` made.
    pub async fn outgoing(&self, agent: &AgentId) -> Result<Vec<CallEntry>, StoreError> {
        self.indexed(&format!("out.{agent}.*")).await
    }

    /// Open calls `agent` must answer.
    pub async fn incoming(&self, agent: &AgentId) -> Result<Vec<CallEntry>, StoreError> {
        self.indexed(&format!("in.{agent}.*")).await
    }

    /// Every open call (the deadline sweep).
    pub async fn open(&self) -> Result<Vec<CallEntry>, StoreError> {
        self.indexed("out.*.*").await
    }

    /// Records a new open call in one round trip: its two index entries are sent first, then
    /// the record right behind them on the same connection (so the server has the entries
    /// before the record), while the caller's open calls are counted; the acks are awaited
    /// together. Returns the stored call and that count (its own entry included), or the record
    /// that already holds the id (a retry racing this one, or another caller's call: the
    /// caller tells them apart; only this call's own index entries are taken back). An index
    /// entry that could not be stored takes the new record back (`unavailable`): an open call
    /// is never left unindexed by a failure (a crash in between is mended by the caller's
    /// retry, which indexes a joined open call again: [`CallStore::reindex`]).
    ///
    /// A waiting call (`call.wait`) is only recorded: it is not indexed (see
    /// [`INDEX_WAITING_AFTER`]) and not counted here (its replica counts its waiting calls),
    /// so the count returned is 0.
    pub async fn create(&self, call: &PendingCall) -> Result<Created, StoreError> {
        let id = &call.correlation_id;
        if call.wait {
            return match self.record(call).await? {
                Some(revision) => Ok(Created::New(
                    CallEntry {
                        call: call.clone(),
                        revision,
                    },
                    0,
                )),
                None => self.find(id).await?.map(Created::Exists).ok_or_else(|| {
                    StoreError::store(
                        "recording the call",
                        "the call id was taken and released again meanwhile; retry",
                    )
                }),
            };
        }
        let entries = index_entries(call);
        let index = send_all(&self.js, &entries).await;
        let record = self.record(call);
        let own = outgoing_key(&call.caller, id);
        let (indexed, revision, open) =
            tokio::join!(index.acked(), record, self.outgoing_keys(&call.caller));
        let revision = revision?;
        let indexed: Result<Vec<_>, _> = indexed.into_iter().collect();
        if let Err(err) = indexed {
            if revision.is_some() {
                let _ = self.calls.purge(call_key(id).as_str()).await;
            }
            return Err(StoreError::store("indexing the call", err));
        }
        let open = open?;
        if let Some(revision) = revision {
            // Counted from the index; this call's own entry may not have been stored yet
            // when it was read.
            let count = open.len() + usize::from(!open.contains(&own));
            return Ok(Created::New(
                CallEntry {
                    call: call.clone(),
                    revision,
                },
                count,
            ));
        }
        let existing = self.find(id).await?;
        // Take back only the entries this attempt wrote that the existing call does not own.
        let ours = existing.as_ref().is_none_or(|found| {
            found.call.caller != call.caller || found.call.callee != call.callee
        });
        if ours {
            let mut keys = Vec::new();
            if existing
                .as_ref()
                .is_none_or(|found| found.call.caller != call.caller)
            {
                keys.push(outgoing_key(&call.caller, id));
            }
            if existing
                .as_ref()
                .is_none_or(|found| found.call.callee != call.callee)
            {
                keys.push(incoming_key(&call.callee, id));
            }
            for key in keys {
                let subject = CALLS_OPEN_INDEX.entry(&key);
                if let Err(err) = self.index.purge().filter(subject.as_str()).await {
                    tracing::debug!(%subject, error = %err, "call index entry not removed");
                }
            }
        }
        existing.map(Created::Exists).ok_or_else(|| {
            StoreError::store(
                "recording the call",
                "the call id was taken and released again meanwhile; retry",
            )
        })
    }

    /// Creates the call's record: its revision, or `None` when the id is taken.
    async fn record(&self, call: &PendingCall) -> Result<Option<u64>, StoreError> {
        match self
            .calls
            .create(call_key(&call.correlation_id).as_str(), encode(call)?)
            .await
        {
            Ok(revision) => Ok(Some(revision)),
            Err(err) if switchboard_request::kv::already_exists(&err) => Ok(None),
            Err(err) => Err(StoreError::store("recording the call", err)),
        }
    }

    /// Removes an ended call from the open-call index: one stream purge filtered to
    /// `*.*.<id>` takes both entries, leaves no marker and needs no lookup (best effort:
    /// readers skip stale entries and the sweep removes them).
    pub async fn unindex(&self, correlation_id: &Uuid) {
        let filter = CALLS_OPEN_INDEX.entry(&format!("*.*.{correlation_id}"));
        if let Err(err) = self.index.purge().filter(filter.as_str()).await {
            tracing::debug!(%filter, error = %err, "call index not removed");
        }
    }

    /// Forgets a call that never started (its request could not be delivered), unless the
    /// record moved on since `stored` was read — a callee that got the request after all has
    /// answered it, and that answer must stay: then `Ok(false)` and the call is left as it is.
    pub async fn forget(&self, stored: &CallEntry) -> Result<bool, StoreError> {
        let key = call_key(&stored.call.correlation_id);
        match self
            .calls
            .purge_expect_revision(key.as_str(), Some(stored.revision))
            .await
        {
            Ok(()) => {}
            Err(err) if switchboard_request::kv::lost_revision(&err) => return Ok(false),
            Err(err) => return Err(StoreError::store("forgetting the call", err)),
        }
        if may_be_indexed(&stored.call) {
            self.unindex(&stored.call.correlation_id).await;
        }
        Ok(true)
    }

    /// Ends an open call (`state` expired): [`CallStore::transition`], then the call leaves
    /// the open-call index when it is (or may be) in it.
    pub async fn end(
        &self,
        stored: &CallEntry,
        state: CallState,
        indexed: bool,
    ) -> Result<Option<CallEntry>, StoreError> {
        let ended = self.transition(stored, state, None).await?;
        if ended.is_some() && indexed {
            self.unindex(&stored.call.correlation_id).await;
        }
        Ok(ended)
    }

    /// Moves the call to `state` if nobody changed it since it was read. `Ok(None)` when
    /// another writer won (re-read to see what happened). The open-call index is the caller's
    /// to update ([`CallStore::end`], or [`CallStore::unindex`] beside the next step).
    pub async fn transition(
        &self,
        stored: &CallEntry,
        state: CallState,
        via: Option<AnswerRoute>,
    ) -> Result<Option<CallEntry>, StoreError> {
        let mut call = stored.call.clone();
        call.state = state;
        call.answered_via = via;
        if state == CallState::Answered && via.is_none() {
            call.claimed_at = Some(timestamp::now());
        }
        self.replace(stored, call).await
    }

    /// Records the delivered answer of a claimed call (where it went, and for a streamed call
    /// the answer itself).
    pub async fn answered(
        &self,
        claimed: &CallEntry,
        via: AnswerRoute,
        answer: Option<CallAnswer>,
    ) -> Result<Option<CallEntry>, StoreError> {
        let mut call = claimed.call.clone();
        call.state = CallState::Answered;
        call.answered_via = Some(via);
        call.answer = answer;
        self.replace(claimed, call).await
    }

    /// Claims an open call and records it answered to its waiting caller, in one write: what
    /// a replica holding the caller does before it hands the answer over in process (should
    /// the hand-over fail, the route is written again).
    pub async fn answered_here(
        &self,
        stored: &CallEntry,
        answer: CallAnswer,
    ) -> Result<Option<CallEntry>, StoreError> {
        let mut call = stored.call.clone();
        call.state = CallState::Answered;
        call.claimed_at = Some(timestamp::now());
        call.answered_via = Some(AnswerRoute::Caller);
        call.answer = Some(answer);
        self.replace(stored, call).await
    }

    /// Writes `call` over `stored` by compare-and-set: `None` when the record changed since
    /// it was read.
    pub async fn replace(
        &self,
        stored: &CallEntry,
        call: PendingCall,
    ) -> Result<Option<CallEntry>, StoreError> {
        match self
            .calls
            .update(
                call_key(&call.correlation_id).as_str(),
                encode(&call)?,
                stored.revision,
            )
            .await
        {
            Ok(revision) => Ok(Some(CallEntry { call, revision })),
            Err(err) if switchboard_request::kv::lost_revision(&err) => Ok(None),
            Err(err) => Err(StoreError::store("updating the call", err)),
        }
    }
}
