//! The micro scaffold against a real nats-server: typed replies, error replies with headers,
//! panics answered as `internal`, requests without a reply subject, and drain on shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchboard_proto::{ErrorKind, ErrorReply, HEADER_SERVICE_ERROR, HEADER_SERVICE_ERROR_CODE};
use switchboard_runtime::CancellationToken;
use switchboard_runtime::micro::{self, AgentRequest, Endpoint, ServiceSpec};
use switchboard_testkit::{NatsServer, assert_eventually};

const SPEC: ServiceSpec = ServiceSpec {
    name: "echo",
    version: "0.0.1",
    description: "test service",
};

#[derive(Deserialize)]
struct Req {
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    fail: bool,
    #[serde(default)]
    panic: bool,
}

#[derive(Serialize)]
struct Resp {
    caller: String,
}

fn endpoints(seen: Arc<AtomicUsize>) -> Vec<Endpoint> {
    vec![Endpoint::agent(
        "echo",
        "test.echo".to_owned(),
        move |req: AgentRequest<Req>| {
            let seen = Arc::clone(&seen);
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                // A real wait: a slow handler, as slow as the request asks.
                tokio::time::sleep(Duration::from_millis(req.body.delay_ms)).await;
                assert!(!req.body.panic, "handler asked to panic");
                if req.body.fail {
                    return Err(ErrorReply::new(ErrorKind::NotFound, "nothing here"));
                }
                Ok(Resp {
                    caller: req.caller.to_string(),
                })
            }
        },
    )]
}

/// A real server with the echo service running under `grace`.
struct Served {
    _nats: NatsServer,
    client: async_nats::Client,
    seen: Arc<AtomicUsize>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn serve(grace: Duration) -> Served {
    let nats = NatsServer::start().await;
    let client = nats.client().await;
    let seen = Arc::new(AtomicUsize::new(0));
    let running = micro::start(
        &client,
        SPEC,
        endpoints(Arc::clone(&seen)),
        &switchboard_runtime::config::RequestBudget::default(),
    )
    .await
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(running.run(shutdown.clone(), grace));
    Served {
        _nats: nats,
        client,
        seen,
        shutdown,
        task,
    }
}

async fn json(
    client: &async_nats::Client,
    subject: &str,
    body: &str,
) -> (async_nats::Message, serde_json::Value) {
    let reply = client
        .request(subject.to_owned(), body.to_owned().into())
        .await
        .unwrap();
    let value = serde_json::from_slice(&reply.payload).unwrap();
    (reply, value)
}

#[tokio::test]
async fn replies_errors_panics_and_fire_and_forget() {
    let Served {
        _nats,
        client,
        seen,
        shutdown,
        task,
    } = serve(Duration::from_secs(2)).await;

    let (_, ok) = json(&client, "test.echo.alice", "").await;
    assert_eq!(ok, serde_json::json!({"caller": "alice"}));

    let (reply, err) = json(&client, "test.echo.alice", r#"{"fail": true}"#).await;
    let headers = reply.headers.unwrap();
    assert_eq!(
        headers.get(HEADER_SERVICE_ERROR_CODE).unwrap().as_str(),
        "404"
    );
    assert_eq!(
        headers.get(HEADER_SERVICE_ERROR).unwrap().as_str(),
        "nothing here"
    );
    assert_eq!(err["error"]["kind"], "not_found");

    let (_, bad) = json(&client, "test.echo.a.b", "{}").await;
    assert_eq!(bad["error"]["kind"], "invalid_agent_id");

    // A panicking handler is answered, and the service keeps serving.
    let (_, panicked) = json(&client, "test.echo.alice", r#"{"panic": true}"#).await;
    assert_eq!(panicked["error"]["kind"], "internal");
    let (_, ok) = json(&client, "test.echo.bob", "{}").await;
    assert_eq!(ok["caller"], "bob");

    // Published without a reply subject: an agent request is not run (under the generated
    // accounts that is what a reply bounced into another agent's request subject looks like).
    let before = seen.load(Ordering::SeqCst);
    client
        .publish("test.echo.carol", "{}".into())
        .await
        .unwrap();
    client
        .publish("test.echo.carol", "{garbage".into())
        .await
        .unwrap();
    let (_, after) = json(&client, "test.echo.dave", "{}").await;
    assert_eq!(after["caller"], "dave");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        before + 1,
        "only dave's request ran"
    );

    // Stats count errors by kind.
    let stats = client.request("$SRV.STATS.echo", "".into()).await.unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.payload).unwrap();
    let data = &stats["endpoints"][0]["data"]["errors_by_kind"];
    assert_eq!(data["not_found"], 1);
    assert_eq!(data["internal"], 1);
    assert_eq!(data["invalid_agent_id"], 1);
    assert_eq!(data["bad_reply_subject"], 2);

    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn shutdown_finishes_in_flight_requests_then_stops_listening() {
    let Served {
        _nats,
        client,
        seen,
        shutdown,
        task,
    } = serve(Duration::from_secs(5)).await;

    // Three slow requests in flight when shutdown starts: all are answered.
    let mut in_flight = Vec::new();
    for _ in 0..3 {
        let client = client.clone();
        in_flight.push(tokio::spawn(async move {
            client
                .request("test.echo.slow", r#"{"delay_ms": 400}"#.into())
                .await
        }));
    }
    assert_eventually!(Duration::from_secs(2), async {
        seen.load(Ordering::SeqCst) == 3
    });
    shutdown.cancel();
    for request in in_flight {
        let reply = request.await.unwrap().unwrap();
        let value: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(value["caller"], "slow");
    }
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    // Nobody listens any more.
    let err = client
        .request("test.echo.late", "{}".into())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), async_nats::RequestErrorKind::NoResponders);
}

#[tokio::test]
async fn grace_period_bounds_shutdown() {
    let Served {
        _nats,
        client,
        seen,
        shutdown,
        task,
    } = serve(Duration::from_millis(200)).await;
    let stuck = client.clone();
    tokio::spawn(async move {
        let _ = stuck
            .request("test.echo.stuck", r#"{"delay_ms": 60000}"#.into())
            .await;
    });
    assert_eventually!(Duration::from_secs(2), async {
        seen.load(Ordering::SeqCst) == 1
    });
    let started = std::time::Instant::now();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
}
