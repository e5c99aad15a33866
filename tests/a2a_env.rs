//! The gateway in a hostile environment (issue 37): proxy variables set around it must not
//! take its webhooks through a proxy (the proxy would resolve the host again and undo the
//! pin to the checked address), and text a client or agent wrote must never start a log line
//! of its own in the real log pipeline (`telemetry::init`, text format, stderr).
//!
//! Its own test binary: the outer test runs the inner one as a child process, with the
//! proxy variables in its environment (the workspace forbids `unsafe`, so no test sets a
//! variable in its own process) and its stderr — the service's real log — captured.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use switchboard_runtime::config::TelemetryConfig;
use switchboard_runtime::telemetry;
use switchboard_testkit::assert_eventually;
use switchboard_tests::a2a::{A2a, message};
use switchboard_tests::http;

/// A timestamp no real line carries: a line starting with it was forged.
const FORGED: &str = "1999-01-01T00:00:00.000000Z ERROR audit: the audit chain is broken";

#[tokio::test]
async fn webhooks_ignore_proxy_variables_and_client_text_never_forges_a_log_line() {
    // A "proxy" on loopback that counts the connections it gets and answers none.
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = proxy.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    let output = switchboard_tests::run_alone("inner_gateway_under_proxy_variables", |child| {
        for variable in [
            "HTTP_PROXY",
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            child.env(variable, &proxy_url);
        }
        child
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .env("RUST_LOG", "info");
    })
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "no webhook went through the proxy"
    );
    // The forged text reached the log (the inner test logged it), on the line of the
    // event that carried it, never at the start of a line.
    assert!(
        stderr.contains("forged-marker"),
        "the event was logged: {stderr}"
    );
    for line in stderr.lines() {
        assert!(
            !line.trim_start().starts_with("1999-01-01"),
            "a forged line: {line:?}"
        );
    }
}

/// A `SendMessage` to `echo` that returns at once and asks for pushes to `url`.
async fn send_with_webhook(a2a: &A2a, url: &str) -> serde_json::Value {
    a2a.rpc(
        "echo",
        "SendMessage",
        json!({
            "message": message("hello", None),
            "configuration": {
                "returnImmediately": true,
                "taskPushNotificationConfig": {"url": url, "token": "tok"},
            },
        }),
    )
    .await
}

/// Run by the outer test in a child process with the proxy variables set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by webhooks_ignore_proxy_variables_and_client_text_never_forges_a_log_line"]
async fn inner_gateway_under_proxy_variables() {
    let guard = telemetry::init(
        "switchboard-a2a-env",
        &TelemetryConfig {
            log: "info".into(),
            ..TelemetryConfig::default()
        },
    )
    .unwrap();
    let a2a = A2a::start().await;

    // A webhook URL with a line break (the URL parser would drop it) is refused.
    let forged_url = format!("http://127.0.0.1:9/hook\n{FORGED}");
    let refused = send_with_webhook(&a2a, &forged_url).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");

    // Any field of any event: the real pipeline keeps it on its own line.
    tracing::warn!(
        url = %format!("http://x/forged-marker\n{FORGED}\r\n{FORGED}"),
        "client text in a field"
    );

    // A webhook is posted straight to its pinned address, not through the proxy.
    let (url, received) = http::webhook_sink(0).await;
    let reply = send_with_webhook(&a2a, &url).await;
    assert!(reply["result"]["task"]["id"].is_string(), "{reply}");
    assert_eventually!(Duration::from_secs(20), async {
        received
            .lock()
            .unwrap()
            .iter()
            .any(|push| push.body["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED")
    });
    drop(a2a);
    tokio::task::spawn_blocking(move || guard.shutdown())
        .await
        .unwrap();
}
