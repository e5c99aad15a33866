//! Pending calls in the `agent_calls` bucket, key `<caller>.<callee>.<correlation_id>`, so
//! outgoing (`<me>.*.*`), incoming (`*.<me>.*`) and by-id (`*.*.<id>`) reads are all subject
//! filters over one bucket. Every state change is a compare-and-set on the record's revision:
//! an answer and a timeout race, and exactly one wins, across any number of replicas.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use switchboard_proto::AgentId;
use switchboard_proto::call::{CallState, PendingCall, call_key};
use switchboard_runtime::kv::snapshot;
use uuid::Uuid;

use crate::error::CorrelatorError;

/// A record with its key and revision.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The KV key.
    pub key: String,
    /// The call.
    pub call: PendingCall,
    /// Its revision, for compare-and-set.
    pub revision: u64,
}

/// The calls bucket.
#[derive(Debug, Clone)]
pub struct CallStore {
    js: jetstream::Context,
    calls: kv::Store,
}

fn encode(call: &PendingCall) -> Result<Bytes, CorrelatorError> {
    serde_json::to_vec(call)
        .map(Bytes::from)
        .map_err(|err| CorrelatorError::Corrupt(err.to_string()))
}

impl CallStore {
    /// Wraps the applied bucket.
    pub fn new(js: jetstream::Context, calls: kv::Store) -> Self {
        Self { js, calls }
    }

    async fn list(&self, filter: &str) -> Result<Vec<Stored>, CorrelatorError> {
        snapshot(&self.js, &self.calls, filter)
            .await
            .map_err(|err| CorrelatorError::store("listing calls", err))?
            .into_iter()
            .map(|entry| {
                let call = serde_json::from_slice(&entry.value)
                    .map_err(|_| CorrelatorError::Corrupt(entry.key.clone()))?;
                Ok(Stored {
                    key: entry.key,
                    call,
                    revision: entry.revision,
                })
            })
            .collect()
    }

    /// A call by correlation id.
    pub async fn find(&self, correlation_id: &Uuid) -> Result<Option<Stored>, CorrelatorError> {
        Ok(self
            .list(&format!("*.*.{correlation_id}"))
            .await?
            .into_iter()
            .next())
    }

    /// Calls `agent` made.
    pub async fn outgoing(&self, agent: &AgentId) -> Result<Vec<Stored>, CorrelatorError> {
        self.list(&format!("{agent}.*.*")).await
    }

    /// Calls `agent` must answer.
    pub async fn incoming(&self, agent: &AgentId) -> Result<Vec<Stored>, CorrelatorError> {
        self.list(&format!("*.{agent}.*")).await
    }

    /// Every call (the deadline sweep).
    pub async fn all(&self) -> Result<Vec<Stored>, CorrelatorError> {
        self.list(">").await
    }

    /// Records a new open call.
    pub async fn create(&self, call: &PendingCall) -> Result<Stored, CorrelatorError> {
        let key = call_key(&call.caller, &call.callee, &call.correlation_id);
        let revision = self
            .calls
            .create(key.as_str(), encode(call)?)
            .await
            .map_err(|err| CorrelatorError::store("recording the call", err))?;
        Ok(Stored {
            key,
            call: call.clone(),
            revision,
        })
    }

    /// Forgets a call that never started (its request could not be delivered).
    pub async fn forget(&self, stored: &Stored) -> Result<(), CorrelatorError> {
        self.calls
            .purge(stored.key.as_str())
            .await
            .map_err(|err| CorrelatorError::store("forgetting the call", err))
    }

    /// Moves an open call to `state` if nobody changed it since it was read. `Ok(None)` when
    /// another writer won (re-read to see what happened).
    pub async fn transition(
        &self,
        stored: &Stored,
        state: CallState,
        via: Option<switchboard_proto::call::AnswerRoute>,
    ) -> Result<Option<Stored>, CorrelatorError> {
        let mut call = stored.call.clone();
        call.state = state;
        call.answered_via = via;
        match self
            .calls
            .update(stored.key.as_str(), encode(&call)?, stored.revision)
            .await
        {
            Ok(revision) => Ok(Some(Stored {
                key: stored.key.clone(),
                call,
                revision,
            })),
            Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(err) => Err(CorrelatorError::store("updating the call", err)),
        }
    }
}
