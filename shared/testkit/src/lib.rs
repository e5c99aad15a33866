//! Test helpers for Switchboard: real `nats-server` processes with JetStream
//! (a single server or an n-node cluster on loopback) and bounded polling
//! assertions.
//!
//! The server binary is found by [`nats_server_bin`]; install the pinned version
//! once with `bash nats/install-server.sh`.
//!
//! Every server gets a free loopback port, a unique name and its own temporary
//! store directory, so tests can run in parallel. Processes are killed (and
//! their temp dirs removed) when the [`NatsServer`] / [`NatsCluster`] is dropped.
//! Setup failures panic with a clear message that includes the tail of the
//! server's log.
//!
//! Never sleep for a fixed time in a test: poll with [`assert_eventually!`] or
//! [`eventually`] instead.
//!
//! ```no_run
//! use std::time::Duration;
//! use switchboard_testkit::{NatsServer, assert_eventually};
//!
//! # async fn example() {
//! // Inside a `#[tokio::test]`:
//! let mut server = NatsServer::start().await;
//! let js = async_nats::jetstream::new(server.client().await);
//! js.create_stream(async_nats::jetstream::stream::Config {
//!     name: "ORDERS".into(),
//!     subjects: vec!["orders.>".into()],
//!     ..Default::default()
//! })
//! .await
//! .unwrap();
//! js.publish("orders.1", "hello".into()).await.unwrap().await.unwrap();
//!
//! // Same port, same store: the message survives a restart.
//! server.restart().await;
//! let js = async_nats::jetstream::new(server.client().await);
//! assert_eventually!(
//!     Duration::from_secs(5),
//!     async {
//!         match js.get_stream("ORDERS").await {
//!             Ok(mut stream) => stream.info().await.is_ok_and(|i| i.state.messages == 1),
//!             Err(_) => false,
//!         }
//!     },
//!     "stream ORDERS on {} lost its message",
//!     server.url()
//! );
//! # }
//! ```

// Panicking with a clear message is the intended way for test setup to fail,
// so unwrap/expect (denied workspace-wide outside tests) are fine here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod process;

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::future::Future;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

/// How long [`NatsServer`] waits for a (re)started server to be ready.
const READY_TIMEOUT_SINGLE: Duration = Duration::from_secs(10);
/// How long [`NatsCluster`] waits for its nodes (and a meta leader).
const READY_TIMEOUT_CLUSTER: Duration = Duration::from_secs(30);
/// Poll interval of readiness checks and [`eventually`].
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How many log lines a readiness panic shows.
const LOG_TAIL_LINES: usize = 40;
/// How long a blocking kill (in `Drop`) waits for the process to exit.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Path to the nats-server binary.
///
/// Looked up in this order: `$NATS_SERVER_BIN`, then
/// `<workspace root>/.tools/nats-server/bin/nats-server` (where
/// `nats/install-server.sh` puts it), then `nats-server` on `PATH`.
///
/// # Panics
/// With "nats-server not found: run nats/install-server.sh (or set
/// NATS_SERVER_BIN)" if none exists, or if `$NATS_SERVER_BIN` is set to a
/// path that does not exist.
pub fn nats_server_bin() -> PathBuf {
    switchboard_runtime::embedded::locate_nats_server().unwrap_or_else(|err| panic!("{err}"))
}

/// The Python interpreter of the tests' pinned venv (`<workspace root>/.tools/py-venv`, built
/// by `tests/python/install.sh`, which `make test` runs): it has `nats-py` and the official MCP
/// SDK for the foreign-client tests.
///
/// # Panics
/// When the venv is missing, saying how to build it (a foreign-client test never skips).
pub fn python_bin() -> PathBuf {
    let python = workspace_root().join(".tools/py-venv/bin/python");
    assert!(
        python.exists(),
        "testkit: {} not found: run `make test` or `bash tests/python/install.sh` first",
        python.display()
    );
    python
}

/// The workspace root (the directory holding `Cargo.lock`), found from this crate's manifest.
pub fn workspace_root() -> PathBuf {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while !dir.join("Cargo.lock").exists() {
        assert!(
            dir.pop(),
            "testkit: no Cargo.lock above {}",
            env!("CARGO_MANIFEST_DIR")
        );
    }
    dir
}

/// Sends `SIG<name>` to `pid` with kill(1) (no unsafe code here); failures are reported.
fn signal(pid: u32, name: &str) {
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
fn unique_name(kind: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "sb-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("testkit: cannot create a temp dir for nats-server")
}

/// Free loopback ports, all distinct (listeners are held until every port is
/// picked, then released).
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("testkit: cannot bind 127.0.0.1:0"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("testkit: local_addr").port())
        .collect()
}

/// Starts `bin args`, stdout and stderr appended to `log_path`.
fn spawn_server(bin: &Path, args: &[OsString], log_path: &Path) -> Child {
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
fn kill_blocking(child: &mut Child) {
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
fn check_alive(child: &mut Child) -> Result<(), String> {
    match child.try_wait() {
        Ok(None) => Ok(()),
        Ok(Some(status)) => Err(format!("nats-server exited early ({status})")),
        Err(e) => Err(format!("cannot check the nats-server process: {e}")),
    }
}

/// The last `lines` lines of a log file.
fn log_tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

fn readiness_panic(what: &str, reason: &str, log_path: &Path) -> ! {
    panic!(
        "testkit: {what} did not become ready: {reason}\n\
         ---- last {LOG_TAIL_LINES} lines of {} ----\n{}\n---- end of log ----",
        log_path.display(),
        log_tail(log_path, LOG_TAIL_LINES)
    );
}

/// Connect options for `url`, taking `user:password@` out of it as credentials.
/// How a client signs in to a test server.
#[derive(Debug, Clone)]
pub enum Login {
    /// No credentials.
    Open,
    /// A user and password.
    Password(String, String),
    /// An NKey seed (`SU…`).
    Nkey(String),
}

impl Login {
    /// Connect options carrying these credentials.
    pub fn options(&self) -> async_nats::ConnectOptions {
        match self {
            Login::Open => async_nats::ConnectOptions::new(),
            Login::Password(user, password) => {
                async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
            }
            Login::Nkey(seed) => async_nats::ConnectOptions::with_nkey(seed.clone()),
        }
    }
}

async fn connect(url: &str, login: &Login) -> async_nats::Client {
    login
        .options()
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("testkit: cannot connect to {url}: {e}"))
}

/// Waits until a client can connect to `url` and a JetStream API request
/// (account info) through it succeeds. `alive` is checked on every round so a
/// crashed server fails fast.
async fn wait_jetstream(
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

/// Status code and body of `GET path` on the monitoring port.
async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let request = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(1), request)
        .await
        .map_err(|_| format!("GET {path} on port {port} timed out"))?
        .map_err(|e| format!("GET {path} on port {port}: {e}"))?;
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("GET {path} on port {port}: bad response {text:?}"))?;
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or("")
        .trim()
        .to_owned();
    Ok((status, body))
}

/// One real nats-server with JetStream, on a free loopback port, with its own
/// temporary store dir.
///
/// The process is killed when this is dropped (and then the temp dir deleted).
/// Its stdout/stderr go to a log file in the temp dir ([`NatsServer::log_path`]).
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    bin: PathBuf,
    name: String,
    port: u16,
    store_dir: PathBuf,
    ports_dir: PathBuf,
    log_path: PathBuf,
    /// How clients sign in.
    auth: Login,
    /// A config file passed with `-c` (its `authorization` replaces `--user`/`--pass`).
    config_file: Option<PathBuf>,
    // Declared last, and `Drop` kills the process first: the dir is removed
    // only once the server is gone.
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server (`-a 127.0.0.1 -p -1 -js -sd <tmp>/store ...`) and waits
    /// (at most 10 s) until it answers JetStream API requests.
    ///
    /// # Panics
    /// If the binary is missing or the server does not become ready (the
    /// message includes the tail of its log).
    pub async fn start() -> NatsServer {
        Self::start_inner(Login::Open, None).await
    }

    /// Like [`NatsServer::start`], but the server requires `user`/`password` (`--user`,
    /// `--pass`). [`NatsServer::url`] stays credential-free; [`NatsServer::client`] and the
    /// readiness check log in.
    pub async fn start_with_user(user: &str, password: &str) -> NatsServer {
        Self::start_inner(Login::Password(user.to_owned(), password.to_owned()), None).await
    }

    /// Like [`NatsServer::start`], with `config` (nats-server config text, e.g. an
    /// `authorization` block) written to a file and passed with `-c`; `login` is the user the
    /// readiness check and [`NatsServer::client`] connect as.
    pub async fn start_with_config(config: &str, login: Login) -> NatsServer {
        Self::start_inner(login, Some(config.to_owned())).await
    }

    async fn start_inner(auth: Login, config: Option<String>) -> NatsServer {
        let bin = nats_server_bin();
        let dir = temp_dir("sb-nats-");
        let store_dir = dir.path().join("store");
        let ports_dir = dir.path().join("ports");
        fs::create_dir_all(&ports_dir).expect("testkit: cannot create the ports dir");
        let mut server = NatsServer {
            child: None,
            bin,
            name: unique_name("nats"),
            port: 0,
            store_dir,
            ports_dir,
            log_path: dir.path().join("nats-server.log"),
            auth,
            config_file: None,
            _dir: dir,
        };
        if let Some(config) = config {
            let path = server._dir.path().join("nats-server.conf");
            fs::write(&path, server.with_name(&config))
                .expect("testkit: cannot write the server config");
            server.config_file = Some(path);
        }
        server.launch(None).await;
        server
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port (stays the same across [`NatsServer::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream store directory (stays the same across restarts).
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// The server's unique name (`server_name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log file the server's stdout and stderr go to (all runs appended).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The OS process id, or `None` while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// A new client connected to [`NatsServer::url`] with default options.
    ///
    /// # Panics
    /// If the connection fails (e.g. the server is stopped).
    pub async fn client(&self) -> async_nats::Client {
        connect(&self.url(), &self.auth).await
    }

    /// Replaces the config file given at start (the server reads it on [`NatsServer::reload`]).
    ///
    /// # Panics
    /// If the server was started without a config, or the file cannot be written.
    pub fn rewrite_config(&self, config: &str) {
        let path = self
            .config_file
            .as_ref()
            .expect("testkit: this server was started without a config file");
        fs::write(path, self.with_name(config)).expect("testkit: cannot write the server config");
    }

    /// `config` with this server's name first: a reload compares the file's `server_name`
    /// with the running one (the `-n` flag does not count) and refuses a change.
    fn with_name(&self, config: &str) -> String {
        format!("server_name: {}\n{config}", quote(&self.name))
    }

    /// Sends SIGHUP: the server re-reads its config file (and what it includes) without
    /// dropping any connection, like `nats-server --signal reload`.
    ///
    /// # Panics
    /// If the server is stopped or the signal cannot be sent.
    pub fn reload(&self) {
        let pid = self.pid().expect("testkit: reload needs a running server");
        signal(pid, "HUP");
    }

    /// Kills the server process (SIGKILL, like a crash) and waits for it to
    /// exit. Does nothing if it is already stopped.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts the server again on the same port with the same store dir and
    /// waits until it is ready. Does nothing if it is running.
    ///
    /// # Panics
    /// If it does not become ready within 10 s (e.g. the port was taken).
    pub async fn start_again(&mut self) {
        if self.child.is_none() {
            self.launch(Some(self.port)).await;
        }
    }

    /// [`NatsServer::stop`] then [`NatsServer::start_again`].
    pub async fn restart(&mut self) {
        self.stop().await;
        self.start_again().await;
    }

    fn args(&self, port: Option<u16>) -> Vec<OsString> {
        let port = port.map_or_else(|| "-1".to_owned(), |p| p.to_string());
        let mut args: Vec<OsString> = [
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "-m",
            "-1",
            "-n",
            &self.name,
            "-js",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        args.push("-sd".into());
        args.push(self.store_dir.clone().into());
        args.push("--ports_file_dir".into());
        args.push(self.ports_dir.clone().into());
        if let Some(config) = &self.config_file {
            args.push("-c".into());
            args.push(config.clone().into());
        } else if let Login::Password(user, password) = &self.auth {
            args.extend([
                "--user".into(),
                user.into(),
                "--pass".into(),
                password.into(),
            ]);
        }
        args
    }

    async fn launch(&mut self, port: Option<u16>) {
        let deadline = Instant::now() + READY_TIMEOUT_SINGLE;
        let child = spawn_server(&self.bin, &self.args(port), &self.log_path);
        let pid = child.id().expect("testkit: a just-spawned child has a pid");
        let child = self.child.insert(child);
        let what = format!("nats-server {} (pid {pid})", self.name);

        let actual = match wait_ports_file(&self.ports_dir, pid, deadline, child).await {
            Ok(actual) => actual,
            Err(reason) => readiness_panic(&what, &reason, &self.log_path),
        };
        if let Some(expected) = port
            && expected != actual
        {
            readiness_panic(
                &what,
                &format!("listening on port {actual}, expected {expected}"),
                &self.log_path,
            );
        }
        self.port = actual;

        let url = format!("nats://127.0.0.1:{actual}");
        if let Err(reason) = wait_jetstream(&url, &self.auth, deadline, || check_alive(child)).await
        {
            readiness_panic(&what, &reason, &self.log_path);
        }
    }
}

/// Waits for `<dir>/<exe>_<pid>.ports` and returns the client port from it.
async fn wait_ports_file(
    dir: &Path,
    pid: u32,
    deadline: Instant,
    child: &mut Child,
) -> Result<u16, String> {
    let suffix = format!("_{pid}.ports");
    let mut last = format!("no *{suffix} file in {} yet", dir.display());
    loop {
        check_alive(child)?;
        let file = fs::read_dir(dir).ok().and_then(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.to_string_lossy().ends_with(&suffix))
        });
        if let Some(file) = file {
            match fs::read(&file).map_err(|e| e.to_string()).and_then(|b| {
                serde_json::from_slice::<serde_json::Value>(&b).map_err(|e| e.to_string())
            }) {
                Ok(json) => match client_port(&json) {
                    Some(port) => return Ok(port),
                    None => last = format!("no client port in {}: {json}", file.display()),
                },
                // Possibly caught half-written: retry.
                Err(e) => last = format!("cannot parse {}: {e}", file.display()),
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out waiting for the ports file; {last}"));
        }
        sleep(POLL_INTERVAL).await;
    }
}

/// The port of the first `"nats"` URL in a ports file.
fn client_port(ports: &serde_json::Value) -> Option<u16> {
    let url = ports.get("nats")?.as_array()?.first()?.as_str()?;
    url.rsplit(':').next()?.trim_end_matches('/').parse().ok()
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            kill_blocking(child);
        }
    }
}

#[derive(Debug)]
struct Node {
    name: String,
    port: u16,
    http_port: u16,
    config: PathBuf,
    log_path: PathBuf,
    store_dir: PathBuf,
    child: Option<Child>,
}

/// An n-node JetStream cluster on loopback. Node `i` has its own config file,
/// temp store dir and log file; all processes are killed on drop.
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<Node>,
    bin: PathBuf,
    // Declared last, and `Drop` kills the processes first.
    _dir: tempfile::TempDir,
}

impl NatsCluster {
    /// Starts `nodes` servers routed to each other as one JetStream cluster
    /// and waits (at most 30 s) until every node accepts connections, is
    /// healthy, and answers JetStream API requests (which needs a meta leader).
    ///
    /// # Panics
    /// If `nodes` is 0, the binary is missing, or the cluster does not become
    /// ready (the message includes the tail of the failing node's log).
    pub async fn start(nodes: usize) -> NatsCluster {
        assert!(nodes > 0, "testkit: a NatsCluster needs at least one node");
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let mut cluster = Self::spawn(nodes);
            let deadline = Instant::now() + READY_TIMEOUT_CLUSTER;
            let mut failure = None;
            for node in 0..nodes {
                if let Err(e) = cluster.wait_node(node, deadline).await {
                    failure = Some(e);
                    break;
                }
            }
            if failure.is_none()
                && let Err(reason) = cluster.wait_placement(deadline).await
            {
                failure = Some((0, reason));
            }
            let Some((node, reason)) = failure else {
                return cluster;
            };
            let log_path = cluster.nodes[node].log_path.clone();
            // Ports are picked then released before the servers bind them, so
            // another process may grab one in between: retry with new ports.
            if attempt < ATTEMPTS
                && log_tail(&log_path, LOG_TAIL_LINES).contains("address already in use")
            {
                continue;
            }
            let what = format!("cluster node {node} ({})", cluster.nodes[node].name);
            readiness_panic(&what, &reason, &log_path);
        }
        unreachable!("the last attempt either returns or panics")
    }

    /// `nats://127.0.0.1:<port>` of node `node`.
    pub fn url(&self, node: usize) -> String {
        format!("nats://127.0.0.1:{}", self.node(node).port)
    }

    /// The URLs of all nodes, in node order.
    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.url(i)).collect()
    }

    /// A new client connected to node `node` (default options, so it may
    /// fail over to other nodes it learns about).
    ///
    /// # Panics
    /// If the connection fails (e.g. the node is stopped).
    pub async fn client(&self, node: usize) -> async_nats::Client {
        connect(&self.url(node), &Login::Open).await
    }

    /// Kills node `node` (SIGKILL, like a crash) and waits for it to exit.
    /// Does nothing if it is already stopped.
    pub async fn stop_node(&mut self, node: usize) {
        if let Some(mut child) = self.node_mut(node).child.take() {
            let _ = child.kill().await;
        }
    }

    /// Stops node `node` with SIGTERM (a clean shutdown, as an orchestrator stops a pod) and
    /// waits (at most 30 s, then SIGKILL) for it to exit. Does nothing if it is stopped.
    pub async fn terminate_node(&mut self, node: usize) {
        if let Some(mut child) = self.node_mut(node).child.take() {
            if let Some(pid) = child.id() {
                signal(pid, "TERM");
            }
            if tokio::time::timeout(Duration::from_secs(30), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }

    /// Freezes node `node` (SIGSTOP): its process and connections stay open but nothing is
    /// answered — a hung machine, not a crashed one. Undo with [`NatsCluster::resume_node`].
    pub fn pause_node(&self, node: usize) {
        if let Some(pid) = self.node(node).child.as_ref().and_then(Child::id) {
            signal(pid, "STOP");
        }
    }

    /// Lets a paused node run again (SIGCONT) and waits (at most 30 s) until it is healthy
    /// again and streams can be placed on every node.
    ///
    /// # Panics
    /// If the node does not recover in time.
    pub async fn resume_node(&mut self, node: usize) {
        if let Some(pid) = self.node(node).child.as_ref().and_then(Child::id) {
            signal(pid, "CONT");
        }
        let deadline = Instant::now() + READY_TIMEOUT_CLUSTER;
        let ready = match self.wait_node(node, deadline).await {
            Ok(()) => self.wait_placement(deadline).await,
            Err((_, reason)) => Err(reason),
        };
        if let Err(reason) = ready {
            let n = self.node(node);
            readiness_panic(
                &format!("cluster node {node} ({})", n.name),
                &reason,
                &n.log_path,
            );
        }
    }

    /// Starts node `node` again with the same ports and store, and waits (at
    /// most 30 s) until it answers, is healthy (caught up), and JetStream API
    /// requests through it succeed (a meta leader exists). Does nothing if it
    /// is running.
    ///
    /// # Panics
    /// If the node does not become ready in time.
    pub async fn start_node(&mut self, node: usize) {
        if self.node(node).child.is_some() {
            return;
        }
        let deadline = Instant::now() + READY_TIMEOUT_CLUSTER;
        let n = self.node(node);
        let child = spawn_server(
            &self.bin,
            &["-c".into(), n.config.clone().into()],
            &n.log_path,
        );
        self.node_mut(node).child = Some(child);
        if let Err((failed, reason)) = self.wait_node(node, deadline).await {
            let n = self.node(failed);
            readiness_panic(
                &format!("cluster node {failed} ({})", n.name),
                &reason,
                &n.log_path,
            );
        }
        if self.nodes.iter().all(|n| n.child.is_some())
            && let Err(reason) = self.wait_placement(deadline).await
        {
            let n = self.node(node);
            readiness_panic(
                &format!("cluster node {node} ({})", n.name),
                &reason,
                &n.log_path,
            );
        }
    }

    /// Waits until the meta leader can place a stream on every node: every node answering
    /// is not enough, since the leader may not yet count a (re)started peer as online, and
    /// creating an R`n` stream then fails with "no suitable peers for placement". A probe
    /// stream with `n` file replicas (what tests create) is created (retried until it works)
    /// and deleted.
    ///
    /// Even then the leader may refuse placement as "peer offline" for a moment (about 100 ms,
    /// about 1 s after start-up, once in ~40 starts here; not visible in `/jsz`): tests that
    /// create replicated streams themselves use [`create_stream`], and the services retry.
    async fn wait_placement(&self, deadline: Instant) -> Result<(), String> {
        const PROBE: &str = "SB_TESTKIT_PLACEMENT_PROBE";
        let client = connect(&self.url(0), &Login::Open).await;
        let js = jetstream::new(client);
        loop {
            let config = jetstream::stream::Config {
                name: PROBE.to_owned(),
                subjects: vec!["_sb_testkit.placement_probe".to_owned()],
                num_replicas: self.nodes.len(),
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            };
            let last = match js.create_stream(config).await {
                Ok(_) => {
                    let _ = js.delete_stream(PROBE).await;
                    return Ok(());
                }
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(format!("streams cannot be placed on all nodes: {last}"));
            }
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no nodes (never true: `start` needs one).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The log file of node `node` (all its runs appended).
    pub fn log_path(&self, node: usize) -> &Path {
        &self.node(node).log_path
    }

    /// The JetStream store dir of node `node`.
    pub fn store_dir(&self, node: usize) -> &Path {
        &self.node(node).store_dir
    }

    fn node(&self, node: usize) -> &Node {
        let len = self.nodes.len();
        self.nodes
            .get(node)
            .unwrap_or_else(|| panic!("testkit: no node {node} in a {len}-node cluster"))
    }

    fn node_mut(&mut self, node: usize) -> &mut Node {
        let len = self.nodes.len();
        self.nodes
            .get_mut(node)
            .unwrap_or_else(|| panic!("testkit: no node {node} in a {len}-node cluster"))
    }

    /// Writes the configs and spawns every node (no waiting).
    fn spawn(nodes: usize) -> NatsCluster {
        let bin = nats_server_bin();
        let dir = temp_dir("sb-nats-cluster-");
        let cluster_name = unique_name("cluster");
        let ports = free_ports(nodes * 3);
        let (client_ports, rest) = ports.split_at(nodes);
        let (cluster_ports, http_ports) = rest.split_at(nodes);

        let mut list = Vec::with_capacity(nodes);
        for i in 0..nodes {
            let node_dir = dir.path().join(format!("n{i}"));
            fs::create_dir_all(&node_dir).expect("testkit: cannot create a node dir");
            let name = format!("{cluster_name}-n{i}");
            let store_dir = node_dir.join("store");
            let routes: Vec<String> = (0..nodes)
                .filter(|&j| j != i)
                .map(|j| quote(&format!("nats-route://127.0.0.1:{}", cluster_ports[j])))
                .collect();
            let config = format!(
                "server_name: {name}\n\
                 listen: {listen}\n\
                 http: {http}\n\
                 jetstream {{\n  store_dir: {store}\n  sync_interval: always\n}}\n\
                 cluster {{\n  name: {cluster}\n  listen: {cluster_listen}\n  routes: [\n    {routes}\n  ]\n}}\n",
                name = quote(&name),
                listen = quote(&format!("127.0.0.1:{}", client_ports[i])),
                http = quote(&format!("127.0.0.1:{}", http_ports[i])),
                store = quote(&store_dir.to_string_lossy()),
                cluster = quote(&cluster_name),
                cluster_listen = quote(&format!("127.0.0.1:{}", cluster_ports[i])),
                routes = routes.join("\n    "),
            );
            let config_path = node_dir.join("nats-server.conf");
            fs::write(&config_path, config).expect("testkit: cannot write a node config");
            list.push(Node {
                name,
                port: client_ports[i],
                http_port: http_ports[i],
                config: config_path,
                log_path: node_dir.join("nats-server.log"),
                store_dir,
                child: None,
            });
        }
        for node in &mut list {
            node.child = Some(spawn_server(
                &bin,
                &["-c".into(), node.config.clone().into()],
                &node.log_path,
            ));
        }
        NatsCluster {
            nodes: list,
            bin,
            _dir: dir,
        }
    }

    /// Waits until node `node` is healthy and answers JetStream API requests.
    /// On failure returns the node to blame (a crashed one, or `node`) and why.
    async fn wait_node(&mut self, node: usize, deadline: Instant) -> Result<(), (usize, String)> {
        let url = self.url(node);
        let http_port = self.node(node).http_port;
        let nodes = &mut self.nodes;
        let mut crashed = None;
        let mut alive = || {
            for (i, n) in nodes.iter_mut().enumerate() {
                if let Some(child) = n.child.as_mut()
                    && let Err(e) = check_alive(child)
                {
                    crashed = Some(i);
                    return Err(e);
                }
            }
            Ok(())
        };
        let result = wait_jetstream(&url, &Login::Open, deadline, &mut alive).await;
        // `/healthz` is 200 once the node's JetStream is current (it has a meta
        // leader and its streams and consumers have caught up).
        let result = match result {
            Ok(()) => loop {
                if let Err(e) = alive() {
                    break Err(e);
                }
                let last = match http_get(http_port, "/healthz").await {
                    Ok((200, _)) => break Ok(()),
                    Ok((status, body)) => format!("/healthz answered {status}: {body}"),
                    Err(e) => e,
                };
                if Instant::now() >= deadline {
                    break Err(format!("timed out; last error: {last}"));
                }
                sleep(POLL_INTERVAL).await;
            },
            Err(e) => Err(e),
        };
        result.map_err(|e| (crashed.unwrap_or(node), e))
    }
}

/// A NATS config string literal.
fn quote(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = node.child.as_mut() {
                let _ = child.start_kill();
            }
        }
        for node in &mut self.nodes {
            if let Some(child) = node.child.as_mut() {
                kill_blocking(child);
            }
        }
    }
}

/// Creates a stream as a careful client would on a cluster: a cluster that has just formed (or
/// had a node restarted) refuses placement as "no suitable peers for placement, peer offline"
/// for a moment (about 100 ms, seen about 1 s after start-up, after every readiness check
/// passed), so that refusal is retried for at most 10 s. Any other error is returned at once.
///
/// # Errors
/// What JetStream answered last.
pub async fn create_stream(
    js: &jetstream::Context,
    config: jetstream::stream::Config,
) -> Result<jetstream::stream::Stream, jetstream::context::CreateStreamError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match js.create_stream(config.clone()).await {
            Err(err)
                if Instant::now() < deadline
                    && matches!(
                        err.kind(),
                        jetstream::context::CreateStreamErrorKind::JetStream(api)
                            if api.error_code() == jetstream::ErrorCode::CLUSTER_NO_PEERS
                                && api.to_string().contains("offline")
                    ) =>
            {
                sleep(Duration::from_millis(50)).await;
            }
            done => return done,
        }
    }
}

/// Polls `f` every 20 ms until it returns `true` (then returns `true`) or
/// `timeout` has passed (then returns `false`). `f` is called at least once,
/// and each call is itself bounded by the time left.
///
/// ```no_run
/// # async fn example(client: async_nats::Client) {
/// use std::time::Duration;
/// let ok = switchboard_testkit::eventually(Duration::from_secs(5), || async {
///     client.request("svc.ping", "".into()).await.is_ok()
/// })
/// .await;
/// assert!(ok, "svc.ping never answered");
/// # }
/// ```
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if let Ok(true) = tokio::time::timeout(remaining.max(POLL_INTERVAL), f()).await {
            return true;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return false;
        }
        sleep(POLL_INTERVAL.min(remaining)).await;
    }
}

/// Bounded polling assertion (never a bare sleep): re-evaluates an `async`
/// block every 20 ms until it yields `true`, and panics with the given
/// message if that has not happened within the timeout.
///
/// ```no_run
/// # async fn example(js: async_nats::jetstream::Context) {
/// use std::time::Duration;
/// use switchboard_testkit::assert_eventually;
///
/// assert_eventually!(
///     Duration::from_secs(5),
///     async { js.get_stream("ORDERS").await.is_ok() },
///     "stream {} never appeared",
///     "ORDERS"
/// );
/// // The message is optional.
/// assert_eventually!(Duration::from_secs(5), async { js.query_account().await.is_ok() });
/// # }
/// ```
///
/// The block is evaluated anew on every poll, so it should borrow what it
/// uses (`async { .. }`, not `async move { .. }` on non-`Copy` values). Must be
/// used inside an async context.
#[macro_export]
macro_rules! assert_eventually {
    ($timeout:expr, $cond:expr $(,)?) => {
        $crate::assert_eventually!(
            $timeout,
            $cond,
            "condition `{}` was not met",
            ::std::stringify!($cond)
        )
    };
    ($timeout:expr, $cond:expr, $($arg:tt)+) => {{
        let timeout: ::std::time::Duration = $timeout;
        if !$crate::eventually(timeout, || $cond).await {
            ::std::panic!(
                "assert_eventually failed after {:?}: {}",
                timeout,
                ::std::format_args!($($arg)+)
            );
        }
    }};
}
