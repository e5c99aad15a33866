//! Ingest: follow (keep this replica's index caught up) until the writer lease is taken, then
//! append while it holds. The parts it runs: `appender.rs` (following the source streams,
//! appending chained records), `indexer.rs` (feeding the index from the stream), `lease.rs`
//! (the writer lease).

use std::sync::Arc;

use async_nats::jetstream::{self};
use tokio_util::sync::CancellationToken;

use crate::appender;
use crate::error::AuditError;
use crate::trail::{IngestSettings, Trail};

/// Runs ingest until `shutdown`. One replica at a time holds the writer lease and appends
/// (the chain has one writer; the expected-sequence check stays as a safety net for the
/// moment a lease changes hands); the others keep their index caught up and answer queries,
/// and take the lease when it expires.
pub async fn ingest(
    trail: Arc<Trail>,
    js: jetstream::Context,
    settings: IngestSettings,
    shutdown: CancellationToken,
) -> Result<(), AuditError> {
    let mut lease = crate::lease::open(&js).await?;
    let every = settings.lease_ttl / 3;
    loop {
        // Follow: keep the index current and wait for the lease.
        let mut ticker = tokio::time::interval(settings.catch_up_every.min(every));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                _ = ticker.tick() => {}
            }
            if let Err(err) = trail.catch_up().await {
                tracing::warn!(error = %err, "audit catch-up failed");
            }
            if lease.acquire().await {
                break;
            }
        }
        tracing::info!(holder = %lease.holder(), "audit writer lease taken");
        // Write while the lease holds.
        let lost = shutdown.child_token();
        let renewing = {
            let lost = lost.clone();
            async move {
                let mut ticker = tokio::time::interval(every);
                ticker.tick().await;
                loop {
                    tokio::select! {
                        () = lost.cancelled() => break,
                        _ = ticker.tick() => {}
                    }
                    if !lease.renew().await {
                        lost.cancel();
                        break;
                    }
                }
                lease
            }
        };
        let writing = appender::write(
            Arc::clone(&trail),
            js.clone(),
            settings.clone(),
            lost.clone(),
        );
        let (result, returned) = tokio::join!(
            async {
                let result = writing.await;
                lost.cancel();
                result
            },
            renewing
        );
        lease = returned;
        if shutdown.is_cancelled() {
            lease.release().await;
            return result;
        }
        if let Err(err) = result {
            lease.release().await;
            return Err(err);
        }
        tracing::warn!("audit writer lease lost; following until it can be taken again");
    }
}
