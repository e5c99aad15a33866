//! Shared fixtures for the integration tests: start services in-process against a real
//! nats-server, send raw requests the way a non-Rust agent would.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use async_nats::{Client, HeaderMap};
use bytes::Bytes;
use serde_json::Value;
use switchboard_client::{Agent, AgentOptions};
use switchboard_proto::{AgentCard, AgentId, HEADER_SERVICE_ERROR_CODE};
use switchboard_runtime::{CancellationToken, RuntimeConfig};
use tokio::task::JoinHandle;

pub use directory::DirectoryConfig;

pub mod bench;

/// Runtime settings pointing at `url`, with a short grace period for tests.
pub fn runtime(url: &str) -> RuntimeConfig {
    let mut config = RuntimeConfig::default();
    config.nats.urls = vec![url.to_owned()];
    config.shutdown_grace_ms = 2_000;
    config
}

/// One in-process service replica with its own NATS connection; [`Replica::stop`] drains it.
pub struct Replica {
    name: &'static str,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<()>,
}

impl Replica {
    fn spawn<F, Fut>(name: &'static str, run: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(shutdown.clone()));
        Self {
            name,
            shutdown,
            task,
        }
    }

    /// Stops serving (drains) and waits for the replica to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap_or_else(|_| panic!("{} did not stop within 10 s", self.name))
            .unwrap();
    }
}

/// A directory replica.
pub async fn start_directory(url: &str, config: DirectoryConfig) -> Replica {
    let client = async_nats::connect(url).await.unwrap();
    let dir = directory::start(&client, &runtime(url), config)
        .await
        .unwrap();
    Replica::spawn("directory", |shutdown| dir.run(shutdown))
}

/// An inbox-fanout replica.
pub async fn start_fanout(url: &str, config: inbox_fanout::FanoutConfig) -> Replica {
    let client = async_nats::connect(url).await.unwrap();
    let running = inbox_fanout::start(&client, &runtime(url), config)
        .await
        .unwrap();
    Replica::spawn("inbox-fanout", |shutdown| running.run(shutdown))
}

/// An inbox-fanout replica publishing through `publisher`.
pub async fn start_fanout_with(
    url: &str,
    config: inbox_fanout::FanoutConfig,
    publisher: std::sync::Arc<dyn inbox_fanout::InboxPublisher>,
) -> Replica {
    let client = async_nats::connect(url).await.unwrap();
    let running = inbox_fanout::start_with(&client, &runtime(url), config, publisher)
        .await
        .unwrap();
    Replica::spawn("inbox-fanout", |shutdown| running.run(shutdown))
}

/// A reply-correlator replica.
pub async fn start_correlator(url: &str, config: reply_correlator::CorrelatorConfig) -> Replica {
    let client = async_nats::connect(url).await.unwrap();
    let running = reply_correlator::start(&client, &runtime(url), config)
        .await
        .unwrap();
    Replica::spawn("reply-correlator", |shutdown| running.run(shutdown))
}

/// A directory config with fast offline detection for tests.
pub fn fast_offline(timeout_ms: u64) -> DirectoryConfig {
    DirectoryConfig {
        heartbeat_timeout_ms: timeout_ms,
        sweep_interval_ms: 50,
        ..DirectoryConfig::default()
    }
}

/// Connects an agent with a given card (heartbeats every `beat`).
pub async fn agent_with(url: &str, card: AgentCard, beat: Duration) -> Agent {
    let nats = switchboard_client::agent_connect_options(&card.agent_id)
        .connect(url)
        .await
        .unwrap();
    let options = AgentOptions {
        heartbeat_interval: beat,
        ..AgentOptions::default()
    };
    Agent::connect_with(nats, card, options).await.unwrap()
}

/// A service binary of this workspace next to the running test's or bench's own executable
/// (`target/<profile>/<name>`, beside `target/<profile>/deps/…`). `cargo test --workspace`
/// builds them; `make bench` builds them in release first.
pub fn service_bin(name: &str) -> String {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| panic!("cannot tell where this executable lives"));
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo test --workspace` (debug) or `cargo build --release --bins`",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// A card with open ACLs.
pub fn card(id: &str) -> AgentCard {
    AgentCard::new(AgentId::parse(id).unwrap())
}

/// Waits (at most 10 s) for the next message in a goal's inbox and acknowledges it.
pub async fn next(goal: &switchboard_client::Goal) -> switchboard_proto::InboxMessage {
    goal.recv(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("a message within 10 s")
        .ack()
        .await
        .unwrap()
}

/// Asserts that nothing more arrives in `goal`'s inbox (waits 300 ms for a stray message).
pub async fn assert_no_more(goal: &switchboard_client::Goal) {
    let stray = goal.recv(Duration::from_millis(300)).await.unwrap();
    assert!(
        stray.is_none(),
        "unexpected message: {:?}",
        stray.map(|d| d.message.clone())
    );
}

/// A raw reply: headers and JSON body.
#[derive(Debug)]
pub struct Raw {
    pub headers: Option<HeaderMap>,
    pub body: Value,
}

impl Raw {
    /// The error kind, asserting the reply is a well-formed error with micro headers.
    pub fn error_kind(&self) -> String {
        let code = self
            .headers
            .as_ref()
            .and_then(|h| h.get(HEADER_SERVICE_ERROR_CODE))
            .unwrap_or_else(|| panic!("no Nats-Service-Error-Code header on {:?}", self.body))
            .as_str()
            .to_owned();
        assert!(
            self.headers
                .as_ref()
                .and_then(|h| h.get(switchboard_proto::HEADER_SERVICE_ERROR))
                .is_some(),
            "no Nats-Service-Error header"
        );
        assert_eq!(
            code,
            self.body["error"]["code"].to_string(),
            "header code matches body code"
        );
        assert!(
            !self.body["error"]["message"].as_str().unwrap().is_empty(),
            "error message is empty"
        );
        self.body["error"]["kind"].as_str().unwrap().to_owned()
    }
}

/// Sends raw bytes to `subject` and returns the decoded reply, as a foreign client would.
pub async fn raw(client: &Client, subject: &str, payload: impl Into<Bytes>) -> Raw {
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(subject.to_owned(), payload.into()),
    )
    .await
    .unwrap_or_else(|_| panic!("no reply on {subject} within 10 s"))
    .unwrap_or_else(|err| panic!("request on {subject} failed: {err}"));
    let body = serde_json::from_slice(&reply.payload).unwrap_or_else(|err| {
        panic!(
            "reply on {subject} is not JSON ({err}): {:?}",
            reply.payload
        )
    });
    Raw {
        headers: reply.headers,
        body,
    }
}

/// Every stored event on `AGENT_EVENTS` whose subject matches `filter`, oldest first.
pub async fn stored_events(
    client: &Client,
    filter: &str,
) -> Vec<switchboard_proto::registry::RegistryEventPayload> {
    stored_json(client, filter).await
}

/// Every stored message on `AGENT_EVENTS` whose subject matches `filter`, decoded as `T`.
pub async fn stored_json<T: serde::de::DeserializeOwned>(client: &Client, filter: &str) -> Vec<T> {
    use async_nats::jetstream::consumer::{AckPolicy, pull};
    use futures::StreamExt;
    let js = async_nats::jetstream::new(client.clone());
    let stream = js
        .get_stream(switchboard_proto::EVENTS_STREAM)
        .await
        .unwrap();
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: filter.to_owned(),
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut messages = consumer
        .fetch()
        .max_messages(1000)
        .messages()
        .await
        .unwrap();
    while let Some(message) = messages.next().await {
        let message = message.unwrap();
        out.push(serde_json::from_slice(&message.payload).unwrap());
    }
    out
}

/// Correlator settings for tests: quick sweeps.
pub fn fast_calls() -> reply_correlator::CorrelatorConfig {
    reply_correlator::CorrelatorConfig {
        sweep_interval_ms: 50,
        ..Default::default()
    }
}

/// A task-lifecycle replica.
pub async fn start_tasks(url: &str, config: task_lifecycle::TaskConfig) -> Replica {
    start_tasks_in_process(url, config).await.0
}

/// A task-lifecycle replica and its service, for calling it in-process.
pub async fn start_tasks_in_process(
    url: &str,
    config: task_lifecycle::TaskConfig,
) -> (Replica, std::sync::Arc<task_lifecycle::Tasks>) {
    let client = async_nats::connect(url).await.unwrap();
    let running = task_lifecycle::start(&client, &runtime(url), config)
        .await
        .unwrap();
    let tasks = running.tasks();
    (
        Replica::spawn("task-lifecycle", |shutdown| running.run(shutdown)),
        tasks,
    )
}

/// An audit replica and its trail, for reading its index in-process.
pub async fn start_audit(
    url: &str,
    config: audit::AuditConfig,
) -> (Replica, std::sync::Arc<audit::Trail>) {
    start_audit_with(&runtime(url), config).await
}

/// An audit replica with these runtime settings (e.g. audit retention).
pub async fn start_audit_with(
    runtime: &RuntimeConfig,
    config: audit::AuditConfig,
) -> (Replica, std::sync::Arc<audit::Trail>) {
    let client = async_nats::connect(runtime.nats.urls.join(","))
        .await
        .unwrap();
    let running = audit::start(&client, runtime, config).await.unwrap();
    let trail = running.trail();
    (
        Replica::spawn("audit", |shutdown| running.run(shutdown)),
        trail,
    )
}

/// Audit settings for tests: quick redelivery and catch-up, index in a private temp file.
pub fn fast_audit() -> audit::AuditConfig {
    audit::AuditConfig {
        ack_wait_ms: 1_000,
        catch_up_interval_ms: 100,
        lease_ttl_ms: 1_000,
        ..Default::default()
    }
}

/// Task settings whose deadline sweep never runs during a test.
pub fn slow_task_sweep() -> task_lifecycle::TaskConfig {
    task_lifecycle::TaskConfig {
        sweep_interval_ms: 3_600_000,
        ..Default::default()
    }
}

/// Task settings for tests: quick sweeps.
pub fn fast_tasks() -> task_lifecycle::TaskConfig {
    task_lifecycle::TaskConfig {
        sweep_interval_ms: 50,
        ..Default::default()
    }
}

/// A nats-server with all four request services: directory, inbox-fanout, reply-correlator
/// and task-lifecycle.
pub struct Fabric {
    pub nats: switchboard_testkit::NatsServer,
    pub directory: Replica,
    pub fanout: Replica,
    pub correlator: Replica,
    /// `None` after [`Fabric::stop_tasks`].
    pub tasks: Option<Replica>,
}

impl Fabric {
    pub async fn start() -> Self {
        Self::start_with(inbox_fanout::FanoutConfig::default()).await
    }

    pub async fn start_with(config: inbox_fanout::FanoutConfig) -> Self {
        Self::start_full(config, fast_calls()).await
    }

    pub async fn start_full(
        fanout: inbox_fanout::FanoutConfig,
        calls: reply_correlator::CorrelatorConfig,
    ) -> Self {
        Self::start_all(fanout, calls, fast_tasks()).await
    }

    /// Default fan-out and calls, these task settings.
    pub async fn start_tasks_with(tasks: task_lifecycle::TaskConfig) -> Self {
        Self::start_all(Default::default(), fast_calls(), tasks).await
    }

    pub async fn start_all(
        fanout: inbox_fanout::FanoutConfig,
        calls: reply_correlator::CorrelatorConfig,
        tasks: task_lifecycle::TaskConfig,
    ) -> Self {
        let nats = switchboard_testkit::NatsServer::start().await;
        let directory = start_directory(&nats.url(), DirectoryConfig::default()).await;
        let fanout = start_fanout(&nats.url(), fanout).await;
        let correlator = start_correlator(&nats.url(), calls).await;
        let tasks = Some(start_tasks(&nats.url(), tasks).await);
        Self {
            nats,
            directory,
            fanout,
            correlator,
            tasks,
        }
    }

    /// Stops the fabric's task-lifecycle replica.
    pub async fn stop_tasks(&mut self) {
        if let Some(tasks) = self.tasks.take() {
            tasks.stop().await;
        }
    }

    pub fn url(&self) -> String {
        self.nats.url()
    }

    /// A registered agent (open ACLs, no automatic heartbeats during a test).
    pub async fn agent(&self, id: &str) -> Agent {
        agent_with(&self.url(), card(id), Duration::from_secs(3600)).await
    }

    /// A registered agent with one open goal.
    pub async fn agent_with_goal(&self, id: &str) -> (Agent, switchboard_client::Goal) {
        let agent = self.agent(id).await;
        let goal = agent.open_goal().await.unwrap();
        (agent, goal)
    }

    /// An agent with one goal whose runtime answers every call request with `answer(body)`,
    /// serving each request in its call's scope (so calls it makes name their parent).
    pub async fn answering(
        &self,
        id: &str,
        answer: impl Fn(String) -> String + Send + Sync + 'static,
    ) -> (std::sync::Arc<Agent>, JoinHandle<()>) {
        let agent = std::sync::Arc::new(self.agent(id).await);
        let goal = agent.open_goal().await.unwrap();
        let me = std::sync::Arc::clone(&agent);
        let task = tokio::spawn(async move {
            loop {
                let Ok(Some(delivery)) = goal.recv(Duration::from_secs(60)).await else {
                    continue;
                };
                let message = delivery.ack().await.unwrap();
                if message.kind == switchboard_proto::MessageKind::Request
                    && let Some(correlation_id) = message.correlation_id
                {
                    let text = answer(message.body.clone());
                    let _ = me.reply(correlation_id, &text).await;
                }
            }
        });
        (agent, task)
    }

    /// Messages stored in AGENT_INBOX right now.
    pub async fn stored(&self) -> u64 {
        let js = async_nats::jetstream::new(self.nats.client().await);
        let mut stream = js
            .get_stream(switchboard_proto::INBOX_STREAM)
            .await
            .unwrap();
        stream.info().await.unwrap().state.messages
    }
}

/// A minimal OTLP/HTTP sink: records the body of every POST to /v1/traces.
pub async fn otlp_sink() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&bodies);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let sink = std::sync::Arc::clone(&sink);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map(|v| v.trim().parse().unwrap())
                        .unwrap_or(0);
                    if buf.len() < end + 4 + length {
                        continue;
                    }
                    if head.starts_with("post /v1/traces") {
                        sink.lock()
                            .unwrap()
                            .push(buf[end + 4..end + 4 + length].to_vec());
                    }
                    buf.drain(..end + 4 + length);
                    let _ = socket
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                }
            });
        }
    });
    (url, bodies)
}

/// Every record in `AGENT_AUDIT`, read straight from the stream.
pub async fn audit_records(nats: &async_nats::Client) -> Vec<switchboard_proto::audit::AuditEntry> {
    let js = async_nats::jetstream::new(nats.clone());
    let stream = js
        .get_stream(switchboard_proto::AUDIT_STREAM)
        .await
        .unwrap();
    let mut out = Vec::new();
    audit::store::read_range(&stream, 1, |stored| {
        let hash = stored
            .headers
            .as_ref()
            .and_then(|h| h.get(switchboard_proto::audit::HEADER_AUDIT_HASH))
            .unwrap()
            .to_string();
        out.push(switchboard_proto::audit::AuditEntry {
            seq: stored.seq,
            hash,
            record: serde_json::from_slice(&stored.payload).unwrap(),
        });
        Ok(())
    })
    .await
    .unwrap();
    out
}

/// `<stream>:<seq>` of every message the two source streams hold now.
pub async fn source_ids(nats: &async_nats::Client) -> std::collections::BTreeSet<String> {
    let js = async_nats::jetstream::new(nats.clone());
    let mut ids = std::collections::BTreeSet::new();
    for name in [
        switchboard_proto::INBOX_STREAM,
        switchboard_proto::EVENTS_STREAM,
    ] {
        let mut stream = js.get_stream(name).await.unwrap();
        let state = stream.info().await.unwrap().state.clone();
        if state.messages == 0 {
            continue;
        }
        assert_eq!(
            state.messages,
            state.last_sequence + 1 - state.first_sequence,
            "{name} has no gaps in this test"
        );
        for seq in state.first_sequence..=state.last_sequence {
            ids.insert(format!("{name}:{seq}"));
        }
    }
    ids
}

/// `<stream>:<seq>` of every message the two source streams ever stored (sequences
/// `1..=last`), including those evicted or expired since: what the audit must have recorded.
pub async fn stored_ever(nats: &async_nats::Client) -> std::collections::BTreeSet<String> {
    let js = async_nats::jetstream::new(nats.clone());
    let mut ids = std::collections::BTreeSet::new();
    for name in [
        switchboard_proto::INBOX_STREAM,
        switchboard_proto::EVENTS_STREAM,
    ] {
        let mut stream = js.get_stream(name).await.unwrap();
        let last = stream.info().await.unwrap().state.last_sequence;
        for seq in 1..=last {
            ids.insert(format!("{name}:{seq}"));
        }
    }
    ids
}

/// Settings for a service or agent on a cluster: `urls` (first one preferred) and R3 streams.
pub fn cluster_runtime(urls: Vec<String>) -> RuntimeConfig {
    let mut runtime = RuntimeConfig::default();
    runtime.nats.urls = urls;
    runtime.jetstream.replicas = 3;
    runtime
}

/// `urls` starting at node `first`: a client connects there and fails over to the rest.
pub fn rotated(urls: &[String], first: usize) -> Vec<String> {
    (0..urls.len())
        .map(|i| urls[(first + i) % urls.len()].clone())
        .collect()
}

/// Starts the services in-process on a cluster, each connected first to its own node
/// (directory 0, inbox-fanout 1, reply-correlator 2, task-lifecycle 0, audit 1, as far as the
/// cluster has nodes) with R3 streams; `with_audit` adds the audit. They stop with the token.
pub async fn start_services_across(urls: &[String], with_audit: bool) -> CancellationToken {
    let shutdown = CancellationToken::new();
    let connect = |first: usize, name: &'static str| {
        let runtime = cluster_runtime(rotated(urls, first % urls.len()));
        async move {
            let client = switchboard_runtime::nats::connect(&runtime.nats, name)
                .await
                .unwrap();
            (client, runtime)
        }
    };
    let (c, rt) = connect(0, "directory").await;
    let service = directory::start(&c, &rt, Default::default()).await.unwrap();
    tokio::spawn(service.run(shutdown.clone()));
    let (c, rt) = connect(1, "inbox-fanout").await;
    let service = inbox_fanout::start(&c, &rt, Default::default())
        .await
        .unwrap();
    tokio::spawn(service.run(shutdown.clone()));
    let (c, rt) = connect(2, "reply-correlator").await;
    let service = reply_correlator::start(&c, &rt, Default::default())
        .await
        .unwrap();
    tokio::spawn(service.run(shutdown.clone()));
    let (c, rt) = connect(0, "task-lifecycle").await;
    let service = task_lifecycle::start(&c, &rt, Default::default())
        .await
        .unwrap();
    tokio::spawn(service.run(shutdown.clone()));
    if with_audit {
        let (c, rt) = connect(1, "audit").await;
        let service = audit::start(&c, &rt, Default::default()).await.unwrap();
        tokio::spawn(service.run(shutdown.clone()));
    }
    shutdown
}
