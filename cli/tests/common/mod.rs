//! What the CLI's tests share: the `switchboard` command as a user runs it, and the whole
//! system (a test nats-server plus `switchboard up --nats-url` running all five services).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use switchboard_testkit::{NatsServer, eventually};
use tokio::process::{Child, Command};

/// The services `up` runs, by their micro service names.
pub const SERVICES: [&str; 5] = [
    "directory",
    "inbox-fanout",
    "reply-correlator",
    "task-lifecycle",
    "audit",
];

/// The built `switchboard` binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `switchboard` with a clean environment (no config file, no NATS_URL), quiet logs.
pub fn switchboard() -> Command {
    let mut command = Command::new(BIN);
    command
        .env_remove("SWITCHBOARD_CONFIG")
        .env_remove("NATS_URL")
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    command
}

/// Runs `switchboard <args> --json`: (success, stdout as JSON or Null, stderr).
pub async fn json(args: &[&str]) -> (bool, serde_json::Value, String) {
    let output = switchboard()
        .args(args)
        .arg("--json")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let value = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
    (
        output.status.success(),
        value,
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// Runs `switchboard <args>`: (success, stdout, stderr) as text.
pub async fn text(args: &[&str]) -> (bool, String, String) {
    let output = switchboard().args(args).output().await.unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// A test nats-server with every service running against it in one `switchboard up` process.
pub struct System {
    /// The server.
    pub nats: NatsServer,
    up: Child,
}

impl System {
    /// Starts the server and `switchboard up --nats-url`, and waits until every service
    /// answers `$SRV.PING`.
    pub async fn start() -> System {
        let nats = NatsServer::start().await;
        let up = switchboard()
            .args(["up", "--nats-url", &nats.url()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let client = nats.client().await;
        for service in SERVICES {
            let ready = eventually(Duration::from_secs(30), || {
                let ping = client.request(format!("$SRV.PING.{service}"), "".into());
                async move {
                    matches!(
                        tokio::time::timeout(Duration::from_millis(500), ping).await,
                        Ok(Ok(_))
                    )
                }
            })
            .await;
            assert!(ready, "{service} never answered $SRV.PING");
        }
        System { nats, up }
    }

    /// The NATS URL agents use.
    pub fn url(&self) -> String {
        self.nats.url()
    }
}

impl Drop for System {
    fn drop(&mut self) {
        if let Err(err) = self.up.start_kill() {
            eprintln!("stopping switchboard up: {err}");
        }
    }
}

/// Sends SIGINT to a process when dropped (a no-op if it has exited): `switchboard up` then
/// stops its services and its embedded nats-server even when a test fails half-way.
pub struct InterruptOnDrop(pub Option<u32>);

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}
