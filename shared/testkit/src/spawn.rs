//! The nats-server process plumbing [`NatsServer`](crate::NatsServer) and
//! [`NatsCluster`](crate::NatsCluster) share: unique names, free ports and temp dirs, spawning
//! with the output in a log file, signals and kills, and the readiness wait that panics with
//! the log's tail.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::net::TcpListener;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

use crate::POLL_INTERVAL;
use crate::login::Login;

/// How many log lines a readiness panic shows.
pub(crate) const LOG_TAIL_LINES: usize = 40;
/// How long a blocking kill (in `Drop`) waits for the process to exit.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Sends `SIG<name>` to `pid` with kill(1) (no unsafe code here); failures are reported.
pub(crate) fn signal(pid: u32, name: &str) {
    match std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
    {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!("testkit: kill -{name} {pid} exited {status}"),
        Err(err) => eprintln!("testkit: cannot run kill -{name} {pid}: {err}"),
    }
}

/// A name no other server started by this or a concurrent test process uses.
pub(crate) fn unique_name(kind: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "sb-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A new temporary directory named `<prefix>…`, removed when dropped.
pub(crate) fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("testkit: cannot create a temp dir for nats-server")
}

/// A free loopback port (bound, read, released): for a process the test starts that must be
/// told its port before it binds.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// Free loopback ports, all distinct (listeners are held until every port is
/// picked, then released).
pub(crate) fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("testkit: cannot bind 127.0.0.1:0"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("testkit: local_addr").port())
        .collect()
}

/// Starts `bin args`, stdout and stderr appended to `log_path`.
pub(crate) fn spawn_server(bin: &Path, args: &[OsString], log_path: &Path) -> Child {
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .unwrap_or_else(|e| panic!("testkit: cannot open {}: {e}", log_path.display()));
    // Best effort: a marker between runs of the same server in one log.
    let _ = writeln!(log, "==== testkit: starting {} {args:?}", bin.display());
    let stderr = log
        .try_clone()
        .expect("testkit: cannot clone the log file handle");
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(stderr))
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("testkit: cannot spawn {}: {e}", bin.display()))
}

/// Kills the process and waits (bounded, blocking) until it is gone. For `Drop`.
pub(crate) fn kill_blocking(child: &mut Child) {
    let _ = child.start_kill();
    let deadline = std::time::Instant::now() + KILL_WAIT;
    while std::time::Instant::now() < deadline {
        match child.try_wait() {
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Ok(Some(_)) | Err(_) => return,
        }
    }
}

/// `Err` with a description if the process has exited.
pub(crate) fn check_alive(child: &mut Child) -> Result<(), String> {
    match child.try_wait() {
        Ok(None) => Ok(()),
        Ok(Some(status)) => Err(format!("nats-server exited early ({status})")),
        Err(e) => Err(format!("cannot check the nats-server process: {e}")),
    }
}

/// The last `lines` lines of a log file.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// Fails test setup: `what` is not ready because of `reason`, with the tail of its log.
pub(crate) fn readiness_panic(what: &str, reason: &str, log_path: &Path) -> ! {
    panic!(
        "testkit: {what} did not become ready: {reason}\n\
         ---- last {LOG_TAIL_LINES} lines of {} ----\n{}\n---- end of log ----",
        log_path.display(),
        log_tail(log_path, LOG_TAIL_LINES)
    );
}

/// A client connected to `url` as `login`; panics if it cannot connect.
pub(crate) async fn connect(url: &str, login: &Login) -> async_nats::Client {
    login
        .options()
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("testkit: cannot connect to {url}: {e}"))
}

/// Waits until a client can connect to `url` and a JetStream API request
/// (account info) through it succeeds. `alive` is checked on every round so a
/// crashed server fails fast.
pub(crate) async fn wait_jetstream(
    url: &str,
    login: &Login,
    deadline: Instant,
    mut alive: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let mut client: Option<async_nats::Client> = None;
    let mut last = String::from("not checked yet");
    loop {
        alive()?;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let attempt = remaining.clamp(POLL_INTERVAL, Duration::from_secs(1));
        if client.is_none() {
            match login
                .options()
                .connection_timeout(attempt)
                .connect(url)
                .await
            {
                Ok(c) => client = Some(c),
                Err(e) => last = format!("cannot connect to {url}: {e}"),
            }
        }
        if let Some(c) = &client {
            let mut js = jetstream::new(c.clone());
            js.set_timeout(attempt);
            match js.query_account().await {
                Ok(_) => return Ok(()),
                Err(e) => last = format!("JetStream account info via {url} failed: {e}"),
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out; last error: {last}"));
        }
        sleep(POLL_INTERVAL).await;
    }
}

/// A NATS config string literal.
pub(crate) fn quote(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}
