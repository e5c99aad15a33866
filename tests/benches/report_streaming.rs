//! The report's streamed-call rows (issue 20): how soon a caller has the first part of an
//! answer that comes in parts.
//!
//! A callee answers each streamed request with part 1 (256 B) at once, then 3 more parts and
//! the final reply. The caller, waiting with `stream`, measures the time to part 1 and to the
//! final answer; the same exchange as a plain call (one 256 B answer) is the reference. The
//! first part of a streamed answer should come as soon as a whole plain answer does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use switchboard_client::CallEvent;
use switchboard_proto::MessageKind;
use switchboard_proto::call::CallRequest;
use switchboard_tests::bench::{Sample, measure, percentile};

use crate::{Report, agent};

/// Parts after the first before the final reply.
const MORE_PARTS: u32 = 3;

/// Adds the streamed-call rows.
pub async fn streaming_rows(report: &mut Report, url: &str, ops: usize, call: Sample) {
    let callee = Arc::new(agent(url, "bench-stream-callee").await);
    let goal = callee.open_goal().await.unwrap();
    let answerer = Arc::clone(&callee);
    let answering = tokio::spawn(async move {
        let chunk = "y".repeat(256);
        loop {
            let Ok(Some(delivery)) = goal.recv(Duration::from_secs(60)).await else {
                continue;
            };
            let (answerer, chunk) = (Arc::clone(&answerer), chunk.clone());
            tokio::spawn(async move {
                let message = delivery.ack().await.unwrap();
                if message.kind != MessageKind::Request {
                    return;
                }
                let id = message.correlation_id.unwrap();
                for part in 1..=1 + MORE_PARTS {
                    answerer.reply_part(id, part, &chunk).await.unwrap();
                }
                answerer.reply(id, &chunk).await.unwrap();
            });
        }
    });
    let caller = Arc::new(agent(url, "bench-stream-caller").await);
    let _caller_goal = caller.open_goal().await.unwrap();
    let mut first = Vec::with_capacity(ops);
    let mut whole = Vec::with_capacity(ops);
    for n in 0..ops + ops / 10 {
        let started = Instant::now();
        let mut events = Box::pin(
            caller
                .call_streamed(request("x".repeat(256)))
                .await
                .unwrap(),
        );
        let mut first_at = None;
        while let Some(event) = events.next().await {
            match event.unwrap() {
                CallEvent::Part(_) => {
                    first_at.get_or_insert_with(|| started.elapsed());
                }
                CallEvent::Answer(answer) => {
                    assert_eq!(answer.streamed, 1 + MORE_PARTS);
                    break;
                }
            }
        }
        if n >= ops / 10 {
            first.push(first_at.unwrap());
            whole.push(started.elapsed());
        }
    }
    first.sort();
    whole.sort();
    // Throughput: whole streamed answers with 8 calls in flight.
    let throughput = {
        let caller = Arc::clone(&caller);
        measure(ops / 4, 1, 8, move || {
            let caller = Arc::clone(&caller);
            async move {
                let mut events = Box::pin(
                    caller
                        .call_streamed(request("x".repeat(256)))
                        .await
                        .unwrap(),
                );
                while let Some(event) = events.next().await {
                    if let CallEvent::Answer(_) = event.unwrap() {
                        break;
                    }
                }
            }
        })
        .await
    };
    answering.abort();
    let first_part = Sample {
        p50: percentile(&first, 0.5),
        p99: percentile(&first, 0.99),
        per_sec: throughput.per_sec,
    };
    let answer = Sample {
        p50: percentile(&whole, 0.5),
        p99: percentile(&whole, 0.99),
        per_sec: throughput.per_sec,
    };
    report.row(
        "streamed call",
        "first part of a 5-part answer (256 B each)",
        first_part,
    );
    report.row("streamed call", "the whole 5-part answer", answer);
    report.ratio(
        "streamed call: first part p50 / plain call round trip p50",
        first_part.p50.as_secs_f64() / call.p50.as_secs_f64(),
        1.2,
        false,
    );
}

fn request(text: String) -> CallRequest {
    CallRequest {
        to: Some("bench-stream-callee".into()),
        message: Some(text),
        timeout_ms: Some(30_000),
        ..CallRequest::default()
    }
}
