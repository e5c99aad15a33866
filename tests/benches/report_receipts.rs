//! The report's receipt rows (issue 20): what `receipt: "read"` adds to a send.
//!
//! One sender and one receiver, each goal read by a reader that keeps up (the receiver's acks
//! make the `read` receipts, the sender's reader takes them): send_to_peer 256 B without
//! receipts, then with `receipt: "read"`, measured the same way. The target: the receipted
//! send's p50 at most 1.1 × the plain one's. The receipts themselves (a publish and a KV
//! update on the fetch that hands a message out, the same on the ack that passes it) are paid
//! by the reader's requests, off the send; the throughput rows show what they cost the
//! machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use switchboard_proto::receipt::ReceiptLevel;
use switchboard_proto::send::SendRequest;
use switchboard_tests::bench::{Sample, keep_reading, measure};

use crate::{IN_FLIGHT, Report, agent};

/// Adds the receipt rows and the 1.1× target.
pub async fn receipt_rows(report: &mut Report, url: &str, ops: usize) {
    let sender = Arc::new(agent(url, "bench-receipt-sender").await);
    let sender_goal = sender.open_goal().await.unwrap();
    let receiver = agent(url, "bench-receipt-receiver").await;
    let receiver_goal = receiver.open_goal().await.unwrap();
    let receipts = Arc::new(AtomicUsize::new(0));
    let read = Arc::new(AtomicUsize::new(0));
    let sender_id = sender_goal.id();
    let readers = [
        keep_reading(sender_goal, Arc::clone(&receipts)),
        keep_reading(receiver_goal, Arc::clone(&read)),
    ];
    let send = |receipt: Option<ReceiptLevel>| {
        let sender = Arc::clone(&sender);
        let body = "x".repeat(256);
        measure(ops, 4, IN_FLIGHT, move || {
            let (sender, body) = (Arc::clone(&sender), body.clone());
            async move {
                let report = sender
                    .send(SendRequest {
                        to: Some("bench-receipt-receiver".into()),
                        message: Some(body),
                        from_goal_id: Some(sender_id),
                        receipt,
                        ..SendRequest::default()
                    })
                    .await
                    .unwrap();
                assert_eq!(report.delivered_to.len(), 1, "{report:?}");
            }
        })
    };
    let plain: Sample = send(None).await;
    let read_before = settled(&read).await;
    let receipted: Sample = send(Some(ReceiptLevel::Read)).await;
    // Every receipted message is read, and each brings two receipts back (delivered, read):
    // let the readers finish, so the counts printed are the whole of it.
    let receipted_read = settled(&read).await - read_before;
    let taken = settled(&receipts).await;
    for reader in readers {
        reader.abort();
    }
    report.row(
        "receipts",
        "send_to_peer 256 B, read by a reader keeping up",
        plain,
    );
    report.row("receipts", "the same with receipt: \"read\"", receipted);
    report.note_row(
        "receipts",
        "receipts the sender's reader took",
        format!("{taken} for {receipted_read} receipted messages read (2 each: delivered, read)"),
    );
    report.ratio(
        "send with receipt: \"read\" p50 / send without p50",
        receipted.p50.as_secs_f64() / plain.p50.as_secs_f64(),
        1.1,
        false,
    );
}

/// `counter` once it has stopped moving for half a second (at most 30 s).
async fn settled(counter: &AtomicUsize) -> usize {
    let mut last = counter.load(Ordering::Relaxed);
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = counter.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
    }
    last
}
