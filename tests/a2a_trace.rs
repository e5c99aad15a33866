//! An A2A client's W3C trace continues through the gateway into the fabric: the client's
//! `traceparent` over HTTP is the parent of the gateway's span, which is the parent of the
//! task service's span for the task it creates — one trace, received over OTLP and decoded.
//! And out again: a Switchboard agent's call to a remote A2A agent reaches it with a
//! `traceparent` of the caller's trace.
//!
//! Its own test binary: the global tracing subscriber can be installed once per process.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use switchboard_runtime::config::TelemetryConfig;
use switchboard_runtime::telemetry;
use switchboard_testkit::assert_eventually;
use switchboard_tests::a2a::{A2a, PythonAgent, TOKEN, message};
use switchboard_tests::{http, otlp_sink};
use tracing::Instrument;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_trace_runs_through_the_gateway_into_the_task_service() {
    let (endpoint, exported) = otlp_sink().await;
    let guard = telemetry::init(
        "switchboard-a2a-trace",
        &TelemetryConfig {
            log: "warn".into(),
            otlp_endpoint: Some(endpoint),
            ..TelemetryConfig::default()
        },
    )
    .unwrap();
    let a2a = A2a::start().await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace_id}-{client_span}-01");
    let auth = format!("Bearer {TOKEN}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("traced", None)}});
    let response = http::request(
        a2a.addr(),
        "POST",
        "/agents/echo",
        &[
            ("Content-Type", "application/json"),
            ("A2A-Version", "1.0"),
            ("Authorization", &auth),
            ("traceparent", &traceparent),
        ],
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(
        response.json()["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );

    let spans = || -> Vec<Span> {
        let mut spans = Vec::new();
        for body in exported.lock().unwrap().iter() {
            let request = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    spans.extend(scope.spans);
                }
            }
        }
        spans
    };
    assert_eventually!(Duration::from_secs(15), async {
        spans()
            .iter()
            .any(|span| span.name == "task-lifecycle.create" && hex(&span.trace_id) == trace_id)
    });
    let all_spans = spans();
    let in_trace: Vec<&Span> = all_spans
        .iter()
        .filter(|span| hex(&span.trace_id) == trace_id)
        .collect();
    let gateway = in_trace
        .iter()
        .find(|span| span.name == "a2a-gateway.SendMessage")
        .unwrap_or_else(|| {
            panic!(
                "no gateway span: {:?}",
                in_trace.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        });
    assert_eq!(
        hex(&gateway.parent_span_id),
        client_span,
        "the client's span is the parent"
    );
    let create = in_trace
        .iter()
        .find(|span| span.name == "task-lifecycle.create")
        .unwrap();
    assert_eq!(
        hex(&create.parent_span_id),
        hex(&gateway.span_id),
        "the task service's span is the gateway's child"
    );

    // Issue 37: a method name from the wire never becomes a span name. Sixty made-up
    // methods, some with CR/LF, give one span name, `a2a-gateway.unknown`.
    for n in 0..60 {
        let body = json!({"jsonrpc": "2.0", "id": n, "method": format!("Forged{n}\r\nX-Evil: {n}"),
            "params": {}});
        let response = http::request(
            a2a.addr(),
            "POST",
            "/agents/echo",
            &[
                ("Content-Type", "application/json"),
                ("A2A-Version", "1.0"),
                ("Authorization", &auth),
            ],
            body.to_string().as_bytes(),
        )
        .await;
        assert_eq!(response.json()["error"]["code"], -32601, "method not found");
    }
    assert_eventually!(Duration::from_secs(15), async {
        spans()
            .iter()
            .filter(|span| span.name == "a2a-gateway.unknown")
            .count()
            == 60
    });
    let names: std::collections::BTreeSet<String> = spans()
        .into_iter()
        .map(|span| span.name)
        .filter(|name| name.starts_with("a2a-gateway."))
        .collect();
    assert!(
        names
            .iter()
            .all(|name| name == "a2a-gateway.unknown" || name == "a2a-gateway.SendMessage"),
        "only served methods and `unknown` name spans: {names:?}"
    );

    // Out: a call to a remote a2a-sdk agent carries the caller's trace over HTTP (the agent
    // answers `trace` with the traceparent it received).
    let python = PythonAgent::start().await;
    let js = async_nats::jetstream::new(a2a.fabric.nats.client().await);
    a2a_gateway::remote::add(
        &js,
        &a2a_gateway::remote::http_client(&[]).unwrap(),
        &python.card_url(),
        Some("py-trace"),
    )
    .await
    .unwrap();
    let caller = a2a.fabric.agent("tracer").await;
    let _goal = caller.open_goal().await.unwrap();
    assert_eventually!(Duration::from_secs(20), async {
        caller
            .lookup("py-trace")
            .await
            .is_ok_and(|found| !found.live_goals.is_empty())
    });
    let out_trace = "0af7651916cd43dd8448eb211c80319c";
    let span = tracing::info_span!("caller");
    let mut parent = async_nats::HeaderMap::new();
    parent.insert(
        "traceparent",
        format!("00-{out_trace}-b7ad6b7169203331-01").as_str(),
    );
    telemetry::set_parent_from(&span, Some(&parent));
    let answer = caller
        .call("py-trace", "trace", Duration::from_secs(20))
        .instrument(span)
        .await
        .unwrap();
    assert!(
        answer.body.starts_with(&format!("00-{out_trace}-")),
        "the remote got the caller's trace: {}",
        answer.body
    );
    drop(a2a);
    tokio::task::spawn_blocking(move || guard.shutdown())
        .await
        .unwrap();
}
