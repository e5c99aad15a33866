//! What an operator sees, as one would see it: `switchboard up` exporting by OTLP to a
//! collector, then `switchboard demo`, then what arrived — each conversation one trace rooted
//! at an agent's span, each service under its own `service.name`, refusals in red with their
//! `error.type`, the ids as attributes, an idle agent adding nothing; `/metrics` scraped after
//! the traffic, OTLP metrics received; and `up` pointed at a closed port saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because it holds one scenario per thing an operator looks at (a demo's
// traces and metrics, a task tree's trace, a dead endpoint), each against a real `up`; every
// integration file is its own test binary, so a topic gets one file however many tests it has.

use std::collections::{BTreeSet, HashMap};
use std::process::Stdio;
use std::time::Duration;

use switchboard_client::{Agent, AgentOptions};
use switchboard_proto::AgentId;
use switchboard_proto::registry::AgentCard;
use switchboard_testkit::free_port;
use switchboard_tests::{ReceivedSpan, otlp_collector, service_bin};
use tokio::io::{AsyncBufReadExt, BufReader};

/// OTLP span status code for an error.
const STATUS_ERROR: i32 = 2;

/// Interrupts `up` (Ctrl-C) when dropped and waits for it to stop its nats-server.
struct Up {
    child: tokio::process::Child,
    banner: String,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    url: String,
    _data: tempfile::TempDir,
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
            let until = std::time::Instant::now() + Duration::from_secs(30);
            while std::time::Instant::now() < until
                && std::path::Path::new(&format!("/proc/{pid}")).exists()
                && self.child.try_wait().ok().flatten().is_none()
            {
                // A real wait: `Drop` cannot await; this polls the exit, bounded by `until`.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// `switchboard up` on a free port exporting to `otlp`, with `/metrics` on a free port.
async fn up(otlp: &str) -> Up {
    up_with(otlp, &[]).await
}

/// [`up`] with more environment variables.
async fn up_with(otlp: &str, env: &[(&str, &str)]) -> Up {
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = tokio::process::Command::new(service_bin("switchboard"))
        .args([
            "up",
            "--port",
            &port.to_string(),
            "--a2a-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data.path().join("nats"))
        .current_dir(data.path())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut err_lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let kept = std::sync::Arc::clone(&stderr);
    tokio::spawn(async move {
        while let Ok(Some(line)) = err_lines.next_line().await {
            kept.lock().unwrap().push_str(&line);
            kept.lock().unwrap().push('\n');
        }
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let banner = tokio::time::timeout(Duration::from_secs(60), async {
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
    .expect("up prints its banner");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Up {
        child,
        banner,
        stderr,
        url: format!("nats://127.0.0.1:{port}"),
        _data: data,
    }
}

/// The banner line that starts with `label` (e.g. `metrics:`), its value trimmed.
fn banner_value(banner: &str, label: &str) -> String {
    banner
        .lines()
        .find_map(|line| line.trim_start().strip_prefix(label))
        .unwrap_or_else(|| panic!("no `{label}` in the banner:\n{banner}"))
        .trim()
        .to_owned()
}

/// Runs the CLI with `args` against `nats_url`, exporting to `otlp`; (success, stdout).
async fn cli(args: &[&str], nats_url: &str, otlp: &str) -> (bool, String) {
    let out = tokio::process::Command::new(service_bin("switchboard"))
        .args(args)
        .env("NATS_URL", nats_url)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SERVICE_NAME")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The spans of the trace rooted at the span named `root`, or a panic naming what arrived.
fn trace_of<'s>(spans: &'s [ReceivedSpan], root: &str) -> Vec<&'s ReceivedSpan> {
    let root = spans
        .iter()
        .find(|span| span.name == root)
        .unwrap_or_else(|| {
            let names: BTreeSet<_> = spans.iter().map(|s| s.name.as_str()).collect();
            panic!("no span `{root}` among {names:?}")
        });
    spans
        .iter()
        .filter(|span| span.trace_id == root.trace_id)
        .collect()
}

/// Fails unless every span of `trace` but its root has its parent in the trace: one tree.
fn assert_one_tree(trace: &[&ReceivedSpan], root: &str) {
    let ids: BTreeSet<&str> = trace.iter().map(|span| span.span_id.as_str()).collect();
    let roots: Vec<_> = trace.iter().filter(|span| span.parent.is_empty()).collect();
    assert_eq!(
        roots
            .iter()
            .map(|span| span.name.as_str())
            .collect::<Vec<_>>(),
        vec![root],
        "one root"
    );
    for span in trace {
        assert!(
            span.parent.is_empty() || ids.contains(span.parent.as_str()),
            "span `{}` of {} names a parent that never arrived",
            span.name,
            span.service
        );
    }
}

/// Waits (10 s at most) until the trace rooted at `root` is one whole tree — every parent
/// arrived — and `done` holds for it; returns every span received by then.
async fn settled(
    otlp: &switchboard_tests::OtlpSink,
    root: &str,
    done: impl Fn(&[&ReceivedSpan]) -> bool,
) -> Vec<ReceivedSpan> {
    // The trace's size when it is whole and `done`.
    let is_settled = |spans: &[ReceivedSpan]| {
        let top = spans.iter().find(|span| span.name == root)?;
        let trace: Vec<&ReceivedSpan> = spans
            .iter()
            .filter(|span| span.trace_id == top.trace_id)
            .collect();
        let ids: BTreeSet<&str> = trace.iter().map(|span| span.span_id.as_str()).collect();
        let whole = trace
            .iter()
            .all(|span| span.parent.is_empty() || ids.contains(span.parent.as_str()));
        (whole && done(&trace)).then_some(trace.len())
    };
    // The spans as they were when the trace settled (later ones are not the caller's). A
    // caller's `done` names every span it checks: services export on their own schedules.
    let found = std::cell::RefCell::new(None);
    let _settled = switchboard_testkit::eventually(Duration::from_secs(10), || async {
        let spans = otlp.spans();
        let now = is_settled(&spans).is_some();
        if now {
            *found.borrow_mut() = Some(spans);
        }
        now
    })
    .await;
    found.into_inner().unwrap_or_else(|| otlp.spans())
}

async fn scrape(url: &str) -> String {
    switchboard_runtime::nats::install_crypto_provider();
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// The value of the first Prometheus series whose line starts with `name{` and contains every
/// one of `labels`.
fn series(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .find(|line| labels.iter().all(|label| line.contains(label)))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_is_whole_traces_per_service_and_the_metrics_move() {
    let otlp = otlp_collector().await;
    let up = up(&otlp.url).await;
    let metrics_url = banner_value(&up.banner, "metrics:");
    assert!(
        metrics_url.starts_with("http://127.0.0.1:"),
        "{}",
        up.banner
    );
    assert!(
        banner_value(&up.banner, "traces:").starts_with("exported to"),
        "{}",
        up.banner
    );

    // An idle agent: registered, a goal open, heartbeats each second and a reader long-polling.
    let idle_id = AgentId::parse("idle-watcher").unwrap();
    let nats = switchboard_client::agent_connect_options(&idle_id)
        .connect(&up.url)
        .await
        .unwrap();
    let idle = Agent::connect_with(
        nats,
        AgentCard::new(idle_id.clone()),
        AgentOptions {
            heartbeat_interval: Duration::from_secs(1),
            ..AgentOptions::default()
        },
    )
    .await
    .unwrap();
    let goal = idle.open_goal().await.unwrap();
    // A real wait: the set-up's spans (register, goal open) reach the collector before
    // `idle_since` marks where idleness begins.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_since = otlp.spans().len();
    let reading = tokio::spawn(async move {
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::time::Instant::now() < until {
            let _ = goal.recv(Duration::from_secs(5)).await;
        }
        goal
    });

    let (ok, out) = cli(&["demo"], &up.url, &otlp.url).await;
    assert!(ok, "{out}");

    // The conversation the coordinator started: the task, its transitions, the researcher's
    // call to the writer and its answer, the updates the coordinator read — one trace.
    settled(&otlp, "demo-coordinator: note to self", |trace| {
        trace.iter().any(|span| span.name == "inbox-fanout.send")
    })
    .await;
    const SERVICES: [&str; 6] = [
        "demo-coordinator",
        "demo-researcher",
        "demo-writer",
        "task-lifecycle",
        "reply-correlator",
        "inbox-fanout",
    ];
    const NAMES: [&str; 7] = [
        "task-lifecycle.create",
        "task-lifecycle.accept",
        "task-lifecycle.start",
        "task-lifecycle.progress",
        "task-lifecycle.complete",
        "reply-correlator.call",
        "reply-correlator.reply",
    ];
    // Settled once every span the checks below name has arrived (each service exports on
    // its own schedule: a reply's span may come after the task's).
    let spans = settled(&otlp, "demo-coordinator: delegate a task", |trace| {
        let has = |wanted: &str| trace.iter().any(|span| span.name == wanted);
        let from = |wanted: &str| trace.iter().any(|span| span.service == wanted);
        NAMES.iter().all(|name| has(name)) && SERVICES.iter().all(|service| from(service))
    })
    .await;
    let task = trace_of(&spans, "demo-coordinator: delegate a task");
    assert_one_tree(&task, "demo-coordinator: delegate a task");
    let services: BTreeSet<&str> = task.iter().map(|span| span.service.as_str()).collect();
    for service in SERVICES {
        assert!(services.contains(service), "{service} not in {services:?}");
    }
    let names: BTreeSet<&str> = task.iter().map(|span| span.name.as_str()).collect();
    for name in NAMES {
        assert!(names.contains(name), "{name} not in {names:?}");
    }
    // The ids are attributes: every task span names the one task, the call's spans its id.
    let task_ids: BTreeSet<&str> = task
        .iter()
        .filter(|span| span.service == "task-lifecycle")
        .filter_map(|span| span.attribute("switchboard.task_id"))
        .collect();
    assert_eq!(task_ids.len(), 1, "{task_ids:?}");
    let call = task
        .iter()
        .find(|span| span.name == "reply-correlator.reply")
        .unwrap();
    assert!(
        call.attribute("switchboard.correlation_id").is_some(),
        "{call:?}"
    );
    // A stored message is published in a PRODUCER span, and its reader's span is under it.
    let stored = task
        .iter()
        .find(|span| span.name == "publish agent.inbox")
        .unwrap_or_else(|| panic!("no inbox publish in {names:?}"));
    assert_eq!(stored.kind, 4, "{stored:?}");
    assert!(
        task.iter()
            .any(|span| span.name == "process agent.inbox" && span.parent == stored.span_id),
        "no reader under the publish"
    );
    // Handling spans are CONSUMER spans (messaging conventions), with no debug text.
    let create = task
        .iter()
        .find(|span| span.name == "task-lifecycle.create")
        .unwrap();
    assert_eq!(create.kind, 5, "{create:?}");
    for span in &task {
        for (key, value) in &span.attributes {
            assert!(
                !value.contains("Some(")
                    && !key.starts_with("thread.")
                    && !key.starts_with("code."),
                "{key}={value} on {}",
                span.name
            );
            assert!(
                key != "busy_ns" && key != "idle_ns",
                "{key} on {}",
                span.name
            );
        }
    }

    // The send to itself: refused, and the service's span is red with the kind.
    let refused = trace_of(&spans, "demo-coordinator: note to self");
    let send = refused
        .iter()
        .find(|span| span.name == "inbox-fanout.send")
        .unwrap_or_else(|| panic!("{refused:?}"));
    assert_eq!(send.status, STATUS_ERROR, "{send:?}");
    assert_eq!(send.attribute("error.type"), Some("self_send"));

    // Each service under its own name; nothing a service handled is left to `switchboard`.
    // (The demo's last step, its audit query, is in the command's own trace: wait for it.)
    let spans = settled(&otlp, "switchboard demo", |trace| {
        trace.iter().any(|span| span.name == "audit.thread")
    })
    .await;
    let by_service: HashMap<&str, usize> = spans.iter().fold(HashMap::new(), |mut m, s| {
        *m.entry(s.service.as_str()).or_default() += 1;
        m
    });
    for service in [
        "directory",
        "inbox-fanout",
        "reply-correlator",
        "task-lifecycle",
        "audit",
        "switchboard-cli",
    ] {
        assert!(
            by_service.contains_key(service),
            "{service}: {by_service:?}"
        );
    }
    let stray: Vec<_> = spans
        .iter()
        .filter(|s| s.service == "switchboard" && s.attribute("messaging.system").is_some())
        .map(|s| s.name.clone())
        .collect();
    assert!(
        stray.is_empty(),
        "service spans under `switchboard`: {stray:?}"
    );

    // The command line, one process per step: a task, its acceptance, a subtask, its start and
    // completion are still one trace (each step joins the trace the task was created in).
    for agent in ["cli-lead", "cli-helper", "cli-worker"] {
        for args in [
            vec!["register", "--as", agent],
            vec!["goal", "open", "--as", agent],
        ] {
            let (ok, out) = cli(&args, &up.url, &otlp.url).await;
            assert!(ok, "{args:?}: {out}");
        }
    }
    let (ok, out) = cli(
        &[
            "--json",
            "task",
            "create",
            "--as",
            "cli-lead",
            "--to",
            "cli-helper",
            "plan it",
        ],
        &up.url,
        &otlp.url,
    )
    .await;
    assert!(ok, "{out}");
    let created: serde_json::Value = serde_json::Deserializer::from_str(&out)
        .into_iter()
        .next()
        .unwrap()
        .unwrap();
    let task_id = created["task"]["task_id"].as_str().unwrap().to_owned();
    for args in [
        vec!["task", "accept", "--as", "cli-helper", &task_id],
        vec![
            "task",
            "create",
            "--as",
            "cli-helper",
            "--to",
            "cli-worker",
            "a part",
            "--parent",
            &task_id,
        ],
        vec!["task", "start", "--as", "cli-helper", &task_id],
        vec![
            "task",
            "complete",
            "--as",
            "cli-helper",
            &task_id,
            "planned",
        ],
    ] {
        let (ok, out) = cli(&args, &up.url, &otlp.url).await;
        assert!(ok, "{args:?}: {out}");
    }
    let spans = settled(&otlp, "switchboard task create", |trace| {
        ["accept", "spawn", "start", "complete"].iter().all(|op| {
            trace
                .iter()
                .any(|s| s.name == format!("task-lifecycle.{op}"))
        })
    })
    .await;
    let by_cli = spans
        .iter()
        .find(|s| {
            s.name == "task-lifecycle.create"
                && s.attribute("switchboard.task_id") == Some(task_id.as_str())
        })
        .expect("the CLI's create");
    let steps: BTreeSet<&str> = spans
        .iter()
        .filter(|s| s.trace_id == by_cli.trace_id)
        .map(|s| s.name.as_str())
        .collect();
    for name in [
        "switchboard task create",
        "task-lifecycle.create",
        "switchboard task accept",
        "task-lifecycle.accept",
        "switchboard task spawn",
        "task-lifecycle.spawn",
        "task-lifecycle.start",
        "task-lifecycle.complete",
    ] {
        assert!(steps.contains(name), "{name} not in {steps:?}");
    }

    // Metrics: /metrics after the traffic, and an OTLP export.
    let text = scrape(&metrics_url).await;
    for (service, endpoint) in [
        ("task-lifecycle", "create"),
        ("reply-correlator", "call"),
        ("inbox-fanout", "inbox_fetch"),
        ("directory", "register"),
        ("audit", "thread"),
    ] {
        let count = series(
            &text,
            "messaging_process_duration_seconds_count",
            &[
                &format!("switchboard_service=\"{service}\""),
                &format!("messaging_operation_name=\"{endpoint}\""),
            ],
        );
        assert!(
            count.is_some_and(|n| n >= 1.0),
            "{service}.{endpoint}:\n{text}"
        );
    }
    assert!(
        series(
            &text,
            "messaging_process_duration_seconds_count",
            &["error_type=\"self_send\""]
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    for (name, labels) in [
        (
            "switchboard_calls_total",
            "switchboard_outcome=\"answered\"",
        ),
        ("switchboard_calls_total", "switchboard_outcome=\"opened\""),
        // The demo's calls are waiting ones with ids the Rust client made just now: each
        // records beside its request (protocol §9, "Call ids").
        ("switchboard_calls_total", "switchboard_opening=\"beside\""),
        (
            "switchboard_task_transitions_total",
            "switchboard_task_state=\"completed\"",
        ),
    ] {
        assert!(
            series(&text, name, &[labels]).is_some_and(|n| n >= 1.0),
            "{name}{{{labels}}}:\n{text}"
        );
    }
    assert!(
        series(&text, "switchboard_goals_live", &[]).is_some(),
        "{text}"
    );
    let _exported = switchboard_testkit::eventually(Duration::from_secs(5), || async {
        otlp.metric_names()
            .iter()
            .any(|(_, name)| name == "messaging.process.duration")
    })
    .await;
    let exported = otlp.metric_names();
    assert!(
        exported
            .iter()
            .any(|(service, name)| service == "switchboard" && name == "switchboard.calls"),
        "{exported:?}"
    );

    // The idle agent, 30 s later: not one span names it.
    let goal = reading.await.unwrap();
    // A real wait: spans still in flight reach the collector before we check that none names
    // the idle agent.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_spans: Vec<_> = otlp.spans()[idle_since..]
        .iter()
        .filter(|span| span.attribute("switchboard.agent_id") == Some(idle_id.as_str()))
        .map(|span| span.name.clone())
        .collect();
    assert!(
        idle_spans.is_empty(),
        "an idle agent traced: {idle_spans:?}"
    );
    drop(goal);
    drop(idle);
    assert!(up.stderr.lock().unwrap().len() < 1_000_000);
}

#[tokio::test]
async fn up_pointed_at_a_closed_otlp_port_says_so_in_its_log_banner_and_health() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let up = up(&closed).await;
    let traces = banner_value(&up.banner, "traces:");
    assert!(
        traces.starts_with("NOT EXPORTED") && traces.contains("does not answer"),
        "{}",
        up.banner
    );
    let _logged = switchboard_testkit::eventually(Duration::from_secs(5), || async {
        up.stderr.lock().unwrap().contains("does not answer")
    })
    .await;
    let logged = up.stderr.lock().unwrap().clone();
    assert!(
        logged.contains("the OTLP endpoint does not answer"),
        "{logged}"
    );
    let (ok, out) = cli(&["health"], &up.url, "").await;
    assert!(!ok, "health passes with a dead endpoint:\n{out}");
    assert!(out.contains("NOT EXPORTED"), "{out}");
    for service in [
        "directory",
        "inbox-fanout",
        "reply-correlator",
        "task-lifecycle",
        "audit",
    ] {
        assert!(
            out.lines()
                .any(|line| line.starts_with(service) && line.contains("NOT EXPORTED")),
            "{service}:\n{out}"
        );
    }
}

/// A root span for a conversation `agent` starts (exported under the agent's name).
fn conversation(agent: &'static str, what: &'static str) -> tracing::Span {
    tracing::info_span!(
        parent: None,
        "conversation",
        otel.name = %format!("{agent}: {what}"),
        switchboard.service = agent,
    )
}

/// Reads `goal` (each message acked in its delivery's span, as an agent handles it) until a
/// message for which `wanted` holds; panics naming `what` after 10 s of silence.
async fn read_until(
    goal: &switchboard_client::Goal,
    what: &str,
    wanted: impl Fn(&switchboard_proto::InboxMessage) -> bool,
) -> switchboard_proto::InboxMessage {
    use tracing::Instrument as _;
    loop {
        let delivery = goal
            .recv(Duration::from_secs(10))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no {what} within 10 s"));
        let read = delivery.span();
        let message = delivery.ack().instrument(read).await.unwrap();
        if wanted(&message) {
            return message;
        }
    }
}

/// Whether `message` tells of a task now in `state`.
fn task_in(message: &switchboard_proto::InboxMessage, state: switchboard_proto::TaskState) -> bool {
    message
        .task
        .as_ref()
        .is_some_and(|task| task.state == state)
}

/// An agent of this test process, its spans exported under its own name.
async fn test_agent(url: &str, id: &str) -> Agent {
    let id = AgentId::parse(id).unwrap();
    let nats = switchboard_client::agent_connect_options(&id)
        .connect(url)
        .await
        .unwrap();
    Agent::connect_with(nats, AgentCard::new(id), AgentOptions::default())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_with_two_subtasks_its_transitions_and_updates_are_one_trace() {
    use switchboard_client::TaskOutcome;
    use switchboard_proto::{MessageKind, TaskState};
    use tracing::Instrument as _;

    let otlp = otlp_collector().await;
    let up = up(&otlp.url).await;
    // This process's agents export too, each under its own name.
    let telemetry = switchboard_runtime::telemetry::init_hosting(
        "observability-test",
        &["lead", "helper", "worker"],
        &switchboard_runtime::config::TelemetryConfig {
            log: "warn".into(),
            otlp_endpoint: Some(otlp.url.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let lead = test_agent(&up.url, "lead").await;
    let helper = test_agent(&up.url, "helper").await;
    let worker = test_agent(&up.url, "worker").await;
    let lead_goal = lead.open_goal().await.unwrap();
    let helper_goal = helper.open_goal().await.unwrap();
    let worker_goal = worker.open_goal().await.unwrap();

    // The worker completes whatever it is given, in the trace each subtask came with.
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = {
        let stop = stop.clone();
        tokio::spawn(async move {
            worker
                .serve_tasks(&worker_goal, stop, None, |task| async move {
                    Ok(TaskOutcome::text(format!("done: {}", task.message)))
                })
                .await
                .unwrap();
        })
    };

    let root = conversation("lead", "plan");
    let task_id = lead
        .give_task("helper", "plan the launch")
        .instrument(root.clone())
        .await
        .unwrap()
        .task
        .task_id;
    drop(root);

    // The helper splits its task in two, waits for both, and completes — all in the trace of
    // the task message it received.
    let delivery = helper_goal
        .recv(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let working = delivery.span();
    delivery.ack().instrument(working.clone()).await.unwrap();
    async {
        helper.accept_task(task_id).await.unwrap();
        helper.start_task(task_id).await.unwrap();
        for part in ["write the post", "check the facts"] {
            helper.spawn_subtask(task_id, "worker", part).await.unwrap();
        }
    }
    .instrument(working.clone())
    .await;
    for _ in 0..2 {
        read_until(&helper_goal, "subtask completion", |message| {
            message.kind == MessageKind::TaskUpdate && task_in(message, TaskState::Completed)
        })
        .await;
    }
    helper
        .complete_task(task_id, TaskOutcome::text("planned"))
        .instrument(working)
        .await
        .unwrap();
    // The lead reads its updates through the completion.
    read_until(&lead_goal, "completion", |message| {
        task_in(message, TaskState::Completed)
    })
    .await;
    // A parked call nobody answers: the deadline sweep ends it, and its timeout notice joins
    // the trace the call was made in.
    let ask = conversation("lead", "ask");
    lead.call_parked("helper", "anything to add?", Duration::from_millis(500))
        .instrument(ask.clone())
        .await
        .unwrap();
    drop(ask);
    read_until(&lead_goal, "timeout notice", |message| {
        message.kind == MessageKind::Notify
    })
    .await;
    // A task nobody takes, past its deadline: the deadline sweep fails it in the task's trace,
    // and the update the lead reads is in it too.
    let late = conversation("lead", "too late");
    lead.create_task(switchboard_proto::task::CreateTask {
        to: Some("helper".to_owned()),
        message: Some("in half a second, please".to_owned()),
        deadline_in_ms: Some(500),
        ..Default::default()
    })
    .instrument(late.clone())
    .await
    .unwrap();
    drop(late);
    read_until(&lead_goal, "task's failure", |message| {
        task_in(message, TaskState::Failed)
    })
    .await;
    stop.cancel();
    serving.await.unwrap();
    telemetry.shutdown();

    settled(&otlp, "lead: ask", |trace| {
        trace
            .iter()
            .any(|span| span.name == "reply-correlator.deadline")
    })
    .await;
    // A hedged copy of a transition (sent when the first is slow) is a span of its own,
    // marked `switchboard.duplicate`: only the ones that did the work are counted.
    let did = |span: &ReceivedSpan, name: &str| {
        span.name == name && span.attribute("switchboard.duplicate").is_none()
    };
    let spans = settled(&otlp, "lead: plan", |trace| {
        let named = |name: &str| trace.iter().filter(|span| did(span, name)).count();
        let read = |reader: &str| {
            trace
                .iter()
                .any(|span| span.service == reader && span.name == "process agent.inbox")
        };
        named("task-lifecycle.create") + named("task-lifecycle.spawn") == 3
            && ["accept", "start", "complete"]
                .iter()
                .all(|op| named(&format!("task-lifecycle.{op}")) == 3)
            && ["helper", "lead", "worker"]
                .iter()
                .all(|reader| read(reader))
    })
    .await;
    let trace = trace_of(&spans, "lead: plan");
    assert_one_tree(&trace, "lead: plan");
    let trace_names: BTreeSet<(&str, &str)> = trace
        .iter()
        .map(|s| (s.service.as_str(), s.name.as_str()))
        .collect();
    let count = |name: &str| trace.iter().filter(|s| did(s, name)).count();
    assert_eq!(count("task-lifecycle.create"), 1, "{trace_names:?}");
    assert_eq!(count("task-lifecycle.spawn"), 2, "{trace_names:?}");
    for op in ["accept", "start", "complete"] {
        assert_eq!(
            count(&format!("task-lifecycle.{op}")),
            3,
            "{op}: {trace_names:?}"
        );
    }
    // Three tasks, each named on its spans; the updates read by helper and lead are in it.
    let tasks: BTreeSet<&str> = trace
        .iter()
        .filter(|s| s.service == "task-lifecycle")
        .filter_map(|s| s.attribute("switchboard.task_id"))
        .collect();
    assert_eq!(tasks.len(), 3, "{tasks:?}");
    for reader in ["helper", "lead", "worker"] {
        assert!(
            trace
                .iter()
                .any(|s| s.service == reader && s.name == "process agent.inbox"),
            "{reader} read nothing in the trace: {trace_names:?}"
        );
    }

    let spans = settled(&otlp, "lead: too late", |trace| {
        trace
            .iter()
            .any(|span| span.name == "task-lifecycle.deadline")
    })
    .await;
    let late = trace_of(&spans, "lead: too late");
    assert_one_tree(&late, "lead: too late");
    let late: BTreeSet<(&str, &str)> = late
        .iter()
        .map(|s| (s.service.as_str(), s.name.as_str()))
        .collect();
    for (service, name) in [
        ("task-lifecycle", "task-lifecycle.create"),
        ("task-lifecycle", "task-lifecycle.deadline"),
        ("lead", "process agent.inbox"),
    ] {
        assert!(
            late.contains(&(service, name)),
            "{service} {name} not in {late:?}"
        );
    }
    let asked = trace_of(&spans, "lead: ask");
    assert_one_tree(&asked, "lead: ask");
    let asked: BTreeSet<(String, String)> = asked
        .iter()
        .map(|s| (s.service.clone(), s.name.clone()))
        .collect();
    for (service, name) in [
        ("reply-correlator", "reply-correlator.call"),
        ("reply-correlator", "reply-correlator.deadline"),
        ("lead", "process agent.inbox"),
    ] {
        assert!(
            asked.contains(&(service.to_owned(), name.to_owned())),
            "{service} {name} not in {asked:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_binary_serves_its_own_metrics() {
    use switchboard_client::proto::audit::ThreadRequest;
    use switchboard_testkit::NatsServer;
    use switchboard_testkit::process::ServiceProcess;

    let nats = NatsServer::start().await;
    let url = nats.url();
    let mut running = Vec::new();
    let mut scraped = Vec::new();
    for service in [
        "directory",
        "inbox-fanout",
        "reply-correlator",
        "task-lifecycle",
        "audit",
        "a2a-gateway",
    ] {
        let listen = format!("127.0.0.1:{}", free_port());
        running.push(
            ServiceProcess::start(
                &service_bin(service),
                service,
                &url,
                &[
                    ("SWITCHBOARD_TELEMETRY__METRICS_LISTEN", listen.as_str()),
                    ("SWITCHBOARD_A2A_GATEWAY__LISTEN", "127.0.0.1:0"),
                ],
            )
            .await,
        );
        scraped.push((service, format!("http://{listen}/metrics")));
    }

    // Traffic for each: register and a goal, a fetch, a refused send, a task, a refused call,
    // an audit query.
    let agent = test_agent(&url, "metered").await;
    let peer = test_agent(&url, "metered-peer").await;
    let _peer_goal = peer.open_goal().await.unwrap();
    let goal = agent.open_goal().await.unwrap();
    let _ = goal.recv(Duration::from_millis(10)).await.unwrap();
    assert!(agent.send_to_peer("metered", "to myself").await.is_err());
    let task = agent
        .give_task("metered-peer", "a task for you")
        .await
        .unwrap()
        .task
        .task_id;
    assert!(
        agent
            .call("nobody-here", "hello?", Duration::from_secs(1))
            .await
            .is_err()
    );
    let client = async_nats::connect(&url).await.unwrap();
    switchboard_client::audit_thread(
        &client,
        &ThreadRequest {
            task_id: Some(task),
            ..ThreadRequest::default()
        },
    )
    .await
    .unwrap();

    for (service, at) in scraped {
        let text = scrape(&at).await;
        // Each binary is its own resource: its own service.name.
        assert!(
            text.contains(&format!("service_name=\"{service}\"")),
            "{service} at {at}:\n{text}"
        );
        if service == "a2a-gateway" {
            continue;
        }
        let count = series(
            &text,
            "messaging_process_duration_seconds_count",
            &[&format!("switchboard_service=\"{service}\"")],
        );
        assert!(
            count.is_some_and(|n| n >= 1.0),
            "{service} at {at}:\n{text}"
        );
    }
    drop(running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_exports_over_grpc_too() {
    let otlp = switchboard_tests::otlp_grpc_collector().await;
    let up = up_with(
        &otlp.url,
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
    )
    .await;
    assert!(
        banner_value(&up.banner, "traces:").contains("(OTLP grpc)"),
        "{}",
        up.banner
    );
    let out = tokio::process::Command::new(service_bin("switchboard"))
        .args(["register", "--as", "grpc-agent"])
        .env("NATS_URL", &up.url)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp.url)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let spans = settled(&otlp, "switchboard register", |trace| {
        trace.iter().any(|span| span.name == "directory.register")
    })
    .await;
    let trace = trace_of(&spans, "switchboard register");
    assert_one_tree(&trace, "switchboard register");
    let services: BTreeSet<&str> = trace.iter().map(|span| span.service.as_str()).collect();
    assert_eq!(
        services,
        BTreeSet::from(["directory", "switchboard-cli"]),
        "{trace:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_exports_its_own_spans_in_the_callers_trace() {
    use switchboard_testkit::{python_bin, workspace_root};

    let otlp = otlp_collector().await;
    let up = up(&otlp.url).await;
    let mut python = tokio::process::Command::new(python_bin())
        .arg(workspace_root().join("examples/python/agent.py"))
        .args([
            "--nats-url",
            &up.url,
            "--agent",
            "py-traced",
            "--max-handled",
            "1",
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp.url)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SERVICE_NAME")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut events = BufReader::new(python.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), events.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(ready.contains("\"ready\""), "{ready}");

    // A call from the command line: the Python agent answers it in the caller's trace.
    let (ok, out) = cli(&["register", "--as", "py-caller"], &up.url, &otlp.url).await;
    assert!(ok, "{out}");
    let (ok, out) = cli(
        &[
            "call",
            "--as",
            "py-caller",
            "--to",
            "py-traced",
            "what is 6 x 7?",
        ],
        &up.url,
        &otlp.url,
    )
    .await;
    assert!(ok, "{out}");
    assert!(out.contains("py-traced answers"), "{out}");
    let status = tokio::time::timeout(Duration::from_secs(30), python.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());

    let spans = settled(&otlp, "switchboard call", |trace| {
        trace
            .iter()
            .any(|span| span.name == "reply-correlator.reply")
    })
    .await;
    let call = trace_of(&spans, "switchboard call");
    assert_one_tree(&call, "switchboard call");
    let handling = call
        .iter()
        .find(|span| span.service == "py-traced" && span.name == "process agent.inbox")
        .unwrap_or_else(|| panic!("the Python agent's span is not in the call: {call:?}"));
    assert_eq!(handling.kind, 5, "{handling:?}");
    let reply = call
        .iter()
        .find(|span| span.name == "reply-correlator.reply")
        .unwrap();
    assert_eq!(
        reply.parent, handling.span_id,
        "the reply is made in its span"
    );

    // Its start is a trace rooted at its own span.
    let started = trace_of(&spans, "py-traced: start");
    assert_one_tree(&started, "py-traced: start");
    let names: BTreeSet<&str> = started.iter().map(|span| span.name.as_str()).collect();
    assert!(
        names.contains("directory.register") && names.contains("directory.goal_open"),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_mcp_tool_call_is_a_trace_rooted_at_the_agent() {
    use switchboard_testkit::{python_bin, workspace_root};

    let otlp = otlp_collector().await;
    let up = up(&otlp.url).await;
    // The official MCP SDK drives two `switchboard mcp` servers (tests/python/mcp_two_agents.py).
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(python_bin())
            .arg(workspace_root().join("tests/python/mcp_two_agents.py"))
            .arg(service_bin("switchboard"))
            .arg(&up.url)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp.url)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env_remove("OTEL_SERVICE_NAME")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(output.status.success(), "{output:?}");

    let spans = settled(&otlp, "mcp-alice: send_to_peer", |trace| {
        trace.iter().any(|span| span.name == "inbox-fanout.send")
    })
    .await;
    let send = trace_of(&spans, "mcp-alice: send_to_peer");
    assert_one_tree(&send, "mcp-alice: send_to_peer");
    let root = send.iter().find(|span| span.parent.is_empty()).unwrap();
    assert_eq!(root.service, "mcp-alice");
    assert_eq!(root.attribute("gen_ai.tool.name"), Some("send_to_peer"));
    // Bob's reply to alice's call is its own tool call, in its own trace under bob's name.
    let spans = settled(&otlp, "mcp-bob: reply_to_peer", |trace| {
        trace
            .iter()
            .any(|span| span.name == "reply-correlator.reply")
    })
    .await;
    let reply = trace_of(&spans, "mcp-bob: reply_to_peer");
    assert_one_tree(&reply, "mcp-bob: reply_to_peer");
    assert!(reply.iter().any(|span| span.service == "mcp-bob"));
}

#[tokio::test]
async fn the_metrics_endpoint_stands_up_to_a_hostile_client() {
    use switchboard_tests::http;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let stop = tokio_util::sync::CancellationToken::new();
    let addr = switchboard_runtime::telemetry::metrics::serve("127.0.0.1:0", stop.clone())
        .await
        .unwrap();
    // Only GET /metrics.
    assert_eq!(
        http::request(addr, "GET", "/metrics", &[], b"")
            .await
            .status,
        200
    );
    assert_eq!(http::request(addr, "GET", "/", &[], b"").await.status, 404);
    assert_eq!(
        http::request(addr, "GET", "/metrics/../../etc/passwd", &[], b"")
            .await
            .status,
        404
    );
    assert_eq!(
        http::request(addr, "POST", "/metrics", &[], b"{}")
            .await
            .status,
        405
    );
    // 150 connections that never finish their headers hold no scrape up, and are closed.
    let mut stalled = Vec::new();
    for _ in 0..150 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: prometheus\r\nAcc")
            .await
            .unwrap();
        stalled.push(stream);
    }
    assert_eq!(
        http::request(addr, "GET", "/metrics", &[], b"")
            .await
            .status,
        200
    );
    let limit = switchboard_runtime::http::HEADER_READ_TIMEOUT + Duration::from_secs(5);
    for mut stream in stalled {
        let mut byte = [0u8; 256];
        let closed = tokio::time::timeout(limit, async {
            loop {
                match stream.read(&mut byte).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "a stalled connection was kept open");
    }
    stop.cancel();
}
