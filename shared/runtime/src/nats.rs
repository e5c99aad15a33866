//! A named NATS connection built from [`NatsConfig`]: auth (user/password, token, NKey seed or
//! seed file, creds file), TLS, a 5 s ping so dead links are noticed fast, and connection events in the log.

use std::time::Duration;

use async_nats::{Client, ConnectErrorKind, ConnectOptions, Event};

use crate::config::NatsConfig;

/// The connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// `nats.urls` is empty.
    #[error("nats.urls is empty")]
    NoUrls,
    /// `user` without `password` or the other way round.
    #[error("nats.user and nats.password must be set together")]
    HalfCredentials,
    /// The creds file could not be read.
    #[error("reading creds file {path}: {source}")]
    CredsFile {
        /// Path of the configured `nats.creds_file`.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The NKey seed file could not be read or holds no user seed.
    #[error("nats.nkey_file: {0}")]
    NkeyFile(String),
    /// Connecting failed.
    #[error("connecting to {urls}: {source}")]
    Connect {
        /// The URLs tried (`nats.urls`), comma-separated.
        urls: String,
        /// Why.
        source: async_nats::ConnectError,
    },
}

/// Makes ring the process's rustls crypto provider (idempotent). reqwest is built without a
/// provider of its own (the workspace compiles one TLS stack, the one async-nats uses), so
/// every HTTP client — the OTLP exporter, the A2A gateway's webhooks and remote agents — needs
/// it installed before it is built.
pub fn install_crypto_provider() {
    // An error only says a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Connects to NATS as `name` (shown by `nats server report connections` and in server logs).
///
/// A server that is not listening yet (services started with it, a cluster coming up) is
/// waited for: tried again with growing pauses for up to `nats.wait_for_server_ms` (60 s by
/// default), each miss logged, then given up. A refused login fails at once. With
/// `retry_on_initial_connect` the client keeps trying for as long as it takes.
pub async fn connect(config: &NatsConfig, name: &str) -> Result<Client, ConnectError> {
    if config.urls.is_empty() {
        return Err(ConnectError::NoUrls);
    }
    let urls = config.urls.join(",");
    let started = tokio::time::Instant::now();
    let wait = Duration::from_millis(config.wait_for_server_ms);
    let mut pause = Duration::from_millis(250);
    let mut tries = 0u32;
    loop {
        tries += 1;
        let error = match options(config, name)
            .await?
            .connect(config.urls.as_slice())
            .await
        {
            Ok(client) => {
                if tries > 1 {
                    tracing::info!(%urls, tries, waited_ms = started.elapsed().as_millis(), "nats reachable now");
                }
                return Ok(client);
            }
            Err(error) => error,
        };
        let not_up_yet = matches!(
            error.kind(),
            ConnectErrorKind::Io | ConnectErrorKind::TimedOut | ConnectErrorKind::Dns
        );
        let left = wait.saturating_sub(started.elapsed());
        if !not_up_yet || left.is_zero() {
            return Err(ConnectError::Connect {
                urls,
                source: error,
            });
        }
        tracing::warn!(%urls, error = %error, left_s = left.as_secs(), "nats not reachable yet; trying again");
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// The connect options `config` asks for (credentials read now).
async fn options(config: &NatsConfig, name: &str) -> Result<ConnectOptions, ConnectError> {
    let mut options = ConnectOptions::new()
        .name(name)
        .ping_interval(Duration::from_millis(config.ping_interval_ms))
        .connection_timeout(Duration::from_millis(config.connect_timeout_ms))
        .request_timeout(Some(Duration::from_millis(config.request_timeout_ms)))
        .event_callback(log_event);
    match (&config.user, &config.password) {
        (Some(user), Some(password)) => {
            options = options.user_and_password(user.clone(), password.expose().to_owned());
        }
        (None, None) => {}
        _ => return Err(ConnectError::HalfCredentials),
    }
    if let Some(token) = &config.token {
        options = options.token(token.expose().to_owned());
    }
    if let Some(seed) = &config.nkey_seed {
        options = options.nkey(seed.expose().to_owned());
    }
    if let Some(path) = &config.nkey_file {
        let seed = read_seed(path).map_err(|err| ConnectError::NkeyFile(err.to_string()))?;
        options = options.nkey(seed);
    }
    if let Some(path) = &config.creds_file {
        options =
            options
                .credentials_file(path)
                .await
                .map_err(|source| ConnectError::CredsFile {
                    path: path.display().to_string(),
                    source,
                })?;
    }
    if let Some(prefix) = &config.inbox_prefix {
        options = options.custom_inbox_prefix(prefix);
    }
    if config.tls.required {
        options = options.require_tls(true);
    }
    if let Some(ca) = &config.tls.ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&config.tls.cert_file, &config.tls.key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if config.retry_on_initial_connect {
        options = options.retry_on_initial_connect();
    }
    Ok(options)
}

/// An NKey seed file could not be read, or holds no user seed.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct SeedError {
    /// The seed file (`nats.nkey_file`, `services.nk`, `agents/<agent_id>.nk`).
    pub path: std::path::PathBuf,
    /// Why.
    pub reason: String,
}

/// Reads an NKey seed file (`<agent_id>.nk`, `services.nk`): the seed, checked.
pub fn read_seed(path: &std::path::Path) -> Result<String, SeedError> {
    let failed = |reason: String| SeedError {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|err| failed(err.to_string()))?;
    let seed = text.trim().to_owned();
    public_key_of(&seed).map_err(failed)?;
    Ok(seed)
}

/// The public key of a user seed (`SU…`); anything else is refused.
pub fn public_key_of(seed: &str) -> Result<String, String> {
    if !seed.starts_with("SU") {
        return Err("not an NKey user seed (it must start with SU)".to_owned());
    }
    nkeys::KeyPair::from_seed(seed)
        .map(|pair| pair.public_key())
        .map_err(|err| format!("not a valid NKey seed: {err}"))
}

async fn log_event(event: Event) {
    match event {
        Event::Connected => tracing::info!("nats connected"),
        Event::Disconnected => tracing::warn!("nats disconnected; reconnecting"),
        Event::LameDuckMode => tracing::warn!("nats server entered lame duck mode"),
        Event::SlowConsumer(sid) => tracing::warn!(sid, "nats slow consumer"),
        Event::Draining | Event::Closed => tracing::info!(%event, "nats connection"),
        Event::ServerError(err) => tracing::warn!(error = %err, "nats server error"),
        Event::ClientError(err) => tracing::warn!(error = %err, "nats client error"),
    }
}

/// Waits until the server has processed everything this connection sent so far.
///
/// `Client::flush` only empties the socket buffer; it is not a PING/PONG. A server handles one
/// connection's protocol in order, so a message we publish to our own inbox and receive back
/// proves every earlier SUB is registered: after `sync`, a request from any other connection
/// to this server finds our subscriptions.
pub async fn sync(client: &Client) -> Result<(), SyncError> {
    use futures::StreamExt;
    let inbox = client.new_inbox();
    let mut echo = client
        .subscribe(inbox.clone())
        .await
        .map_err(|err| SyncError(err.to_string()))?;
    client
        .publish(inbox, bytes::Bytes::new())
        .await
        .map_err(|err| SyncError(err.to_string()))?;
    let got = tokio::time::timeout(Duration::from_secs(10), echo.next()).await;
    let _ = echo.unsubscribe().await;
    match got {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(SyncError("subscription closed".to_owned())),
        Err(_) => Err(SyncError("no echo within 10 s".to_owned())),
    }
}

/// The server did not confirm our earlier commands.
#[derive(Debug, thiserror::Error)]
#[error("round trip to the NATS server failed: {0}")]
pub struct SyncError(String);
