//! The `agent_limits` bucket (docs/protocol.md §15): `spec.<h>` holds a declared limit and
//! `state.<h>` its [`Ledger`], `<h>` the first 32 hex digits of the key's SHA-256 (a key may
//! hold characters a KV key may not). Every change to a state is a compare-and-set on its
//! revision, so replicas racing on one key serialise and none grants past the limit.

use async_nats::jetstream::kv;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use switchboard_proto::limits::LimitSpec;
use switchboard_runtime::store::StoreError;

use crate::ledger::Ledger;

/// The stored name of a key: the first 32 hex digits of its SHA-256.
pub fn hashed(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// The bucket.
#[derive(Debug, Clone)]
pub struct LimitStore {
    kv: kv::Store,
    js: async_nats::jetstream::Context,
}

/// A compare-and-set's outcome.
#[derive(Debug, PartialEq, Eq)]
pub enum Cas {
    /// Written at this revision.
    Done(u64),
    /// Another writer changed it first.
    Lost,
}

impl LimitStore {
    /// Wraps the applied bucket (`js`: its JetStream, for listings).
    pub fn new(kv: kv::Store, js: async_nats::jetstream::Context) -> Self {
        Self { kv, js }
    }

    /// The bucket (for watches).
    pub fn bucket(&self) -> &kv::Store {
        &self.kv
    }

    /// A declared limit.
    pub async fn spec(&self, key: &str) -> Result<Option<LimitSpec>, StoreError> {
        let name = format!("spec.{}", hashed(key));
        match self
            .kv
            .entry(name.as_str())
            .await
            .map_err(|err| StoreError::store("reading a limit", err))?
        {
            Some(entry) if entry.operation == kv::Operation::Put => {
                serde_json::from_slice(&entry.value)
                    .map(Some)
                    .map_err(|_| StoreError::Corrupt(name))
            }
            _ => Ok(None),
        }
    }

    /// Declares or replaces a limit.
    pub async fn put_spec(&self, spec: &LimitSpec) -> Result<(), StoreError> {
        let value = serde_json::to_vec(spec).map_err(|err| StoreError::Corrupt(err.to_string()))?;
        self.kv
            .put(format!("spec.{}", hashed(&spec.key)), value.into())
            .await
            .map_err(|err| StoreError::store("writing a limit", err))?;
        Ok(())
    }

    /// Removes a limit and its state.
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let h = hashed(key);
        for name in [format!("spec.{h}"), format!("state.{h}")] {
            self.kv
                .purge(name)
                .await
                .map_err(|err| StoreError::store("removing a limit", err))?;
        }
        Ok(())
    }

    /// Every declared limit (at most [`switchboard_proto::limits::LIMITS_MAX`] are ever
    /// written), as of one moment (docs/protocol.md §12, "How listings are read": one batched
    /// direct get, not a consumer per listing).
    pub async fn specs(&self) -> Result<Vec<LimitSpec>, StoreError> {
        let entries = switchboard_request::kv::snapshot(&self.js, &self.kv, "spec.*")
            .await
            .map_err(|err| StoreError::store("listing limits", err))?;
        let mut specs: Vec<LimitSpec> = entries
            .iter()
            .filter_map(|entry| serde_json::from_slice(&entry.value).ok())
            .collect();
        specs.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(specs)
    }

    /// A key's state and its revision (0: none stored yet).
    pub async fn state(&self, key: &str) -> Result<(Ledger, u64), StoreError> {
        let name = format!("state.{}", hashed(key));
        match self
            .kv
            .entry(name.as_str())
            .await
            .map_err(|err| StoreError::store("reading a limit's leases", err))?
        {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let ledger =
                    serde_json::from_slice(&entry.value).map_err(|_| StoreError::Corrupt(name))?;
                Ok((ledger, entry.revision))
            }
            Some(entry) => Ok((Ledger::default(), entry.revision)),
            None => Ok((Ledger::default(), 0)),
        }
    }

    /// Writes a key's state if it is still at `revision` (0: not stored yet).
    pub async fn put_state(
        &self,
        key: &str,
        ledger: &Ledger,
        revision: u64,
    ) -> Result<Cas, StoreError> {
        let name = format!("state.{}", hashed(key));
        let value: Bytes = serde_json::to_vec(ledger)
            .map_err(|err| StoreError::Corrupt(err.to_string()))?
            .into();
        let written = match revision {
            0 => match self.kv.create(name.as_str(), value).await {
                Ok(revision) => Ok(revision),
                Err(err) if switchboard_request::kv::already_exists(&err) => return Ok(Cas::Lost),
                Err(err) => Err(StoreError::store("writing a limit's leases", err)),
            },
            _ => match self.kv.update(name.as_str(), value, revision).await {
                Ok(revision) => Ok(revision),
                Err(err) if switchboard_request::kv::lost_revision(&err) => return Ok(Cas::Lost),
                Err(err) => Err(StoreError::store("writing a limit's leases", err)),
            },
        }?;
        Ok(Cas::Done(written))
    }
}
