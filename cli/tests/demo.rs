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
