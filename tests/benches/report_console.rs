//! The report's console rows (issue 39): the map page with every agent the bench registered,
//! loaded 20 times as a fresh page in headless Chromium (`tests/console/bench.mjs`), and the
//! console process's resident memory after. The targets: p95 of the loads at most 1 s, RSS at
//! most 128 MiB.

use std::time::{Duration, Instant};

use switchboard_tests::bench::percentile;
use switchboard_tests::service_bin;

use crate::{Report, rss_bytes};

/// Adds the console rows and their targets; `agents` are registered already.
pub async fn console_rows(report: &mut Report, url: &str, agents: usize) {
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
    let output = tokio::process::Command::new("node")
        .current_dir(root.join("tests/console"))
        .arg("bench.mjs")
        .env("CONSOLE_URL", &console_url)
        .env("ADMIN_TOKEN", &token)
        .env("LOADS", "20")
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
    let rss = process.id().and_then(rss_bytes).unwrap_or(0) as f64 / (1024.0 * 1024.0);
    let _ = process.kill().await;
    let (p50, p95) = (percentile(&loads, 0.50), percentile(&loads, 0.95));
    report.note_row(
        "console",
        &format!("the map with {tiles} agents, loaded 20 times in headless Chromium"),
        format!(
            "p50 {:.0} ms, p95 {:.0} ms (at least {agents} registered)",
            p50.as_secs_f64() * 1e3,
            p95.as_secs_f64() * 1e3
        ),
    );
    report.note_row(
        "console",
        "console RSS after",
        format!("{rss:.1} MiB resident"),
    );
    report.absolute(
        &format!("console map load p95 with {tiles} agents"),
        p95.as_secs_f64() * 1e3,
        "ms",
        1000.0,
    );
    report.absolute("console RSS after the map loads", rss, "MiB", 128.0);
}
