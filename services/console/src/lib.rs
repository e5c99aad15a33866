//! # console
//!
//! The page an operator opens first (docs/console.md): a live map of the agents and who
//! talked to whom, any conversation as a timeline from the audit trail with a link to its
//! trace, task trees (cancel), the dead letters (redrive, discard), talking to an agent, and
//! a person's inbox, where people answer agents'
//! questions and decide their approvals. Served by this service itself from three embedded
//! files: no Node, no asset fetched from elsewhere, loopback by default.
//!
//! People sign in with a token: the one-time link `switchboard up` prints (as Jupyter does),
//! or a token whose SHA-256 the people file lists. Their access (`viewer`, `operator`,
//! `approver`) comes from the same file, read again on every request.
//!
//! Layout: `config.rs` (`[console]`), `error.rs` (errors as HTTP replies), `store.rs` (sign-in
//! and sessions), `auth.rs` (who a request is from), `endpoints.rs` (the page and the JSON API, with the host, CSRF and header
//! rules), `live.rs` (server-sent events), `steer.rs` (task trees and cancel, talk routes), `talk.rs`
//! (a person's agent and conversation), `assets/` (the page), this file (`start`/`run`).

mod auth;
pub mod config;
mod endpoints;
pub mod error;
mod live;
mod steer;
pub mod store;
mod talk;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_delivery::registry_view::RegistryView;
use switchboard_runtime::people_book::Books;
use switchboard_runtime::service::StartError;
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use config::ConsoleConfig;
pub use endpoints::CSP;

/// The service's name (its NATS connection's and its telemetry's).
pub const NAME: &str = "console";

/// The console's state, shared by every request.
#[derive(Debug)]
pub struct Console {
    pub(crate) client: Client,
    pub(crate) sessions: store::Sessions,
    pub(crate) books: Books,
    pub(crate) registry: RegistryView,
    pub(crate) config: ConsoleConfig,
    pub(crate) hints: tokio::sync::broadcast::Sender<live::Hint>,
    pub(crate) streams: AtomicUsize,
    /// The people talking to agents from this console.
    pub(crate) talk: talk::Talk,
    /// Cancelled when the console stops: its live streams end, so the HTTP server's graceful
    /// stop does not wait for open pages.
    pub(crate) stopping: CancellationToken,
    port: u16,
}

impl Console {
    /// Whether `host` (the request's `Host`) is one this console answers.
    fn host_allowed(&self, host: &str) -> bool {
        let port = self.port;
        host == format!("127.0.0.1:{port}")
            || host == format!("localhost:{port}")
            || host == format!("[::1]:{port}")
            || self
                .config
                .allowed_hosts
                .iter()
                .any(|allowed| allowed == host)
    }
}

/// A started console; call [`Running::run`] to serve.
#[derive(Debug)]
pub struct Running {
    console: Arc<Console>,
    listener: tokio::net::TcpListener,
}

/// Reads the people file, opens the registry view and binds the listener.
pub async fn start(
    client: &Client,
    runtime: &RuntimeConfig,
    config: ConsoleConfig,
) -> Result<Running, StartError> {
    let js = jetstream::new(client.clone());
    // The directory makes them; the console only reads (its own NATS user may not create).
    let _ = runtime;
    let agents = resources::bind_bucket(&js, switchboard_proto::REGISTRY_BUCKET).await?;
    let goals = resources::bind_bucket(&js, switchboard_proto::GOALS_BUCKET).await?;
    let books = match &config.people_file {
        Some(path) => Books::load(path).map_err(StartError::Config)?,
        None => Books::default(),
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|err| StartError::Listen {
            address: config.listen.to_string(),
            message: err.to_string(),
        })?;
    let port = listener
        .local_addr()
        .map_err(|err| StartError::Listen {
            address: config.listen.to_string(),
            message: err.to_string(),
        })?
        .port();
    let bootstrap = config
        .bootstrap_token_sha256
        .clone()
        .map(|hash| (hash.to_ascii_lowercase(), config.bootstrap_person.clone()));
    let sessions = store::Sessions::new(
        books.clone(),
        Duration::from_millis(config.session_ttl_ms),
        bootstrap,
    );
    let console = Arc::new(Console {
        client: client.clone(),
        sessions,
        books,
        registry: RegistryView::new(js, agents, goals),
        hints: tokio::sync::broadcast::channel(live::HINTS).0,
        streams: AtomicUsize::new(0),
        talk: talk::Talk::default(),
        stopping: CancellationToken::new(),
        config,
        port,
    });
    tracing::info!(service = NAME, %port, "console ready");
    Ok(Running { console, listener })
}

impl Running {
    /// Where it listens (port 0 picks one).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let console = self.console;
        let registry = tokio::spawn(console.registry.clone().watch(shutdown.clone()));
        let live = tokio::spawn(live::listen(
            console.client.clone(),
            console.hints.clone(),
            shutdown.clone(),
        ));
        let follow = console.config.people_file.clone().map(|path| {
            tokio::spawn(console.books.clone().follow(
                path,
                Duration::from_secs(2),
                shutdown.clone(),
            ))
        });
        let app = endpoints::router(Arc::clone(&console));
        let stopping = console.stopping.clone();
        let stop_streams = shutdown.clone();
        tokio::spawn(async move {
            stop_streams.cancelled().await;
            stopping.cancel();
        });
        switchboard_runtime::http::serve(NAME, self.listener, app, shutdown).await;
        let _ = registry.await;
        let _ = live.await;
        if let Some(follow) = follow {
            let _ = follow.await;
        }
    }
}

/// Starts and serves until `shutdown` (what `main` and `switchboard up` call).
pub async fn run(
    client: &Client,
    runtime: &RuntimeConfig,
    config: ConsoleConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    start(client, runtime, config).await?.run(shutdown).await;
    Ok(())
}

/// A fresh one-time sign-in token and its SHA-256 (what `switchboard up` puts in its banner
/// and in [`ConsoleConfig::bootstrap_token_sha256`]).
pub fn one_time_token() -> (String, String) {
    let token = store::random_hex();
    let hash = store::sha256_hex(&token);
    (token, hash)
}
