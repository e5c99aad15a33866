//! The report's console rows (issue 39): the map page with every agent the bench registered,
//! and a conversation of [`THREAD_MESSAGES`] messages, each loaded 20 times as a fresh page in
//! headless Chromium (`tests/console/bench.mjs`), and the console process's resident memory
//! after. The targets: p95 of the loads at most 1 s, RSS at most 128 MiB.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use switchboard_client::Agent;

use switchboard_tests::bench::percentile;
use switchboard_tests::service_bin;

use crate::{Report, rss_bytes};

/// How many messages the bench's conversation has (the figure).
pub const THREAD_MESSAGES: usize = 10_000;

/// A conversation of `messages` messages: one message and `messages - 1` answers to it
/// (`in_reply_to`), between two agents; returns the first message's id. The receiver reads
/// along so its inbox never fills.
pub async fn thread_of(url: &str, messages: usize) -> uuid::Uuid {
    let talker: Agent = crate::agent(url, "thread-talker").await;
    let listener: Agent = crate::agent(url, "thread-listener").await;
    let goal = listener.open_goal().await.unwrap();
    let from = talker.open_goal().await.unwrap();
    let first = talker
        .send_to_peer("thread-listener", "the first message of a long thread")
        .await
        .unwrap()
        .message_id
        .unwrap();
    let reading = tokio::spawn(async move {
        loop {
            if goal.drain().await.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let client = talker.nats().clone();
    let subject = switchboard_proto::subject::send(talker.id());
    let from_goal = from.id();
    futures::stream::iter(1..messages)
        .map(|n| {
            let client = client.clone();
            let subject = subject.clone();
            async move {
                let body = serde_json::json!({"to": "thread-listener", "message": format!("answer {n}"),
                    "in_reply_to": first, "from_goal_id": from_goal});
                let reply = client
                    .request(subject, body.to_string().into())
                    .await
                    .unwrap();
                assert!(
                    reply
                        .headers
                        .is_none_or(|h| h.get("Nats-Service-Error").is_none()),
                    "send {n}: {:?}",
                    reply.payload
                );
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
    reading.abort();
    first
}

/// Adds the console rows and their targets; `agents` are registered already, `thread` is a
/// conversation of [`THREAD_MESSAGES`] messages (from [`thread_of`]).
pub async fn console_rows(report: &mut Report, url: &str, agents: usize, thread: uuid::Uuid) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("people.toml");
    std::fs::write(
        &file,
        "[[person]]\nid = \"admin\"\naccess = [\"viewer\", \"operator\", \"approver\"]\n",
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (token, hash) = console::one_time_token();
    let mut process = tokio::process::Command::new(service_bin("console"))
        .env("SWITCHBOARD_NATS__URLS", format!("[{url}]"))
        .env("SWITCHBOARD_CONSOLE__LISTEN", format!("127.0.0.1:{port}"))
        .env("SWITCHBOARD_CONSOLE__PEOPLE_FILE", &file)
        .env("SWITCHBOARD_CONSOLE__BOOTSTRAP_TOKEN_SHA256", &hash)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let console_url = format!("http://127.0.0.1:{port}");
    let ready = Instant::now();
    loop {
        let up = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok();
        if up {
            break;
        }
        assert!(
            ready.elapsed() < Duration::from_secs(30),
            "the console did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The registry view fills from the watch before the first load is timed (the sign-in
    // load waits for the map too).
    let root = switchboard_testkit::workspace_root();
    // 20 fresh loads each (the figure); `BENCH_CONSOLE_LOADS` fewer in the CI smoke run.
    let load_count: usize = std::env::var("BENCH_CONSOLE_LOADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let output = tokio::process::Command::new("node")
        .current_dir(root.join("tests/console"))
        .arg("bench.mjs")
        .env("CONSOLE_URL", &console_url)
        .env("ADMIN_TOKEN", &token)
        .env("LOADS", load_count.to_string())
        .env("THREAD", thread.to_string())
        .output()
        .await
        .expect("node runs (make test installs tests/console)");
    assert!(
        output.status.success(),
        "the console bench failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let result: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();
    let mut loads: Vec<Duration> = result["map"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ms| Duration::from_millis(ms.as_u64().unwrap_or(0)))
        .collect();
    loads.sort();
    let tiles = result["tiles"].as_u64().unwrap_or(0);
    let sorted = |key: &str| {
        let mut loads: Vec<Duration> = result[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|ms| Duration::from_millis(ms.as_u64().unwrap_or(0)))
            .collect();
        loads.sort();
        loads
    };
    let (first_page, whole) = (sorted("thread"), sorted("thread_all"));
    let records = result["records"].as_u64().unwrap_or(0);
    println!("console API alone (ms): {}", result["api"]);
    println!("console thread load breakdown: {}", result["breakdown"]);
    let first_records = result["first_records"].as_u64().unwrap_or(0);
    let rss = process.id().and_then(rss_bytes).unwrap_or(0) as f64 / (1024.0 * 1024.0);
    let _ = process.kill().await;
    let (p50, p95) = (percentile(&loads, 0.50), percentile(&loads, 0.95));
    report.note_row(
        "console",
        &format!("the map with {agents} agents ({tiles} tiles drawn, the rest found by the filter), {load_count} fresh loads in headless Chromium"),
        format!(
            "p50 {:.0} ms, p95 {:.0} ms",
            p50.as_secs_f64() * 1e3,
            p95.as_secs_f64() * 1e3
        ),
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    report.note_row(
        "console",
        &format!("a conversation of {records} records, its first page ({first_records} records), {load_count} fresh loads"),
        format!(
            "p50 {:.0} ms, p95 {:.0} ms",
            ms(percentile(&first_page, 0.50)),
            ms(percentile(&first_page, 0.95))
        ),
    );
    report.note_row(
        "console",
        &format!("the same conversation, every record drawn by \"Load more\" ({records} records), 3 loads"),
        format!(
            "p50 {:.0} ms, p95 {:.0} ms",
            ms(percentile(&whole, 0.50)),
            ms(percentile(&whole, 0.95))
        ),
    );
    report.absolute(
        &format!("console conversation of {records} records, first page load p95"),
        ms(percentile(&first_page, 0.95)),
        "ms",
        1000.0,
    );
    report.note_row(
        "console",
        "console RSS after",
        format!("{rss:.1} MiB resident"),
    );
    report.absolute(
        &format!("console map load p95 with {agents} agents"),
        p95.as_secs_f64() * 1e3,
        "ms",
        1000.0,
    );
    report.absolute("console RSS after the map loads", rss, "MiB", 128.0);
}
