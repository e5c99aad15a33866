//! Service replicas in-process: one [`Service`] started on its own NATS connection and run
//! until stopped, the configs tests use, and every service across a cluster.

use std::sync::Arc;
use std::time::Duration;

use switchboard_runtime::{CancellationToken, RuntimeConfig};
use tokio::task::JoinHandle;

use crate::DirectoryConfig;

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

/// A directory config with fast offline detection for tests.
pub fn fast_offline(timeout_ms: u64) -> DirectoryConfig {
    DirectoryConfig {
        heartbeat_timeout_ms: timeout_ms,
        sweep_interval_ms: 50,
        ..DirectoryConfig::default()
    }
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

/// Runs `switchboard --json <args>` against the fabric at `url`, as a person would on the
/// command line, and returns its parsed output (panics with its stderr when it fails).
pub async fn switchboard_json(url: &str, args: &[&str]) -> serde_json::Value {
    let out = tokio::process::Command::new(service_bin("switchboard"))
        .arg("--json")
        .args(args)
        .env("NATS_URL", url)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "switchboard {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Correlator settings for tests: quick sweeps.
pub fn fast_calls() -> reply_correlator::CorrelatorConfig {
    reply_correlator::CorrelatorConfig {
        sweep_interval_ms: 50,
        ..Default::default()
    }
}

/// The people the SDK suites address (`sdk/python/tests`, `sdk/typescript/test`): alice and
/// bob answer for `role:oncall`, alice may approve; carol may approve only.
pub const SDK_PEOPLE: &str = r#"
[[person]]
id = "alice"
name = "Alice"
roles = ["oncall"]
access = ["viewer", "approver"]

[[person]]
id = "bob"
name = "Bob"
roles = ["oncall"]

[[person]]
id = "carol"
name = "Carol"
access = ["approver"]
"#;

/// A people replica on `url` reading [`SDK_PEOPLE`] (written into `dir`).
pub async fn start_sdk_people(url: &str, dir: &std::path::Path) -> Replica {
    let file = dir.join("people.toml");
    std::fs::write(&file, SDK_PEOPLE).expect("the people file is written");
    Service::People(fast_people(&file))
        .start(&runtime(url))
        .await
}

/// People settings for tests: quick sweeps and reloads of the people file at `file`.
pub fn fast_people(file: &std::path::Path) -> people::PeopleConfig {
    people::PeopleConfig {
        file: Some(file.to_owned()),
        sweep_interval_ms: 50,
        reload_interval_ms: 50,
        ..Default::default()
    }
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

/// One service and its settings: what a test starts in-process.
pub enum Service {
    Directory(DirectoryConfig),
    Fanout(inbox_fanout::FanoutConfig),
    /// An inbox-fanout replica publishing through its own publisher (fault injection).
    FanoutWith(
        inbox_fanout::FanoutConfig,
        Arc<dyn inbox_fanout::InboxPublisher>,
    ),
    Correlator(reply_correlator::CorrelatorConfig),
    Tasks(task_lifecycle::TaskConfig),
    Audit(audit::AuditConfig),
    Gateway(a2a_gateway::GatewayConfig),
    People(people::PeopleConfig),
    /// A limits replica.
    Limits(limits::LimitsConfig),
    /// A files replica (its runtime's `jetstream.files_retention_secs` from
    /// [`Service::start`]'s).
    Files(files::FilesConfig),
    Console(console::ConsoleConfig),
}

/// What a test may reach into while a service runs.
pub enum Handle {
    /// The service offers nothing in-process.
    None,
    /// The task service, to call its rules directly.
    Tasks(Arc<task_lifecycle::Tasks>),
    /// The audit trail, to read its index.
    Trail(Arc<audit::Trail>),
    /// The A2A gateway's address.
    Listening(std::net::SocketAddr),
}

impl Service {
    /// The service's name (and its NATS connection's).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Directory(_) => "directory",
            Self::Fanout(_) | Self::FanoutWith(..) => "inbox-fanout",
            Self::Correlator(_) => "reply-correlator",
            Self::Tasks(_) => "task-lifecycle",
            Self::Audit(_) => "audit",
            Self::Gateway(_) => "a2a-gateway",
            Self::People(_) => "people",
            Self::Limits(_) => "limits",
            Self::Files(_) => "files",
            Self::Console(_) => "console",
        }
    }

    /// Connects with `runtime`'s NATS settings, starts the service and runs it until the
    /// replica is stopped.
    pub async fn start(self, runtime: &RuntimeConfig) -> Replica {
        self.start_with_handle(runtime).await.0
    }

    /// [`Service::start`], also returning what a test may reach into.
    pub async fn start_with_handle(self, runtime: &RuntimeConfig) -> (Replica, Handle) {
        let name = self.name();
        let client = switchboard_runtime::nats::connect(&runtime.nats, name)
            .await
            .unwrap();
        // Each service's start is boxed: inline, the largest of them sizes every test's
        // future, and a test that starts a few overflowed the test thread's stack.
        match self {
            Self::Directory(config) => {
                let running = Box::pin(directory::start(&client, runtime, config))
                    .await
                    .unwrap();
                (Replica::spawn(name, |stop| running.run(stop)), Handle::None)
            }
            Self::Fanout(config) => {
                let running = Box::pin(inbox_fanout::start(&client, runtime, config))
                    .await
                    .unwrap();
                (Replica::spawn(name, |stop| running.run(stop)), Handle::None)
            }
            Self::FanoutWith(config, publisher) => {
                let running = Box::pin(inbox_fanout::start_with(
                    &client, runtime, config, publisher,
                ))
                .await
                .unwrap();
                (Replica::spawn(name, |stop| running.run(stop)), Handle::None)
            }
            Self::Correlator(config) => {
                let running = Box::pin(reply_correlator::start(&client, runtime, config))
                    .await
                    .unwrap();
                (Replica::spawn(name, |stop| running.run(stop)), Handle::None)
            }
            Self::Tasks(config) => {
                let running = Box::pin(task_lifecycle::start(&client, runtime, config))
                    .await
                    .unwrap();
                let tasks = running.tasks();
                let replica = Replica::spawn(name, |stop| running.run(stop));
                (replica, Handle::Tasks(tasks))
            }
            Self::Audit(config) => {
                let running = Box::pin(audit::start(&client, runtime, config))
                    .await
                    .unwrap();
                let trail = running.trail();
                let replica = Replica::spawn(name, |stop| running.run(stop));
                (replica, Handle::Trail(trail))
            }
            Self::Gateway(config) => {
                let running = Box::pin(a2a_gateway::start(&client, runtime, config))
                    .await
                    .unwrap();
                let address = running.local_addr().unwrap();
                let replica = Replica::spawn(name, |stop| running.run(stop));
                (replica, Handle::Listening(address))
            }
            Self::People(config) => {
                let running = Box::pin(people::start(&client, runtime, config))
                    .await
                    .unwrap();
                (Replica::spawn(name, |stop| running.run(stop)), Handle::None)
            }
            Self::Limits(config) => {
                let running = Box::pin(limits::start(&client, runtime, config))
                    .await
                    .unwrap();
                (Replica::spawn(name, |stop| running.run(stop)), Handle::None)
            }
            Self::Files(config) => {
                let running = Box::pin(files::start(&client, runtime, config))
                    .await
                    .unwrap();
                (Replica::spawn(name, |stop| running.run(stop)), Handle::None)
            }
            Self::Console(config) => {
                let running = Box::pin(console::start(&client, runtime, config))
                    .await
                    .unwrap();
                let address = running.local_addr().unwrap();
                let replica = Replica::spawn(name, |stop| running.run(stop));
                (replica, Handle::Listening(address))
            }
        }
    }
}

/// A limits replica (docs/protocol.md §15).
pub async fn start_limits(url: &str) -> Replica {
    start_limits_with(url, limits::LimitsConfig::default()).await
}

/// A limits replica with its own `[limits]` settings.
pub async fn start_limits_with(url: &str, config: limits::LimitsConfig) -> Replica {
    Service::Limits(config).start(&runtime(url)).await
}

/// A files replica (docs/protocol.md §17) with its own `[files]` settings.
pub async fn start_files_with(url: &str, config: files::FilesConfig) -> Replica {
    Service::Files(config).start(&runtime(url)).await
}

/// A directory replica.
pub async fn start_directory(url: &str, config: DirectoryConfig) -> Replica {
    Service::Directory(config).start(&runtime(url)).await
}

/// An inbox-fanout replica.
pub async fn start_fanout(url: &str, config: inbox_fanout::FanoutConfig) -> Replica {
    Service::Fanout(config).start(&runtime(url)).await
}

/// A reply-correlator replica.
pub async fn start_correlator(url: &str, config: reply_correlator::CorrelatorConfig) -> Replica {
    Service::Correlator(config).start(&runtime(url)).await
}

/// A task-lifecycle replica.
pub async fn start_tasks(url: &str, config: task_lifecycle::TaskConfig) -> Replica {
    Service::Tasks(config).start(&runtime(url)).await
}

/// A task-lifecycle replica and its service, for calling it in-process.
pub async fn start_tasks_in_process(
    url: &str,
    config: task_lifecycle::TaskConfig,
) -> (Replica, Arc<task_lifecycle::Tasks>) {
    let (replica, Handle::Tasks(tasks)) = Service::Tasks(config)
        .start_with_handle(&runtime(url))
        .await
    else {
        panic!("task-lifecycle hands out its Tasks");
    };
    (replica, tasks)
}

/// An audit replica and its trail, for reading its index in-process.
pub async fn start_audit(url: &str, config: audit::AuditConfig) -> (Replica, Arc<audit::Trail>) {
    start_audit_with(&runtime(url), config).await
}

/// An audit replica with these runtime settings (e.g. audit retention).
pub async fn start_audit_with(
    runtime: &RuntimeConfig,
    config: audit::AuditConfig,
) -> (Replica, Arc<audit::Trail>) {
    let (replica, Handle::Trail(trail)) = Service::Audit(config).start_with_handle(runtime).await
    else {
        panic!("audit hands out its trail");
    };
    (replica, trail)
}

/// Starts the services in-process on a cluster, each connected first to its own node
/// (directory 0, inbox-fanout 1, reply-correlator 2, task-lifecycle 0, audit 1, as far as the
/// cluster has nodes) with R3 streams; `with_audit` adds the audit. They stop with the token.
pub async fn start_services_across(urls: &[String], with_audit: bool) -> CancellationToken {
    let shutdown = CancellationToken::new();
    let mut services = vec![
        (0, Service::Directory(Default::default())),
        (1, Service::Fanout(Default::default())),
        (2, Service::Correlator(Default::default())),
        (0, Service::Tasks(Default::default())),
    ];
    if with_audit {
        services.push((1, Service::Audit(Default::default())));
    }
    for (first, service) in services {
        let runtime = cluster_runtime(rotated(urls, first % urls.len()));
        let replica = service.start(&runtime).await;
        let stop = replica.shutdown.clone();
        let outer = shutdown.clone();
        tokio::spawn(async move {
            outer.cancelled().await;
            stop.cancel();
        });
    }
    shutdown
}
