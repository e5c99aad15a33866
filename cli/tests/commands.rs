//! Every capability from the command line, as a person uses it: readable text by default,
//! the service's JSON with `--json`, non-zero exit with the error kind on failure, and an
//! example in every command's `--help`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{System, json, text};

#[tokio::test]
async fn an_agents_whole_life_from_the_command_line() {
    let system = System::start().await;
    let url = system.url();
    let url = url.as_str();

    let (ok, out, err) = text(&[
        "register",
        "--as",
        "alpha",
        "--description",
        "does things",
        "--capability",
        "search",
        "--nats-url",
        url,
    ])
    .await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "alpha registered (idle)");
    let (ok, _, err) = text(&["register", "--as", "beta", "--nats-url", url]).await;
    assert!(ok, "{err}");
    let (ok, opened, err) = json(&["goal", "open", "--as", "alpha", "--nats-url", url]).await;
    assert!(ok, "{err}");
    let goal = opened["goal_id"].as_str().unwrap().to_owned();
    let (ok, out, _) = text(&["goal", "open", "--as", "beta", "--nats-url", url]).await;
    assert!(ok);
    assert!(
        out.starts_with("goal ") && out.contains("inbox:    agent.inbox."),
        "{out}"
    );
    // A named goal is the same goal each time it is opened (a restarted agent resumes it),
    // and a bad name is refused with the service's kind.
    let named = [
        "goal",
        "open",
        "--as",
        "beta",
        "--name",
        "main",
        "--nats-url",
        url,
    ];
    let (ok, first, err) = json(&named).await;
    assert!(ok, "{err}");
    let (ok, again, err) = json(&named).await;
    assert!(ok, "{err}");
    assert_eq!(first["goal_id"], again["goal_id"], "{first} {again}");
    assert_ne!(first["goal_id"].as_str(), Some(goal.as_str()));
    let (ok, _, err) = text(&[
        "goal",
        "open",
        "--as",
        "beta",
        "--name",
        "no/slash",
        "--nats-url",
        url,
    ])
    .await;
    assert!(!ok && err.contains("bad_request"), "{err}");

    let (ok, out, _) = text(&["peers", "--as", "beta", "--nats-url", url]).await;
    assert!(ok);
    assert!(
        out.starts_with(
            "AGENT  STATUS  REACHABLE  DESCRIPTION\nalpha  idle    yes        does things"
        ),
        "{out}"
    );
    let (ok, out, _) = text(&["lookup", "alpha", "--nats-url", url]).await;
    assert!(ok);
    assert!(
        out.starts_with("alpha  (idle)\n  does things\n  capabilities: search"),
        "{out}"
    );
    let (ok, out, _) = text(&["agents", "--nats-url", url]).await;
    assert!(ok);
    assert!(out.starts_with("AGENT  STATUS  GOALS"), "{out}");

    // A message, taken as the agent takes it: once.
    let (ok, out, _) = text(&[
        "send",
        "--as",
        "beta",
        "--to",
        "alpha",
        "hi alpha",
        "--nats-url",
        url,
    ])
    .await;
    assert!(ok);
    assert!(out.starts_with("delivered to 1 goal(s)"), "{out}");
    let (ok, out, _) = text(&[
        "inbox",
        "--as",
        "alpha",
        "--goal",
        &goal,
        "--take",
        "--nats-url",
        url,
    ])
    .await;
    assert!(ok);
    assert!(out.starts_with("<peer-message from=\"beta\""), "{out}");
    assert!(out.contains("hi alpha\n</peer-message>"), "{out}");
    let (ok, out, err) = text(&[
        "inbox",
        "--as",
        "alpha",
        "--goal",
        &goal,
        "--take",
        "--nats-url",
        url,
    ])
    .await;
    assert!(ok);
    assert_eq!(out, "", "taken once");
    assert!(err.contains("took 0 message(s)"), "{err}");

    // Receipts: beta sends from a goal of its own and follows the message until it is read.
    let (ok, beta_goal, err) = json(&["goal", "open", "--as", "beta", "--nats-url", url]).await;
    assert!(ok, "{err}");
    let beta_goal = beta_goal["goal_id"].as_str().unwrap().to_owned();
    let (ok, sent, err) = json(&[
        "send",
        "--as",
        "beta",
        "--to",
        "alpha",
        "read me",
        "--goal",
        &beta_goal,
        "--receipt",
        "read",
        "--nats-url",
        url,
    ])
    .await;
    assert!(ok, "{err}");
    let message_id = sent["message_id"].as_str().unwrap().to_owned();
    let status = [
        "status",
        "--as",
        "beta",
        message_id.as_str(),
        "--nats-url",
        url,
    ];
    let (ok, out, err) = text(&status).await;
    assert!(ok, "{err}");
    assert!(out.starts_with(&format!("message {message_id}:")), "{out}");
    assert!(out.contains(&format!("{goal} of alpha: stored")), "{out}");
    let take = [
        "inbox",
        "--as",
        "alpha",
        "--goal",
        &goal,
        "--take",
        "--nats-url",
        url,
    ];
    let (ok, _, err) = text(&take).await;
    assert!(ok, "{err}");
    // The record follows the receipts a moment behind them.
    let mut out = String::new();
    for _ in 0..50 {
        let (ok, now, _) = text(&status).await;
        assert!(ok, "{now}");
        out = now;
        if out.contains(&format!("{goal} of alpha: read")) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(out.contains(&format!("{goal} of alpha: read")), "{out}");
    let (ok, _, err) = text(&[
        "send",
        "--as",
        "beta",
        "--to",
        "alpha",
        "x",
        "--receipt",
        "seen",
        "--nats-url",
        url,
    ])
    .await;
    assert!(!ok && err.contains("give `delivered` or `read`"), "{err}");

    // A task, every step of the assignee from the command line.
    let (ok, created, err) = json(&[
        "task",
        "create",
        "--as",
        "beta",
        "--to",
        "alpha",
        "sum 2 and 2",
        "--nats-url",
        url,
    ])
    .await;
    assert!(ok, "{err}");
    let task = created["task"]["task_id"].as_str().unwrap().to_owned();
    for step in [
        vec![
            "task",
            "accept",
            "--as",
            "alpha",
            task.as_str(),
            "--goal",
            goal.as_str(),
        ],
        vec!["task", "start", "--as", "alpha", task.as_str()],
        vec!["task", "progress", "--as", "alpha", task.as_str(), "adding"],
    ] {
        let mut args = step.clone();
        args.extend(["--nats-url", url]);
        let (ok, _, err) = text(&args).await;
        assert!(ok, "{step:?}: {err}");
    }
    let (ok, out, err) = text(&[
        "task",
        "complete",
        "--as",
        "alpha",
        &task,
        "4",
        "--nats-url",
        url,
    ])
    .await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("task {task}  completed\n  beta → alpha")),
        "{out}"
    );
    assert!(out.contains("\n  result: 4"), "{out}");
    let (ok, out, _) = text(&["task", "list", "--as", "beta", "--nats-url", url]).await;
    assert!(ok);
    assert!(
        out.starts_with("TASK") && out.contains(&task) && out.contains("completed"),
        "{out}"
    );
    // A refused step exits non-zero with the kind.
    let (ok, _, err) = text(&["task", "start", "--as", "alpha", &task, "--nats-url", url]).await;
    assert!(!ok);
    assert!(err.contains("task_terminal"), "{err}");

    let (ok, out, _) = text(&["heartbeat", "--as", "alpha", "--nats-url", url]).await;
    assert!(ok);
    assert!(out.starts_with("alpha: "), "{out}");
    let (ok, out, _) = text(&["goal", "close", "--as", "alpha", &goal, "--nats-url", url]).await;
    assert!(ok);
    assert!(out.starts_with(&format!("goal {goal} closed")), "{out}");
    let (ok, out, _) = text(&["deregister", "--as", "alpha", "--nats-url", url]).await;
    assert!(ok);
    assert!(out.starts_with("alpha deregistered"), "{out}");
    // Deregistered agents stay in the directory as offline, with no goals (protocol §4.3).
    let (ok, out, _) = text(&["lookup", "alpha", "--nats-url", url]).await;
    assert!(ok);
    assert!(out.starts_with("alpha  (offline)"), "{out}");
    assert!(!out.contains("live goals"), "{out}");
    // Errors exit non-zero with the kind.
    let (ok, _, err) = text(&["lookup", "ghost", "--nats-url", url]).await;
    assert!(!ok);
    assert!(err.contains("not_found"), "{err}");
}

#[tokio::test]
async fn every_command_shows_an_example_in_its_help() {
    let commands: &[&[&str]] = &[
        &[],
        &["up"],
        &["a2a", "token"],
        &["register"],
        &["heartbeat"],
        &["deregister"],
        &["goal"],
        &["goal", "open"],
        &["goal", "close"],
        &["peers"],
        &["agents"],
        &["lookup"],
        &["send"],
        &["call"],
        &["reply"],
        &["pending"],
        &["inbox"],
        &["task"],
        &["task", "create"],
        &["task", "get"],
        &["task", "list"],
        &["task", "cancel"],
        &["task", "accept"],
        &["task", "reject"],
        &["task", "start"],
        &["task", "progress"],
        &["task", "ask"],
        &["task", "complete"],
        &["task", "fail"],
        &["thread"],
        &["history"],
        &["audit"],
        &["audit", "export"],
        &["audit", "verify"],
        &["audit", "pending"],
        &["nats-config"],
        &["dlq"],
        &["dlq", "list"],
        &["dlq", "replay"],
        &["mcp"],
        &["demo"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let (ok, out, err) = text(&args).await;
        assert!(ok, "{command:?}: {err}");
        assert!(
            out.contains("Example"),
            "{command:?} --help has no example:\n{out}"
        );
        let invocation = format!("switchboard {}", command.join(" "));
        assert!(
            out.contains(invocation.trim_end()),
            "{command:?}: the example runs it:\n{out}"
        );
    }
}

#[tokio::test]
async fn dead_letters_are_listed_and_replayed_from_the_command_line() {
    let system = System::start().await;
    let url = system.url();
    let alpha = switchboard_client::Agent::connect(&url, "alpha")
        .await
        .unwrap();
    let goal = alpha.open_goal().await.unwrap();
    let beta = switchboard_client::Agent::connect(&url, "beta")
        .await
        .unwrap();
    beta.send_to_peer("alpha", "unreadable").await.unwrap();
    let delivery = goal
        .recv(std::time::Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    delivery.reject("nope").await.unwrap();

    let mut letters = serde_json::Value::Null;
    for _ in 0..50 {
        let (ok, listed, err) = json(&["dlq", "list", "--nats-url", &url]).await;
        assert!(ok, "{err}");
        if listed.as_array().is_some_and(|l| !l.is_empty()) {
            letters = listed;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let seq = letters[0]["seq"].as_u64().expect("a dead letter");
    let (ok, out, _) = text(&["dlq", "list", "--nats-url", &url]).await;
    assert!(ok);
    assert!(out.starts_with(&format!("#{seq}  ")), "{out}");
    assert!(
        out.contains("rejected by its reader: nope") && out.contains("unreadable"),
        "{out}"
    );
    let seq = seq.to_string();
    let (ok, out, err) = text(&["dlq", "replay", &seq, "--nats-url", &url]).await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!(
            "dead letter #{seq} replayed to {}",
            goal.subject()
        )),
        "{out}"
    );
    let back = goal
        .recv(std::time::Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back.ack().await.unwrap().body, "unreadable");
    let (ok, out, _) = text(&["dlq", "list", "--nats-url", &url]).await;
    assert!(ok);
    assert_eq!(out.trim(), "no dead letters");
    let (ok, _, err) = text(&["dlq", "replay", &seq, "--nats-url", &url]).await;
    assert!(!ok, "a letter replays once");
    assert!(!err.is_empty());
}
