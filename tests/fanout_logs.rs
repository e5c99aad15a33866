//! The fan-out warns, naming the goal, when a goal's unread backlog reaches the inbox cap.
//!
//! Its own test binary: it installs a global subscriber that captures log output.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use switchboard_testkit::assert_eventually;
use switchboard_tests::Fabric;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test]
async fn a_goal_at_its_inbox_cap_is_logged_with_its_id() {
    let logs = Captured::default();
    tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .init();

    let fabric = Fabric::start_with(inbox_fanout::FanoutConfig {
        backlog_check_interval_ms: 0,
        ..Default::default()
    })
    .await;
    let writer = fabric.agent("writer").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let text = || String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();

    for i in 0..63 {
        writer
            .send_to_peer("reader", &format!("m{i}"))
            .await
            .unwrap();
    }
    // A real wait: below the cap no warning may appear (the checks run right after each
    // delivery).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!text().contains("at its cap"), "{}", text());
    for i in 63..70 {
        writer
            .send_to_peer("reader", &format!("m{i}"))
            .await
            .unwrap();
    }
    let goal_id = goal.id().to_string();
    assert_eventually!(Duration::from_secs(5), async {
        let logged = text();
        logged.contains("goal inbox is at its cap") && logged.contains(&goal_id)
    });
}
