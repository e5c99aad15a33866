//! `request::request_json_retrying` against a real nats-server: a request whose reply is lost
//! is hedged and answered by the copy, in a fraction of the timeout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use switchboard_runtime::request::{HEDGE_AFTER, request_json_retrying};
use switchboard_testkit::NatsServer;

#[tokio::test]
async fn a_lost_reply_is_ridden_out_by_a_hedge_not_the_timeout() {
    let nats = NatsServer::start().await;
    let client = nats.client().await;
    // A service that drops the first request it gets (as one whose server went away would)
    // and answers every later one with how many it has seen.
    let seen = Arc::new(AtomicUsize::new(0));
    let mut requests = client.subscribe("svc.echo").await.unwrap();
    let responder = {
        let client = client.clone();
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
                if n == 1 {
                    continue;
                }
                let body = serde_json::to_vec(&serde_json::json!({ "n": n })).unwrap();
                client
                    .publish(request.reply.unwrap(), body.into())
                    .await
                    .unwrap();
            }
        })
    };

    let started = Instant::now();
    let reply: serde_json::Value = request_json_retrying(
        &client,
        "svc.echo",
        &serde_json::json!({ "id": "same-every-time" }),
        Duration::from_secs(5),
        0,
    )
    .await
    .unwrap();
    let took = started.elapsed();
    assert_eq!(reply["n"], 2, "the hedge got the answer");
    assert!(took >= HEDGE_AFTER, "{took:?}");
    assert!(
        took < Duration::from_secs(2),
        "not the 5 s timeout: {took:?}"
    );

    // A healthy service answers the first copy: no hedge is sent.
    let before = seen.load(Ordering::SeqCst);
    let _: serde_json::Value = request_json_retrying(
        &client,
        "svc.echo",
        &serde_json::json!({}),
        Duration::from_secs(5),
        0,
    )
    .await
    .unwrap();
    tokio::time::sleep(HEDGE_AFTER * 2).await;
    assert_eq!(
        seen.load(Ordering::SeqCst),
        before + 1,
        "one request, no hedge"
    );
    responder.abort();
}

#[tokio::test]
async fn a_conflict_from_a_hedge_waits_for_the_copy_that_holds_the_resource() {
    // The first copy is slow (it holds the resource and answers after 700 ms); the hedge sent
    // after 250 ms is refused at once with `conflict` ("being delivered; retry"). The caller
    // gets the first copy's answer, not the conflict.
    let nats = NatsServer::start().await;
    let client = nats.client().await;
    let seen = Arc::new(AtomicUsize::new(0));
    let mut requests = client.subscribe("svc.claim").await.unwrap();
    let responder = {
        let client = client.clone();
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
                let client = client.clone();
                tokio::spawn(async move {
                    let reply = request.reply.unwrap();
                    if n == 1 {
                        tokio::time::sleep(Duration::from_millis(700)).await;
                        let body = serde_json::to_vec(&serde_json::json!({ "by": n })).unwrap();
                        client.publish(reply, body.into()).await.unwrap();
                    } else {
                        let mut headers = async_nats::HeaderMap::new();
                        headers.insert(switchboard_proto::HEADER_SERVICE_ERROR_CODE, "409");
                        headers.insert(switchboard_proto::HEADER_SERVICE_ERROR, "being delivered");
                        let body = serde_json::to_vec(&switchboard_proto::ErrorReply::new(
                            switchboard_proto::ErrorKind::Conflict,
                            "being delivered; retry",
                        ))
                        .unwrap();
                        client
                            .publish_with_headers(reply, headers, body.into())
                            .await
                            .unwrap();
                    }
                });
            }
        })
    };
    let reply: serde_json::Value = request_json_retrying(
        &client,
        "svc.claim",
        &serde_json::json!({ "id": "same-every-time" }),
        Duration::from_secs(5),
        0,
    )
    .await
    .unwrap();
    assert_eq!(reply["by"], 1, "the holder's answer");
    assert!(
        seen.load(Ordering::SeqCst) >= 2,
        "a hedge was refused meanwhile"
    );

    // With no other copy out, a conflict is the outcome.
    let mut lone = client.subscribe("svc.lone").await.unwrap();
    let refuser = {
        let client = client.clone();
        tokio::spawn(async move {
            while let Some(request) = lone.next().await {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(switchboard_proto::HEADER_SERVICE_ERROR_CODE, "409");
                let body = serde_json::to_vec(&switchboard_proto::ErrorReply::new(
                    switchboard_proto::ErrorKind::Conflict,
                    "taken",
                ))
                .unwrap();
                client
                    .publish_with_headers(request.reply.unwrap(), headers, body.into())
                    .await
                    .unwrap();
            }
        })
    };
    let refused = request_json_retrying::<_, serde_json::Value>(
        &client,
        "svc.lone",
        &serde_json::json!({}),
        Duration::from_secs(5),
        0,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&refused, switchboard_runtime::request::RequestFailure::Service(r)
            if r.kind() == switchboard_proto::ErrorKind::Conflict),
        "{refused:?}"
    );
    responder.abort();
    refuser.abort();
}
