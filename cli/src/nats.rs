//! How the CLI talks to NATS: the credentials every connection signs in with, connecting as an
//! operator or as an agent, and one request with its reply (or error) as JSON.

use switchboard_client::proto::AgentId;
use switchboard_client::proto::subject;
use switchboard_request::request::RequestFailure;

/// The NKey seed every connection of this process signs in with, if any (set once in `main`).
static NKEY_SEED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Env var holding an NKey seed (the same variable the services' config reads).
const NKEY_SEED_ENV: &str = "SWITCHBOARD_NATS__NKEY_SEED";

/// Reads the credentials once: `--nkey FILE`, else `SWITCHBOARD_NATS__NKEY_SEED`.
pub(crate) fn load_credentials(nkey: Option<&std::path::Path>) -> anyhow::Result<()> {
    let seed = match nkey {
        Some(path) => Some(switchboard_runtime::nats::read_seed(path)?),
        None => match std::env::var(NKEY_SEED_ENV) {
            Ok(seed) if !seed.trim().is_empty() => {
                let seed = seed.trim().to_owned();
                switchboard_runtime::nats::public_key_of(&seed)
                    .map_err(|reason| anyhow::anyhow!("{NKEY_SEED_ENV}: {reason}"))?;
                Some(seed)
            }
            _ => None,
        },
    };
    let _ = NKEY_SEED.set(seed);
    Ok(())
}

/// Connect options with this process's credentials (see [`load_credentials`]).
pub(crate) fn signed_in(options: async_nats::ConnectOptions) -> async_nats::ConnectOptions {
    match NKEY_SEED.get().and_then(Option::as_ref) {
        Some(seed) => options.nkey(seed.clone()),
        None => options,
    }
}

/// Connects as an operator (no agent identity): the inspection commands.
pub(crate) async fn connect(nats_url: &str) -> anyhow::Result<async_nats::Client> {
    connect_as(nats_url, None).await
}

/// Connects, as `agent` when given: then with its reply inbox prefix `_INBOX.<agent_id>`, the
/// only replies the secured NATS config lets it receive.
pub(crate) async fn connect_as(
    nats_url: &str,
    agent: Option<&AgentId>,
) -> anyhow::Result<async_nats::Client> {
    connect_signed(nats_url, agent, None).await
}

/// [`connect_as`], signed in with `seed` instead of this process's credentials when given
/// (`switchboard demo --keys`: one key per demo agent).
pub(crate) async fn connect_signed(
    nats_url: &str,
    agent: Option<&AgentId>,
    seed: Option<String>,
) -> anyhow::Result<async_nats::Client> {
    let options = match agent {
        Some(agent) => switchboard_client::agent_connect_options(agent),
        None => async_nats::ConnectOptions::new().name("switchboard-cli"),
    };
    // A one-shot command the server refuses (a subject this key may not use) would otherwise
    // wait for its reply timeout, retries included: say what the server said and stop.
    let options = options.event_callback(|event| async move {
        if let async_nats::Event::ServerError(err) = event {
            let text = err.to_string();
            if text.contains("Permissions Violation") {
                eprintln!("switchboard: the NATS server refused this key: {text}");
                std::process::exit(77);
            }
        }
    });
    let servers = switchboard_client::server_list(nats_url);
    let options = match seed {
        Some(seed) => options.nkey(seed),
        None => signed_in(options),
    };
    options.connect(servers.as_slice()).await.map_err(|err| {
        anyhow::anyhow!("connecting to {nats_url}: {err} (is `switchboard up` running?)")
    })
}

/// An idempotent request (it carries its own id), retried while no service answers.
pub(crate) async fn request_with_retry<T: serde::Serialize>(
    nats_url: &str,
    subject: &str,
    request: &T,
) -> anyhow::Result<serde_json::Value> {
    let client = connect_as(nats_url, caller_of(subject).as_ref()).await?;
    switchboard_request::request::request_json_retrying(
        &client,
        subject,
        request,
        std::time::Duration::from_secs(10),
        switchboard_request::request::IDEMPOTENT_RETRIES,
    )
    .await
    .map_err(cli_failure)
}

/// The agent a request subject speaks for: the last token of an agent-facing request
/// subject (`agent.send.alice` → alice), `None` for the audit queries and anything else.
fn caller_of(subject: &str) -> Option<AgentId> {
    switchboard_proto::endpoint::agent_endpoints()
        .iter()
        .filter(|endpoint| endpoint.by_caller)
        .find_map(|endpoint| subject::caller_from_subject(subject, &endpoint.prefix).ok())
}

/// A request failure as the CLI reports it.
pub(crate) fn cli_failure(failure: RequestFailure) -> anyhow::Error {
    match failure {
        RequestFailure::NoResponders { subject } => {
            anyhow::anyhow!("no service answers on {subject} (is `switchboard up` running?)")
        }
        other => anyhow::anyhow!("{other}"),
    }
}

/// Sends a JSON request and returns the reply, or the service's error reply as an error.
pub(crate) async fn request_json<T: serde::Serialize>(
    nats_url: &str,
    subject: &str,
    body: &T,
) -> anyhow::Result<serde_json::Value> {
    request_json_within(nats_url, subject, body, std::time::Duration::from_secs(10)).await
}

/// [`request_json`] with an explicit reply timeout.
pub(crate) async fn request_json_within<T: serde::Serialize>(
    nats_url: &str,
    subject: &str,
    body: &T,
    timeout: std::time::Duration,
) -> anyhow::Result<serde_json::Value> {
    let client = connect_as(nats_url, caller_of(subject).as_ref()).await?;
    switchboard_request::request::request_json(&client, subject, body, timeout)
        .await
        .map_err(cli_failure)
}
