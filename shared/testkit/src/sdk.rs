//! The programs in other languages the tests run: any of them to success within a deadline
//! ([`stdout_of`]), and the SDK agents the cross-language tests run beside a Rust one — the
//! TypeScript SDK's relay example (`sdk/typescript/examples/relay.ts`, built by `make test`)
//! and a Python SDK agent that makes one call. Both take an NKey seed when the fabric runs
//! under generated accounts.

use std::process::Output;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::paths::{python_bin, workspace_root};

/// Runs `command` (its output captured) and returns its stdout, failing the test when it does
/// not finish within `within` or exits non-zero (`what` names it; its stdout and stderr are
/// shown).
pub async fn stdout_of(command: &mut Command, within: Duration, what: &str) -> String {
    let output = tokio::time::timeout(within, command.kill_on_drop(true).output())
        .await
        .unwrap_or_else(|_| panic!("{what} finishes within {within:?}"))
        .unwrap_or_else(|err| panic!("{what} runs: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    stdout
}

/// Starts the TypeScript relay as agent `id` on `nats_url`: it answers each call by giving
/// the work as a task to `worker` and answering with its result (`via <id>: <result>`).
/// Returns once it printed `ready`; killed when dropped.
pub async fn start_ts_relay(nats_url: &str, id: &str, worker: &str, seed: Option<&str>) -> Child {
    let mut command = Command::new("node");
    command
        .current_dir(workspace_root().join("sdk/typescript"))
        .args(["dist/examples/relay.js", nats_url, id, worker])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(seed) = seed {
        command.env("SWITCHBOARD_NKEY_SEED", seed);
    }
    let mut relay = command
        .spawn()
        .expect("node runs the built TypeScript SDK (make test builds it)");
    let mut lines = BufReader::new(relay.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the TypeScript agent starts within 30 s")
        .unwrap()
        .unwrap_or_default();
    assert!(ready.starts_with("ready"), "{ready}");
    relay
}

/// Runs a Python SDK agent `id` (with `seed`, when given) that calls `to` with `text` and
/// prints the answer's body; its output, within 60 s.
pub async fn python_call(
    nats_url: &str,
    id: &str,
    seed: Option<&str>,
    to: &str,
    text: &str,
) -> Output {
    let seed = seed.map_or_else(String::new, |seed| format!(", nkey_seed={seed:?}"));
    let script = format!(
        "import asyncio\nfrom switchboard import Agent\n\
         async def main():\n    \
             async with await Agent.connect({nats_url:?}, {id:?}{seed}) as agent:\n        \
                 print((await agent.call({to:?}, {text:?}, timeout_ms=20000))['body'])\n\
         asyncio.run(main())\n",
    );
    tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(python_bin())
            .args(["-c", &script])
            .env("PYTHONPATH", workspace_root().join("sdk/python"))
            .output(),
    )
    .await
    .expect("the Python agent finishes within 60 s")
    .unwrap()
}
