//! Bounded redelivery and dead letters: a goal's message that its reader cannot handle (it
//! gives it back every time) is handed out `INBOX_MAX_DELIVER` times, then moves to `AGENT_DLQ` with
//! its reason; one a reader rejects moves at once with the reader's reason; later messages flow
//! on; a replayed letter comes back to the goal once and leaves the dead letters.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use switchboard_client::{dlq_list, dlq_replay};
use switchboard_proto::InboxMessage;
use switchboard_proto::inbox::INBOX_MAX_DELIVER;
use switchboard_testkit::eventually;
use switchboard_tests::Fabric;

#[tokio::test]
async fn a_poison_message_moves_to_the_dead_letters_with_its_reason_and_replays() {
    let fabric = Fabric::start().await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let (_bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let nats = fabric.nats.client().await;

    // A message bob's reader can never handle: it gives it back every time.
    let poison = alice.send_to_peer("bob", "poison").await.unwrap();
    let mut deliveries = 0;
    while let Some(delivery) = bob_goal.recv(Duration::from_secs(2)).await.unwrap() {
        assert_eq!(delivery.message.id, poison.message_id);
        deliveries += 1;
        delivery.nak(None).await.unwrap();
    }
    assert_eq!(
        deliveries, INBOX_MAX_DELIVER,
        "delivered up to the limit, then given up on"
    );

    // One bob rejects for good, with a reason.
    let rejected = alice.send_to_peer("bob", "gibberish").await.unwrap();
    let delivery = bob_goal
        .recv(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(delivery.message.id, rejected.message_id);
    delivery.reject("cannot parse the request").await.unwrap();

    // Later messages flow on.
    let fine = alice.send_to_peer("bob", "all good").await.unwrap();
    let next = bob_goal
        .recv(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.message.id, fine.message_id);
    next.ack().await.unwrap();

    // Both are dead letters, with their reasons and where they came from.
    assert!(
        eventually(Duration::from_secs(10), || {
            let nats = nats.clone();
            async move { dlq_list(&nats, 10).await.map(|l| l.len()).unwrap_or(0) == 2 }
        })
        .await,
        "two dead letters"
    );
    let letters = dlq_list(&nats, 10).await.unwrap();
    let inbox = bob_goal.subject().to_owned();
    let by_body = |body: &str| {
        letters
            .iter()
            .find(|letter| letter.payload["body"] == body)
            .unwrap_or_else(|| panic!("no letter for {body}: {letters:?}"))
            .clone()
    };
    let nakked = by_body("poison");
    assert_eq!(
        nakked.reason,
        format!("handed out {INBOX_MAX_DELIVER} times without being acknowledged (the limit)")
    );
    assert_eq!(nakked.subject, inbox);
    assert_eq!(nakked.stream, switchboard_proto::INBOX_STREAM);
    assert_eq!(
        nakked.consumer,
        switchboard_proto::inbox_consumer(&bob_goal.id())
    );
    assert_eq!(nakked.deliveries, INBOX_MAX_DELIVER as u64);
    let refused = by_body("gibberish");
    assert_eq!(
        refused.reason,
        "rejected by its reader: cannot parse the request"
    );

    // Replayed: back in bob's inbox once, and gone from the dead letters.
    let replayed = dlq_replay(&nats, refused.seq).await.unwrap();
    assert_eq!(replayed.subject, inbox);
    assert!(
        dlq_replay(&nats, refused.seq).await.is_err(),
        "a letter replays once"
    );
    let back = bob_goal
        .recv(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let back: InboxMessage = back.ack().await.unwrap();
    assert_eq!(back.body, "gibberish");
    assert_eq!(back.id, rejected.message_id, "the message as it was");
    assert!(
        bob_goal
            .recv(Duration::from_millis(500))
            .await
            .unwrap()
            .is_none()
    );
    let left = dlq_list(&nats, 10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].seq, nakked.seq);
}
