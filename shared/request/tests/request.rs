//! `request::request_json_retrying` against a real nats-server: a request whose reply is lost
//! is hedged and answered by the copy, in a fraction of the timeout; a copy refused with
//! `conflict` while another copy holds the resource waits for that copy.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use switchboard_proto::{ErrorKind, ErrorReply, HEADER_SERVICE_ERROR_CODE};
use switchboard_request::request::{HEDGE_AFTER, RequestFailure, request_json_retrying};
use switchboard_testkit::NatsServer;
use tokio::task::JoinHandle;

/// What a scripted service does with its n-th request (counting from 1).
enum Answer {
    /// Nothing (as a service whose server went away).
    Drop,
    /// This JSON, after this long.
    Json(serde_json::Value, Duration),
    /// A `conflict` error reply, at once.
    Conflict,
}

/// A service on `subject` that answers each request as `script` says, each in its own task;
/// returns how many requests it has seen.
async fn service(
    client: &async_nats::Client,
    subject: &str,
    script: impl Fn(usize) -> Answer + Send + Sync + 'static,
) -> (Arc<AtomicUsize>, JoinHandle<()>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let mut requests = client.subscribe(subject.to_owned()).await.unwrap();
    let task = {
        let client = client.clone();
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
                let (client, reply) = (client.clone(), request.reply.unwrap());
                match script(n) {
                    Answer::Drop => {}
                    Answer::Json(body, after) => {
                        tokio::spawn(async move {
                            // A real wait: the script answers this late.
                            tokio::time::sleep(after).await;
                            let body = serde_json::to_vec(&body).unwrap();
                            client.publish(reply, body.into()).await.unwrap();
                        });
                    }
                    Answer::Conflict => {
                        let mut headers = async_nats::HeaderMap::new();
                        headers.insert(HEADER_SERVICE_ERROR_CODE, "409");
                        let refusal =
                            ErrorReply::new(ErrorKind::Conflict, "being delivered; retry");
                        let body = serde_json::to_vec(&refusal).unwrap();
                        client
                            .publish_with_headers(reply, headers, body.into())
                            .await
                            .unwrap();
                    }
                }
            }
        })
    };
    (seen, task)
}

async fn ask(
    client: &async_nats::Client,
    subject: &str,
) -> Result<serde_json::Value, RequestFailure> {
    request_json_retrying(
        client,
        subject,
        &serde_json::json!({ "id": "same-every-time" }),
        Duration::from_secs(5),
        0,
    )
    .await
}

#[tokio::test]
async fn a_lost_reply_is_ridden_out_by_a_hedge_not_the_timeout() {
    let nats = NatsServer::start().await;
    let client = nats.client().await;
    // Drops the first request it gets and answers every later one with how many it has seen.
    let (seen, responder) = service(&client, "svc.echo", |n| {
        if n == 1 {
            Answer::Drop
        } else {
            Answer::Json(serde_json::json!({ "n": n }), Duration::ZERO)
        }
    })
    .await;

    let started = Instant::now();
    let reply = ask(&client, "svc.echo").await.unwrap();
    let took = started.elapsed();
    assert_eq!(reply["n"], 2, "the hedge got the answer");
    assert!(took >= HEDGE_AFTER, "{took:?}");
    assert!(
        took < Duration::from_secs(2),
        "not the 5 s timeout: {took:?}"
    );

    // A healthy service answers the first copy: no hedge is sent.
    let before = seen.load(Ordering::SeqCst);
    ask(&client, "svc.echo").await.unwrap();
    // A real wait: past the hedge delay, a hedge (which must not be sent) would be seen.
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
    let nats = NatsServer::start().await;
    let client = nats.client().await;
    // The first copy holds the resource and answers after 700 ms; the hedge sent after 250 ms
    // is refused at once with `conflict` ("being delivered; retry"). The caller gets the first
    // copy's answer, not the conflict.
    let (seen, holder) = service(&client, "svc.claim", |n| {
        if n == 1 {
            Answer::Json(serde_json::json!({ "by": n }), Duration::from_millis(700))
        } else {
            Answer::Conflict
        }
    })
    .await;
    let reply = ask(&client, "svc.claim").await.unwrap();
    assert_eq!(reply["by"], 1, "the holder's answer");
    assert!(
        seen.load(Ordering::SeqCst) >= 2,
        "a hedge was refused meanwhile"
    );

    // With no other copy out, a conflict is the outcome.
    let (_, refuser) = service(&client, "svc.lone", |_| Answer::Conflict).await;
    let refused = ask(&client, "svc.lone").await.unwrap_err();
    assert!(
        matches!(&refused, RequestFailure::Service(r) if r.kind() == ErrorKind::Conflict),
        "{refused:?}"
    );
    holder.abort();
    refuser.abort();
}
