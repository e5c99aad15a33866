//! The writer lease: the one key of the `audit_lease` bucket, holding the writing replica's
//! id. One replica at a time holds it and appends, so the chain has one writer (the
//! expected-sequence check stays as a safety net for the moment the lease changes hands). It
//! expires `ttl` after its last write, so a replica that stops renewing (crash, pause,
//! partition) gives way to another. The lease itself is the shared
//! [`switchboard_runtime::lease::Lease`]; when to take, renew and give it up is decided by
//! `trail::ingest`.

use async_nats::jetstream;
use switchboard_runtime::lease::Lease;

use crate::error::AuditError;

/// The lease's key in the bucket.
const LEASE_KEY: &str = "writer";

/// Opens the writer lease under a new holder id; nothing is held yet.
pub(crate) async fn open(js: &jetstream::Context) -> Result<Lease, AuditError> {
    let kv = js
        .get_key_value(switchboard_proto::AUDIT_LEASE_BUCKET)
        .await
        .map_err(|err| AuditError::OpenLease(err.into()))?;
    Ok(Lease::new(
        kv,
        LEASE_KEY,
        switchboard_proto::new_id().to_string(),
    ))
}
