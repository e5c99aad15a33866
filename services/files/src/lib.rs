//! # files
//!
//! Files between agents, by reference (docs/protocol.md §17). An agent uploads a file of any
//! size (up to `max_file_bytes`, 1 GiB by default) in 128 KiB chunks through this service —
//! agents have no JetStream API — and gets an attachment `{name, media_type, size, sha256,
//! ref}` to put on any message. The bytes are stored once, in the JetStream Object Store
//! bucket `agent_files`, in the Object Store's own format; whoever a message carrying the
//! reference is delivered to may read them (the door records a grant at delivery), the
//! uploader too, nobody else. Files go when their retention and every grant ran out.
//!
//! Layout: `config.rs` (`[files]`), `error.rs` (errors → stable kinds), `digest.rs` (SHA-256
//! carried from chunk to chunk), `store.rs` (the object stream and the index bucket),
//! `upload.rs`, `read.rs`, `service.rs` (who may read, stat, revoke, delete, events),
//! `sweep.rs` (what ran out), `endpoints.rs` (the endpoint table), this file (`start`/`run`).

pub mod config;
pub mod digest;
mod endpoints;
pub mod error;
mod read;
mod service;
pub mod store;
mod sweep;
mod upload;
mod window;

use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_proto::{FILES_SERVICE, FILES_STREAM};
use switchboard_runtime::micro::{self, ServiceSpec};
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use config::FilesConfig;
pub use service::Files;
pub use switchboard_runtime::service::StartError;

/// The micro service description.
pub const SPEC: ServiceSpec = ServiceSpec {
    name: FILES_SERVICE,
    version: env!("CARGO_PKG_VERSION"),
    description: "Switchboard files: attachments of any size through the Object Store, by reference",
};

/// A started files service; call [`Running::run`] to serve.
#[derive(Debug)]
pub struct Running {
    running: micro::Running,
    files: Arc<Files>,
    grace: Duration,
    sweep_every: Duration,
}

/// Applies the object stream, the index bucket and the events stream, and subscribes the
/// endpoints.
pub async fn start(
    client: &Client,
    runtime: &RuntimeConfig,
    config: FilesConfig,
) -> Result<Running, StartError> {
    let js = jetstream::new(client.clone());
    resources::ensure_stream(&js, resources::files_object_stream(&runtime.jetstream)).await?;
    let objects = js
        .get_stream(FILES_STREAM)
        .await
        .map_err(|err| StartError::Stream {
            stream: FILES_STREAM,
            message: err.to_string(),
        })?;
    let index =
        resources::ensure_bucket(&js, resources::files_index_bucket(&runtime.jetstream)).await?;
    resources::ensure_stream(&js, resources::events_stream(&runtime.jetstream)).await?;
    let sweep_every = Duration::from_millis(config.sweep_ms);
    // Chunks as large as the server carries (with room for headers): fewer round trips.
    let chunk_bytes = switchboard_proto::files::chunk_bytes_for(client.server_info().max_payload);
    let files = Arc::new(
        Files::new(
            store::Store::new(js.clone(), objects, index),
            config,
            Duration::from_secs(runtime.jetstream.files_retention_secs),
        )
        .with_chunk_bytes(chunk_bytes),
    );
    let running = micro::start(
        client,
        SPEC,
        endpoints::endpoints(&files),
        &runtime.requests,
    )
    .await?;
    tracing::info!(service = SPEC.name, "files ready");
    Ok(Running {
        running,
        files,
        grace: runtime.shutdown_grace(),
        sweep_every,
    })
}

impl Running {
    /// The service (for in-process callers and tests).
    pub fn files(&self) -> Arc<Files> {
        Arc::clone(&self.files)
    }

    /// Serves and sweeps until `shutdown`, then drains.
    pub async fn run(self, shutdown: CancellationToken) {
        let sweeper = tokio::spawn(sweep::sweep_every(
            Arc::clone(&self.files),
            self.sweep_every,
            shutdown.clone(),
        ));
        self.running.run(shutdown, self.grace).await;
        let _ = sweeper.await;
    }
}

/// Starts and serves until `shutdown` (what `main` and `switchboard up` call).
pub async fn run(
    client: &Client,
    runtime: &RuntimeConfig,
    config: FilesConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    start(client, runtime, config).await?.run(shutdown).await;
    Ok(())
}
