//! An agent in another language: `examples/python/agent.py`, written with only `nats-py` and
//! docs/protocol.md, registers, opens a goal, reads its inbox through agent.inbox.fetch/ack,
//! answers a call and sends a message — against the real system, with a Rust agent on the
//! other side.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::System;
use switchboard_client::proto::{AgentCard, AgentId};
use switchboard_client::{Agent, AgentOptions};
use switchboard_testkit::{python_bin, workspace_root};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

/// The next JSON line the Python agent prints (bounded wait).
async fn next_event(lines: &mut Lines<BufReader<ChildStdout>>) -> serde_json::Value {
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the Python agent says something within 30 s")
        .unwrap()
        .expect("the Python agent is still running");
    serde_json::from_str(&line).unwrap_or_else(|err| panic!("{err}: {line}"))
}

#[tokio::test]
async fn the_nats_py_example_agent_receives_answers_and_sends() {
    echo_session(&System::start().await).await;
}

/// The same session under the accounts `switchboard nats-config` writes: the Python agent
/// signs in with `nkeys_seed=` and reads its replies under `inbox_prefix="_INBOX.py-echo"`.
#[tokio::test]
async fn the_nats_py_example_agent_works_signed_in_with_its_key() {
    echo_session(&System::start_secured(&["tester", "py-echo"]).await).await;
}

async fn echo_session(system: &System) {
    let tester_id = AgentId::parse("tester").unwrap();
    let mut options = switchboard_client::agent_connect_options(&tester_id);
    let mut key = Vec::new();
    if system.keys.is_some() {
        let seed = std::fs::read_to_string(system.agent_key("tester")).unwrap();
        options = options.nkey(seed.trim().to_owned());
        key = vec![
            "--nkey".to_owned(),
            system.agent_key("py-echo").display().to_string(),
        ];
    }
    let nats = options.connect(system.url()).await.unwrap();
    let tester = Agent::connect_with(nats, AgentCard::new(tester_id), AgentOptions::default())
        .await
        .unwrap();
    let goal = tester.open_goal().await.unwrap();

    let mut python = tokio::process::Command::new(python_bin())
        .arg(workspace_root().join("examples/python/agent.py"))
        .args(["--nats-url", &system.url(), "--agent", "py-echo"])
        .args(key)
        .args(["--max-handled", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut events = BufReader::new(python.stdout.take().unwrap()).lines();
    let ready = next_event(&mut events).await;
    assert_eq!(ready["event"], "ready", "{ready}");
    assert_eq!(ready["agent_id"], "py-echo");
    let (ok, looked, stderr) = system
        .cli_json(&["lookup", "py-echo", "--nats-url", &system.url()])
        .await;
    assert!(ok, "{stderr}");
    assert_eq!(looked["live_goals"][0], ready["goal_id"], "{looked}");

    // A message in: the Python agent reads it and sends one back to the sender.
    let report = tester.send_to_peer("py-echo", "hello").await.unwrap();
    assert_eq!(report.delivered_to.len(), 1, "{report:?}");
    let received = next_event(&mut events).await;
    assert_eq!(received["event"], "received", "{received}");
    assert_eq!(received["from"], "tester");
    assert_eq!(received["message"], "hello");
    let sent = next_event(&mut events).await;
    assert_eq!(sent["event"], "sent", "{sent}");
    assert_eq!(sent["report"]["delivered_to"][0], goal.id().to_string());
    let echo = goal
        .recv(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the echo reaches the tester's goal")
        .ack()
        .await
        .unwrap();
    assert_eq!(echo.from_agent_id.as_str(), "py-echo");
    assert_eq!(echo.body, "py-echo got: hello");
    assert_eq!(echo.in_reply_to, report.message_id);

    // A call: the Python agent answers it with reply_to_peer, and the waiting caller gets it.
    let answer = tester
        .call("py-echo", "what time?", Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(answer.body, "py-echo answers: what time?");
    assert_eq!(answer.from_agent_id.as_str(), "py-echo");
    let received = next_event(&mut events).await;
    assert_eq!(received["kind"], "request", "{received}");
    let answered = next_event(&mut events).await;
    assert_eq!(answered["event"], "answered", "{answered}");
    assert_eq!(answered["reply"]["delivered"], "caller");

    // Two handled: it closes its goal, leaves, and exits cleanly.
    let stopped = next_event(&mut events).await;
    assert_eq!(stopped["event"], "stopped", "{stopped}");
    let status = tokio::time::timeout(Duration::from_secs(10), python.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let (_, looked, _) = system
        .cli_json(&["lookup", "py-echo", "--nats-url", &system.url()])
        .await;
    assert_eq!(looked["live_goals"], serde_json::json!([]), "{looked}");
}
