//! # a2a-gateway
//!
//! Every Switchboard agent as an A2A v1.0 agent (docs/a2a.md): agent cards at
//! `/agents/<agent_id>/.well-known/agent-card.json`, and JSON-RPC 2.0 at `/agents/<agent_id>`
//! — `SendMessage` makes a Switchboard task for the agent (or answers its question),
//! `SendStreamingMessage` and `SubscribeToTask` stream the task's events from `AGENT_EVENTS`
//! (resumable from any replica by `Last-Event-ID`), `GetTask`, `ListTasks` and `CancelTask`
//! go through the task service as the client's own agent `a2a-<name>`, and push-notification
//! webhooks get every event of their task, at least once. The other way round, remote A2A
//! agents added with `switchboard a2a add` join the fabric as ordinary agents: one replica
//! at a time carries each one's inbox to it with the A2A client.
//!
//! The gateway is stateless: tasks live in the task service's bucket, events in the stream,
//! cards in the directory; any number of replicas serve the same clients.
//!
//! Layout (the accept loop — HTTP/1.1, header-read timeout, graceful stop — is
//! `switchboard_runtime::http`, shared with every service's `/metrics`):
//! - this file (`start`/`run`), `config.rs` (`[a2a_gateway]`), `endpoints.rs` (the HTTP
//!   routes: the gateway's endpoints, as in every service);
//! - [`serve`]: the A2A server — both bindings, the checks every request passes, cards, the
//!   methods, streams, push notifications;
//! - [`remote`]: remote A2A agents on the fabric — card checks, leases, carrying an inbox, the
//!   A2A client;
//! - what both sides share: `gateway.rs` (the `Gateway` and how it speaks to the fabric),
//!   `store.rs` (agent records, task events, push configs, history, the `a2a_remotes` records
//!   and paused remote tasks in JetStream), `mapping.rs` (Switchboard ↔ A2A states, parts and
//!   tasks), `error.rs` (`GatewayError` → the spec's codes) and the leaf `http.rs` (the HTTP
//!   client builder; the A2A version and bounded bodies the remote side reads with).

pub mod config;
pub mod endpoints;
pub mod error;
pub mod gateway;
pub mod http;
pub mod links;
pub mod mapping;
pub mod remote;
pub mod serve;
pub mod store;

use std::sync::Arc;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_delivery::registry_view::RegistryView;
use switchboard_runtime::micro::{self, ServiceSpec};
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use config::GatewayConfig;
pub use gateway::Gateway;
pub use switchboard_runtime::service::StartError;

/// The micro service description: the gateway answers `$SRV.PING`/`INFO`/`STATS` like every
/// service (so `a2a-gateway health` and the probes work the same way); its requests are HTTP.
pub const SPEC: ServiceSpec = ServiceSpec {
    name: switchboard_proto::A2A_GATEWAY_SERVICE,
    version: env!("CARGO_PKG_VERSION"),
    description: "Switchboard A2A gateway: every agent as an A2A v1.0 agent over HTTP",
};

/// A started gateway: listening; call [`Running::run`] to serve.
#[derive(Debug)]
pub struct Running {
    listener: tokio::net::TcpListener,
    gateway: Arc<Gateway>,
    js: jetstream::Context,
    view: RegistryView,
    micro: micro::Running,
    grace: std::time::Duration,
}

/// Applies what it reads (the events stream, the directory's buckets), binds the listener.
pub async fn start(
    client: &Client,
    runtime: &RuntimeConfig,
    mut config: GatewayConfig,
) -> Result<Running, StartError> {
    let js = jetstream::new(client.clone());
    let settings = &runtime.jetstream;
    resources::ensure_stream(&js, resources::events_stream(settings)).await?;
    let agents = resources::ensure_bucket(&js, resources::registry_bucket(settings)).await?;
    let goals = resources::ensure_bucket(&js, resources::goals_bucket(settings)).await?;
    let push = resources::ensure_bucket(&js, resources::a2a_push_bucket(settings)).await?;
    resources::ensure_bucket(&js, resources::a2a_remotes_bucket(settings)).await?;
    resources::ensure_bucket(&js, resources::a2a_paused_bucket(settings)).await?;
    let history = resources::ensure_bucket(&js, resources::a2a_history_bucket(settings)).await?;
    resources::ensure_bucket(
        &js,
        resources::a2a_leases_bucket(settings, remote::bridge::LEASE_TTL),
    )
    .await?;
    let events = store::events_stream(&js)
        .await
        .map_err(|err| StartError::Stream {
            stream: switchboard_proto::EVENTS_STREAM,
            message: err.to_string(),
        })?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|err| StartError::Listen {
            address: config.listen.to_string(),
            message: err.to_string(),
        })?;
    // Cards name the address actually bound (a port of 0 picks one) unless a public URL is set.
    if config.public_url.is_empty()
        && let Ok(bound) = listener.local_addr()
    {
        config.public_url = format!("http://{bound}");
    }
    let view = RegistryView::new(js.clone(), agents, goals);
    let store = store::Store::new(events, view.clone(), push, history);
    let roots = match &config.ca_file {
        None => Vec::new(),
        Some(path) => {
            remote::outbound::read_roots(path).map_err(|message| StartError::Certificates {
                path: path.display().to_string(),
                message,
            })?
        }
    };
    let anonymous_key = store
        .anonymous_context_key()
        .await
        .map_err(|err| StartError::Stream {
            stream: switchboard_proto::A2A_PUSH_BUCKET,
            message: err.to_string(),
        })?;
    let gateway = Arc::new(Gateway::new(
        client.clone(),
        config,
        store,
        roots,
        anonymous_key,
    ));
    let micro = micro::start(client, SPEC, Vec::new(), &runtime.requests).await?;
    tracing::info!(
        address = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "a2a-gateway ready"
    );
    Ok(Running {
        listener,
        gateway,
        js,
        view,
        micro,
        grace: runtime.shutdown_grace(),
    })
}

impl Running {
    /// The address it listens on (a port of 0 in the config picks a free one).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// The gateway (for in-process callers and tests).
    pub fn gateway(&self) -> Arc<Gateway> {
        Arc::clone(&self.gateway)
    }

    /// Serves until `shutdown`; open streams end with it.
    pub async fn run(self, shutdown: CancellationToken) {
        let view = self.view.clone().watch(shutdown.clone());
        let micro = self.micro;
        let grace = self.grace;
        let pushes = Arc::clone(&self.gateway).deliver_pushes(self.js.clone(), shutdown.clone());
        let remotes =
            remote::bridge::run(Arc::clone(&self.gateway), self.js.clone(), shutdown.clone());
        let stopping = self.gateway.stopping.clone();
        let stop_streams = {
            let shutdown = shutdown.clone();
            async move {
                shutdown.cancelled().await;
                stopping.cancel();
            }
        };
        let app = endpoints::router(self.gateway);
        let stop = shutdown.clone();
        let serve = switchboard_runtime::http::serve(SPEC.name, self.listener, app, stop);
        tokio::join!(
            view,
            serve,
            pushes,
            remotes,
            stop_streams,
            micro.run(shutdown, grace)
        );
    }
}

/// Starts and serves until `shutdown` (what `main` and `switchboard up` call).
pub async fn run(
    client: &Client,
    runtime: &RuntimeConfig,
    config: GatewayConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    start(client, runtime, config).await?.run(shutdown).await;
    Ok(())
}
