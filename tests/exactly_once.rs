//! Hand-out is at least once (docs/protocol.md §7, "Hand-out is at least once"): a fetch is
//! answered before its bookkeeping is written, so an inbox replica that dies in between hands
//! the same messages out again, and the reader's SDK drops what it already acknowledged.
//!
//! For each reader — the Rust client, the Python SDK, the TypeScript SDK — a burst of 2,000
//! messages goes into one goal (which refuses messages while full, so the sender backs off and
//! nothing is removed unread) while the two inbox-fanout replicas, separate processes, are
//! killed with SIGKILL and started again in turn. Every message is handled exactly once.
//!
//! A kill costs the reader a couple of seconds, not its request timeout (10 s): each client
//! sends a fetch or an ack that a killed replica held again after [`INBOX_ATTEMPT`] (past the
//! fetch's wait), to the replica still up, and its own loop never sees the replica go (it
//! would start again if a request failed all the same: that is counted and must stay zero).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use switchboard_client::Agent;
use switchboard_proto::send::SendRequest;
use switchboard_proto::{ErrorKind, GoalId};
use switchboard_testkit::NatsServer;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::services::{service_bin, start_directory, start_fanout};
use switchboard_tests::{agent_with, card};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

const BURST: usize = 2_000;
/// The burst's messages handled before each kill of a replica.
const KILL_AT: [usize; 3] = [500, 1_000, 1_500];

/// How long a client waits for a fetch's reply past its wait, or for an ack's, before sending
/// it again (the Rust client's, Python's `INBOX_ATTEMPT_S`, TypeScript's `INBOX_ATTEMPT_MS`).
const INBOX_ATTEMPT: Duration = Duration::from_secs(2);
/// The longest a reader may go without handling a message while the burst is on: a replica
/// killed under a held fetch costs its wait (500 ms) and [`INBOX_ATTEMPT`], and a replica
/// started in its place has to connect; a client waiting out its whole request timeout (10 s)
/// instead goes past it.
const LONGEST_PAUSE: Duration = Duration::from_secs(8);

/// What a reader printed: each body it handled, how often it started its loop again, and the
/// longest time between two messages it handled.
struct Printed {
    bodies: BTreeMap<String, usize>,
    restarts: usize,
    longest_pause: Duration,
}

/// Two inbox-fanout processes (queue group `inbox-fanout`) on `url`.
async fn fanouts(url: &str) -> [ServiceProcess; 2] {
    let bin = service_bin("inbox-fanout");
    [
        ServiceProcess::start(&bin, "inbox-fanout", url, &[]).await,
        ServiceProcess::start(&bin, "inbox-fanout", url, &[]).await,
    ]
}

/// Sends the burst to `to` as fast as its goal takes it: a send refused with `inbox_full`
/// (the goal refuses while full) is sent again a moment later, as is one whose replica was
/// killed under it — with the same message id, so it is stored once.
async fn burst(sender: Arc<Agent>, to: String) {
    for n in 0..BURST {
        let id = switchboard_proto::new_id();
        loop {
            let request = SendRequest {
                to: Some(to.clone()),
                message: Some(format!("m{n}")),
                id: Some(id),
                ..SendRequest::default()
            };
            match sender.send(request).await {
                Ok(report) if !report.delivered_to.is_empty() => break,
                Ok(report) => panic!("m{n} reached nobody: {report:?}"),
                Err(err) if err.kind() == Some(ErrorKind::InboxFull) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(err)
                    if err.kind().is_none_or(|kind| {
                        matches!(kind, ErrorKind::Unavailable | ErrorKind::Conflict)
                    }) =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err) => panic!("m{n}: {err}"),
            }
        }
    }
}

/// Runs the burst into `reader`'s goal, killing and restarting the fan-out replicas in turn as
/// `handled` passes [`KILL_AT`], until every message was printed once or a minute passed.
async fn run_burst(
    url: &str,
    mut replicas: [ServiceProcess; 2],
    reader: &str,
    mut lines: mpsc::UnboundedReceiver<String>,
) -> Printed {
    let sender = Arc::new(agent_with(url, card("burst-sender"), Duration::from_secs(3600)).await);
    let sending = tokio::spawn(burst(Arc::clone(&sender), reader.to_owned()));
    let mut printed = Printed {
        bodies: BTreeMap::new(),
        restarts: 0,
        longest_pause: Duration::ZERO,
    };
    let mut last: Option<tokio::time::Instant> = None;
    let handled = AtomicUsize::new(0);
    let mut kills = KILL_AT.iter().peekable();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while printed.bodies.len() < BURST {
        let line = tokio::time::timeout_at(deadline, lines.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{reader}: {} of {BURST} handled within 90 s",
                    printed.bodies.len()
                )
            })
            .unwrap_or_else(|| panic!("{reader} stopped after {} messages", printed.bodies.len()));
        if line == "restart" {
            printed.restarts += 1;
            continue;
        }
        *printed.bodies.entry(line).or_default() += 1;
        let at = tokio::time::Instant::now();
        if let Some(last) = last {
            printed.longest_pause = printed.longest_pause.max(at - last);
        }
        last = Some(at);
        let now = handled.fetch_add(1, Ordering::Relaxed) + 1;
        if kills.peek().is_some_and(|at| now >= **at) {
            let which = kills.len() % 2;
            kills.next();
            let old = std::mem::replace(
                &mut replicas[which],
                ServiceProcess::start(&service_bin("inbox-fanout"), "inbox-fanout", url, &[]).await,
            );
            old.signal("KILL").await;
        }
    }
    sending.await.unwrap();
    // Nothing more comes: a repeat would arrive within this moment.
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_millis(700), lines.recv()).await
    {
        if line != "restart" {
            *printed.bodies.entry(line).or_default() += 1;
        }
    }
    printed
}

fn assert_exactly_once(reader: &str, printed: &Printed) {
    let missing: Vec<String> = (0..BURST)
        .map(|n| format!("m{n}"))
        .filter(|body| !printed.bodies.contains_key(body))
        .collect();
    let twice: Vec<(&String, &usize)> = printed.bodies.iter().filter(|(_, n)| **n > 1).collect();
    println!(
        "{reader}: {} messages handled, {} missing, {} more than once, {} restarts of its loop, \
         {:?} at most between two",
        printed.bodies.len(),
        missing.len(),
        twice.len(),
        printed.restarts,
        printed.longest_pause
    );
    assert!(missing.is_empty(), "{reader} never handled {missing:?}");
    assert!(
        twice.is_empty(),
        "{reader} handled more than once: {twice:?}"
    );
    assert_eq!(
        printed.restarts, 0,
        "{reader}'s loop saw a request fail while one replica stayed up"
    );
    assert!(
        printed.longest_pause < LONGEST_PAUSE,
        "{reader} handled nothing for {:?}: a killed replica cost it more than a retry after \
         {INBOX_ATTEMPT:?}",
        printed.longest_pause
    );
}

/// Forwards each line of `child`'s stdout after its first (`ready <goal>`) to a channel.
fn lines_of(child: &mut tokio::process::Child) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = out.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a reader's `ready <goal>` line; returns the goal.
async fn ready(lines: &mut mpsc::UnboundedReceiver<String>, who: &str) -> GoalId {
    let first = tokio::time::timeout(Duration::from_secs(30), lines.recv())
        .await
        .unwrap_or_else(|_| panic!("{who} is ready within 30 s"))
        .unwrap_or_else(|| panic!("{who} exited before it was ready"));
    let goal = first
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("{who}: {first}"));
    GoalId::parse(goal.trim()).unwrap()
}

/// The Python SDK reader of [`BURST`]s: prints each body it handles, `restart` when a request
/// found no replica. Returns it with its lines and its goal.
async fn python_reader(
    url: &str,
    id: &str,
) -> (
    tokio::process::Child,
    mpsc::UnboundedReceiver<String>,
    GoalId,
) {
    let script = format!(
        "import asyncio\n\
         from switchboard import Agent\n\
         from switchboard.errors import Unavailable\n\
         async def main():\n    \
             agent = await Agent.connect({url:?}, {id:?}, open_goal=False)\n    \
             goal = await agent.open_goal(name='burst', overflow='refuse')\n    \
             print('ready', goal, flush=True)\n    \
             while True:\n        \
                 try:\n            \
                     async for message in agent.messages(goal_id=goal, wait_ms=500):\n                \
                         print(message.body, flush=True)\n        \
                 except Unavailable:\n            \
                     print('restart', flush=True)\n            \
                     await asyncio.sleep(0.1)\n\
         asyncio.run(main())\n",
    );
    let mut child = Command::new(switchboard_testkit::python_bin())
        .args(["-c", &script])
        .env(
            "PYTHONPATH",
            switchboard_testkit::workspace_root().join("sdk/python"),
        )
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = lines_of(&mut child);
    let goal = ready(&mut lines, id).await;
    (child, lines, goal)
}

/// The TypeScript SDK reader (`sdk/typescript/examples/reader.ts`), as [`python_reader`].
async fn typescript_reader(
    url: &str,
    id: &str,
) -> (
    tokio::process::Child,
    mpsc::UnboundedReceiver<String>,
    GoalId,
) {
    let mut child = Command::new("node")
        .current_dir(switchboard_testkit::workspace_root().join("sdk/typescript"))
        .args(["dist/examples/reader.js", url, id, "burst"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs the built TypeScript SDK (make test builds it)");
    let mut lines = lines_of(&mut child);
    let goal = ready(&mut lines, id).await;
    (child, lines, goal)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_reader_handles_a_burst_exactly_once_while_inbox_replicas_are_killed() {
    let nats = NatsServer::start().await;
    let _directory = start_directory(&nats.url(), Default::default()).await;
    let replicas = fanouts(&nats.url()).await;
    let reader = agent_with(&nats.url(), card("rust-reader"), Duration::from_secs(3600)).await;
    let goal = reader
        .open_goal_with(switchboard_proto::registry::GoalOpenRequest {
            name: Some("burst".to_owned()),
            overflow: Some(switchboard_proto::inbox::Overflow::Refuse),
            ..Default::default()
        })
        .await
        .unwrap();
    let (tx, lines) = mpsc::unbounded_channel();
    let reading = tokio::spawn(async move {
        loop {
            match goal.recv(Duration::from_millis(500)).await {
                Ok(Some(delivery)) => {
                    let body = delivery.message.body.clone();
                    // Printed once acknowledged: the client retries its ack while no replica
                    // answers, and drops a repeat of what it acknowledged.
                    if delivery.ack().await.is_ok() && tx.send(body).is_err() {
                        break;
                    }
                }
                Ok(None) => {}
                Err(_) => {
                    if tx.send("restart".to_owned()).is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    let printed = run_burst(&nats.url(), replicas, "rust-reader", lines).await;
    reading.abort();
    assert_exactly_once("rust-reader", &printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_reader_handles_a_burst_exactly_once_while_inbox_replicas_are_killed() {
    let nats = NatsServer::start().await;
    let _directory = start_directory(&nats.url(), Default::default()).await;
    let replicas = fanouts(&nats.url()).await;
    let (mut child, lines, _) = python_reader(&nats.url(), "py-reader").await;
    let printed = run_burst(&nats.url(), replicas, "py-reader", lines).await;
    let _ = child.kill().await;
    assert_exactly_once("py-reader", &printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typescript_reader_handles_a_burst_exactly_once_while_inbox_replicas_are_killed() {
    let nats = NatsServer::start().await;
    let _directory = start_directory(&nats.url(), Default::default()).await;
    let replicas = fanouts(&nats.url()).await;
    let (mut child, lines, _) = typescript_reader(&nats.url(), "ts-reader").await;
    let printed = run_burst(&nats.url(), replicas, "ts-reader", lines).await;
    let _ = child.kill().await;
    assert_exactly_once("ts-reader", &printed);
}

/// Rewinds `goal`'s cursor to the start, as a hand-out record lost with its replica leaves it
/// behind what the reader acknowledged: the goal's messages are handed out again.
async fn rewind(url: &str, goal: &GoalId) {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let cursors = js
        .get_key_value(switchboard_proto::CURSORS_BUCKET)
        .await
        .unwrap();
    let key = switchboard_proto::inbox::cursor_key(goal);
    let mut record: switchboard_proto::inbox::CursorRecord =
        serde_json::from_slice(&cursors.get(&key).await.unwrap().unwrap()).unwrap();
    assert!(record.cursor > 0, "the reader acknowledged what it read");
    (record.cursor, record.handed) = (0, 0);
    cursors
        .put(&key, serde_json::to_vec(&record).unwrap().into())
        .await
        .unwrap();
}

/// Each SDK drops a message handed out again after it acknowledged it (docs/protocol.md §7,
/// "Hand-out is at least once"): five messages are read and acknowledged, the goal's cursor is
/// rewound behind them, and a sixth is sent — the reader handles the sixth, and none of the
/// five again, though the fabric hands all six out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sdk_drops_a_repeat_of_what_it_acknowledged() {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let _directory = start_directory(&url, Default::default()).await;
    let _fanout = start_fanout(&url, Default::default()).await;
    let sender = agent_with(&url, card("repeat-sender"), Duration::from_secs(3600)).await;

    // The Rust client, in process.
    let rust = agent_with(&url, card("rust-repeats"), Duration::from_secs(3600)).await;
    let goal = rust.open_goal().await.unwrap();
    let (tx, rust_lines) = mpsc::unbounded_channel();
    let goal_id = goal.id();
    let reading = tokio::spawn(async move {
        while let Ok(next) = goal.recv(Duration::from_millis(300)).await {
            if let Some(delivery) = next {
                let body = delivery.message.body.clone();
                if delivery.ack().await.is_ok() && tx.send(body).is_err() {
                    break;
                }
            }
        }
    });
    let (mut py, py_lines, py_goal) = python_reader(&url, "py-repeats").await;
    let (mut ts, ts_lines, ts_goal) = typescript_reader(&url, "ts-repeats").await;
    for (reader, goal, lines) in [
        ("rust-repeats", goal_id, rust_lines),
        ("py-repeats", py_goal, py_lines),
        ("ts-repeats", ts_goal, ts_lines),
    ] {
        let printed = repeated_after_rewind(&url, &sender, reader, &goal, lines).await;
        assert_eq!(
            printed,
            ["r0", "r1", "r2", "r3", "r4", "r5"],
            "{reader} handled a repeat (or missed one)"
        );
    }
    reading.abort();
    let _ = py.kill().await;
    let _ = ts.kill().await;
}

/// Sends r0..r4 to `reader`, waits until it handled them, rewinds its goal, sends r5 and
/// returns every body it handled until a moment after r5.
async fn repeated_after_rewind(
    url: &str,
    sender: &Agent,
    reader: &str,
    goal: &GoalId,
    mut lines: mpsc::UnboundedReceiver<String>,
) -> Vec<String> {
    let mut printed = Vec::new();
    let mut next = async |printed: &mut Vec<String>, want: &str| loop {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.recv())
            .await
            .unwrap_or_else(|_| panic!("{reader} handled {want} within 20 s: {printed:?}"))
            .unwrap();
        let done = line == want;
        printed.push(line);
        if done {
            return;
        }
    };
    for n in 0..5 {
        sender.send_to_peer(reader, &format!("r{n}")).await.unwrap();
    }
    next(&mut printed, "r4").await;
    // Its ack of r4 is written before the next fetch's hand-out: let it land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    rewind(url, goal).await;
    // The reader's held fetch ends (its wait is at most 500 ms); the next one reads the rewound
    // cursor and hands r0..r4 out again.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    sender.send_to_peer(reader, "r5").await.unwrap();
    next(&mut printed, "r5").await;
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_millis(700), lines.recv()).await
    {
        printed.push(line);
    }
    printed
}
