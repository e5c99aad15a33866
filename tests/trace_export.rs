//! Observability end to end: W3C trace context crosses the agent → directory → event hop in NATS
//! headers, and spans leave the process over OTLP/HTTP when an endpoint is configured.
//!
//! One test in this binary: the global tracing subscriber can be installed once per process.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;
use switchboard_proto::{EVENTS_STREAM, HEADER_TRACEPARENT};
use switchboard_runtime::config::TelemetryConfig;
use switchboard_runtime::telemetry;
use switchboard_testkit::{NatsServer, assert_eventually};
use switchboard_tests::{
    DirectoryConfig, agent_with, card, otlp_sink, start_directory, start_fanout,
};
use tracing::Instrument;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn trace_id_of(headers: Option<&HeaderMap>) -> String {
    let value = headers
        .and_then(|h| h.get(HEADER_TRACEPARENT))
        .expect("traceparent header")
        .as_str()
        .to_owned();
    value.split('-').nth(1).unwrap().to_owned()
}

#[tokio::test]
async fn trace_context_crosses_every_hop_and_spans_are_exported() {
    let (endpoint, exported) = otlp_sink().await;
    let guard = telemetry::init(
        "switchboard-test",
        &TelemetryConfig {
            log: "warn".into(),
            otlp_endpoint: Some(endpoint),
            ..TelemetryConfig::default()
        },
    )
    .unwrap();

    let nats = NatsServer::start().await;
    let dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let client = nats.client().await;

    // A foreign caller sends a traceparent: the reply and the event it causes carry its trace.
    let mut headers = HeaderMap::new();
    headers.insert(
        HEADER_TRACEPARENT,
        format!("00-{TRACE_ID}-00f067aa0ba902b7-01").as_str(),
    );
    let reply = client
        .send_request(
            "agent.registry.register.traced",
            async_nats::Request::new()
                .headers(headers)
                .payload("{}".into()),
        )
        .await
        .unwrap();
    assert_eq!(trace_id_of(reply.headers.as_ref()), TRACE_ID);
    let reply_span = reply
        .headers
        .as_ref()
        .unwrap()
        .get(HEADER_TRACEPARENT)
        .unwrap()
        .as_str()
        .to_owned();
    assert!(
        !reply_span.contains("00f067aa0ba902b7"),
        "the service answers from its own span"
    );

    let js = jetstream::new(client.clone());
    let stream = js.get_stream(EVENTS_STREAM).await.unwrap();
    let event = stream
        .get_last_raw_message_by_subject("agent.registry.events.registered.traced")
        .await
        .unwrap();
    assert_eq!(trace_id_of(Some(&event.headers)), TRACE_ID);

    // The Rust client injects the current span's context on its requests.
    let span = tracing::info_span!("agent-turn");
    let agent_trace = {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        span.context().span().span_context().trace_id().to_string()
    };
    async {
        let agent = agent_with(
            &nats.url(),
            card("client-traced"),
            Duration::from_secs(3600),
        )
        .await;
        agent.open_goal().await.unwrap();
    }
    .instrument(span)
    .await;
    let event = stream
        .get_last_raw_message_by_subject("agent.registry.events.goal_opened.client-traced")
        .await
        .unwrap();
    assert_eq!(trace_id_of(Some(&event.headers)), agent_trace);

    // The send hop: the copy stored in the receiver's inbox carries the sender's trace.
    let fanout = start_fanout(&nats.url(), inbox_fanout::FanoutConfig::default()).await;
    let reader = agent_with(&nats.url(), card("reader"), Duration::from_secs(3600)).await;
    let reader_goal = reader.open_goal().await.unwrap();
    let span = tracing::info_span!("agent-send");
    let send_trace = {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        span.context().span().span_context().trace_id().to_string()
    };
    async {
        let writer = agent_with(&nats.url(), card("writer"), Duration::from_secs(3600)).await;
        let report = writer.send_to_peer("reader", "traced").await.unwrap();
        assert_eq!(report.delivered_to, vec![reader_goal.id()]);
    }
    .instrument(span)
    .await;
    let inbox = js
        .get_stream(switchboard_proto::INBOX_STREAM)
        .await
        .unwrap();
    let copy = inbox
        .get_last_raw_message_by_subject(&switchboard_proto::subject::inbox(&reader_goal.id()))
        .await
        .unwrap();
    assert_eq!(trace_id_of(Some(&copy.headers)), send_trace);
    fanout.stop().await;

    // Spans reach the OTLP endpoint (flushed at shutdown), named after service.endpoint.
    dir.stop().await;
    tokio::task::spawn_blocking(move || guard.shutdown())
        .await
        .unwrap();
    assert_eventually!(Duration::from_secs(10), async {
        exported
            .lock()
            .unwrap()
            .iter()
            .any(|body| body.windows(18).any(|w| w == b"directory.register"))
    });
    let bodies = exported.lock().unwrap();
    let all: Vec<u8> = bodies.concat();
    let trace_bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&TRACE_ID[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    assert!(
        all.windows(16).any(|w| w == trace_bytes.as_slice()),
        "the exported spans include the caller's trace id"
    );
    assert!(
        all.windows(16).any(|w| w == b"switchboard-test"),
        "service name in the resource"
    );
}
