//! `switchboard demo` against the running system: every step of the scripted conversation is
//! printed, and the audit thread of the task ends it.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{System, text};

#[tokio::test]
async fn the_demo_runs_the_scripted_conversation_and_prints_the_audit_thread() {
    let system = System::start().await;
    let (ok, out, err) = text(&["demo", "--nats-url", &system.url()]).await;
    assert!(ok, "{err}\n{out}");
    for step in [
        "setup: registered demo-coordinator, demo-researcher, demo-writer",
        "demo-coordinator: list_peers",
        "demo-coordinator: create_task → demo-researcher",
        "demo-researcher: accept, start",
        "demo-researcher: talk_to_agent → demo-writer (waits)",
        "demo-writer: reply_to_peer (answers the call by its correlation id)",
        "Say: every acknowledged message is on disk on a quorum of servers.",
        "demo-coordinator: task_update: completed",
        "demo-coordinator: send_to_peer \"*\" (broadcast)",
        "delivered to 2 goal(s)",
        "demo-coordinator: send_to_peer itself: refused",
        "self_send",
        "audit: thread of task",
    ] {
        assert!(out.contains(step), "missing {step:?} in:\n{out}");
    }
    // The thread: the task's creation, its transitions and the completion, oldest first.
    assert!(out.contains("task.created"), "{out}");
    assert!(out.contains("task.complete "), "{out}");

    // With --json, one JSON object per step, then the thread as the service returned it.
    let (ok, out, err) = text(&["demo", "--nats-url", &system.url(), "--json"]).await;
    assert!(ok, "{err}");
    let mut steps = 0;
    let mut rest = String::new();
    for line in out.lines() {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(step) if step.get("step").is_some() => steps += 1,
            _ => {
                rest.push_str(line);
                rest.push('\n');
            }
        }
    }
    assert!(steps >= 12, "{out}");
    let thread: serde_json::Value = serde_json::from_str(&rest).unwrap();
    assert!(thread["records"].as_array().unwrap().len() >= 4, "{thread}");
}

/// Issue 26, item 11: the demo runs under the generated accounts too, each demo agent signed in
/// with its own key from the folder `nats-config` wrote (the compose stack's default), and an
/// agent without a key is refused.
#[tokio::test]
async fn the_demo_runs_under_the_generated_accounts_with_keys() {
    let system =
        System::start_secured(&["demo-coordinator", "demo-researcher", "demo-writer"]).await;
    let keys = system
        .agent_key("demo-writer")
        .parent()
        .and_then(std::path::Path::parent)
        .unwrap()
        .to_owned();
    let (ok, out, err) = text(&[
        "demo",
        "--nats-url",
        &system.url(),
        "--keys",
        keys.to_str().unwrap(),
    ])
    .await;
    assert!(ok, "{err}\n{out}");
    assert!(out.contains("audit: thread of task"), "{out}");
    let (ok, _, _) = text(&["demo", "--nats-url", &system.url()]).await;
    assert!(
        !ok,
        "without keys the secured server refuses the demo's agents"
    );
}
