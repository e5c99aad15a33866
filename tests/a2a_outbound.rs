//! Outbound A2A: a remote agent built with the official Python SDK (`a2a-sdk`,
//! tests/python/a2a_echo_server.py) added with `switchboard a2a add` joins the fabric; a
//! Switchboard agent calls it, gives it tasks (streamed progress, a failure, a question
//! answered by the requester) and messages it, and gets every answer as an ordinary reply,
//! task update or inbox message. A remote that goes away is offline and its messages wait;
//! a hostile remote cannot crash the gateway or make it post elsewhere.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because it holds one scenario per attack a remote A2A agent can make
// (issues 26 and 37) beside the fakes that make them; every integration file is its own test
// binary, so a topic gets one file however many tests it has.

use std::net::SocketAddr;
use std::time::Duration;

use a2a_gateway::config::GatewayConfig;
use serde_json::{Value, json};
use switchboard_client::Agent;
use switchboard_proto::send::SendRequest;
use switchboard_proto::{AgentStatus, MessageKind, TaskState};
use switchboard_testkit::{eventually, free_port};
use switchboard_tests::a2a::PythonAgent;
use switchboard_tests::{
    DirectoryConfig, Fabric, Handle, Replica, Service, fast_offline, runtime, service_bin,
};
use uuid::Uuid;

/// The fabric (offline after 1.5 s without heartbeats) and a gateway that refreshes remote
/// cards every second.
async fn fabric_and_gateway() -> (Fabric, Replica) {
    fabric_and_gateway_trusting(None).await
}

/// [`fabric_and_gateway`], the gateway trusting the CA in `ca_file` too.
async fn fabric_and_gateway_trusting(ca_file: Option<std::path::PathBuf>) -> (Fabric, Replica) {
    fabric_and_gateway_with(fast_offline(1_500), ca_file).await
}

/// [`fabric_and_gateway_trusting`], the directory with `directory`'s settings.
async fn fabric_and_gateway_with(
    directory: DirectoryConfig,
    ca_file: Option<std::path::PathBuf>,
) -> (Fabric, Replica) {
    let fabric = Fabric::start_directory_with(directory).await;
    let config = GatewayConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], free_port())),
        remote_refresh_ms: 1_000,
        remote_heartbeat_ms: 300,
        remote_timeout_ms: 20_000,
        ca_file,
        ..Default::default()
    };
    let (gateway, Handle::Listening(_)) = Service::Gateway(config)
        .start_with_handle(&runtime(&fabric.url()))
        .await
    else {
        panic!("the gateway reports its address")
    };
    (fabric, gateway)
}

/// `switchboard a2a add <card_url> --as <id>`, then waits until the agent is online with a
/// live goal (a gateway replica carries it).
async fn add(fabric: &Fabric, card_url: &str, id: &str) {
    add_trusting(fabric, card_url, id, &[]).await;
}

/// [`add`], trusting `roots` beside the system's.
async fn add_trusting(fabric: &Fabric, card_url: &str, id: &str, roots: &[reqwest::Certificate]) {
    let js = async_nats::jetstream::new(fabric.nats.client().await);
    let http = a2a_gateway::remote::http_client(roots).unwrap();
    let added = a2a_gateway::remote::add(&js, &http, card_url, Some(id))
        .await
        .unwrap();
    assert_eq!(added.remote.agent_id.as_str(), id);
    let looker = fabric.agent(&format!("look-{id}")).await;
    assert!(
        online(&looker, id, Duration::from_secs(20)).await,
        "{id} never came online"
    );
}

async fn online(looker: &Agent, id: &str, within: Duration) -> bool {
    eventually(within, || async {
        looker
            .lookup(id)
            .await
            .is_ok_and(|found| found.status != AgentStatus::Offline && !found.live_goals.is_empty())
    })
    .await
}

/// Waits (at most 20 s) until task `id` is in one of `states`; returns it.
async fn task_in(
    agent: &Agent,
    id: Uuid,
    states: &[TaskState],
) -> switchboard_proto::task::TaskRecord {
    let last = std::cell::RefCell::new(None);
    let reached = eventually(Duration::from_secs(20), || async {
        let task = agent.get_task(id).await.unwrap();
        let reached = states.contains(&task.state);
        *last.borrow_mut() = Some(task);
        reached
    })
    .await;
    let task = last.into_inner();
    assert!(reached, "task {id} never in {states:?}: {task:?}");
    task.unwrap()
}

#[tokio::test]
async fn a_switchboard_agent_calls_tasks_and_messages_an_a2a_sdk_agent() {
    let (fabric, _gateway) = fabric_and_gateway().await;
    let python = PythonAgent::start().await;
    add(&fabric, &python.card_url(), "py-echo").await;
    let (me, goal) = fabric.agent_with_goal("planner").await;

    // Its card on the fabric comes from the A2A card: skills, examples, where it lives.
    let found = me.lookup("py-echo").await.unwrap();
    assert_eq!(found.card.capabilities, ["echo"]);
    assert_eq!(found.card.metadata["a2a_card_url"], python.card_url());

    // A call: the remote's artifact is the answer.
    let answer = me
        .call("py-echo", "hello", Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(answer.body, "echo: hello");
    assert_eq!(answer.from_agent_id.as_str(), "py-echo");

    // A task, streamed: the status note becomes progress, the artifact the result.
    let task = me.give_task("py-echo", "slow").await.unwrap().task;
    let done = task_in(&me, task.task_id, &[TaskState::Completed]).await;
    assert_eq!(done.result.as_deref(), Some("echo: slow"));
    assert!(
        done.history
            .iter()
            .any(|step| step.note.as_deref() == Some("halfway")),
        "the remote's working note is a progress step: {:?}",
        done.history
    );

    // A task the remote fails: failed, with its reason.
    let task = me.give_task("py-echo", "fail").await.unwrap().task;
    let failed = task_in(&me, task.task_id, &[TaskState::Failed]).await;
    assert!(
        failed
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("cannot do that"),
        "{failed:?}"
    );

    // A question: the task asks the requester; the answer goes into the same remote task.
    let task = me
        .give_task("py-echo", "ask: which colour?")
        .await
        .unwrap()
        .task;
    let asking = task_in(&me, task.task_id, &[TaskState::InputRequired]).await;
    let question = asking.history.last().and_then(|step| step.note.clone());
    assert_eq!(question.as_deref(), Some("which colour?"));
    let mut metadata = serde_json::Map::new();
    metadata.insert("task_id".into(), json!(task.task_id.to_string()));
    // Another agent that learnt the task id cannot answer the question for the requester:
    // its message is carried as an ordinary one, and the task still waits.
    let intruder = fabric.agent("intruder").await;
    let _intruder_goal = intruder.open_goal().await.unwrap();
    intruder
        .send(SendRequest {
            to: Some("py-echo".into()),
            message: Some("red".into()),
            metadata: metadata.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    // A real wait: proving the intruder's answer does not resume the task needs a window.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        me.get_task(task.task_id).await.unwrap().state,
        TaskState::InputRequired,
        "only the requester's answer resumes the task"
    );
    me.send(SendRequest {
        to: Some("py-echo".into()),
        message: Some("blue".into()),
        in_reply_to: Some(asking.message_id),
        metadata,
        ..Default::default()
    })
    .await
    .unwrap();
    let answered = task_in(&me, task.task_id, &[TaskState::Completed]).await;
    assert_eq!(answered.result.as_deref(), Some("answered: blue"));

    // A message: the remote's answer comes back as an ordinary message in reply to it.
    let sent = me.send_to_peer("py-echo", "hi there").await.unwrap();
    let message_id = sent.message_id.unwrap();
    let reply = std::cell::RefCell::new(None);
    switchboard_testkit::assert_eventually!(
        Duration::from_secs(20),
        async {
            let answers: Vec<_> = goal.drain().await.unwrap();
            if let Some(found) = answers.into_iter().find(|message| {
                message.kind == MessageKind::Message && message.in_reply_to == Some(message_id)
            }) {
                *reply.borrow_mut() = Some(found);
            }
            reply.borrow().is_some()
        },
        "the remote's answer never reached the sender"
    );
    let reply = reply.into_inner().unwrap();
    assert_eq!(reply.body, "echo: hi there");
    assert_eq!(reply.from_agent_id.as_str(), "py-echo");
}

#[tokio::test]
async fn a_remote_that_goes_away_is_offline_and_its_messages_wait_for_it() {
    let (fabric, _gateway) = fabric_and_gateway().await;
    let python = PythonAgent::start().await;
    let port = python.port;
    add(&fabric, &python.card_url(), "py-away").await;
    let (me, _goal) = fabric.agent_with_goal("asker").await;
    python.stop().await;
    let offline = eventually(Duration::from_secs(20), || async {
        me.lookup("py-away")
            .await
            .is_ok_and(|found| found.status == AgentStatus::Offline)
    })
    .await;
    assert!(offline, "an unreachable remote goes offline");
    // A task given while it is away waits in its inbox, and is carried once it is back.
    let task = me.give_task("py-away", "later").await.unwrap().task;
    // A real wait: proving the task is neither carried nor failed while the remote is away.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let waiting = me.get_task(task.task_id).await.unwrap().state;
    assert!(
        !waiting.is_terminal(),
        "it waits, neither done nor failed: {waiting:?}"
    );
    let _back = PythonAgent::start_on(port).await;
    assert!(online(&me, "py-away", Duration::from_secs(30)).await);
    let done = task_in(&me, task.task_id, &[TaskState::Completed]).await;
    assert_eq!(done.result.as_deref(), Some("echo: later"));
}

#[tokio::test]
async fn a_remote_agent_over_https_is_checked_against_the_trusted_roots() {
    let dir = tempfile::tempdir().unwrap();
    let python = PythonAgent::start_tls(dir.path()).await;
    let ca = dir.path().join("ca.pem");
    let (fabric, _gateway) = fabric_and_gateway_trusting(Some(ca.clone())).await;
    // Its CA is not a system root: without it the card is refused, never read unverified.
    let js = async_nats::jetstream::new(fabric.nats.client().await);
    let untrusting = a2a_gateway::remote::http_client(&[]).unwrap();
    let refused =
        a2a_gateway::remote::add(&js, &untrusting, &python.card_url(), Some("py-tls")).await;
    assert!(
        matches!(
            refused,
            Err(a2a_gateway::remote::RemoteError::Unreachable { .. })
        ),
        "{refused:?}"
    );
    // Trusted (`--ca-file`, the gateway's `ca_file`): added, carried, answered over TLS.
    let roots = a2a_gateway::remote::outbound::read_roots(&ca).unwrap();
    add_trusting(&fabric, &python.card_url(), "py-tls", &roots).await;
    let me = fabric.agent("tls-caller").await;
    let _goal = me.open_goal().await.unwrap();
    let answer = me
        .call("py-tls", "over tls", Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(answer.body, "echo: over tls");
}

/// An HTTP server that serves a valid card (its JSON-RPC interface on itself) and answers
/// every JSON-RPC request with `answer`; returns its card URL and how many posts it got.
async fn hostile_remote(
    answer: &'static [u8],
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    hostile_remote_with(200, answer).await
}

/// [`hostile_remote`] answering every JSON-RPC request with HTTP `status`.
async fn hostile_status_remote(
    status: u16,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    hostile_remote_with(status, b"busy").await
}

async fn hostile_remote_with(
    status: u16,
    answer: &'static [u8],
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    remote_named("hostile", status, answer).await
}

/// [`hostile_remote_with`], its card named `name` (on loopback only).
async fn remote_named(
    name: &str,
    status: u16,
    answer: &'static [u8],
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let card = json!({
        "name": name, "description": "answers badly", "version": "1",
        "supportedInterfaces": [{"url": format!("http://{address}/rpc"),
                                 "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {}, "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"], "skills": []
    })
    .to_string();
    let posts = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&posts);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let card = card.clone();
            let counted = std::sync::Arc::clone(&counted);
            tokio::spawn(async move {
                let mut request = vec![0u8; 65_536];
                let read = socket.read(&mut request).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..read]);
                let (status, body): (u16, Vec<u8>) = if head.starts_with("GET") {
                    (200, card.into_bytes())
                } else {
                    counted.fetch_add(1, Ordering::SeqCst);
                    (status, answer.to_vec())
                };
                let header = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(header.as_bytes()).await;
                let _ = socket.write_all(&body).await;
            });
        }
    });
    (
        format!("http://{address}/.well-known/agent-card.json"),
        posts,
    )
}

#[tokio::test]
async fn a_hostile_remote_gets_an_error_reply_not_a_crash() {
    let (fabric, _gateway) = fabric_and_gateway().await;
    let me = fabric.agent("caller").await;
    let _goal = me.open_goal().await.unwrap();
    for (id, answer) in [
        ("not-json", &b"<html>nope</html>"[..]),
        (
            "wrong-shape",
            &br#"{"jsonrpc":"2.0","id":1,"result":{"task":{"nope":1}}}"#[..],
        ),
        (
            "rpc-error",
            &br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"go away"}}"#[..],
        ),
    ] {
        let (card_url, posts) = hostile_remote(answer).await;
        add(&fabric, &card_url, id).await;
        let answer = me.call(id, "hello", Duration::from_secs(20)).await.unwrap();
        assert!(
            answer.body.starts_with("the remote agent did not answer"),
            "{id}: {}",
            answer.body
        );
        assert_eq!(
            posts.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "{id}: sent once, not retried"
        );
    }
    // A remote whose card answers but whose JSON-RPC endpoint is overloaded (503): the call
    // is tried 5 times, then answered as given up, never left for the dead letters.
    let (card_url, posts) = hostile_status_remote(503).await;
    add(&fabric, &card_url, "overloaded").await;
    let answer = me
        .call("overloaded", "hello", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        answer.body.contains("HTTP 503"),
        "given up with the reason: {}",
        answer.body
    );
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 5);
    // Its card may not send the gateway to another origin, nor may an id shadow an agent.
    let js = async_nats::jetstream::new(fabric.nats.client().await);
    let http = a2a_gateway::remote::http_client(&[]).unwrap();
    let (card_url, _) = hostile_remote(b"{}").await;
    let taken = a2a_gateway::remote::add(&js, &http, &card_url, Some("caller")).await;
    assert!(
        matches!(taken, Err(a2a_gateway::remote::RemoteError::Taken(_))),
        "{taken:?}"
    );
    let client = a2a_gateway::remote::add(&js, &http, &card_url, Some("a2a-x")).await;
    assert!(matches!(
        client,
        Err(a2a_gateway::remote::RemoteError::BadId(_))
    ));
    let nowhere =
        a2a_gateway::remote::add(&js, &http, "http://127.0.0.1:1/card", Some("ghost")).await;
    assert!(matches!(
        nowhere,
        Err(a2a_gateway::remote::RemoteError::Unreachable { .. })
    ));
    let value: Value = serde_json::to_value(
        a2a_gateway::remote::list(&a2a_gateway::remote::bucket(&js).await.unwrap())
            .await
            .unwrap()
            .iter()
            .map(|remote| remote.agent_id.to_string())
            .collect::<Vec<_>>(),
    )
    .unwrap();
    assert_eq!(
        value,
        json!(["not-json", "overloaded", "rpc-error", "wrong-shape"])
    );
}

/// CPU time this process (the gateway runs in it) has used so far, from `/proc/self/stat`.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The fields after the command name (which may hold spaces) end with `)`.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // utime and stime count USER_HZ ticks, 100 a second in procfs on every Linux.
    Duration::from_millis(ticks * 10)
}

/// Issue 26, item 2: a remote's answer of 4 MB of empty text parts costs the gateway time
/// linear in its size (it was quadratic: 13.8 s of CPU), decoded off the async runtime, so two
/// at once hold up no other request. The CPU is this process's: the test runs alone in a
/// child process of this test binary, so the other tests of the file (run beside it) are not
/// counted.
#[tokio::test]
async fn a_flood_of_empty_parts_from_a_remote_holds_up_no_one() {
    switchboard_tests::run_alone("flood_of_empty_parts_alone", |_| {}).await;
}

/// The body of [`a_flood_of_empty_parts_from_a_remote_holds_up_no_one`], run by it in a
/// process of its own (ignored when the file's tests run together).
#[tokio::test]
#[ignore = "run alone in a child process by a_flood_of_empty_parts_from_a_remote_holds_up_no_one"]
async fn flood_of_empty_parts_alone() {
    let (fabric, _gateway) = fabric_and_gateway().await;
    let me = std::sync::Arc::new(fabric.agent("caller").await);
    let _goal = me.open_goal().await.unwrap();
    let head = br#"{"jsonrpc":"2.0","id":1,"result":{"message":{"messageId":"m","role":"ROLE_AGENT","parts":["#;
    let tail = br#"{"text":"the end"}]}}}"#;
    let part = br#"{"text":""},"#;
    let mut body = head.to_vec();
    while body.len() + part.len() + tail.len() < a2a_gateway::remote::outbound::MAX_ANSWER_BYTES {
        body.extend_from_slice(part);
    }
    body.extend_from_slice(tail);
    let (card_url, posts) = hostile_remote(Box::leak(body.into_boxed_slice())).await;
    add(&fabric, &card_url, "flood").await;

    let looker = fabric.agent("looker").await;
    let cpu_before = process_cpu();
    let started = std::time::Instant::now();
    let calls: Vec<_> = (0..2)
        .map(|n| {
            let me = std::sync::Arc::clone(&me);
            tokio::spawn(async move {
                me.call("flood", &format!("hello {n}"), Duration::from_secs(30))
                    .await
            })
        })
        .collect();
    // Another agent's requests stay quick while both answers are decoded.
    let mut slowest = Duration::ZERO;
    while !calls.iter().all(tokio::task::JoinHandle::is_finished) {
        let asked = std::time::Instant::now();
        looker.lookup("caller").await.unwrap();
        slowest = slowest.max(asked.elapsed());
        // A real wait: samples the lookup latency every 20 ms while the answers are decoded.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for call in calls {
        let answer = call.await.unwrap().unwrap();
        assert!(!answer.body.is_empty());
        assert!(answer.body.len() <= switchboard_proto::MAX_BODY_BYTES);
    }
    let (took, cpu) = (started.elapsed(), process_cpu() - cpu_before);
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 2);
    // Decoded on the runtime (the defect), the answers held every request for seconds; off
    // it, a lookup waits only for the machine, which `make test` shares with the other lane.
    assert!(
        slowest < Duration::from_secs(2),
        "a lookup waited {slowest:?} behind the remote's answers"
    );
    eprintln!("two 4 MB answers: {cpu:?} of CPU in {took:?}; slowest lookup {slowest:?}");
    // Everything in this process (the gateway, the agents, the hostile server), debug build.
    assert!(
        cpu < Duration::from_millis(500),
        "two 4 MB answers cost {cpu:?} of CPU in {took:?}"
    );
}

/// Issue 26, item 1: a remote that answers everything cannot be made to loop at another
/// agent's cost. Alice sends more than her goal holds to an echo remote and reads nothing: the
/// echoes evict each other unread, and the notices that says so — the fabric's own word to the
/// remote's goal — are not carried to the remote; each echo comes back with the hop budget its
/// message arrived with. The remote is posted each message once, and then nothing.
#[tokio::test]
async fn an_echo_remote_and_an_agent_that_does_not_read_do_not_loop() {
    let (fabric, _gateway) = fabric_and_gateway().await;
    let alice = fabric.agent("alice").await;
    let goal = alice.open_goal().await.unwrap();
    let (card_url, posts) = hostile_remote(
        br#"{"jsonrpc":"2.0","id":1,"result":{"message":{"messageId":"e","role":"ROLE_AGENT","parts":[{"text":"echo"}]}}}"#,
    )
    .await;
    add(&fabric, &card_url, "echo").await;
    let stored = usize::try_from(switchboard_proto::INBOX_STORED_PER_GOAL).unwrap();
    let sent = stored + 12;
    for n in 0..sent {
        alice.send_to_peer("echo", &format!("m{n}")).await.unwrap();
    }
    let count = || posts.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(30), || async { count() >= sent }).await,
        "the remote got {} of {sent}",
        count()
    );
    // A real wait: long enough for a loop to show (the carrier polls its inbox continuously).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(count(), sent, "the remote was posted more than it was sent");
    // Alice holds the newest echoes, each an answer with the budget her message had left.
    let kept = goal.drain().await.unwrap();
    assert_eq!(kept.len(), stored);
    assert!(kept.iter().all(|message| message.body == "echo"
        && message.in_reply_to.is_some()
        && message.ttl == Some(1)));
}

/// A remote's answer to every message: one A2A message, `echo`.
const ECHO: &[u8] = br#"{"jsonrpc":"2.0","id":1,"result":{"message":{"messageId":"e","role":"ROLE_AGENT","parts":[{"text":"echo"}]}}}"#;

/// Issue 37, item 1: a remote could take the id of an agent listed in `agents.toml` that had
/// not signed in yet (`a2a add` looked only for a registry record), and got its messages. The
/// directory knows the keyed ids from the grants file `nats-config` writes
/// (`directory.skill_grants_file`) and refuses the remote's card under one, so `a2a add` of a
/// card named after the agent, or `--as` it, is refused before anything is recorded; the agent
/// signs in later and gets what is sent to it.
#[tokio::test]
async fn a_remote_named_after_a_keyed_agent_not_signed_in_yet_is_refused_at_add() {
    let dir = tempfile::tempdir().unwrap();
    let grants = dir.path().join("skill-grants.json");
    std::fs::write(&grants, r#"{"keyed-bob": []}"#).unwrap();
    let directory = DirectoryConfig {
        skill_grants_file: Some(grants),
        ..fast_offline(1_500)
    };
    let (fabric, _gateway) = fabric_and_gateway_with(directory, None).await;
    let (card_url, posts) = remote_named("Keyed Bob", 200, ECHO).await;
    let js = async_nats::jetstream::new(fabric.nats.client().await);
    let http = a2a_gateway::remote::http_client(&[]).unwrap();
    for as_id in [None, Some("keyed-bob")] {
        let refused = a2a_gateway::remote::add(&js, &http, &card_url, as_id).await;
        assert!(
            matches!(&refused, Err(a2a_gateway::remote::RemoteError::Taken(id)) if id.as_str() == "keyed-bob"),
            "{as_id:?}: {refused:?}"
        );
    }
    let remotes = a2a_gateway::remote::bucket(&js).await.unwrap();
    let recorded = a2a_gateway::remote::list(&remotes).await.unwrap();
    assert!(recorded.is_empty(), "nothing recorded: {recorded:?}");
    let (sender, _goal) = fabric.agent_with_goal("sender").await;
    assert!(
        sender.lookup("keyed-bob").await.is_err(),
        "nothing registered: the id waits for its agent"
    );
    // The agent signs in later: what is sent to it reaches it, and the remote gets nothing.
    let (_bob, bob_goal) = fabric.agent_with_goal("keyed-bob").await;
    sender.send_to_peer("keyed-bob", "for bob").await.unwrap();
    let delivery = bob_goal
        .recv(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("bob's message");
    assert_eq!(delivery.ack().await.unwrap().body, "for bob");
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// Issue 37, item 1: a remote carried under an id whose agent then signs in (keyed after
/// `a2a add`, or a directory without grants) kept the id in part: the gateway only logged the
/// refused card refresh and went on heartbeating and reading the remote's goal, so the remote
/// got a copy of the agent's traffic. Now it stops the moment the agent's card replaces its
/// own: its goal is closed, nothing more is carried to it, and nobody heartbeats for the id.
#[tokio::test]
async fn a_remote_stops_heartbeating_and_reading_once_the_agent_of_its_id_signs_in() {
    let (fabric, _gateway) = fabric_and_gateway().await;
    let (card_url, posts) = hostile_remote(ECHO).await;
    add(&fabric, &card_url, "shadow").await;
    let (sender, _goal) = fabric.agent_with_goal("sender").await;
    let count = || posts.load(std::sync::atomic::Ordering::SeqCst);
    sender
        .send_to_peer("shadow", "for the remote")
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || async { count() >= 1 }).await,
        "carried while the remote holds the id"
    );
    let carried = count();
    // The agent signs in as `shadow` (and in this test never heartbeats).
    let (_shadow, shadow_goal) = fabric.agent_with_goal("shadow").await;
    let only_its_goal = eventually(Duration::from_secs(10), || async {
        sender
            .lookup("shadow")
            .await
            .is_ok_and(|found| found.live_goals == [shadow_goal.id()])
    })
    .await;
    assert!(
        only_its_goal,
        "the remote's goal is still open beside the agent's: {:?}",
        sender.lookup("shadow").await.map(|found| found.live_goals)
    );
    sender
        .send_to_peer("shadow", "for the agent")
        .await
        .unwrap();
    let delivery = shadow_goal
        .recv(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the agent's message");
    assert_eq!(delivery.ack().await.unwrap().body, "for the agent");
    // A real wait: proving nothing more reaches the remote needs a window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        count(),
        carried,
        "the remote got a copy of the agent's message"
    );
    // Nobody heartbeats for `shadow` now: offline after the directory's 1.5 s, with the
    // agent's own card.
    let offline = eventually(Duration::from_secs(10), || async {
        sender
            .lookup("shadow")
            .await
            .is_ok_and(|found| found.status == AgentStatus::Offline)
    })
    .await;
    assert!(offline, "the gateway still heartbeats for the agent's id");
    let found = sender.lookup("shadow").await.unwrap();
    assert!(!found.card.is_remote(), "{:?}", found.card.metadata);
}

/// Issue 37, item 1: `switchboard a2a remove` deregistered the id, which closes every goal of
/// it: once the agent of the id had signed in, its goals and their unread messages. Now it
/// closes only the remote's own goal.
#[tokio::test]
async fn removing_a_remote_leaves_the_agent_of_its_id_and_its_messages_alone() {
    let (fabric, _gateway) = fabric_and_gateway().await;
    let (card_url, _posts) = hostile_remote(ECHO).await;
    add(&fabric, &card_url, "twin").await;
    let (_twin, twin_goal) = fabric.agent_with_goal("twin").await;
    let (sender, _goal) = fabric.agent_with_goal("sender").await;
    sender.send_to_peer("twin", "unread").await.unwrap();
    let removed = tokio::process::Command::new(service_bin("switchboard"))
        .args(["a2a", "remove", "twin"])
        .env("NATS_URL", fabric.url())
        .output()
        .await
        .unwrap();
    assert!(removed.status.success(), "{removed:?}");
    // A real wait: the carrying replica lets go of a removed remote within its 2 s tick.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let found = sender.lookup("twin").await.unwrap();
    assert_eq!(
        found.live_goals,
        [twin_goal.id()],
        "the agent's goal is open"
    );
    let delivery = twin_goal
        .recv(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the agent's unread message");
    assert_eq!(delivery.ack().await.unwrap().body, "unread");
}
