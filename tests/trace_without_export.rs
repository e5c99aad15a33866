//! Trace context through service binaries that export no spans (no OTLP endpoint, the shipped
//! default): they record nothing, yet every hop they make carries the caller's trace on. A
//! send and a call, each made with a `traceparent` (one sampled, one not, one with a
//! `tracestate`), reach the receiver's inbox stored under the same trace id and flags and
//! state, with a parent span id of the service's own; a request with no context starts a
//! trace of its own.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use async_nats::HeaderMap;
use switchboard_proto::{GoalId, HEADER_TRACEPARENT, HEADER_TRACESTATE, INBOX_STREAM, subject};
use switchboard_testkit::NatsServer;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::service_bin;

/// (trace id, parent span id, flags) of the `traceparent` in `headers`.
fn parts(headers: &HeaderMap) -> (String, String, String) {
    let value = headers
        .get(HEADER_TRACEPARENT)
        .expect("the stored message carries a traceparent")
        .as_str()
        .to_owned();
    let fields: Vec<&str> = value.split('-').collect();
    assert_eq!(fields.len(), 4, "a W3C traceparent: {value}");
    (fields[1].into(), fields[2].into(), fields[3].into())
}

/// The headers of the newest message stored in `goal`'s inbox.
async fn stored_headers(js: &async_nats::jetstream::Context, goal: &GoalId) -> HeaderMap {
    let stream = js.get_stream(INBOX_STREAM).await.unwrap();
    let stored = stream
        .get_last_raw_message_by_subject(&subject::inbox(goal))
        .await
        .unwrap();
    stored.headers
}

/// Requests `subject` with `body` under `traceparent` (and `tracestate`, when given; none at
/// all when `traceparent` is empty), as an agent with a span of its own would; checks the
/// reply names `expected` (a field of a success) and returns the reply's headers.
async fn traced_request(
    client: &async_nats::Client,
    subject: String,
    traceparent: &str,
    tracestate: Option<&str>,
    body: serde_json::Value,
    expected: &str,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if !traceparent.is_empty() {
        headers.insert(HEADER_TRACEPARENT, traceparent);
    }
    if let Some(state) = tracestate {
        headers.insert(HEADER_TRACESTATE, state);
    }
    let reply = client
        .request_with_headers(subject, headers, serde_json::to_vec(&body).unwrap().into())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&reply.payload);
    assert!(text.contains(expected), "{text}");
    reply.headers.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_that_export_nothing_still_carry_every_trace_on() {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let mut running = Vec::new();
    for service in ["directory", "inbox-fanout", "reply-correlator"] {
        running.push(
            ServiceProcess::start(
                &service_bin(service),
                service,
                &url,
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "")],
            )
            .await,
        );
    }
    let nats_client = async_nats::connect(&url).await.unwrap();
    let sender = switchboard_client::Agent::connect(&url, "tracer")
        .await
        .unwrap();
    let receiver = switchboard_client::Agent::connect(&url, "traced")
        .await
        .unwrap();
    let goal = receiver.open_goal().await.unwrap();
    let sender_goal = sender.open_goal().await.unwrap();
    let js = async_nats::jetstream::new(nats_client.clone());
    let me = sender.id().clone();

    // A send with a sampled context and a trace state.
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let replied = traced_request(
        &nats_client,
        subject::send(&me),
        &format!("00-{trace}-00f067aa0ba902b7-01"),
        Some("congo=t61rcWkgMzE"),
        serde_json::json!({"to": "traced", "message": "hello"}),
        "delivered_to",
    )
    .await;
    // The reply carries the service's own span in the same trace (protocol §1).
    let (replied_trace, replied_span, _) = parts(&replied);
    assert_eq!(replied_trace, trace);
    assert_ne!(replied_span, "00f067aa0ba902b7");
    let stored = stored_headers(&js, &goal.id()).await;
    let (stored_trace, parent, flags) = parts(&stored);
    assert_eq!(stored_trace, trace, "the send's trace goes on");
    assert_ne!(parent, "00f067aa0ba902b7", "under the fan-out's own span");
    assert_ne!(parent, "0".repeat(16));
    assert_eq!(flags, "01");
    assert_eq!(
        stored.get(HEADER_TRACESTATE).map(|v| v.as_str().to_owned()),
        Some("congo=t61rcWkgMzE".to_owned())
    );

    // A call (not waiting) with a context that is not sampled: its request is stored under
    // the same trace, still not sampled, through the correlator's own span.
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let replied = traced_request(
        &nats_client,
        subject::call(&me),
        &format!("00-{trace}-b7ad6b7169203331-00"),
        None,
        serde_json::json!({
            "to": "traced",
            "message": "a question",
            "wait": false,
            "from_goal_id": sender_goal.id(),
        }),
        "correlation_id",
    )
    .await;
    assert_eq!(parts(&replied).0, trace);
    let (stored_trace, parent, flags) = parts(&stored_headers(&js, &goal.id()).await);
    assert_eq!(stored_trace, trace, "the call's trace goes on");
    assert_ne!(parent, "b7ad6b7169203331");
    assert_eq!(flags, "00", "not sampled stays not sampled");

    // No context: the send starts a trace of its own, sampled.
    let body = serde_json::json!({"to": "traced", "message": "untraced"});
    nats_client
        .request(
            subject::send(&me),
            serde_json::to_vec(&body).unwrap().into(),
        )
        .await
        .unwrap();
    let (fresh, _, flags) = parts(&stored_headers(&js, &goal.id()).await);
    assert_ne!(fresh, trace);
    assert_ne!(fresh, "0".repeat(32));
    assert_eq!(flags, "01");

    // A fetch with no context starts no trace: its span is not sampled (an idle reader adds
    // nothing to a tracing backend), and the reply says so.
    let replied = traced_request(
        &nats_client,
        subject::inbox_fetch(receiver.id()),
        "",
        None,
        serde_json::json!({"goal_id": goal.id(), "max": 1, "peek": true}),
        "messages",
    )
    .await;
    assert_eq!(
        parts(&replied).2,
        "00",
        "a fetch with no context is not sampled"
    );

    // And the receiver reads every one of them.
    let mut read = 0;
    while read < 3 {
        let page = goal.fetch(8, Duration::from_secs(5), None).await.unwrap();
        assert!(!page.messages.is_empty(), "three messages wait");
        read += page.messages.len();
    }
    drop(running);
}
