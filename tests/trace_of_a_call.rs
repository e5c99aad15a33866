//! One trace from sender to receiver, received over OTLP and decoded: an agent's call goes
//! client → reply-correlator (the call, then its request through the one door into every
//! inbox) → the callee's inbox → the callee's handling span → its reply → reply-correlator, all under one trace id, each span the child of the hop
//! before it, with OpenTelemetry messaging attributes.
//!
//! Its own test binary: the global tracing subscriber can be installed once per process.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use switchboard_proto::MessageKind;
use switchboard_runtime::config::TelemetryConfig;
use switchboard_runtime::telemetry;
use switchboard_testkit::assert_eventually;
use switchboard_tests::{Fabric, otlp_sink};
use tracing::Instrument;

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(AnyValue::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_covers_call_fanout_inbox_and_reply() {
    let (endpoint, exported) = otlp_sink().await;
    let guard = telemetry::init(
        "switchboard-traces",
        &TelemetryConfig {
            log: "warn".into(),
            otlp_endpoint: Some(endpoint),
            ..TelemetryConfig::default()
        },
    )
    .unwrap();
    let fabric = Fabric::start().await;
    let (callee, callee_goal) = fabric.agent_with_goal("callee").await;
    let (caller, _caller_goal) = fabric.agent_with_goal("caller").await;

    // The callee's runtime: each request handled inside the span that continues its trace.
    let answering = tokio::spawn(async move {
        let delivery = callee_goal
            .recv(Duration::from_secs(10))
            .await
            .unwrap()
            .expect("the request");
        let span = delivery.span();
        let message = delivery.ack().await.unwrap();
        assert_eq!(message.kind, MessageKind::Request);
        async {
            callee
                .reply(message.correlation_id.unwrap(), "forty-two")
                .await
                .unwrap();
        }
        .instrument(span)
        .await;
    });
    let turn = tracing::info_span!("agent-turn");
    let answer = caller
        .call("callee", "the answer?", Duration::from_secs(10))
        .instrument(turn)
        .await
        .unwrap();
    assert_eq!(answer.body, "forty-two");
    answering.await.unwrap();
    // A real wait: the correlator's `reply` span ends just after the callee has its answer
    // (nothing shows when); let it end before the exporter is shut down.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Flush and decode what the collector received.
    tokio::task::spawn_blocking(move || guard.shutdown())
        .await
        .unwrap();
    let mut spans: Vec<Span> = Vec::new();
    assert_eventually!(Duration::from_secs(10), async {
        !exported.lock().unwrap().is_empty()
    });
    for body in exported.lock().unwrap().iter() {
        let request = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        for resource in request.resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
    }
    let by_name = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let one = |name: &str| -> &Span {
        let found = by_name(name);
        assert_eq!(
            found.len(),
            1,
            "one `{name}` span; names: {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        found[0]
    };
    let turn = one("agent-turn");
    let call = one("reply-correlator.call");
    let send = one("reply-correlator.deliver");
    let receive = one("process agent.inbox");
    let reply = one("reply-correlator.reply");

    // One trace.
    let trace = hex(&turn.trace_id);
    for span in [call, send, receive, reply] {
        assert_eq!(
            hex(&span.trace_id),
            trace,
            "{} is in another trace",
            span.name
        );
    }
    // Each hop the child of the one before.
    let ids: HashMap<String, &str> = spans
        .iter()
        .map(|s| (hex(&s.span_id), s.name.as_str()))
        .collect();
    let parent = |span: &Span| ids.get(&hex(&span.parent_span_id)).copied().unwrap_or("?");
    assert_eq!(parent(call), "agent-turn");
    assert_eq!(parent(send), "reply-correlator.call");
    // The stored request is published in a PRODUCER span; its reader continues from it.
    let publish = spans
        .iter()
        .find(|s| s.name == "publish agent.inbox" && hex(&s.parent_span_id) == hex(&send.span_id))
        .expect("the request's publish under the send");
    assert_eq!(parent(receive), "publish agent.inbox");
    assert_eq!(hex(&receive.parent_span_id), hex(&publish.span_id));
    assert_eq!(parent(reply), "process agent.inbox");

    // Messaging attributes.
    for span in [call, send, receive, reply] {
        assert_eq!(
            attribute(span, "messaging.system").as_deref(),
            Some("nats"),
            "{}",
            span.name
        );
        assert_eq!(
            attribute(span, "messaging.operation.type").as_deref(),
            Some("process"),
            "{}",
            span.name
        );
    }
    assert_eq!(
        attribute(send, "messaging.operation.name").as_deref(),
        Some("deliver")
    );
    assert_eq!(
        attribute(send, "switchboard.agent_id").as_deref(),
        Some("caller")
    );
    assert_eq!(
        attribute(receive, "switchboard.from_agent_id").as_deref(),
        Some("caller")
    );
    assert!(attribute(receive, "messaging.message.id").is_some_and(|id| !id.is_empty()));
    assert!(
        attribute(receive, "messaging.destination.name")
            .is_some_and(|d| d.starts_with("agent.inbox."))
    );
}
