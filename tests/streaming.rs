//! Streamed calls (issue 20): a callee answers in parts, then a final reply that ends the call.
//! A waiting caller gets the parts in order as they come; a parked caller gets them as `kind:
//! response` messages; a caller that lost its connection reads back the ones it missed; a
//! callee may ask its caller a question inside the call; and only the callee sends parts, only
//! the caller reads them back.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use switchboard_client::{Agent, CallEvent, Goal};
use switchboard_proto::call::{CallPart, CallParts, CallRequest};
use switchboard_proto::{ErrorKind, InboxMessage, MessageKind, subject};
use switchboard_tests::{Fabric, raw};
use uuid::Uuid;

/// The next `kind: request` in `goal` (waits up to 10 s).
async fn next_request(goal: &Goal) -> InboxMessage {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "no request came");
        if let Some(delivery) = goal.recv(Duration::from_secs(1)).await.unwrap() {
            let message = delivery.ack().await.unwrap();
            if message.kind == MessageKind::Request {
                return message;
            }
        }
    }
}

fn question(to: &str, text: &str) -> CallRequest {
    CallRequest {
        to: Some(to.to_owned()),
        message: Some(text.to_owned()),
        timeout_ms: Some(20_000),
        ..CallRequest::default()
    }
}

#[tokio::test]
async fn parts_arrive_in_order_and_the_final_answer_ends_the_call() {
    let fabric = Fabric::start().await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let (bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let (mallory, _) = fabric.agent_with_goal("mallory").await;
    let mut stream = Box::pin(
        alice
            .call_streamed(question("bob", "tell me a story"))
            .await
            .unwrap(),
    );
    let request = next_request(&bob_goal).await;
    let call = request.correlation_id.unwrap();

    // Part 1 reaches alice before part 2 is even sent.
    let ack = bob.reply_part(call, 1, "Once upon a time, ").await.unwrap();
    assert_eq!(ack.part, Some(1));
    let Some(Ok(CallEvent::Part(first))) = stream.next().await else {
        panic!("the first part first")
    };
    assert_eq!((first.part, first.body.as_str()), (1, "Once upon a time, "));
    assert!(first.partial);
    // A retried part is taken once; a part out of order and a part from anyone else are
    // refused.
    assert!(bob.reply_part(call, 1, "again").await.unwrap().duplicate);
    let skipped = bob.reply_part(call, 3, "too soon").await.unwrap_err();
    assert_eq!(skipped.kind(), Some(ErrorKind::BadRequest), "{skipped}");
    let zero = bob.reply_part(call, 0, "nothing").await.unwrap_err();
    assert_eq!(zero.kind(), Some(ErrorKind::BadRequest), "{zero}");
    let intruder = mallory.reply_part(call, 2, "the end").await.unwrap_err();
    assert_eq!(intruder.kind(), Some(ErrorKind::NotCallee), "{intruder}");
    bob.reply_part(call, 2, "a fabric carried ").await.unwrap();
    bob.reply(call, "every word.").await.unwrap();

    let mut rest = Vec::new();
    while let Some(item) = stream.next().await {
        rest.push(item.unwrap());
    }
    let [CallEvent::Part(second), CallEvent::Answer(answer)] = rest.as_slice() else {
        panic!("part 2, then the answer: {rest:?}")
    };
    assert_eq!(
        (second.part, second.body.as_str()),
        (2, "a fabric carried ")
    );
    assert_eq!(
        answer.body,
        "Once upon a time, a fabric carried every word."
    );
    assert_eq!(answer.streamed, 2);
    // The final reply ended the call: no more parts (a retry of one taken is still a
    // duplicate).
    let late = bob.reply_part(call, 3, "epilogue").await.unwrap_err();
    assert_eq!(late.kind(), Some(ErrorKind::Conflict), "{late}");
    assert!(bob.reply_part(call, 2, "again").await.unwrap().duplicate);

    // A caller that did not ask for the stream gets one answer with everything joined.
    let plain = {
        let alice = &alice;
        async move {
            alice
                .call("bob", "again, all at once", Duration::from_secs(20))
                .await
        }
    };
    let answering = async {
        let request = next_request(&bob_goal).await;
        let call = request.correlation_id.unwrap();
        bob.reply_part(call, 1, "one, ").await.unwrap();
        bob.reply(call, "two.").await.unwrap();
    };
    let (answer, ()) = tokio::join!(plain, answering);
    let answer = answer.unwrap();
    assert_eq!((answer.body.as_str(), answer.streamed), ("one, two.", 1));
}

#[tokio::test]
async fn a_parked_caller_and_a_caller_that_lost_its_connection_see_every_part() {
    let fabric = Fabric::start().await;
    let (alice, alice_goal) = fabric.agent_with_goal("alice").await;
    let (bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let (mallory, _) = fabric.agent_with_goal("mallory").await;

    // Parked: every part lands in the calling goal, then the joined answer.
    let parked = alice
        .call_parked("bob", "list three colours", Duration::from_secs(20))
        .await
        .unwrap();
    let call = next_request(&bob_goal).await.correlation_id.unwrap();
    assert_eq!(call, parked.correlation_id);
    bob.reply_part(call, 1, "red, ").await.unwrap();
    bob.reply_part(call, 2, "green, ").await.unwrap();
    bob.reply(call, "blue").await.unwrap();
    let responses: Vec<InboxMessage> = alice_goal
        .drain()
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.kind == MessageKind::Response && m.correlation_id == Some(call))
        .collect();
    let seen: Vec<(Option<u64>, &str)> = responses
        .iter()
        .map(|m| {
            (
                m.metadata.get("part").and_then(|p| p.as_u64()),
                m.body.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (Some(1), "red, "),
            (Some(2), "green, "),
            (None, "red, green, blue")
        ]
    );
    assert_eq!(responses[0].metadata["partial"], json!(true));
    assert_eq!(responses[2].metadata["streamed"], json!(2));

    // A callee cannot flood a parked caller's goal with parts: 16 reach it, the rest stay on
    // the record, and the final response joins all 40.
    let parked = alice
        .call_parked("bob", "forty words", Duration::from_secs(20))
        .await
        .unwrap();
    let call = next_request(&bob_goal).await.correlation_id.unwrap();
    assert_eq!(call, parked.correlation_id);
    for part in 1..=40 {
        bob.reply_part(call, part, "w ").await.unwrap();
    }
    bob.reply(call, "end").await.unwrap();
    let taken = alice_goal.drain().await.unwrap();
    let parts = taken
        .iter()
        .filter(|m| m.correlation_id == Some(call) && m.metadata.contains_key("part"))
        .count();
    assert_eq!(parts, 16);
    let last = taken
        .iter()
        .rfind(|m| m.correlation_id == Some(call))
        .unwrap();
    assert_eq!(last.body, format!("{}end", "w ".repeat(40)));

    // A waiting caller whose connection went away after part 1 reads back the rest.
    let nats = alice.nats();
    let inbox = nats.new_inbox();
    let mut replies = nats.subscribe(inbox.clone()).await.unwrap();
    let mut streamed = question("bob", "count to four");
    streamed.stream = true;
    streamed.wait = Some(true);
    nats.publish_with_reply(
        subject::call(alice.id()),
        inbox,
        serde_json::to_vec(&streamed).unwrap().into(),
    )
    .await
    .unwrap();
    let call = next_request(&bob_goal).await.correlation_id.unwrap();
    bob.reply_part(call, 1, "one ").await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), replies.next())
        .await
        .unwrap()
        .unwrap();
    let first: CallPart = serde_json::from_slice(&first.payload).unwrap();
    assert_eq!(first.part, 1);
    replies.unsubscribe().await.unwrap();
    bob.reply_part(call, 2, "two ").await.unwrap();
    bob.reply_part(call, 3, "three ").await.unwrap();
    bob.reply(call, "four").await.unwrap();
    let parts_subject = subject::calls_parts(alice.id());
    let back = raw(
        nats,
        &parts_subject,
        json!({"correlation_id": call, "after": 1}).to_string(),
    )
    .await;
    let back: CallParts = serde_json::from_value(back.body).unwrap();
    let numbers: Vec<u32> = back.parts.iter().map(|p| p.part).collect();
    assert_eq!(numbers, [2, 3]);
    assert_eq!(back.answer.unwrap().body, "one two three four");

    // Only the caller reads them back; bad bodies are `bad_request`.
    let intruder = raw(
        mallory.nats(),
        &subject::calls_parts(mallory.id()),
        json!({"correlation_id": call}).to_string(),
    )
    .await;
    assert_eq!(intruder.error_kind(), "not_found");
    for body in [
        json!({}),
        json!({"correlation_id": "nope"}),
        json!({"correlation_id": call, "after": -1}),
        json!({"correlation_id": call, "after": 9_223_372_036_854_775_808_u64}),
        json!({"correlation_id": call, "extra": true}),
    ] {
        let reply = raw(nats, &parts_subject, body.to_string()).await;
        assert_eq!(reply.error_kind(), "bad_request", "{body}");
    }
}

/// Bob, serving `call` (whose request is `request_id`), asks alice a question inside it.
async fn ask_back(bob: &Agent, call: Uuid, request_id: Uuid) -> Result<String, String> {
    bob.call_with(CallRequest {
        to: Some("alice".into()),
        message: Some("which city?".into()),
        timeout_ms: Some(60_000),
        parent_correlation_id: Some(call),
        in_reply_to: Some(request_id),
        ..CallRequest::default()
    })
    .await
    .map(|answer| answer.body)
    .map_err(|err| format!("{:?}: {err}", err.kind()))
}

#[tokio::test]
async fn a_callee_asks_its_caller_back_within_the_call() {
    let fabric = Fabric::start().await;
    let (alice, alice_goal) = fabric.agent_with_goal("alice").await;
    let (bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let asking = alice.call("bob", "book me a train", Duration::from_secs(20));
    let serving = async {
        let request = next_request(&bob_goal).await;
        let call = request.correlation_id.unwrap();
        let request_id = request.id.unwrap();
        // A call back to alice that is not a question about this call is a cycle, as ever.
        let cycle = bob
            .call_with(CallRequest {
                parent_correlation_id: Some(call),
                ..question("alice", "unrelated")
            })
            .await
            .unwrap_err();
        assert_eq!(cycle.kind(), Some(ErrorKind::Cycle), "{cycle}");
        // The question: in reply to alice's request; its deadline is cut to the call's.
        let question = ask_back(&bob, call, request_id);
        let answering = async {
            let asked = next_request(&alice_goal).await;
            assert_eq!(asked.in_reply_to, Some(request_id));
            assert_eq!(asked.from_agent_id.as_str(), "bob");
            alice
                .reply(asked.correlation_id.unwrap(), "Lisbon")
                .await
                .unwrap();
        };
        let (city, ()) = tokio::join!(question, answering);
        let city = city.unwrap();
        bob.reply(call, &format!("booked to {city}")).await.unwrap();
    };
    let (answer, ()) = tokio::join!(asking, serving);
    assert_eq!(answer.unwrap().body, "booked to Lisbon");
}

#[tokio::test]
async fn a_streamed_answer_is_bounded_in_parts_and_bytes() {
    let fabric = Fabric::start().await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let (bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let parked = alice
        .call_parked("bob", "talk a lot", Duration::from_secs(30))
        .await
        .unwrap();
    let call = next_request(&bob_goal).await.correlation_id.unwrap();
    assert_eq!(call, parked.correlation_id);
    // 64 KiB for the whole answer as stored: a 40 KiB part fits, a second one does not, and
    // the call stays open for a smaller one.
    bob.reply_part(call, 1, &"a".repeat(40_000)).await.unwrap();
    let big = bob
        .reply_part(call, 2, &"b".repeat(30_000))
        .await
        .unwrap_err();
    assert_eq!(big.kind(), Some(ErrorKind::BodyTooLarge), "{big}");
    // Control characters count as stored (escaped, 6 bytes each).
    let escaped = bob
        .reply_part(call, 2, &"\u{1}".repeat(5_000))
        .await
        .unwrap_err();
    assert_eq!(escaped.kind(), Some(ErrorKind::BodyTooLarge), "{escaped}");
    // At most CALL_PARTS_MAX parts.
    let max = switchboard_proto::call::CALL_PARTS_MAX;
    for part in 2..=max {
        bob.reply_part(call, part, "c").await.unwrap();
    }
    let over = bob.reply_part(call, max + 1, "d").await.unwrap_err();
    assert_eq!(over.kind(), Some(ErrorKind::BodyTooLarge), "{over}");
    bob.reply(call, "done").await.unwrap();

    // A final reply that would make the joined answer too large for a message (130048 bytes
    // with its envelope) is refused before the claim; a shorter one still ends the call.
    alice
        .call_parked("bob", "one more", Duration::from_secs(30))
        .await
        .unwrap();
    let call = next_request(&bob_goal).await.correlation_id.unwrap();
    bob.reply_part(call, 1, &"a".repeat(65_000)).await.unwrap();
    let last = bob.reply(call, &"e".repeat(65_000)).await.unwrap_err();
    assert_eq!(last.kind(), Some(ErrorKind::BodyTooLarge), "{last}");
    bob.reply(call, "done").await.unwrap();
}

/// Issue 38: a callee whose handler failed answers with `error` at once — the waiting caller
/// gets it in the answer, not a timeout at its deadline — and a streamed answer ends cleanly
/// with an empty final reply after its parts. Bad error replies are refused.
#[tokio::test]
async fn a_failed_call_is_answered_at_once_and_a_stream_ends_without_more_text() {
    let fabric = Fabric::start().await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let (bob, bob_goal) = fabric.agent_with_goal("bob").await;

    let asking = std::sync::Arc::new(alice);
    let caller = std::sync::Arc::clone(&asking);
    let started = tokio::time::Instant::now();
    let waiting = tokio::spawn(async move {
        caller
            .call("bob", "divide by zero", Duration::from_secs(20))
            .await
    });
    let request = next_request(&bob_goal).await;
    let call = request.correlation_id.unwrap();
    let client = fabric.nats.client().await;
    for (bad, why) in [
        (
            json!({"correlation_id": call, "error": {"kind": "Bad Kind", "message": "x"}}),
            "a kind outside [a-z0-9_]",
        ),
        (
            json!({"correlation_id": call, "error": {"kind": "k", "message": "x".repeat(1025)}}),
            "a message over 1,024 characters",
        ),
        (
            json!({"correlation_id": call, "message": "text", "error": {"kind": "k"}}),
            "an error with text",
        ),
        (
            json!({"correlation_id": call, "partial": true, "error": {"kind": "k"}}),
            "a partial error",
        ),
        (
            json!({"correlation_id": call}),
            "an empty final reply to a call that streamed nothing",
        ),
    ] {
        let refused = raw(
            &client,
            &subject::reply(bob.id()),
            serde_json::to_vec(&bad).unwrap(),
        )
        .await;
        assert!(
            matches!(
                refused.error_kind().as_str(),
                "bad_request" | "empty_message"
            ),
            "{why}: {:?}",
            refused.error_kind()
        );
    }
    bob.reply_error(call, "handler_error", "ZeroDivisionError: division by zero")
        .await
        .unwrap();
    let answer = waiting.await.unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "at once");
    let error = answer.error.expect("the answer says the call failed");
    assert_eq!(error.kind, "handler_error");
    assert_eq!(error.message, "ZeroDivisionError: division by zero");
    assert_eq!(answer.body, "");

    // A stream that says everything in parts ends with an empty final reply.
    let mut stream = Box::pin(
        asking
            .call_streamed(question("bob", "count"))
            .await
            .unwrap(),
    );
    let request = next_request(&bob_goal).await;
    let call = request.correlation_id.unwrap();
    bob.reply_part(call, 1, "one, ").await.unwrap();
    bob.reply_part(call, 2, "two").await.unwrap();
    bob.end_stream(call).await.unwrap();
    let mut last = None;
    while let Some(event) = stream.next().await {
        last = Some(event.unwrap());
    }
    let Some(CallEvent::Answer(answer)) = last else {
        panic!("the stream ends with the answer: {last:?}");
    };
    assert_eq!(answer.body, "one, two");
    assert_eq!(answer.streamed, 2);
    assert!(answer.error.is_none());
}
