//! `switchboard mcp` driven by a client we did not write: the official MCP Python SDK starts two
//! MCP agents over stdio, exactly as an agent host would, and they exchange a message and a
//! call through the running system (tests/python/mcp_two_agents.py does the MCP side).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;

use common::{BIN, System, json};
use switchboard_testkit::{python_bin, stdout_of, workspace_root};

/// Every call and task gets a default budget of $1.00 here (docs/protocol.md §16), so the
/// callee's `check_inbox` shows what is left of its request's budget.
const DEFAULT_BUDGET: [(&str, &str); 1] = [("SWITCHBOARD_BUDGETS__DEFAULT_COST", "1000000")];

#[tokio::test]
async fn two_mcp_agents_exchange_a_message_and_a_call_through_the_official_sdk() {
    exchange(&System::start_env(&DEFAULT_BUDGET).await).await;
}

/// The same session against the accounts `switchboard nats-config` writes: each MCP server
/// signs in with its own key (`--nkey`) and reads its replies on `_INBOX.<agent_id>` only.
#[tokio::test]
async fn the_official_sdk_drives_agents_signed_in_with_their_own_keys() {
    exchange(&System::start_secured_env(&["mcp-alice", "mcp-bob"], &DEFAULT_BUDGET).await).await;
}

async fn exchange(system: &System) {
    let script = workspace_root().join("tests/python/mcp_two_agents.py");
    let stdout = stdout_of(
        tokio::process::Command::new(python_bin())
            .arg(&script)
            .arg(BIN)
            .arg(system.url())
            .args(
                system
                    .keys
                    .as_ref()
                    .map(|_| system.agent_key("KEY").parent().unwrap().to_owned()),
            ),
        Duration::from_secs(120),
        "the MCP client session",
    )
    .await;
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap())
        .unwrap_or_else(|err| panic!("{err}: {stdout}"));

    assert_eq!(report["server_name"], "switchboard");
    assert_eq!(report["tools"].as_array().unwrap().len(), 20, "{report}");
    let goal = report["delivery"]["delivered_to"][0].as_str().unwrap();
    let inbox = report["bob_inbox"].as_str().unwrap();
    assert!(
        inbox.starts_with("# PEER MESSAGES\n<peer-message from=\"mcp-alice\""),
        "{inbox}"
    );
    assert_eq!(report["answer"]["body"], "4, says bob");
    // The model sees the budget its request carries, and what is left of it.
    let request = report["request_inbox"].as_str().unwrap();
    assert!(
        request.contains("(budget of request ")
            && request.contains("1000000 of 1000000 micro-units of cost left"),
        "{request}"
    );
    assert_eq!(report["answer"]["from_agent_id"], "mcp-bob");
    // An unknown peer is a delivery report with the reason, not a silent "ok".
    assert_eq!(
        report["unknown_peer"]["result"]["unreachable_reasons"][0],
        "unknown agent_id `nobody-here`"
    );
    assert_eq!(report["bad_task"]["error"]["kind"], "not_found");

    // Both servers closed their goals when the host closed their stdin.
    for agent in ["mcp-alice", "mcp-bob"] {
        let (ok, looked, stderr) = system
            .cli_json(&["lookup", agent, "--nats-url", &system.url()])
            .await;
        assert!(ok, "{stderr}");
        assert_eq!(
            looked["live_goals"],
            serde_json::json!([]),
            "{agent}: {looked}"
        );
    }
    // The call is in the audit trail, joined to its answer.
    let correlation = report["answer"]["correlation_id"].as_str().unwrap();
    let url = system.url();
    let mut kinds = Vec::new();
    for _ in 0..50 {
        let (ok, thread, stderr) = system
            .cli_json(&["thread", correlation, "--nats-url", &url])
            .await;
        assert!(ok, "{stderr}");
        kinds = thread["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|record| record["kind"].as_str().map(str::to_owned))
            .collect();
        if kinds.iter().any(|kind| kind == "call.answered") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        kinds.iter().any(|kind| kind == "call.answered"),
        "{kinds:?}"
    );
    assert!(!goal.is_empty());
}

/// A host that stops the server with SIGTERM (not by closing stdin) still sees it exit at
/// once, with its goal closed.
#[tokio::test]
async fn sigterm_closes_the_goal_and_exits_while_stdin_stays_open() {
    let system = System::start().await;
    let url = system.url();
    let mut server = common::switchboard()
        .args(["mcp", "--agent", "mcp-term", "--nats-url", &url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut goals = serde_json::Value::Null;
    for _ in 0..100 {
        let (ok, looked, _) = json(&["lookup", "mcp-term", "--nats-url", &url]).await;
        if ok
            && looked["live_goals"]
                .as_array()
                .is_some_and(|g| !g.is_empty())
        {
            goals = looked["live_goals"].clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        goals.as_array().map(Vec::len),
        Some(1),
        "the server opened a goal"
    );
    let pid = server.id().unwrap().to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(10), server.wait())
        .await
        .expect("exits on SIGTERM although stdin is still open")
        .unwrap();
    assert!(status.success(), "{status:?}");
    let (ok, looked, _) = json(&["lookup", "mcp-term", "--nats-url", &url]).await;
    assert!(ok);
    assert_eq!(looked["live_goals"], serde_json::json!([]), "{looked}");
}
