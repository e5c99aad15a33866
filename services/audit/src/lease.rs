//! The writer lease: the one key of the `audit_lease` bucket, holding the writing replica's
//! id. One replica at a time holds it and appends, so the chain has one writer (the
//! expected-sequence check stays as a safety net for the moment the lease changes hands). It
//! expires `ttl` after its last write, so a replica that stops renewing (crash, pause,
//! partition) gives way to another. When to take, renew and give it up is decided by
//! `trail::ingest`.

use async_nats::jetstream;

use crate::error::AuditError;

/// The lease's key in the bucket.
const LEASE_KEY: &str = "writer";

/// This replica's handle on the writer lease.
pub(crate) struct Lease {
    kv: jetstream::kv::Store,
    /// This replica's id, the value it writes when it holds the lease.
    pub(crate) holder: String,
    revision: Option<u64>,
}

impl Lease {
    /// Opens the lease bucket under a new holder id; nothing is held yet.
    pub(crate) async fn open(js: &jetstream::Context) -> Result<Self, AuditError> {
        let kv = js
            .get_key_value(switchboard_proto::AUDIT_LEASE_BUCKET)
            .await
            .map_err(|err| AuditError::OpenLease(err.to_string()))?;
        Ok(Self {
            kv,
            holder: switchboard_proto::new_id().to_string(),
            revision: None,
        })
    }

    /// Takes the lease if nobody holds it.
    pub(crate) async fn acquire(&mut self) -> bool {
        match self.kv.create(LEASE_KEY, self.holder.clone().into()).await {
            Ok(revision) => {
                self.revision = Some(revision);
                true
            }
            Err(_) => false,
        }
    }

    /// Renews the lease; false when it was lost (expired and taken, or unreachable).
    pub(crate) async fn renew(&mut self) -> bool {
        let Some(revision) = self.revision else {
            return false;
        };
        match self
            .kv
            .update(LEASE_KEY, self.holder.clone().into(), revision)
            .await
        {
            Ok(revision) => {
                self.revision = Some(revision);
                true
            }
            Err(err) => {
                tracing::warn!(error = %err, "audit writer lease not renewed");
                self.revision = None;
                false
            }
        }
    }

    /// Gives the lease up (on shutdown), so another replica takes over at once.
    pub(crate) async fn release(&mut self) {
        if let Some(revision) = self.revision.take()
            && let Err(err) = self
                .kv
                .delete_expect_revision(LEASE_KEY, Some(revision))
                .await
        {
            tracing::debug!(error = %err, "audit writer lease not released");
        }
    }
}
