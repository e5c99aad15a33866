//! Configuration with figment: defaults < `switchboard.toml` < `SWITCHBOARD_*` environment.
//!
//! Nested keys use `__` in the environment: `SWITCHBOARD_NATS__URLS='["nats://a:4222"]'` sets
//! `nats.urls`, `SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT_MS=5000` sets
//! `directory.heartbeat_timeout_ms`. The file is `switchboard.toml` in the working directory, or
//! the path in `SWITCHBOARD_CONFIG`.
//!
//! Shared settings live in [`RuntimeConfig`] (`[nats]`, `[telemetry]`, `[jetstream]`,
//! `shutdown_grace_ms`, `worker_threads`); each service reads its own section with [`section`]. Every section
//! struct uses `deny_unknown_fields`, so a typo is a start-up error, not a silent default.

use std::path::PathBuf;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Environment variable prefix.
pub const ENV_PREFIX: &str = "SWITCHBOARD_";
/// Environment variable naming a config file instead of `./switchboard.toml`.
pub const CONFIG_PATH_ENV: &str = "SWITCHBOARD_CONFIG";
/// Default config file name.
pub const DEFAULT_CONFIG_FILE: &str = "switchboard.toml";

/// Configuration could not be read, or reads but makes no sense.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A source does not parse or a value has the wrong type / an unknown key.
    #[error("invalid configuration: {0}")]
    Figment(#[from] Box<figment::Error>),
    /// The values parse but contradict each other or are missing.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl From<ConfigError> for figment::Error {
    fn from(value: ConfigError) -> Self {
        match value {
            ConfigError::Figment(err) => *err,
            ConfigError::Invalid(message) => figment::Error::from(message),
        }
    }
}

impl From<figment::Error> for ConfigError {
    fn from(value: figment::Error) -> Self {
        Self::Figment(Box::new(value))
    }
}

/// The layered sources: the config file (if any) then `SWITCHBOARD_*` env vars. Defaults come
/// from each struct's `Default` when it is extracted. `./switchboard.toml` is optional and read
/// from the working directory only; a file named by `SWITCHBOARD_CONFIG` must exist (checked
/// by [`RuntimeConfig::load`]).
pub fn figment() -> Figment {
    let path = std::env::var_os(CONFIG_PATH_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_FILE));
    let mut figment = Figment::new();
    if path.is_file() {
        figment = figment.merge(Toml::file_exact(path));
    }
    figment.merge(Env::prefixed(ENV_PREFIX).split("__"))
}

/// A service's config section: its defaults, and the checks types alone cannot express.
pub trait Section: Default + Serialize + DeserializeOwned {
    /// Explains what is wrong with the values, if anything (start-up then exits 64).
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    /// Checks that involve the shared settings too (e.g. a retention that must outlive a
    /// timeout). Called by `service::main` and `switchboard up` after both are loaded.
    fn validate_with(&self, _runtime: &RuntimeConfig) -> Result<(), String> {
        Ok(())
    }
}

/// Loads a section and checks it against the shared settings (`[key] …` in the error).
pub fn section_for<T: Section>(
    figment: &Figment,
    key: &str,
    runtime: &RuntimeConfig,
) -> Result<T, ConfigError> {
    let section: T = section(figment, key)?;
    section
        .validate_with(runtime)
        .map_err(|message| ConfigError::Invalid(format!("[{key}] {message}")))?;
    Ok(section)
}

/// Extracts the section `key` as `T`, with `T::default()` under every layer, and validates it.
pub fn section<T: Section>(figment: &Figment, key: &str) -> Result<T, ConfigError> {
    let section: T = Figment::from(Serialized::default(key, T::default()))
        .merge(figment.clone())
        .extract_inner(key)?;
    section
        .validate()
        .map_err(|message| ConfigError::Invalid(format!("[{key}] {message}")))?;
    Ok(section)
}

/// A secret string: deserializes normally, never prints or serializes its value.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("[redacted]")
    }
}

/// Most async threads a service binary may ask for (`worker_threads`).
pub const MAX_WORKER_THREADS: usize = 256;

/// Settings every service shares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RuntimeConfig {
    /// How to reach NATS.
    pub nats: NatsConfig,
    /// Logs and traces.
    pub telemetry: TelemetryConfig,
    /// Stream and bucket settings.
    pub jetstream: JetStreamConfig,
    /// How long in-flight requests may take to finish after SIGINT/SIGTERM, in milliseconds;
    /// a service binary exits when it has passed, even if it was still starting.
    pub shutdown_grace_ms: u64,
    /// Threads of a service binary's async runtime: 1 (the default) runs it on one thread, so a
    /// request's hops inside the service wake no other thread (the lowest latency, and the
    /// most throughput where the service shares a few cores with nats-server); 0 is one per
    /// core; N > 1 is N. Scale a busy service with more replicas or with this.
    pub worker_threads: usize,
    /// Each agent's request budget at each service replica (`[requests]`).
    pub requests: RequestBudget,
    /// Cost budgets (`[budgets]`, docs/protocol.md §16): the default for work that names
    /// none and the cap on any one root budget.
    pub budgets: BudgetsConfig,
}

/// Cost budgets every service applies alike (`[budgets]`, `SWITCHBOARD_BUDGETS__*`). Amounts
/// are tokens and micro-units of the one currency the fabric is configured with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetsConfig {
    /// The currency cost is counted in, shown to people (`USD`: cost 1,000,000 is $1.00).
    pub currency: String,
    /// Tokens of the budget a call or task gets when it names none and draws on no parent's;
    /// none (the default): such work has no budget.
    pub default_tokens: Option<u64>,
    /// Cost of that default budget, in micro-units; none (the default): no default.
    pub default_cost: Option<u64>,
    /// The most tokens one root budget may hold, whoever opens it (an amount above is cut to
    /// it and the grant says `cut`); none: no cap.
    pub cap_tokens: Option<u64>,
    /// The most cost one root budget may hold, like `cap_tokens`.
    pub cap_cost: Option<u64>,
}

impl Default for BudgetsConfig {
    fn default() -> Self {
        Self {
            currency: "USD".to_owned(),
            default_tokens: None,
            default_cost: None,
            cap_tokens: None,
            cap_cost: None,
        }
    }
}

impl BudgetsConfig {
    /// What a new tree asking for `tokens`/`cost` is granted: each cut to its cap (a unit
    /// asked for without an amount is bounded at its cap), and whether any was cut. Every
    /// service applies the same `[budgets]`, so the correlator knows a root's grant before the
    /// limits service stores it.
    pub fn root_grant(
        &self,
        tokens: Option<u64>,
        cost: Option<u64>,
    ) -> (Option<u64>, Option<u64>, bool) {
        let mut cut = false;
        let mut capped = |asked: Option<u64>, cap: Option<u64>| match (asked, cap) {
            (Some(asked), Some(cap)) if asked > cap => {
                cut = true;
                Some(cap)
            }
            (None, Some(cap)) => Some(cap),
            (asked, _) => asked,
        };
        let (tokens, cost) = (capped(tokens, self.cap_tokens), capped(cost, self.cap_cost));
        (tokens, cost, cut)
    }

    /// The budget work that names none gets, if any is configured.
    pub fn default_ask(&self) -> Option<switchboard_proto::budget::BudgetAsk> {
        (self.default_tokens.is_some() || self.default_cost.is_some()).then(|| {
            switchboard_proto::budget::BudgetAsk {
                tokens: self.default_tokens,
                cost: self.default_cost,
                ..Default::default()
            }
        })
    }
}

/// A per-agent token bucket: every request an agent makes to a service replica takes one
/// token; tokens come back at `per_second` up to `burst`. A request without a token is
/// answered `rate_limited` (429) before any storage work, and only counted (`errors_by_kind`),
/// not recorded one by one in the audit trail. The defaults are far above what an agent
/// reasoning between steps sends; they stop a runaway loop or a flood.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestBudget {
    /// Tokens returned per second.
    pub per_second: u32,
    /// The most tokens an agent can hold (a burst after a quiet spell).
    pub burst: u32,
}

impl Default for RequestBudget {
    fn default() -> Self {
        Self {
            // An agent serving 2,000 calls/s spends at most a fetch, a reply and an ack per
            // call (fewer when fetches batch): 6,000 requests/s. A second of that is the burst.
            per_second: 6_000,
            burst: 6_000,
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            nats: NatsConfig::default(),
            telemetry: TelemetryConfig::default(),
            jetstream: JetStreamConfig::default(),
            shutdown_grace_ms: 10_000,
            worker_threads: 1,
            requests: RequestBudget::default(),
            budgets: BudgetsConfig::default(),
        }
    }
}

impl RuntimeConfig {
    /// Reads the shared settings from the layered sources (unknown top-level keys are other
    /// services' sections and are ignored here).
    pub fn load(figment: &Figment) -> Result<Self, ConfigError> {
        if let Some(path) = std::env::var_os(CONFIG_PATH_ENV).map(PathBuf::from)
            && !path.is_file()
        {
            return Err(ConfigError::Invalid(format!(
                "{CONFIG_PATH_ENV}={} does not exist",
                path.display()
            )));
        }
        let config: Self = Figment::from(Serialized::defaults(Self::default()))
            .merge(figment.clone())
            .extract()?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what types alone cannot: at least one URL, credentials in pairs, replicas ≥ 1.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.nats.urls.is_empty() {
            return Err(ConfigError::Invalid("nats.urls is empty".to_owned()));
        }
        if self.nats.user.is_some() != self.nats.password.is_some() {
            return Err(ConfigError::Invalid(
                "nats.user and nats.password must be set together".to_owned(),
            ));
        }
        if self.nats.nkey_seed.is_some() && self.nats.nkey_file.is_some() {
            return Err(ConfigError::Invalid(
                "set nats.nkey_seed or nats.nkey_file, not both".to_owned(),
            ));
        }
        if let Some(prefix) = &self.nats.inbox_prefix
            && (prefix.is_empty()
                || prefix.len() > 64
                || !prefix
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                || prefix.starts_with('.')
                || prefix.ends_with('.'))
        {
            return Err(ConfigError::Invalid(format!(
                "nats.inbox_prefix must be 1-64 characters of [A-Za-z0-9_.-] without wildcards, \
                 not starting or ending with a dot; got `{}`",
                prefix.chars().take(80).collect::<String>()
            )));
        }
        let (cert, key) = (&self.nats.tls.cert_file, &self.nats.tls.key_file);
        if cert.is_some() != key.is_some() {
            return Err(ConfigError::Invalid(
                "nats.tls.cert_file and nats.tls.key_file must be set together".to_owned(),
            ));
        }
        if self.worker_threads > MAX_WORKER_THREADS {
            return Err(ConfigError::Invalid(format!(
                "worker_threads must be 0 (one per core) to {MAX_WORKER_THREADS}, got {}",
                self.worker_threads
            )));
        }
        let max = switchboard_proto::budget::BUDGET_AMOUNT_MAX;
        let b = &self.budgets;
        for (name, amount) in [
            ("default_tokens", b.default_tokens),
            ("default_cost", b.default_cost),
            ("cap_tokens", b.cap_tokens),
            ("cap_cost", b.cap_cost),
        ] {
            if amount.is_some_and(|a| !(1..=max).contains(&a)) {
                return Err(ConfigError::Invalid(format!(
                    "budgets.{name} must be 1..={max}"
                )));
            }
        }
        if self.requests.per_second == 0 || self.requests.burst == 0 {
            return Err(ConfigError::Invalid(
                "requests.per_second and requests.burst must be above 0".to_owned(),
            ));
        }
        if self.jetstream.replicas == 0 || self.jetstream.replicas > 5 {
            return Err(ConfigError::Invalid(format!(
                "jetstream.replicas must be 1..=5, got {}",
                self.jetstream.replicas
            )));
        }
        let js = &self.jetstream;
        if js.duplicate_window_secs < MIN_DUPLICATE_WINDOW_SECS {
            // A retried call re-delivers its request for 60 s after it opened, and a fresh call
            // id is fresh for 30 s (docs/protocol.md §9, "Call ids"): a shorter window would
            // store the request twice.
            return Err(ConfigError::Invalid(format!(
                "jetstream.duplicate_window_secs must be at least {MIN_DUPLICATE_WINDOW_SECS} s (a retried call's request is stored once only inside it), got {}",
                js.duplicate_window_secs
            )));
        }
        // The server refuses a stream whose duplicate window outlives its max age (0: forever).
        for (name, max_age) in [
            ("inbox_max_age_secs", js.inbox_max_age_secs),
            ("events_max_age_secs", js.events_max_age_secs),
            ("audit_max_age_secs", js.audit_max_age_secs),
        ] {
            if max_age != 0 && max_age < js.duplicate_window_secs {
                return Err(ConfigError::Invalid(format!(
                    "jetstream.{name} ({max_age} s) must be 0 (forever) or at least duplicate_window_secs ({} s)",
                    js.duplicate_window_secs
                )));
            }
        }
        Ok(())
    }

    /// `shutdown_grace_ms` as a duration: how long in-flight requests may finish after a signal.
    pub fn shutdown_grace(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.shutdown_grace_ms)
    }
}

/// How to connect to NATS.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URLs; the client picks one and fails over to the others.
    pub urls: Vec<String>,
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password (with `user`).
    pub password: Option<Secret>,
    /// Token for token authentication; never printed or serialized (a [`Secret`]).
    pub token: Option<Secret>,
    /// NKey seed (`SU…`).
    pub nkey_seed: Option<Secret>,
    /// A file holding the NKey seed (`services.nk` from `switchboard nats-config`), read at
    /// connect; for a mounted secret, where the seed should not sit in the environment.
    pub nkey_file: Option<PathBuf>,
    /// A `.creds` file (JWT + NKey), as issued by `nsc`.
    pub creds_file: Option<PathBuf>,
    /// TLS settings.
    pub tls: TlsConfig,
    /// Client ping interval, in milliseconds (detects dead connections).
    pub ping_interval_ms: u64,
    /// Connection timeout, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Default request timeout, in milliseconds.
    pub request_timeout_ms: u64,
    /// Keep retrying the first connection for as long as it takes.
    pub retry_on_initial_connect: bool,
    /// Without `retry_on_initial_connect`: how long a start waits for a server that is not
    /// listening yet (started together with it, a cluster coming up), in milliseconds, trying
    /// again with growing pauses and logging each miss; 0 fails at once.
    pub wait_for_server_ms: u64,
    /// The prefix of this connection's reply subjects (default `_INBOX`). A user whose
    /// permissions allow subscribing only below its own prefix sets it: the console signs in
    /// as `console.nk` with `_INBOX.console` (docs/security.md).
    pub inbox_prefix: Option<String>,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            urls: vec!["nats://127.0.0.1:4222".to_owned()],
            user: None,
            password: None,
            token: None,
            nkey_seed: None,
            nkey_file: None,
            creds_file: None,
            tls: TlsConfig::default(),
            ping_interval_ms: 5_000,
            connect_timeout_ms: 5_000,
            request_timeout_ms: 10_000,
            retry_on_initial_connect: false,
            inbox_prefix: None,
            wait_for_server_ms: 60_000,
        }
    }
}

/// TLS settings for the NATS connection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Require TLS even for `nats://` URLs.
    pub required: bool,
    /// PEM file with extra root certificates.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (mutual TLS, with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM client key (mutual TLS, with `cert_file`).
    pub key_file: Option<PathBuf>,
}

/// Logging and tracing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// `tracing` filter directives when `RUST_LOG` is unset, e.g. `info,directory=debug`.
    pub log: String,
    /// OTLP collector base URL (e.g. `http://jaeger:4318` for HTTP, `http://jaeger:4317` for
    /// gRPC): traces and metrics go there. When unset, the standard
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is used; when both are unset nothing is exported.
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` or `grpc`. When unset, the standard `OTEL_EXPORTER_OTLP_PROTOCOL`, else
    /// `http/protobuf`.
    pub otlp_protocol: Option<OtlpProtocol>,
    /// Where to serve Prometheus metrics (`GET /metrics`), e.g. `0.0.0.0:9464`; unset serves
    /// none. `switchboard up` serves one for all its services (`--metrics-listen`).
    pub metrics_listen: Option<String>,
    /// How log lines are written to stderr: `text` (colours only at a terminal) or `json`, one
    /// object per line for a log shipper.
    pub log_format: LogFormat,
}

/// The OTLP transport ([`TelemetryConfig::otlp_protocol`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// Protobuf over HTTP, the collector's port 4318 (`/v1/traces`, `/v1/metrics`).
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// gRPC, the collector's port 4317.
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    /// The name OpenTelemetry gives it (`OTEL_EXPORTER_OTLP_PROTOCOL`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HttpProtobuf => "http/protobuf",
            Self::Grpc => "grpc",
        }
    }
}

/// The format of log lines ([`TelemetryConfig::log_format`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`, `span` names).
    Json,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log: "info".to_owned(),
            otlp_endpoint: None,
            otlp_protocol: None,
            metrics_listen: None,
            log_format: LogFormat::Text,
        }
    }
}

/// The shortest de-duplication window a deployment may set: every attempt of a call re-delivers
/// its request within 120 s of the first (docs/protocol.md §9, "Call ids").
pub const MIN_DUPLICATE_WINDOW_SECS: u64 = 120;

/// JetStream settings shared by every stream and bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JetStreamConfig {
    /// Replicas of every stream and bucket (1 locally, 3 in a cluster).
    pub replicas: usize,
    /// How long a goal inbox keeps an unread message, in seconds.
    pub inbox_max_age_secs: u64,
    /// JetStream de-duplication window, in seconds: a retried publish with the same
    /// `Nats-Msg-Id` inside it is stored once.
    pub duplicate_window_secs: u64,
    /// How long registry/goal events are kept, in seconds.
    pub events_max_age_secs: u64,
    /// How long a call record is kept after its last change, in seconds (well above the
    /// 300 s maximum call timeout, so late and retried replies are answered correctly).
    pub calls_max_age_secs: u64,
    /// How long a task record (and its index entries) is kept after its last change, in
    /// seconds; a task left untouched longer is forgotten.
    pub tasks_max_age_secs: u64,
    /// How long an item addressed to a person (note, ask, approval) is kept after its last
    /// change, in seconds: longer than the seven days an ask or approval may wait.
    pub people_max_age_secs: u64,
    /// How long the audit trail keeps a record, in seconds (0 = forever).
    pub audit_max_age_secs: u64,
    /// Most bytes the audit trail keeps, oldest dropped first (0 = no limit).
    pub audit_max_bytes: u64,
    /// How long a file stays readable after its upload, and after each delivery of a message
    /// carrying it, in seconds (docs/protocol.md §17): the files service keeps a file until
    /// then, the door grants its readers that long.
    pub files_retention_secs: u64,
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        Self {
            replicas: 1,
            inbox_max_age_secs: 7 * 24 * 3600,
            duplicate_window_secs: 120,
            events_max_age_secs: 7 * 24 * 3600,
            calls_max_age_secs: 24 * 3600,
            tasks_max_age_secs: 30 * 24 * 3600,
            people_max_age_secs: 30 * 24 * 3600,
            audit_max_age_secs: 90 * 24 * 3600,
            audit_max_bytes: 0,
            files_retention_secs: 7 * 24 * 3600,
        }
    }
}

#[cfg(test)]
// figment::Jail closures return figment::Error, which is large; fine in tests.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Demo {
        limit: u32,
        nested: DemoNested,
    }

    impl Section for Demo {
        fn validate(&self) -> Result<(), String> {
            if self.limit > 100 {
                return Err(format!("limit {} is over 100", self.limit));
            }
            Ok(())
        }
    }

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct DemoNested {
        depth: u32,
    }

    #[test]
    fn defaults_then_file_then_env() {
        Jail::expect_with(|jail| {
            let defaults = RuntimeConfig::load(&figment())?;
            assert_eq!(defaults, RuntimeConfig::default());
            assert_eq!(defaults.nats.ping_interval_ms, 5_000);

            jail.create_file(
                "switchboard.toml",
                r#"
                shutdown_grace_ms = 2000
                [nats]
                urls = ["nats://file:4222"]
                user = "svc"
                password = "hunter2"
                [demo]
                limit = 5
                [demo.nested]
                depth = 1
                "#,
            )?;
            jail.set_env(
                "SWITCHBOARD_NATS__URLS",
                "[nats://env-a:4222, nats://env-b:4222]",
            );
            jail.set_env("SWITCHBOARD_DEMO__NESTED__DEPTH", "9");
            jail.set_env("SWITCHBOARD_JETSTREAM__REPLICAS", "3");

            let fig = figment();
            let rt = RuntimeConfig::load(&fig)?;
            assert_eq!(rt.shutdown_grace_ms, 2000);
            assert_eq!(rt.nats.urls, vec!["nats://env-a:4222", "nats://env-b:4222"]);
            assert_eq!(rt.nats.user.as_deref(), Some("svc"));
            assert_eq!(
                rt.nats.password.as_ref().map(Secret::expose),
                Some("hunter2")
            );
            assert!(
                !format!("{rt:?}").contains("hunter2"),
                "secrets are redacted"
            );
            assert_eq!(rt.jetstream.replicas, 3);

            let demo: Demo = section(&fig, "demo")?;
            assert_eq!(
                demo,
                Demo {
                    limit: 5,
                    nested: DemoNested { depth: 9 }
                }
            );
            let missing: Demo = section(&fig, "absent")?;
            assert_eq!(missing, Demo::default());
            jail.set_env("SWITCHBOARD_DEMO__LIMIT", "101");
            let err = section::<Demo>(&figment(), "demo").unwrap_err();
            assert!(
                err.to_string().contains("[demo] limit 101 is over 100"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_in_a_section_are_errors() {
        Jail::expect_with(|jail| {
            jail.create_file("switchboard.toml", "[nats]\nurl = \"typo\"\n")?;
            let err = RuntimeConfig::load(&figment()).unwrap_err();
            assert!(err.to_string().contains("url"), "{err}");
            jail.set_env("SWITCHBOARD_DEMO__LIMTI", "1");
            assert!(section::<Demo>(&figment(), "demo").is_err());
            Ok(())
        });
    }

    #[test]
    fn contradictions_are_errors() {
        Jail::expect_with(|jail| {
            jail.set_env("SWITCHBOARD_NATS__URLS", "[]");
            let err = RuntimeConfig::load(&figment()).unwrap_err();
            assert!(err.to_string().contains("nats.urls is empty"), "{err}");
            jail.set_env("SWITCHBOARD_NATS__URLS", "[nats://a:4222]");
            jail.set_env("SWITCHBOARD_NATS__USER", "svc");
            let err = RuntimeConfig::load(&figment()).unwrap_err();
            assert!(err.to_string().contains("together"), "{err}");
            jail.set_env("SWITCHBOARD_NATS__PASSWORD", "pw");
            jail.set_env("SWITCHBOARD_JETSTREAM__REPLICAS", "0");
            assert!(RuntimeConfig::load(&figment()).is_err());
            jail.set_env("SWITCHBOARD_JETSTREAM__REPLICAS", "3");
            assert!(RuntimeConfig::load(&figment()).is_ok());
            jail.set_env("SWITCHBOARD_JETSTREAM__DUPLICATE_WINDOW_SECS", "119");
            let err = RuntimeConfig::load(&figment()).unwrap_err();
            assert!(err.to_string().contains("duplicate_window_secs"), "{err}");
            jail.set_env("SWITCHBOARD_JETSTREAM__DUPLICATE_WINDOW_SECS", "120");
            assert!(RuntimeConfig::load(&figment()).is_ok());
            jail.set_env("SWITCHBOARD_JETSTREAM__INBOX_MAX_AGE_SECS", "60");
            let err = RuntimeConfig::load(&figment()).unwrap_err();
            assert!(err.to_string().contains("inbox_max_age_secs"), "{err}");
            jail.set_env("SWITCHBOARD_JETSTREAM__INBOX_MAX_AGE_SECS", "120");
            assert!(RuntimeConfig::load(&figment()).is_ok());
            jail.set_env("SWITCHBOARD_WORKER_THREADS", "100000");
            let err = RuntimeConfig::load(&figment()).unwrap_err();
            assert!(err.to_string().contains("worker_threads"), "{err}");
            jail.set_env("SWITCHBOARD_WORKER_THREADS", "0");
            assert_eq!(RuntimeConfig::load(&figment()).unwrap().worker_threads, 0);
            jail.set_env(CONFIG_PATH_ENV, "missing.toml");
            let err = RuntimeConfig::load(&figment()).unwrap_err();
            assert!(err.to_string().contains("missing.toml"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn config_file_path_from_env() {
        Jail::expect_with(|jail| {
            jail.create_file("other.toml", "[telemetry]\nlog = \"debug\"\n")?;
            jail.set_env(CONFIG_PATH_ENV, "other.toml");
            assert_eq!(RuntimeConfig::load(&figment())?.telemetry.log, "debug");
            Ok(())
        });
    }
}
