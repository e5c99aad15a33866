//! The A2A rows of the report (issues 19 and 28): a blocking `SendMessage` through the
//! gateway to an echo agent that answers it as a call (a Message) and to one that works it as
//! a task, each beside the same exchange made natively (a call; a task given and completed),
//! and beside the official Python SDK's own server answering the same message on the same
//! machine. Every HTTP request opens its own connection (the same client for both servers).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use switchboard_client::{Agent, TaskOutcome};
use switchboard_proto::{MessageKind, TaskState};
use switchboard_testkit::free_port;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::bench::{Sample, measure};
use switchboard_tests::{http, service_bin};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::{Report, SERVICE_ENV, agent};

/// Requests in flight for the A2A rows' throughput: the native requester's goal keeps 64 unread
/// messages and each task sends it three updates, so more in flight would evict the very
/// updates it waits for.
const IN_FLIGHT: usize = 8;

const TOKEN: &str = "bench-token";

/// A blocking SendMessage of `text` to `path` on `addr`; panics unless it was answered (a
/// Message, or the task completed).
async fn send_message(addr: SocketAddr, path: &str, text: &str, auth: Option<&str>) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"messageId": Uuid::now_v7().to_string(), "role": "ROLE_USER",
                    "parts": [{"text": text}]}}});
    let mut headers = vec![("Content-Type", "application/json"), ("A2A-Version", "1.0")];
    if let Some(auth) = auth {
        headers.push(("Authorization", auth));
    }
    let response = http::request(addr, "POST", path, &headers, body.to_string().as_bytes()).await;
    let reply = response.json();
    let result = &reply["result"];
    assert!(
        result["message"]["parts"][0]["text"].is_string()
            || result["task"]["status"]["state"] == "TASK_STATE_COMPLETED",
        "{reply}"
    );
}

/// An echo agent `id`: every task worked on at once (accept, start, complete), every call
/// answered `echo: <text>`. With `as_calls` its card takes A2A messages as calls.
async fn serve_echo(url: &str, id: &str, as_calls: bool) -> Arc<Agent> {
    let agent_id = switchboard_proto::AgentId::parse(id).unwrap();
    let nats = switchboard_client::agent_connect_options(&agent_id)
        .connect(url)
        .await
        .unwrap();
    let mut card = switchboard_tests::card(id);
    // Every task in flight is worked on at once: no concurrency cap in the way.
    card.max_concurrent_tasks = 100_000;
    if as_calls {
        card.metadata.insert(
            a2a_gateway::serve::messages::MESSAGES_KEY.into(),
            a2a_gateway::serve::messages::AS_CALLS.into(),
        );
    }
    let options = switchboard_client::AgentOptions {
        heartbeat_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let echo = Arc::new(Agent::connect_with(nats, card, options).await.unwrap());
    let goal = echo.open_goal().await.unwrap();
    let worker = Arc::clone(&echo);
    tokio::spawn(async move {
        loop {
            let Ok(Some(delivery)) = goal.recv(Duration::from_secs(60)).await else {
                continue;
            };
            let Ok(message) = delivery.ack().await else {
                continue;
            };
            if message.kind == MessageKind::Request
                && let Some(call) = message.correlation_id
            {
                let worker = Arc::clone(&worker);
                tokio::spawn(async move {
                    let _ = worker.reply(call, &format!("echo: {}", message.body)).await;
                });
                continue;
            }
            if message.kind != MessageKind::Task {
                continue;
            }
            let (worker, goal_id) = (Arc::clone(&worker), goal.id());
            tokio::spawn(async move {
                let _ = worker
                    .work_on(goal_id, &message, |task| async move {
                        Ok(TaskOutcome::text(format!("echo: {}", task.message)))
                    })
                    .await;
            });
        }
    });
    echo
}

/// The native task round trip's requester: gives a task and waits for its `completed` update
/// (updates of concurrent tasks are handed to their waiters by task id).
struct Requester {
    agent: Arc<Agent>,
    waiting: Arc<Mutex<HashMap<Uuid, oneshot::Sender<()>>>>,
}

impl Requester {
    async fn start(url: &str) -> Arc<Self> {
        let agent = Arc::new(agent(url, "bench-a2a-native").await);
        let goal = agent.open_goal().await.unwrap();
        let waiting: Arc<Mutex<HashMap<Uuid, oneshot::Sender<()>>>> = Arc::default();
        let routes = Arc::clone(&waiting);
        tokio::spawn(async move {
            loop {
                let Ok(Some(delivery)) = goal.recv(Duration::from_secs(60)).await else {
                    continue;
                };
                let Ok(message) = delivery.ack().await else {
                    continue;
                };
                if let Some(task) = message.task
                    && task.state == TaskState::Completed
                    && let Some(done) = routes.lock().unwrap().remove(&task.id)
                {
                    let _ = done.send(());
                }
            }
        });
        Arc::new(Self { agent, waiting })
    }

    async fn round_trip(&self, text: &str) {
        let id = Uuid::now_v7();
        let (done, finished) = oneshot::channel();
        self.waiting.lock().unwrap().insert(id, done);
        self.agent
            .create_task(switchboard_proto::task::CreateTask {
                to: Some("bench-a2a-echo".to_owned()),
                message: Some(text.to_owned()),
                task_id: Some(id),
                ..Default::default()
            })
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(30), finished)
            .await
            .expect("the task completes within 30 s")
            .unwrap();
    }
}

/// The A2A rows: native task round trip, the gateway's blocking SendMessage, the Python SDK's
/// reference server; `call` is the native call measured before.
pub async fn a2a_rows(report: &mut Report, url: &str, ops: usize, call: Sample) {
    let _echo = serve_echo(url, "bench-a2a-echo", false).await;
    let _answering = serve_echo(url, "bench-a2a-answer", true).await;
    let requester = Requester::start(url).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let clients = format!(
        "[{{name=\"bench\",sha256=\"{}\"}}]",
        a2a_gateway::serve::auth::sha256_hex(TOKEN.as_bytes())
    );
    let mut env = SERVICE_ENV.to_vec();
    env.push(("SWITCHBOARD_A2A_GATEWAY__LISTEN", &listen));
    env.push(("SWITCHBOARD_A2A_GATEWAY__CLIENTS", &clients));
    env.push(("SWITCHBOARD_A2A_GATEWAY__MAX_STREAMS_PER_CLIENT", "100000"));
    let _gateway =
        ServiceProcess::start(&service_bin("a2a-gateway"), "a2a-gateway", url, &env).await;
    let gateway: SocketAddr = listen.parse().unwrap();

    let native = {
        let requester = Arc::clone(&requester);
        measure(ops, 2, IN_FLIGHT, move || {
            let requester = Arc::clone(&requester);
            async move { requester.round_trip("x").await }
        })
        .await
    };
    let auth = format!("Bearer {TOKEN}");
    let as_call = {
        let auth = auth.clone();
        measure(ops, 2, IN_FLIGHT, move || {
            let auth = auth.clone();
            async move { send_message(gateway, "/agents/bench-a2a-answer", "x", Some(&auth)).await }
        })
        .await
    };
    let through_gateway = {
        let auth = auth.clone();
        measure(ops, 2, IN_FLIGHT, move || {
            let auth = auth.clone();
            async move { send_message(gateway, "/agents/bench-a2a-echo", "x", Some(&auth)).await }
        })
        .await
    };

    // The official Python SDK's server, answering the same message.
    let reference = switchboard_tests::a2a::PythonAgent::start().await;
    let python = reference.addr();
    let reference_sample = measure(ops, 2, IN_FLIGHT, move || async move {
        send_message(python, "/", "x", None).await
    })
    .await;

    // Outbound: the same agent added with `switchboard a2a add`, called by a Switchboard agent
    // (caller → correlator → its inbox → the gateway → HTTP → the reply back).
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let http = a2a_gateway::remote::http_client(&[]).unwrap();
    a2a_gateway::remote::add(&js, &http, &reference.card_url(), Some("bench-py"))
        .await
        .unwrap();
    let caller = Arc::new(agent(url, "bench-a2a-caller").await);
    caller.open_goal().await.unwrap();
    let carried = switchboard_testkit::eventually(Duration::from_secs(30), || {
        let caller = Arc::clone(&caller);
        async move {
            caller
                .lookup("bench-py")
                .await
                .is_ok_and(|found| !found.live_goals.is_empty())
        }
    })
    .await;
    assert!(carried, "the gateway never carried the a2a-sdk agent");
    let outbound = {
        let caller = Arc::clone(&caller);
        measure(ops, 2, IN_FLIGHT, move || {
            let caller = Arc::clone(&caller);
            async move {
                let answer = caller
                    .call("bench-py", "x", Duration::from_secs(30))
                    .await
                    .unwrap();
                assert_eq!(answer.body, "echo: x");
            }
        })
        .await
    };
    reference.stop().await;

    report.row("A2A", "native call round trip (callee answers)", call);
    report.row(
        "A2A",
        "SendMessage through the gateway, answered as a call (a Message)",
        as_call,
    );
    report.row("A2A", "native task: create → completed update", native);
    report.row(
        "A2A",
        "SendMessage (blocking) through the gateway, worked as a task",
        through_gateway,
    );
    report.row(
        "A2A",
        "SendMessage (blocking) to the a2a-sdk Python server",
        reference_sample,
    );
    report.row(
        "A2A",
        "outbound: a native call to that server, carried by the gateway",
        outbound,
    );
    // A message answered as a call against the call; one worked as a task against the
    // native task round trip (create, accept, start, complete).
    report.absolute(
        "A2A SendMessage (as a call) p50 over the native call p50",
        (as_call.p50.as_secs_f64() - call.p50.as_secs_f64()) * 1e3,
        "ms",
        1.0,
    );
    report.absolute(
        "A2A gateway p50 overhead over the native task round trip",
        (through_gateway.p50.as_secs_f64() - native.p50.as_secs_f64()) * 1e3,
        "ms",
        1.0,
    );
    // Carrying a call costs what the call itself costs (the callee's half is the gateway's
    // HTTP exchange): the target is at most 1 ms over the two measured separately.
    report.absolute(
        "A2A outbound call p50 over (direct SendMessage p50 + native call p50)",
        (outbound.p50.as_secs_f64() - reference_sample.p50.as_secs_f64() - call.p50.as_secs_f64())
            * 1e3,
        "ms",
        1.0,
    );
    report.ratio(
        "A2A gateway SendMessage (as a call) throughput / a2a-sdk Python server",
        as_call.per_sec / reference_sample.per_sec,
        1.0,
        true,
    );
}
