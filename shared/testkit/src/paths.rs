//! Where the test tools live: the nats-server binary, the Python venv of the foreign-client
//! tests, and the workspace root that holds them.

use std::path::PathBuf;

/// Path to the nats-server binary: `$NATS_SERVER_BIN`, else
/// `<workspace root>/.tools/nats-server/bin/nats-server` (where `nats/install-server.sh` puts
/// it, as `make test` does).
///
/// # Panics
/// With "nats-server not found: run nats/install-server.sh (or set NATS_SERVER_BIN)" if
/// neither exists, or if `$NATS_SERVER_BIN` is set to a path that does not exist.
pub fn nats_server_bin() -> PathBuf {
    locate_nats_server().unwrap_or_else(|err| panic!("{err}"))
}

/// Where [`nats_server_bin`] looks (`switchboard up` looks in more places: `cli/src/embedded.rs`).
fn locate_nats_server() -> Result<PathBuf, String> {
    const NOT_FOUND: &str =
        "nats-server not found: run nats/install-server.sh (or set NATS_SERVER_BIN)";
    if let Some(bin) = std::env::var_os("NATS_SERVER_BIN").filter(|bin| !bin.is_empty()) {
        let bin = PathBuf::from(bin);
        if bin.is_file() {
            return Ok(bin);
        }
        return Err(format!(
            "{NOT_FOUND} (NATS_SERVER_BIN={} does not exist)",
            bin.display()
        ));
    }
    let installed = workspace_root().join(".tools/nats-server/bin/nats-server");
    if installed.is_file() {
        return Ok(installed);
    }
    Err(NOT_FOUND.to_owned())
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
