//! The embedded default: a local nats-server with JetStream that `switchboard up` starts
//! itself, so a laptop or a demo needs no separate NATS install step.
//!
//! [`locate_nats_server`] knows where the binary is (the test kit has its own, shorter
//! search: `shared/testkit/src/paths.rs`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// Environment variable naming the nats-server binary explicitly.
pub const NATS_SERVER_BIN_ENV: &str = "NATS_SERVER_BIN";
/// Where `nats/install-server.sh` installs the pinned server, relative to the project root.
pub const PROJECT_INSTALL_PATH: &str = ".tools/nats-server/bin/nats-server";

/// The nats-server binary could not be found or started.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// No binary anywhere we look.
    #[error("nats-server not found: run nats/install-server.sh (or set NATS_SERVER_BIN){0}")]
    NotFound(String),
    /// Spawning failed.
    #[error("starting {bin}: {source}")]
    Spawn {
        /// Path of the nats-server binary [`locate_nats_server`] found.
        bin: String,
        /// Why.
        source: std::io::Error,
    },
    /// The data folder could not be created.
    #[error("creating the data folder {dir}: {source}")]
    DataDir {
        /// The JetStream data folder (`-sd`) asked for.
        dir: String,
        /// Why.
        source: std::io::Error,
    },
    /// The `--auth` folder is missing `auth.conf` or `services.nk`, or the config cannot be
    /// written.
    #[error("{0}")]
    Auth(String),
    /// The server did not accept connections in time.
    #[error("nats-server did not become ready on {url} within {timeout:?}: {last}")]
    NotReady {
        /// The client URL it was started on, `nats://127.0.0.1:<port>`.
        url: String,
        /// How long we waited.
        timeout: Duration,
        /// The last attempt's error: connecting, or JetStream not answering yet.
        last: String,
    },
}

/// The project root as seen at build time (`cli/..`).
fn build_time_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Finds nats-server: `$NATS_SERVER_BIN` (must exist if set), then the project's install
/// location (under the current directory, then under the source tree this was built from),
/// then `nats-server` on `PATH`.
pub fn locate_nats_server() -> Result<PathBuf, EmbeddedError> {
    if let Some(bin) = std::env::var_os(NATS_SERVER_BIN_ENV).filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        if bin.is_file() {
            return Ok(bin);
        }
        return Err(EmbeddedError::NotFound(format!(
            " (NATS_SERVER_BIN={} does not exist)",
            bin.display()
        )));
    }
    let mut candidates = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        candidates.push(cwd.join(PROJECT_INSTALL_PATH));
    }
    candidates.push(build_time_root().join(PROJECT_INSTALL_PATH));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|dir| dir.join("nats-server")));
    }
    candidates
        .into_iter()
        .find(|candidate| candidate.is_file())
        .map(|found| found.canonicalize().unwrap_or(found))
        .ok_or_else(|| EmbeddedError::NotFound(String::new()))
}

/// The first `name` on `PATH` that is a file.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The embedded server's log file, inside its data folder.
pub const LOG_FILE: &str = "nats-server.log";

/// A nats-server child process with JetStream, stopped by [`EmbeddedNats::stop`] (or killed
/// when dropped).
#[derive(Debug)]
pub struct EmbeddedNats {
    child: Child,
    url: String,
    bin: PathBuf,
    data_dir: PathBuf,
    /// The services' NKey seed when the server runs the generated accounts.
    services_seed: Option<String>,
}

/// The config file `up --auth` writes into the data folder.
const AUTH_CONFIG_FILE: &str = "nats-server.conf";

/// `to` relative to the folder `from` (both absolute): nats-server resolves an `include`
/// against the including file's folder, even for an absolute path.
fn relative_to(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to_parts: Vec<_> = to.components().collect();
    let common = from
        .iter()
        .zip(&to_parts)
        .take_while(|(a, b)| a == b)
        .count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for part in &to_parts[common..] {
        path.push(part);
    }
    path
}

impl EmbeddedNats {
    /// Starts nats-server on `127.0.0.1:<port>` with JetStream storing under `data_dir`, and
    /// waits (bounded) until it accepts connections with JetStream ready.
    ///
    /// With `auth` (a folder `switchboard nats-config --out` wrote), the server runs its
    /// `auth.conf` — accounts SWITCHBOARD and AGENTS, one NKey per agent — and
    /// [`EmbeddedNats::services_seed`] is the key the services sign in with. `nats-server
    /// --signal reload` after regenerating picks up added agents.
    pub async fn start(
        port: u16,
        data_dir: &Path,
        auth: Option<&Path>,
    ) -> Result<Self, EmbeddedError> {
        let bin = locate_nats_server()?;
        std::fs::create_dir_all(data_dir).map_err(|source| EmbeddedError::DataDir {
            dir: data_dir.display().to_string(),
            source,
        })?;
        let data_dir = data_dir
            .canonicalize()
            .unwrap_or_else(|_| data_dir.to_owned());
        let mut config = None;
        let mut services_seed = None;
        if let Some(auth) = auth {
            let auth = auth
                .canonicalize()
                .map_err(|err| EmbeddedError::Auth(format!("--auth {}: {err}", auth.display())))?;
            let auth_file = auth.join(crate::permissions::AUTH_FILE);
            if !auth_file.is_file() {
                return Err(EmbeddedError::Auth(format!(
                    "{} is missing: run `switchboard nats-config --agents agents.toml --out {}` first",
                    auth_file.display(),
                    auth.display()
                )));
            }
            let seed = switchboard_runtime::nats::read_seed(
                &auth.join(crate::permissions::SERVICES_SEED_FILE),
            )
            .map_err(|err| EmbeddedError::Auth(err.to_string()))?;
            let path = data_dir.join(AUTH_CONFIG_FILE);
            let text = format!(
                "# Written by `switchboard up --auth`: the embedded server with the generated accounts.\nserver_name: switchboard\ninclude {:?}\n",
                relative_to(&data_dir, &auth_file).display().to_string()
            );
            std::fs::write(&path, text)
                .map_err(|err| EmbeddedError::Auth(format!("writing {}: {err}", path.display())))?;
            config = Some(path);
            services_seed = Some(seed);
        }
        // The server dies with its parent however the parent dies, SIGKILL included: Linux's
        // parent-death signal, which util-linux `setpriv` sets before it becomes nats-server
        // (same pid). Where there is no `setpriv` (macOS), a hard-killed parent leaves it
        // running.
        let mut command = match on_path("setpriv") {
            Some(setpriv) if cfg!(target_os = "linux") => {
                let mut command = Command::new(setpriv);
                command.args(["--pdeathsig", "TERM", "--"]).arg(&bin);
                command
            }
            _ => Command::new(&bin),
        };
        if let Some(config) = &config {
            command.arg("-c").arg(config);
        }
        let child = command
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-js",
                "-n",
                "switchboard",
            ])
            .arg("-sd")
            .arg(&data_dir)
            .arg("-l")
            .arg(data_dir.join(LOG_FILE))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            // Its own process group: a terminal Ctrl-C reaches only us, and we stop the
            // server after the services have drained.
            .process_group(0)
            .spawn()
            .map_err(|source| EmbeddedError::Spawn {
                bin: bin.display().to_string(),
                source,
            })?;
        let url = format!("nats://127.0.0.1:{port}");
        let server = Self {
            child,
            url,
            bin,
            data_dir,
            services_seed,
        };
        server.wait_ready(Duration::from_secs(15)).await?;
        Ok(server)
    }

    async fn wait_ready(&self, timeout: Duration) -> Result<(), EmbeddedError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::from("not tried");
        while tokio::time::Instant::now() < deadline {
            let options = match &self.services_seed {
                Some(seed) => async_nats::ConnectOptions::with_nkey(seed.clone()),
                None => async_nats::ConnectOptions::new(),
            };
            match options.connect(&self.url).await {
                Ok(client) => {
                    let js = async_nats::jetstream::new(client.clone());
                    let ready = js.query_account().await;
                    let _ = client.drain().await;
                    match ready {
                        Ok(_) => return Ok(()),
                        Err(err) => last = err.to_string(),
                    }
                }
                Err(err) => last = err.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(EmbeddedError::NotReady {
            url: self.url.clone(),
            timeout,
            last,
        })
    }

    /// The services' NKey seed, when the server runs the generated accounts (`--auth`).
    pub fn services_seed(&self) -> Option<&str> {
        self.services_seed.as_deref()
    }

    /// Where clients connect.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Path of the nats-server binary [`locate_nats_server`] found (also used to signal it).
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Where JetStream stores its data.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's log file.
    pub fn log_file(&self) -> PathBuf {
        self.data_dir.join(LOG_FILE)
    }

    /// Asks the server to shut down cleanly (it flushes JetStream), killing it if it has not
    /// exited within `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            // nats-server signals its own process portably: `--signal quit=<pid>`.
            let _ = Command::new(&self.bin)
                .arg("--signal")
                .arg(format!("quit={pid}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await;
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!("nats-server did not exit in time; killing it");
            let _ = self.child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_are_written_relative_to_the_config() {
        assert_eq!(
            relative_to(Path::new("/w/.data/nats"), Path::new("/w/auth/auth.conf")),
            PathBuf::from("../../auth/auth.conf")
        );
        assert_eq!(
            relative_to(Path::new("/w"), Path::new("/w/auth/auth.conf")),
            PathBuf::from("auth/auth.conf")
        );
    }
}
