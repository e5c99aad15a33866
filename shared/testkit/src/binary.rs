//! [`ServiceBinary`]: what every `services/*/tests/binary.rs` does with its service's compiled
//! binary — start it against a fresh nats-server, wait until it serves, ask it something, stop
//! it with SIGTERM, check it refuses bad settings — so each of those tests says only what
//! differs: the binary, its settings, its question and its answer.

use std::ops::Deref;

use crate::NatsServer;
use crate::process::{self, ServiceProcess};

/// One service's compiled binary, as its `tests/binary.rs` runs it.
///
/// The path must come from the service's own test crate (`env!("CARGO_BIN_EXE_<name>")` is
/// only set there), so each test file holds one of these as a `const`:
///
/// ```no_run
/// use switchboard_testkit::ServiceBinary;
///
/// // In services/audit/tests/binary.rs: `env!("CARGO_BIN_EXE_audit")`.
/// const AUDIT: ServiceBinary = ServiceBinary::new("target/debug/audit", "audit");
///
/// # async fn example() {
/// // Inside a `#[tokio::test]`: start, ask, stop with SIGTERM (exit 0, nobody answers PING).
/// let body = AUDIT
///     .answer_then_stop(&[("SWITCHBOARD_AUDIT__BATCH", "8")], "agent.audit.verify", "")
///     .await;
/// assert_eq!(body["ok"], true, "{body}");
/// // Bad settings: exit code 64 and one stderr line, for the common ones and these.
/// AUDIT.refuses_bad_settings(&[("SWITCHBOARD_AUDIT__BATCH", "0")]).await;
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ServiceBinary {
    bin: &'static str,
    service: &'static str,
}

impl ServiceBinary {
    /// `bin` is the test crate's `env!("CARGO_BIN_EXE_<name>")`; `service` is the name its
    /// micro service answers `$SRV.PING.<service>` under (and prefixes its config errors with).
    pub const fn new(bin: &'static str, service: &'static str) -> Self {
        Self { bin, service }
    }

    /// The binary's path, for running it another way (a subcommand, a hand-built environment).
    pub const fn bin(&self) -> &'static str {
        self.bin
    }

    /// Starts a fresh [`NatsServer`], then the binary against it with the extra `env`
    /// (`SWITCHBOARD_*` pairs), and waits (polling, at most 30 s) until the service answers
    /// `$SRV.PING.<service>`.
    ///
    /// # Panics
    /// If the binary exits before it answers (with its exit status), or never answers.
    pub async fn start(&self, env: &[(&str, &str)]) -> RunningService {
        let nats = NatsServer::start().await;
        let process = self.start_on(&nats.url(), env).await;
        RunningService { process, nats }
    }

    /// Like [`ServiceBinary::start`], against a server the test set up itself (`nats_url`: a
    /// shared [`NatsServer`], a cluster node).
    pub async fn start_on(&self, nats_url: &str, env: &[(&str, &str)]) -> ServiceProcess {
        ServiceProcess::start(self.bin, self.service, nats_url, env).await
    }

    /// The whole serve-and-stop check: [`ServiceBinary::start`] with `env`, send `body` to
    /// `subject` as an agent would, then [`RunningService::stops_cleanly`]. Returns the JSON
    /// answer for the test to check.
    ///
    /// # Panics
    /// If the service does not start, answer (within 10 s, in JSON) or stop cleanly.
    pub async fn answer_then_stop(
        &self,
        env: &[(&str, &str)],
        subject: &str,
        body: &str,
    ) -> serde_json::Value {
        let service = self.start(env).await;
        let answer = service.request_json(subject, body).await;
        service.stops_cleanly().await;
        answer
    }

    /// Checks the binary refuses each of [`process::BAD_SETTINGS`] and then each of `own` (its
    /// own section's bad values) before connecting: exit code 64 and one stderr line starting
    /// `<service>: invalid configuration`.
    pub async fn refuses_bad_settings(&self, own: &[(&str, &str)]) {
        process::refuses_bad_settings(self.bin, self.service, own).await;
    }

    /// Runs the binary against `nats_url` with the extra `env` until it exits by itself
    /// (bounded: 60 s); returns its exit code and stderr. For settings only a server can
    /// refuse, or a server that is not there.
    pub async fn run_to_exit(&self, nats_url: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
        process::run_to_exit(self.bin, nats_url, env).await
    }
}

/// A service binary serving against its own nats-server (from [`ServiceBinary::start`]).
///
/// Derefs to its [`ServiceProcess`] (`request_json`, `client`, `pid`, …). Dropped without
/// [`RunningService::stops_cleanly`] (a test that failed first), the process is killed and
/// waited for, then the server: nothing outlives the test.
#[derive(Debug)]
pub struct RunningService {
    // Declared first, so dropped first: the service goes before its server.
    process: ServiceProcess,
    nats: NatsServer,
}

impl RunningService {
    /// The server the service runs against (for a client of the test's own, or its URL).
    pub fn nats(&self) -> &NatsServer {
        &self.nats
    }

    /// Stops the service with SIGTERM and checks it exited with status 0 and that nobody
    /// answers its `PING` any more; then stops the server.
    ///
    /// # Panics
    /// If the exit is not clean or takes more than 20 s.
    pub async fn stops_cleanly(self) {
        let Self { process, nats } = self;
        process.stops_cleanly().await;
        drop(nats);
    }
}

impl Deref for RunningService {
    type Target = ServiceProcess;

    fn deref(&self) -> &ServiceProcess {
        &self.process
    }
}
