//! `switchboard up` as a user runs it: the embedded nats-server starts, the directory serves,
//! the inspection commands work, and Ctrl-C (SIGINT) stops everything cleanly.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because it holds one scenario per test of `switchboard up` as a user
// runs it; every integration file is its own test binary, so a topic gets one file however
// many tests it has.

use std::process::Stdio;
use std::time::Duration;

mod common;

use common::{free_port, json, switchboard};
use switchboard_client::Agent;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The banner `up` prints once everything serves, through its `Stop:` line (30 s at most).
async fn read_banner(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> String {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut banner = String::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            banner.push_str(&line);
            banner.push('\n');
            if line.starts_with("Stop:") {
                break;
            }
        }
        banner
    })
    .await
    .expect("up prints its banner")
}

/// `switchboard up` with its embedded nats-server on `port`, data under `dir`, stdout piped
/// (for the banner).
fn embedded_up(dir: &std::path::Path, port: u16) -> tokio::process::Child {
    switchboard()
        .args([
            "up",
            "--port",
            &port.to_string(),
            "--a2a-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.join("nats"))
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn up_runs_the_embedded_system_and_stops_on_ctrl_c() {
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let mut up = embedded_up(data.path(), port);
    // However the test ends, `up` gets Ctrl-C and stops its embedded nats-server (a killed
    // `up` would leave the server running).
    let _interrupt = common::InterruptOnDrop(up.id());
    let mut lines = BufReader::new(up.stdout.take().unwrap()).lines();
    let banner = read_banner(&mut lines).await;
    assert!(
        banner.contains(&format!("NATS:      {url} (embedded nats-server")),
        "{banner}"
    );
    assert!(
        banner.contains(
            "services:  directory, inbox-fanout, reply-correlator, task-lifecycle, audit, a2a-gateway"
        ),
        "{banner}"
    );
    assert!(
        data.path().join("nats/jetstream").exists(),
        "JetStream data in the data dir"
    );

    let agent = Agent::connect(&url, "researcher").await.unwrap();
    let goal = agent.open_goal().await.unwrap();

    let (ok, agents, _) = json(&["agents", "--nats-url", &url]).await;
    assert!(ok);
    assert_eq!(agents[0]["agent_id"], "researcher");
    assert_eq!(agents[0]["live_goals"], 1);
    assert_eq!(agents[0]["status"], "idle");

    let (ok, peers, _) = json(&["peers", "--as", "researcher", "--nats-url", &url]).await;
    assert!(ok);
    assert_eq!(peers, serde_json::json!({"peers": []}));
    let (ok, peers, _) = json(&["peers", "--as", "stranger", "--nats-url", &url]).await;
    assert!(ok);
    assert_eq!(peers["note"], "agent `stranger` is not registered");

    let (ok, looked, _) = json(&["lookup", "researcher", "--nats-url", &url]).await;
    assert!(ok);
    assert_eq!(looked["live_goals"][0], goal.id().to_string());
    let (ok, _, stderr) = json(&["lookup", "ghost", "--nats-url", &url]).await;
    assert!(!ok, "errors exit non-zero");
    assert!(stderr.contains("not_found"), "{stderr}");
    let (ok, _, stderr) = json(&["peers", "--as", "Not.Valid", "--nats-url", &url]).await;
    assert!(!ok);
    assert!(stderr.contains("invalid"), "{stderr}");

    // send as a second agent, then read the inbox without consuming it.
    let writer = Agent::connect(&url, "writer").await.unwrap();
    let (ok, report, stderr) = json(&[
        "send",
        "--as",
        "writer",
        "--to",
        "researcher",
        "draft ready",
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok, "{stderr}");
    assert_eq!(report["delivered_to"][0], goal.id().to_string());
    assert_eq!(report["unreachable_reasons"], serde_json::json!([]));
    let (ok, report, _) = json(&[
        "send",
        "--as",
        "writer",
        "--to",
        "ghost",
        "x",
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok);
    assert_eq!(report["unreachable_reasons"][0], "unknown agent_id `ghost`");
    let (ok, _, stderr) = json(&[
        "send",
        "--as",
        "writer",
        "--to",
        "writer",
        "me",
        "--nats-url",
        &url,
    ])
    .await;
    assert!(!ok, "a refused send exits non-zero");
    assert!(stderr.contains("self_send"), "{stderr}");

    let goal_id = goal.id().to_string();
    let output = switchboard()
        .args([
            "inbox",
            "--as",
            "researcher",
            "--goal",
            &goal_id,
            "--nats-url",
            &url,
            "--json",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(printed.len(), 1);
    assert_eq!(printed[0]["body"], "draft ready");
    assert_eq!(printed[0]["from_agent_id"], "writer");
    // Not consumed: the goal itself still gets it.
    let taken = goal.drain().await.unwrap();
    assert_eq!(taken.len(), 1);
    let output = switchboard()
        .args([
            "inbox",
            "--as",
            "writer",
            "--goal",
            &goal_id,
            "--nats-url",
            &url,
            "--json",
        ])
        .output()
        .await
        .unwrap();
    assert!(!output.status.success(), "someone else's goal is refused");

    // A parked call from the CLI, seen as pending by the callee, answered with reply.
    let (ok, parked, stderr) = json(&[
        "call",
        "--as",
        "writer",
        "--to",
        "researcher",
        "title?",
        "--park",
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok, "{stderr}");
    let cid = parked["correlation_id"].as_str().unwrap().to_owned();
    let (ok, pending, _) = json(&["pending", "--as", "researcher", "--nats-url", &url]).await;
    assert!(ok);
    assert_eq!(pending["incoming"][0]["correlation_id"], cid.as_str());
    let (ok, ack, stderr) = json(&[
        "reply",
        "--as",
        "researcher",
        &cid,
        "Beyond the Inbox",
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok, "{stderr}");
    assert_eq!(ack["correlation_id"], cid.as_str());
    let (ok, pending, _) = json(&["pending", "--as", "researcher", "--nats-url", &url]).await;
    assert!(ok);
    assert_eq!(pending["incoming"], serde_json::json!([]));
    // A waiting call nobody answers: a timeout error and a non-zero exit.
    let (ok, _, stderr) = json(&[
        "call",
        "--as",
        "writer",
        "--to",
        "researcher",
        "hello?",
        "--timeout-ms",
        "300",
        "--nats-url",
        &url,
    ])
    .await;
    assert!(!ok);
    assert!(stderr.contains("timeout"), "{stderr}");

    // Tasks: create as writer for researcher, see it listed and read it, cancel it.
    goal.drain().await.unwrap();
    let (ok, created, stderr) = json(&[
        "task",
        "create",
        "--as",
        "writer",
        "--to",
        "researcher",
        "find three sources",
        "--deadline-ms",
        "600000",
        "--callback",
        r#"{"session_id":"chat:42"}"#,
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok, "{stderr}");
    let task_id = created["task"]["task_id"].as_str().unwrap().to_owned();
    assert_eq!(created["task"]["state"], "submitted");
    assert_eq!(created["delivered_to"][0], goal.id().to_string());
    let handed = goal.drain().await.unwrap();
    assert_eq!(handed[0].kind, switchboard_client::proto::MessageKind::Task);
    let (ok, listed, _) = json(&[
        "task",
        "list",
        "--as",
        "researcher",
        "--role",
        "assignee",
        "--state",
        "submitted",
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok);
    assert_eq!(listed["tasks"][0]["task_id"], task_id.as_str());
    let (ok, got, _) = json(&[
        "task",
        "get",
        "--as",
        "writer",
        &task_id,
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok);
    assert_eq!(got["task"]["callback"]["session_id"], "chat:42");
    let (ok, canceled, stderr) = json(&[
        "task",
        "cancel",
        "--as",
        "writer",
        &task_id,
        "--reason",
        "not needed",
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok, "{stderr}");
    assert_eq!(canceled["task"]["state"], "canceled");
    let (ok, _, stderr) = json(&[
        "task",
        "cancel",
        "--as",
        "researcher",
        &task_id,
        "--nats-url",
        &url,
    ])
    .await;
    assert!(!ok, "a refused op exits non-zero");
    assert!(stderr.contains("not_allowed"), "{stderr}");
    let (ok, _, stderr) = json(&[
        "task",
        "list",
        "--as",
        "writer",
        "--state",
        "asleep",
        "--nats-url",
        &url,
    ])
    .await;
    assert!(!ok);
    assert!(stderr.contains("--state"), "{stderr}");

    // The audit trail: the task's thread, a history page, the chain, an export.
    let mut thread = serde_json::Value::Null;
    for _ in 0..100 {
        let (ok, found, stderr) = json(&["thread", &task_id, "--nats-url", &url]).await;
        assert!(ok, "{stderr}");
        let kinds: Vec<String> = found["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["kind"].as_str().unwrap().to_owned())
            .collect();
        if kinds.contains(&"task.cancel".to_owned()) {
            thread = found;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kinds: Vec<&str> = thread["records"]
        .as_array()
        .expect("the task's thread reaches its cancel")
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    let at = |kind: &str| {
        kinds
            .iter()
            .position(|k| *k == kind)
            .unwrap_or_else(|| panic!("{kind} missing from {kinds:?}"))
    };
    assert!(at("task.created") < at("task.cancel"), "{kinds:?}");
    assert!(at("task") < at("task_update"), "{kinds:?}");
    let (ok, page, stderr) = json(&[
        "history",
        "--agent",
        "writer",
        "--kind",
        "task.*",
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok, "{stderr}");
    assert!(!page["records"].as_array().unwrap().is_empty());
    let (ok, verified, stderr) = json(&["audit", "verify", "--nats-url", &url]).await;
    assert!(ok, "{stderr}");
    assert_eq!(verified["ok"], true);
    let output = switchboard()
        .args(["audit", "export", "--kind", "task.*", "--nats-url", &url])
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    let exported: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(exported.len() >= 2, "{exported:?}");
    assert!(
        exported
            .iter()
            .all(|l| l["kind"].as_str().unwrap().starts_with("task."))
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("exported"));
    let (ok, _, stderr) = json(&["history", "--since", "yesterday", "--nats-url", &url]).await;
    assert!(!ok);
    assert!(stderr.contains("--since"), "{stderr}");
    drop(writer);
    drop(goal);
    drop(agent);

    let status = tokio::process::Command::new("kill")
        .args(["-INT", &up.id().unwrap().to_string()])
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(20), up.wait())
        .await
        .expect("up stops after Ctrl-C")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    let rest = lines.next_line().await.unwrap().unwrap_or_default();
    assert_eq!(rest, "Switchboard stopped.");
    // The embedded server is gone too.
    assert!(async_nats::connect(&url).await.is_err());
}

#[tokio::test]
async fn inspection_commands_fail_clearly_without_a_server() {
    let url = format!("nats://127.0.0.1:{}", free_port());
    let (ok, _, stderr) = json(&["agents", "--nats-url", &url]).await;
    assert!(!ok);
    assert!(stderr.contains("is `switchboard up` running?"), "{stderr}");
}

#[tokio::test]
async fn up_refuses_more_replicas_than_the_server_can_place_with_exit_64() {
    let nats = switchboard_testkit::NatsServer::start().await;
    let output = switchboard()
        .args(["up", "--nats-url", &nats.url()])
        .env("SWITCHBOARD_JETSTREAM__REPLICAS", "3")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("jetstream.replicas is 3"), "{stderr}");
}

/// `up --auth DIR`: the embedded server runs the accounts `nats-config` wrote; an agent signs
/// in with its key (the CLI with `--nkey`), a client without a key is refused, and the
/// services sign in with `services.nk` on their own.
#[tokio::test]
async fn up_with_auth_runs_the_generated_accounts() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(
        data.path().join("agents.toml"),
        "[[agents]]\nid = \"alice\"\n[[agents]]\nid = \"bob\"\n",
    )
    .unwrap();
    let (ok, _, err) = common::text(&[
        "nats-config",
        "--agents",
        data.path().join("agents.toml").to_str().unwrap(),
        "--out",
        data.path().join("auth").to_str().unwrap(),
    ])
    .await;
    assert!(ok, "{err}");
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let mut up = switchboard()
        .args([
            "up",
            "--port",
            &port.to_string(),
            "--auth",
            "auth",
            "--a2a-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data.path().join("nats"))
        .current_dir(data.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let _interrupt = common::InterruptOnDrop(up.id());
    let mut lines = BufReader::new(up.stdout.take().unwrap()).lines();
    let banner = read_banner(&mut lines).await;
    assert!(banner.contains("access:    accounts from auth"), "{banner}");

    assert!(
        async_nats::connect(url.as_str()).await.is_err(),
        "no key, no connection"
    );
    let key = |agent: &str| data.path().join(format!("auth/agents/{agent}.nk"));
    let seed = std::fs::read_to_string(key("alice")).unwrap();
    let id = switchboard_client::proto::AgentId::parse("alice").unwrap();
    let nats = switchboard_client::agent_connect_options(&id)
        .nkey(seed.trim().to_owned())
        .connect(url.as_str())
        .await
        .unwrap();
    let alice = Agent::connect_with(
        nats,
        switchboard_client::proto::AgentCard::new(id),
        switchboard_client::AgentOptions::default(),
    )
    .await
    .unwrap();
    let goal = alice.open_goal().await.unwrap();
    // bob, through the CLI with his key, registers and sends to alice.
    let (ok, _, err) = json(&[
        "register",
        "--as",
        "bob",
        "--nkey",
        key("bob").to_str().unwrap(),
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    let (ok, report, err) = json(&[
        "send",
        "--as",
        "bob",
        "--to",
        "alice",
        "hello alice",
        "--nkey",
        key("bob").to_str().unwrap(),
        "--nats-url",
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert_eq!(report["delivered_to"][0], goal.id().to_string(), "{report}");
    let got = goal.recv(Duration::from_secs(10)).await.unwrap().unwrap();
    assert_eq!(got.ack().await.unwrap().body, "hello alice");
    // bob's key cannot speak for alice.
    let started = std::time::Instant::now();
    let (ok, _, err) = json(&[
        "send",
        "--as",
        "alice",
        "--to",
        "bob",
        "spoofed",
        "--nkey",
        key("bob").to_str().unwrap(),
        "--nats-url",
        &url,
    ])
    .await;
    assert!(!ok, "bob's key cannot send as alice");
    assert!(err.contains("Permissions Violation"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "refused at once, not after the request timeout"
    );
}

/// Issue 26, items 9 and 12: `up --nats-url` takes a comma-separated list as NATS tools do (a
/// server that is down is failed over), and `up` started before its NATS is listening waits
/// for it and serves once it is up; the CLI takes the same list.
#[tokio::test]
async fn up_takes_a_server_list_and_waits_for_nats_to_come_up() {
    let mut nats = switchboard_testkit::NatsServer::start().await;
    let url = nats.url();
    nats.stop().await;
    let down = format!("nats://127.0.0.1:{}", free_port());
    let list = format!("{down}, {url}");
    let up = switchboard()
        .args(["up", "--nats-url", &list, "--a2a-listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let _stop = common::InterruptOnDrop(up.id());
    // NATS comes up 2 s after `up` started.
    tokio::time::sleep(Duration::from_secs(2)).await;
    nats.start_again().await;
    let client = nats.client().await;
    let ready = switchboard_testkit::eventually(Duration::from_secs(30), || {
        let ping = client.request("$SRV.PING.directory", "".into());
        async move {
            matches!(
                tokio::time::timeout(Duration::from_millis(500), ping).await,
                Ok(Ok(_))
            )
        }
    })
    .await;
    assert!(ready, "up never served once NATS came up");
    let agent = Agent::connect(&list, "listed").await.unwrap();
    agent.open_goal().await.unwrap();
    let (ok, agents, err) = json(&["agents", "--nats-url", &list]).await;
    assert!(ok, "{err}");
    assert!(agents.to_string().contains("listed"), "{agents}");
}

/// Issue 26, item 8: `up` killed hard (SIGKILL, no chance to clean up) takes its embedded
/// nats-server with it, so the port and the data folder are free for the next `up`.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_hard_killed_up_leaves_no_nats_server_behind() {
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut up = embedded_up(data.path(), port);
    let _interrupt = common::InterruptOnDrop(up.id());
    let mut lines = BufReader::new(up.stdout.take().unwrap()).lines();
    read_banner(&mut lines).await;
    let address = format!("127.0.0.1:{port}");
    assert!(tokio::net::TcpStream::connect(&address).await.is_ok());
    up.start_kill().unwrap();
    up.wait().await.unwrap();
    let gone = switchboard_testkit::eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(&address).await.is_err()
    })
    .await;
    assert!(gone, "the embedded nats-server outlived a SIGKILL of up");
}

/// Issue 26, item 11: docs/deploy.md's commands for the compose stack's default (the generated
/// accounts), run as written against `switchboard up` with those accounts: the operator signs
/// in with `services.nk`, an agent with its own key, both through
/// `SWITCHBOARD_NATS__NKEY_FILE`, over a comma-separated `NATS_URL`.
#[tokio::test]
async fn the_deploy_guides_commands_run_under_the_generated_accounts() {
    let system = common::System::start_secured(&["researcher", "writer"]).await;
    let researcher_key = system.agent_key("researcher");
    let auth = researcher_key
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    let nats_url = format!("{},{}", system.url(), system.url());
    let run = |key: std::path::PathBuf, args: &[&str]| {
        let mut command = switchboard();
        command
            .env("NATS_URL", &nats_url)
            .env("SWITCHBOARD_NATS__NKEY_FILE", key)
            .args(args);
        async move {
            let output = command.output().await.unwrap();
            (
                output.status.success(),
                String::from_utf8_lossy(&output.stdout).to_string(),
                String::from_utf8_lossy(&output.stderr).to_string(),
            )
        }
    };
    let (ok, _, err) = run(researcher_key.clone(), &["register", "--as", "researcher"]).await;
    assert!(ok, "{err}");
    let (ok, out, err) = run(auth.join("services.nk"), &["agents"]).await;
    assert!(ok && out.contains("researcher"), "{err}\n{out}");
    let (ok, _, err) = run(researcher_key, &["peers", "--as", "researcher"]).await;
    assert!(ok, "{err}");
    // Without a key the server refuses the same command.
    let output = switchboard()
        .env("NATS_URL", &nats_url)
        .args(["agents"])
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
}
