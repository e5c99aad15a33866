//! `switchboard demo`: a scripted conversation among three agents against the running system,
//! printing each step, then the audit thread of the task.
//!
//! A coordinator delegates a task to a researcher; the researcher accepts, consults a writer
//! with a call and gets the answer, reports progress and completes; the coordinator reads every
//! update; a broadcast reaches both peers; a send to itself is refused. The agents are
//! `demo-coordinator`, `demo-researcher` and `demo-writer` (their ACLs keep them among
//! themselves, so the broadcast reaches nobody else); their goals are closed at the end.

use std::time::Duration;

use switchboard_client::proto::audit::ThreadRequest;
use switchboard_client::proto::registry::AgentCard;
use switchboard_client::proto::{AgentId, InboxMessage, MessageKind, TaskState};
use switchboard_client::{Agent, AgentOptions, Goal, TaskOutcome, audit_thread};
use tracing::Instrument as _;

use super::args::Connection;

/// A scripted conversation among three agents against the running system: a task
/// delegated, a call answered, a broadcast, a refused self-send, then the audit thread.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  switchboard up &   # in another terminal\n  switchboard demo",
    mut_args(super::args::nats_url_help("NATS URL of the running system"))
)]
pub struct DemoArgs {
    #[command(flatten)]
    conn: Connection,
    /// Under the generated accounts: the folder `switchboard nats-config --out DIR` wrote. Each
    /// demo agent signs in with `DIR/agents/<id>.nk` (the agents file must list
    /// demo-coordinator, demo-researcher and demo-writer, as deploy/agents.toml does) and the
    /// audit steps with `DIR/services.nk`.
    #[arg(long, value_name = "DIR")]
    keys: Option<std::path::PathBuf>,
}

/// The seed in `file` under `--keys DIR` (`None` without it).
fn seed_of(keys: Option<&std::path::Path>, file: &str) -> anyhow::Result<Option<String>> {
    keys.map(|dir| {
        let path = dir.join(file);
        switchboard_runtime::nats::read_seed(&path)
            .map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))
    })
    .transpose()
}

/// How long any one step may wait for a message.
const WAIT: Duration = Duration::from_secs(15);

/// The demo's agents; each exports its spans under its own `service.name`.
pub const AGENTS: [&str; 3] = ["demo-coordinator", "demo-researcher", "demo-writer"];

/// The root span of one conversation `agent` starts: everything it causes — the services'
/// spans, the other agents' handling of what they receive — joins its trace.
fn conversation(agent: &'static str, what: &str) -> tracing::Span {
    tracing::info_span!(
        parent: None,
        "conversation",
        otel.name = %format!("{agent}: {what}"),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        switchboard.service = agent,
        switchboard.agent_id = agent,
    )
}

/// Prints one step: human text by default, a JSON line with `--json`.
struct Narrator {
    json: bool,
    step: u32,
}

impl Narrator {
    fn say(&mut self, who: &str, what: &str, detail: serde_json::Value) {
        self.step += 1;
        if self.json {
            crate::output::line(
                &serde_json::json!({"step": self.step, "agent": who, "what": what, "detail": detail})
                    .to_string(),
            );
        } else {
            let detail = match &detail {
                serde_json::Value::Null => String::new(),
                serde_json::Value::String(text) => format!("\n      {text}"),
                other => format!("\n      {other}"),
            };
            crate::output::line(&format!("{:>2}. {who}: {what}{detail}", self.step));
        }
    }
}

/// Registers a demo agent over its own connection (its own reply inbox prefix, its own key
/// under `--keys`).
async fn agent(args: &DemoArgs, id: &str, description: &str) -> anyhow::Result<Agent> {
    let seed = seed_of(args.keys.as_deref(), &format!("agents/{id}.nk"))?;
    let id = AgentId::parse(id)?;
    let nats = crate::nats::connect_signed(&args.conn.nats_url, Some(&id), seed).await?;
    let mut card = AgentCard::new(id);
    card.description = description.to_owned();
    card.can_talk_to = vec!["demo-*".to_owned()];
    card.allow_from = vec!["demo-*".to_owned()];
    Ok(Agent::connect_with(nats, card, AgentOptions::default()).await?)
}

/// The next message in `goal` (acknowledged), with the span its reader handles it in (the
/// sender's trace continued), or an error naming what was awaited.
async fn next(goal: &Goal, what: &str) -> anyhow::Result<(InboxMessage, tracing::Span)> {
    match goal.recv(WAIT).await? {
        Some(delivery) => {
            let span = delivery.span();
            let message = delivery.ack().instrument(span.clone()).await?;
            Ok((message, span))
        }
        None => anyhow::bail!("no {what} within {} s", WAIT.as_secs()),
    }
}

/// Runs the demo; returns the task's audit thread as the final value.
pub async fn run(args: DemoArgs, json: bool) -> anyhow::Result<serde_json::Value> {
    let operator = seed_of(args.keys.as_deref(), "services.nk")?;
    let nats = crate::nats::connect_signed(&args.conn.nats_url, None, operator).await?;
    let mut say = Narrator { json, step: 0 };

    let coordinator = agent(&args, "demo-coordinator", "plans the work and delegates").await?;
    let researcher = agent(&args, "demo-researcher", "finds and checks facts").await?;
    let writer = agent(&args, "demo-writer", "phrases things well").await?;
    let coordinator_goal = coordinator.open_goal().await?;
    let researcher_goal = researcher.open_goal().await?;
    let writer_goal = writer.open_goal().await?;
    say.say(
        "setup",
        "registered demo-coordinator, demo-researcher, demo-writer; each opened a goal",
        serde_json::Value::Null,
    );

    let peers = coordinator.peers().await?;
    let names: Vec<String> = peers
        .peers
        .iter()
        .map(|peer| format!("{} ({})", peer.agent_id, name(&peer.status)))
        .collect();
    say.say(
        "demo-coordinator",
        "list_peers",
        serde_json::json!(names.join(", ")),
    );

    // The coordinator delegates: one conversation, one trace, from the task's creation through
    // the researcher's call to the writer to the last update the coordinator reads.
    let delegate = conversation("demo-coordinator", "delegate a task");
    let created = coordinator
        .give_task(
            "demo-researcher",
            "Find one fact about NATS JetStream durability for the launch post.",
        )
        .instrument(delegate.clone())
        .await?;
    let task_id = created.task.task_id;
    say.say(
        "demo-coordinator",
        "create_task → demo-researcher",
        serde_json::json!(format!(
            "task {task_id}, delivered to {} goal(s)",
            created.delivered_to.len()
        )),
    );

    let (task_message, working) = next(&researcher_goal, "task message").await?;
    say.say(
        "demo-researcher",
        "check_inbox",
        serde_json::json!(format!(
            "{}: {}",
            name(&task_message.kind),
            task_message.body
        )),
    );
    researcher
        .accept_task(task_id)
        .instrument(working.clone())
        .await?;
    researcher
        .start_task(task_id)
        .instrument(working.clone())
        .await?;
    say.say(
        "demo-researcher",
        "accept, start",
        serde_json::json!("task is working"),
    );

    // The researcher consults the writer and waits; the writer answers with reply_to_peer.
    let writer_side = async {
        let (request, answering) = next(&writer_goal, "call request").await?;
        let Some(correlation_id) = request.correlation_id else {
            anyhow::bail!("the call request carries no correlation id");
        };
        writer
            .reply(
                correlation_id,
                "Say: every acknowledged message is on disk on a quorum of servers.",
            )
            .instrument(answering)
            .await?;
        Ok::<_, anyhow::Error>(request)
    };
    let researcher_side = researcher
        .call(
            "demo-writer",
            "How should I phrase the durability fact in one sentence?",
            Duration::from_secs(20),
        )
        .instrument(working.clone());
    let (request, answer) = tokio::join!(writer_side, researcher_side);
    let request = request?;
    let answer = answer?;
    say.say(
        "demo-researcher",
        "talk_to_agent → demo-writer (waits)",
        serde_json::json!(request.body),
    );
    say.say(
        "demo-writer",
        "reply_to_peer (answers the call by its correlation id)",
        serde_json::json!(answer.body),
    );

    researcher
        .task_progress(task_id, "found it in the JetStream docs", Vec::new())
        .instrument(working.clone())
        .await?;
    researcher
        .complete_task(
            task_id,
            TaskOutcome::text(format!("JetStream: {}", answer.body)),
        )
        .instrument(working.clone())
        .await?;
    drop(working);
    say.say(
        "demo-researcher",
        "progress, complete_task",
        serde_json::Value::Null,
    );

    // The coordinator reads its updates until the task is done.
    loop {
        let (update, _read) = next(&coordinator_goal, "task update").await?;
        let state = update.task.as_ref().map(|task| task.state);
        say.say(
            "demo-coordinator",
            &format!("task_update: {}", state_name(state)),
            serde_json::json!(update.body),
        );
        if state.is_some_and(TaskState::is_terminal) {
            break;
        }
    }
    drop(delegate);

    // A broadcast reaches both peers; a send to oneself is refused.
    let report = coordinator
        .broadcast("Thanks both, the post is ready.")
        .instrument(conversation("demo-coordinator", "broadcast"))
        .await?;
    say.say(
        "demo-coordinator",
        "send_to_peer \"*\" (broadcast)",
        serde_json::json!(format!(
            "delivered to {} goal(s)",
            report.delivered_to.len()
        )),
    );
    for (goal, who) in [
        (&researcher_goal, "demo-researcher"),
        (&writer_goal, "demo-writer"),
    ] {
        let (got, _read) = next(goal, "broadcast").await?;
        if got.kind != MessageKind::Message {
            anyhow::bail!("{who} expected the broadcast, got {:?}", got.kind);
        }
        say.say(who, "check_inbox", serde_json::json!(got.body));
    }
    let to_self = conversation("demo-coordinator", "note to self");
    match coordinator
        .send_to_peer("demo-coordinator", "note to self")
        .instrument(to_self.clone())
        .await
    {
        Err(err) => {
            to_self.record("otel.status_code", "ERROR");
            to_self.record("error.type", "self_send");
            say.say(
                "demo-coordinator",
                "send_to_peer itself: refused",
                serde_json::json!(err.to_string()),
            );
        }
        Ok(report) => anyhow::bail!("a send to oneself was not refused: {report:?}"),
    }

    // The audit thread of the task (the audit service ingests asynchronously: wait for the
    // completion to be recorded).
    let query = ThreadRequest {
        task_id: Some(task_id),
        ..ThreadRequest::default()
    };
    let mut thread = audit_thread(&nats, &query).await?;
    for _ in 0..50 {
        if thread
            .records
            .iter()
            .any(|entry| entry.record.kind == "task.complete")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        thread = audit_thread(&nats, &query).await?;
    }
    say.say(
        "audit",
        &format!("thread of task {task_id}"),
        serde_json::json!(format!("{} records", thread.records.len())),
    );

    for (agent, goal) in [
        (&coordinator, coordinator_goal),
        (&researcher, researcher_goal),
        (&writer, writer_goal),
    ] {
        agent.close_goal(goal.id()).await?;
    }
    Ok(serde_json::to_value(thread)?)
}

fn state_name(state: Option<TaskState>) -> String {
    state.map_or_else(|| "?".to_owned(), |state| name(&state))
}

/// A wire enum's name as it is written on the wire (`task`, `idle`, `completed` …).
fn name<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}
