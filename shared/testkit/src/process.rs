//! Service binaries as real processes: start one configured by environment, wait until its
//! micro service answers `$SRV.PING`, stop it with SIGTERM, or check it refuses bad config.
//! A process still running when its [`ServiceProcess`] is dropped is killed and waited for.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::eventually;
use crate::spawn::kill_blocking;

/// A service binary running against a test server. Dropped while it runs (a test that failed
/// before stopping it), it is killed (SIGKILL) and waited for, so no process outlives its test.
#[derive(Debug)]
pub struct ServiceProcess {
    child: Child,
    service: String,
    client: async_nats::Client,
}

fn command(bin: &str) -> Command {
    let mut command = Command::new(bin);
    command
        .env_remove("SWITCHBOARD_CONFIG")
        .env("RUST_LOG", "warn")
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    command
}

impl ServiceProcess {
    /// Starts `bin` (e.g. `env!("CARGO_BIN_EXE_directory")`) against `nats_url` with extra
    /// `SWITCHBOARD_*` variables, and waits (at most 30 s) until `$SRV.PING.<service>` answers.
    ///
    /// # Panics
    /// If the process exits first (with its exit status), or never answers.
    pub async fn start(bin: &str, service: &str, nats_url: &str, env: &[(&str, &str)]) -> Self {
        Self::start_within(bin, service, nats_url, env, Duration::from_secs(30)).await
    }

    /// [`ServiceProcess::start`], waiting up to `ready_within` for the first `PING` answer (a
    /// service that waits for a slow JetStream before it serves).
    pub async fn start_within(
        bin: &str,
        service: &str,
        nats_url: &str,
        env: &[(&str, &str)],
        ready_within: Duration,
    ) -> Self {
        let mut command = command(bin);
        command
            .env("SWITCHBOARD_NATS__URLS", format!("[{nats_url}]"))
            .stderr(Stdio::inherit());
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|err| panic!("testkit: cannot start {bin}: {err}"));
        let client = async_nats::connect(nats_url)
            .await
            .unwrap_or_else(|err| panic!("testkit: cannot connect to {nats_url}: {err}"));
        let mut process = Self {
            child,
            service: service.to_owned(),
            client,
        };
        let deadline = tokio::time::Instant::now() + ready_within;
        loop {
            // A service that exits fails at once, with its exit status.
            if let Some(status) = process
                .child
                .try_wait()
                .expect("testkit: cannot poll a child")
            {
                panic!(
                    "testkit: {service} ({bin}) exited ({status}) before answering $SRV.PING.{service}"
                );
            }
            if process.answers_ping().await {
                return process;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "testkit: {service} ({bin}) never answered $SRV.PING.{service}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn answers_ping(&self) -> bool {
        let ping = self.client.request(
            switchboard_proto::subject::service_ping(&self.service, None),
            "".into(),
        );
        matches!(
            tokio::time::timeout(Duration::from_millis(500), ping).await,
            Ok(Ok(_))
        )
    }

    /// How the process exited, or `None` while it runs.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("testkit: cannot poll a child")
    }

    /// The process id (for reading its resource use from `/proc`), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// A connection to the same server, for requests to the service.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Sends `SIG<signal>` (`TERM`, `KILL`, …) and waits (bounded: 20 s) for the exit — for a
    /// replica among others, where someone still answers `PING` afterwards.
    pub async fn signal(mut self, signal: &str) -> ExitStatus {
        let pid = self
            .child
            .id()
            .expect("testkit: the service already exited");
        let sent = Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .await
            .expect("testkit: cannot run kill");
        assert!(sent.success(), "testkit: kill -{signal} {pid} failed");
        tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("testkit: {} did not exit after SIG{signal}", self.service))
            .expect("testkit: waiting for the service failed")
    }

    /// Sends SIGTERM and waits (bounded) for the exit; then waits until the server has
    /// dropped the service's subscriptions (nobody answers PING).
    pub async fn terminate(mut self) -> ExitStatus {
        let pid = self
            .child
            .id()
            .expect("testkit: the service already exited");
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await
            .expect("testkit: cannot run kill");
        assert!(sent.success(), "testkit: kill -TERM {pid} failed");
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("testkit: {} did not exit after SIGTERM", self.service))
            .expect("testkit: waiting for the service failed");
        let gone = eventually(Duration::from_secs(10), || async {
            !self.answers_ping().await
        })
        .await;
        assert!(
            gone,
            "testkit: {} still answers after exiting",
            self.service
        );
        status
    }
}

/// Checks `bin` refuses each of [`BAD_SETTINGS`] and then each of `own` (its section's bad
/// values) before connecting: exit code 64 and one stderr line starting
/// `<service>: invalid configuration`.
pub async fn refuses_bad_settings(bin: &str, service: &str, own: &[(&str, &str)]) {
    let prefix = format!("{service}: invalid configuration");
    for (key, value) in BAD_SETTINGS.iter().chain(own) {
        let (code, stderr) = config_error(bin, key, value).await;
        assert_eq!(code, Some(64), "{key}={value}: {stderr}");
        assert!(stderr.starts_with(&prefix), "{key}={value}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one clear line: {stderr}");
    }
}

impl ServiceProcess {
    /// Sends `body` to `subject` as an agent would and returns the JSON reply.
    pub async fn request_json(&self, subject: &str, body: &str) -> serde_json::Value {
        let reply = tokio::time::timeout(
            Duration::from_secs(10),
            self.client()
                .request(subject.to_owned(), body.to_owned().into()),
        )
        .await
        .unwrap_or_else(|_| panic!("testkit: {} did not answer {subject}", self.service))
        .unwrap_or_else(|err| panic!("testkit: request to {subject} failed: {err}"));
        serde_json::from_slice(&reply.payload)
            .unwrap_or_else(|err| panic!("testkit: {subject} answered non-JSON: {err}"))
    }

    /// Stops the process with SIGTERM and checks it exited cleanly.
    pub async fn stops_cleanly(self) {
        let service = self.service.clone();
        let status = self.terminate().await;
        assert!(status.success(), "{service}: clean exit, got {status:?}");
    }
}

/// Runs `bin` with one bad setting and returns its exit code and stderr (it must not need a
/// server to refuse the configuration).
pub async fn config_error(bin: &str, key: &str, value: &str) -> (Option<i32>, String) {
    let output = command(bin)
        .env(key, value)
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap_or_else(|err| panic!("testkit: cannot run {bin}: {err}"));
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `bin` against `nats_url` with extra `SWITCHBOARD_*` variables until it exits by itself
/// (bounded: 60 s) and returns its exit code and stderr — for settings only the server can
/// refuse, such as more `jetstream.replicas` than the cluster has servers.
pub async fn run_to_exit(bin: &str, nats_url: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = command(bin);
    command
        .env("SWITCHBOARD_NATS__URLS", format!("[{nats_url}]"))
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap_or_else(|_| panic!("testkit: {bin} did not exit within 60 s"))
        .unwrap_or_else(|err| panic!("testkit: cannot run {bin}: {err}"));
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The bad settings every service binary must refuse with exit code 64 and one line.
pub const BAD_SETTINGS: &[(&str, &str)] = &[
    ("SWITCHBOARD_NATS__URLS", "[]"),
    ("SWITCHBOARD_NATS__USER", "svc-without-password"),
    ("SWITCHBOARD_NATS__PING_INTERVAL_MS", "soon"),
    ("SWITCHBOARD_NATS__URL", "typo-in-the-key"),
    ("SWITCHBOARD_CONFIG", "/nonexistent/switchboard.toml"),
];

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        // Does nothing to a process that has already exited and been waited for.
        kill_blocking(&mut self.child);
    }
}
