//! [`NatsServer`]: one real nats-server with JetStream per test, on a free loopback port with
//! its own store — started open, with a user and password, or with a config file that can be
//! rewritten and reloaded.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Child;
use tokio::time::{Instant, sleep};

use crate::POLL_INTERVAL;
use crate::login::Login;
use crate::paths::nats_server_bin;
use crate::spawn::{
    check_alive, connect, kill_blocking, quote, readiness_panic, signal, spawn_server, temp_dir,
    unique_name, wait_jetstream,
};

/// How long [`NatsServer`] waits for a (re)started server to be ready.
const READY_TIMEOUT_SINGLE: Duration = Duration::from_secs(10);

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
