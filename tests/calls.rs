//! reply-correlator end to end against a real nats-server: calls that wait and park, replies
//! routed by correlation id, timeouts, cycle/depth/concurrency limits, restarts and replicas.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because it holds one scenario per test of correlated calls; every
// integration file is its own test binary (a link of all five services), so a topic gets one file
// however many tests it has.

use std::collections::BTreeSet;
use std::time::Duration;

use switchboard_client::{Agent, Goal};
use switchboard_proto::call::{AnswerRoute, CallEvent, CallEventKind};
use switchboard_proto::{ErrorKind, MessageKind};
use switchboard_testkit::assert_eventually;
use switchboard_tests::{
    Fabric, assert_no_more, fast_calls, next, raw, start_correlator, stored_json,
};

const LONG: Duration = Duration::from_secs(20);

fn kind<T: std::fmt::Debug>(result: Result<T, switchboard_client::ClientError>) -> ErrorKind {
    result.unwrap_err().kind().expect("a service error reply")
}

#[tokio::test]
async fn a_waiting_call_gets_the_answer_and_a_parked_one_gets_it_in_the_inbox() {
    let fabric = Fabric::start().await;
    let (_writer, _serve) = fabric.answering("writer", |q| format!("re: {q}")).await;
    let (researcher, goal) = fabric.agent_with_goal("researcher").await;

    let answer = researcher
        .call("writer", "need a title", LONG)
        .await
        .unwrap();
    assert_eq!(answer.body, "re: need a title");
    assert_eq!(answer.from_agent_id, "writer");

    let parked = researcher
        .call_parked("writer", "and a subtitle", LONG)
        .await
        .unwrap();
    assert_eq!(parked.delivered_to.len(), 1);
    let response = next(&goal).await;
    assert_eq!(response.kind, MessageKind::Response);
    assert_eq!(response.correlation_id, Some(parked.correlation_id));
    assert!(response.in_reply_to.is_some());
    assert_eq!(response.body, "re: and a subtitle");
    assert_eq!(response.from_agent_id, "writer");
    // Nothing else arrived (the waiting call's answer did not also land in the inbox).
    assert_no_more(&goal).await;
}

#[tokio::test]
async fn the_callee_sees_a_request_with_its_correlation_and_chain() {
    let fabric = Fabric::start().await;
    let (_callee, callee_goal) = fabric.agent_with_goal("callee").await;
    let (caller, _caller_goal) = fabric.agent_with_goal("caller").await;
    let parked = caller
        .call_parked("callee", "question", LONG)
        .await
        .unwrap();
    let request = next(&callee_goal).await;
    assert_eq!(request.kind, MessageKind::Request);
    assert!(request.expects_reply);
    assert_eq!(request.correlation_id, Some(parked.correlation_id));
    assert_eq!(
        request.metadata["call_chain"],
        serde_json::json!(["caller"])
    );
    assert!(request.metadata.contains_key("call_deadline"));
}

#[tokio::test]
async fn two_calls_in_flight_from_one_goal_resolve_independently_out_of_order() {
    let fabric = Fabric::start().await;
    let (callee, callee_goal) = fabric.agent_with_goal("slowpoke").await;
    let caller = std::sync::Arc::new(fabric.agent("asker").await);
    let _goal = caller.open_goal().await.unwrap();

    let (c1, c2) = (
        std::sync::Arc::clone(&caller),
        std::sync::Arc::clone(&caller),
    );
    let first = tokio::spawn(async move { c1.call("slowpoke", "first?", LONG).await });
    let second = tokio::spawn(async move { c2.call("slowpoke", "second?", LONG).await });
    let mut requests = [next(&callee_goal).await, next(&callee_goal).await];
    requests.sort_by_key(|m| m.body.clone());
    // Answer the second one first.
    callee
        .reply(requests[1].correlation_id.unwrap(), "answer to second")
        .await
        .unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(second.body, "answer to second");
    assert!(!first.is_finished());
    callee
        .reply(requests[0].correlation_id.unwrap(), "answer to first")
        .await
        .unwrap();
    assert_eq!(first.await.unwrap().unwrap().body, "answer to first");
}

#[tokio::test]
async fn timeouts_default_clamp_and_notify_a_parked_caller() {
    let fabric = Fabric::start_full(
        inbox_fanout::FanoutConfig::default(),
        reply_correlator::CorrelatorConfig {
            default_timeout_ms: 300,
            max_timeout_ms: 700,
            ..fast_calls()
        },
    )
    .await;
    let (_silent, _silent_goal) = fabric.agent_with_goal("silent").await;
    let (caller, goal) = fabric.agent_with_goal("caller").await;

    // No timeout given: the default (300 ms) applies.
    let client = fabric.nats.client().await;
    let started = std::time::Instant::now();
    let reply = raw(
        &client,
        "agent.call.caller",
        r#"{"to":"silent","message":"hello?"}"#,
    )
    .await;
    assert_eq!(reply.error_kind(), "timeout");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(5_000),
        "{took:?}"
    );

    // Asking for 60 s is clamped to 700 ms.
    let parked = caller
        .call_parked("silent", "anyone?", Duration::from_secs(60))
        .await
        .unwrap();
    let budget = parked.deadline - switchboard_proto::timestamp::now();
    assert!(budget <= time::Duration::milliseconds(700), "{budget:?}");
    let err = caller
        .call("silent", "still there?", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::Timeout));

    // The parked caller is told in its inbox, once.
    let notice = next(&goal).await;
    assert_eq!(notice.kind, MessageKind::Notify);
    assert_eq!(notice.correlation_id, Some(parked.correlation_id));
    assert!(notice.body.contains("timed out"), "{}", notice.body);
    assert_no_more(&goal).await;
}

/// A waiting call that times out at the replica holding it ends with one `expired` event, as
/// a parked one does (found by the fault test: such a call had no ending in the trail).
#[tokio::test]
async fn a_waiting_call_that_times_out_has_its_expired_event() {
    let fabric = Fabric::start().await;
    let (_callee, callee_goal) = fabric.agent_with_goal("silent").await;
    let (caller, _goal) = fabric.agent_with_goal("caller").await;
    let timed_out = caller
        .call("silent", "anyone?", Duration::from_millis(300))
        .await;
    assert_eq!(kind(timed_out), ErrorKind::Timeout);
    let request = next(&callee_goal).await;
    let client = fabric.nats.client().await;
    let filter = format!("agent.calls.events.*.{}", request.correlation_id.unwrap());
    assert_eventually!(Duration::from_secs(5), async {
        let events: Vec<CallEvent> = stored_json(&client, &filter).await;
        events.iter().map(|e| e.event).collect::<Vec<_>>() == vec![CallEventKind::Expired]
    });
}

#[tokio::test]
async fn a_late_reply_is_expired_and_never_delivered() {
    let fabric = Fabric::start().await;
    let (callee, callee_goal) = fabric.agent_with_goal("tardy").await;
    let (caller, goal) = fabric.agent_with_goal("caller").await;
    let parked = caller
        .call_parked("tardy", "quick question", Duration::from_millis(200))
        .await
        .unwrap();
    let request = next(&callee_goal).await;
    assert_eq!(next(&goal).await.kind, MessageKind::Notify);
    let err = callee
        .reply(request.correlation_id.unwrap(), "sorry, late")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::Expired));
    assert_eq!(parked.correlation_id, request.correlation_id.unwrap());
    assert_no_more(&goal).await;

    // The late answer is not lost: it is in the event trail, after the expiry (the request
    // message in the callee's inbox records the opening).
    let client = fabric.nats.client().await;
    let filter = format!("agent.calls.events.*.{}", parked.correlation_id);
    let events: Vec<CallEvent> = stored_json(&client, &filter).await;
    let kinds: Vec<CallEventKind> = events.iter().map(|e| e.event).collect();
    assert_eq!(
        kinds,
        vec![CallEventKind::Expired, CallEventKind::LateAnswer]
    );
    assert_eq!(events[1].body.as_deref(), Some("sorry, late"));
}

#[tokio::test]
async fn replies_are_for_the_callee_only_and_delivered_exactly_once() {
    let fabric = Fabric::start().await;
    let (callee, callee_goal) = fabric.agent_with_goal("callee").await;
    let intruder = fabric.agent("intruder").await;
    let (caller, goal) = fabric.agent_with_goal("caller").await;
    let parked = caller.call_parked("callee", "q", LONG).await.unwrap();
    let cid = next(&callee_goal).await.correlation_id.unwrap();

    assert_eq!(
        kind(intruder.reply(cid, "fake answer").await),
        ErrorKind::NotCallee
    );
    assert_eq!(
        kind(callee.reply(uuid::Uuid::now_v7(), "to nothing").await),
        ErrorKind::NotFound
    );
    let first = callee.reply(cid, "the answer").await.unwrap();
    let client = fabric.nats.client().await;
    let answered: Vec<CallEvent> =
        stored_json(&client, &format!("agent.calls.events.answered.{cid}")).await;
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].body.as_deref(), Some("the answer"));
    assert_eq!(first.delivered, AnswerRoute::Inbox);
    assert!(!first.duplicate);
    let again = callee.reply(cid, "the answer").await.unwrap();
    assert!(
        again.duplicate,
        "a retried reply is acknowledged, not sent again"
    );
    let response = next(&goal).await;
    assert_eq!(response.correlation_id, Some(parked.correlation_id));
    assert_eq!(response.body, "the answer");
    assert_no_more(&goal).await;
}

#[tokio::test]
async fn a_sub_call_of_a_call_with_2_s_left_times_out_by_2_s() {
    let fabric = Fabric::start().await;
    let (a, _a_goal) = fabric.agent_with_goal("a").await;
    let (b, b_goal) = fabric.agent_with_goal("b").await;
    let (_c, _c_goal) = fabric.agent_with_goal("c").await;
    // A gives B 2 s; C never answers.
    let parent = a
        .call_parked("b", "ask c for me", Duration::from_secs(2))
        .await
        .unwrap();
    let request = next(&b_goal).await;
    let serving = request.correlation_id.unwrap();
    assert_eq!(serving, parent.correlation_id);
    // A parked sub-call asking for 300 s is cut to what the parent has left, and says so.
    let parked = switchboard_client::serving(serving, async {
        b.call_parked("c", "park this", Duration::from_secs(300))
            .await
    })
    .await
    .unwrap();
    assert!(parked.clamped, "the reply says the deadline was cut");
    assert_eq!(parked.deadline, parent.deadline);
    // A waiting sub-call asking for 30 s times out with the parent, by 2 s.
    let started = std::time::Instant::now();
    let err = switchboard_client::serving(serving, async {
        b.call("c", "answer me", Duration::from_secs(30)).await
    })
    .await
    .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind(), Some(ErrorKind::Timeout), "{err}");
    assert!(waited < Duration::from_millis(2_500), "waited {waited:?}");
    assert!(err.to_string().contains("parent call had left"), "{err}");
    // Once the parent has run out, a sub-call is refused outright.
    let late = switchboard_client::serving(serving, async {
        b.call("c", "too late", Duration::from_secs(30)).await
    })
    .await
    .unwrap_err();
    assert_eq!(late.kind(), Some(ErrorKind::Expired), "{late}");
    // Without a parent nothing is cut.
    let free = a
        .call_parked("c", "no parent", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!free.clamped);
}

#[tokio::test]
async fn a_b_a_is_refused_as_a_cycle() {
    let fabric = Fabric::start().await;
    let (a, _a_goal) = fabric.agent_with_goal("a").await;
    let (b, b_goal) = fabric.agent_with_goal("b").await;
    a.call_parked("b", "please ask me back", LONG)
        .await
        .unwrap();
    let request = next(&b_goal).await;
    // B, serving A's call, calls A: the chain a → b → a is a cycle.
    let err = switchboard_client::serving(request.correlation_id.unwrap(), async {
        b.call("a", "what did you mean?", LONG).await
    })
    .await
    .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::Cycle));
    assert!(err.to_string().contains("a → b → a"), "{err}");
    let client = fabric.nats.client().await;
    let refused: Vec<CallEvent> = stored_json(&client, "agent.calls.events.refused.*").await;
    assert_eq!(refused.len(), 1);
    assert_eq!(
        (refused[0].caller.as_str(), refused[0].callee.as_str()),
        ("b", "a")
    );
    assert!(refused[0].body.as_deref().unwrap().contains("cycle"));
}

#[tokio::test]
async fn a_chain_of_six_is_refused_at_the_depth_limit() {
    let fabric = Fabric::start().await;
    let names = ["c1", "c2", "c3", "c4", "c5", "c6"];
    let mut agents: Vec<(Agent, Goal)> = Vec::new();
    for name in names {
        let agent = fabric.agent(name).await;
        let goal = agent.open_goal().await.unwrap();
        agents.push((agent, goal));
    }
    // c1 → c2 → c3 → c4 → c5 are allowed; c5 → c6 (depth 5) is not.
    let mut parent: Option<uuid::Uuid> = None;
    for hop in 0..5 {
        let (caller, _) = &agents[hop];
        let to = names[hop + 1];
        let made = async { caller.call_parked(to, "go deeper", LONG).await };
        let result = match parent {
            Some(p) => switchboard_client::serving(p, made).await,
            None => made.await,
        };
        if hop < 4 {
            result.unwrap();
            let request = next(&agents[hop + 1].1).await;
            parent = request.correlation_id;
        } else {
            let err = result.unwrap_err();
            assert_eq!(err.kind(), Some(ErrorKind::DepthExceeded), "{err}");
            assert!(err.to_string().contains("c1 → c2 → c3 → c4 → c5"), "{err}");
        }
    }
}

#[tokio::test]
async fn the_call_past_the_open_call_cap_is_refused_until_one_resolves() {
    let fabric = Fabric::start().await;
    let (callee, callee_goal) = fabric.agent_with_goal("busy").await;
    let (caller, _goal) = fabric.agent_with_goal("eager").await;
    let cap = switchboard_proto::MAX_OPEN_CALLS_PER_AGENT;
    assert!(cap >= 64, "an orchestrator has 32 calls out and more");
    for i in 0..cap {
        caller
            .call_parked("busy", &format!("q{i}"), LONG)
            .await
            .unwrap();
    }
    assert_eq!(
        kind(caller.call_parked("busy", "one more", LONG).await),
        ErrorKind::TooManyCalls
    );
    let pending = caller.pending_calls().await.unwrap();
    assert_eq!(pending.outgoing.len(), cap);
    assert_eq!(callee.pending_calls().await.unwrap().incoming.len(), cap);
    let first = next(&callee_goal).await;
    callee
        .reply(first.correlation_id.unwrap(), "done")
        .await
        .unwrap();
    assert_eq!(
        caller.pending_calls().await.unwrap().outgoing.len(),
        cap - 1
    );
    caller
        .call_parked("busy", "one more again", LONG)
        .await
        .unwrap();
}

#[tokio::test]
async fn calls_that_cannot_be_made_are_typed_errors() {
    let fabric = Fabric::start().await;
    let (caller, _goal) = fabric.agent_with_goal("caller").await;
    let _idle = fabric.agent("idle").await;
    assert_eq!(
        kind(caller.call("caller", "me?", LONG).await),
        ErrorKind::SelfSend
    );
    assert_eq!(kind(caller.call("", "x", LONG).await), ErrorKind::MissingTo);
    assert_eq!(
        kind(caller.call("ghost", "x", LONG).await),
        ErrorKind::Unreachable
    );
    assert_eq!(
        kind(caller.call("idle", "x", LONG).await),
        ErrorKind::Unreachable
    );
    assert_eq!(
        kind(caller.call("*", "x", LONG).await),
        ErrorKind::BadRequest
    );
    assert!(
        caller.pending_calls().await.unwrap().outgoing.is_empty(),
        "nothing left open"
    );
    let client = fabric.nats.client().await;
    for (subject, payload, want) in [
        ("agent.call.caller", "{nope", "bad_request"),
        (
            "agent.call.caller",
            r#"{"to":"idle","message":"x","wait":"yes"}"#,
            "bad_request",
        ),
        (
            "agent.call.caller",
            r#"{"to":"idle","message":""}"#,
            "empty_message",
        ),
        (
            "agent.call.a.b",
            r#"{"to":"idle","message":"x"}"#,
            "invalid_agent_id",
        ),
        ("agent.reply.caller", r#"{"message":"x"}"#, "bad_request"),
        (
            "agent.reply.caller",
            r#"{"correlation_id":"nope","message":"x"}"#,
            "bad_request",
        ),
        // An empty final reply may end a streamed answer (issue 38), so it is judged once
        // the call is read: to a call that does not exist, `not_found`.
        (
            "agent.reply.caller",
            r#"{"correlation_id":"0193a1b2-0000-7000-8000-000000000001"}"#,
            "not_found",
        ),
        ("agent.calls.pending.a.b", "", "invalid_agent_id"),
        // A call id the caller names (issue 25): a UUID, nothing else.
        (
            "agent.call.caller",
            r#"{"to":"callee","message":"x","correlation_id":"nope"}"#,
            "bad_request",
        ),
        (
            "agent.call.caller",
            r#"{"to":"callee","message":"x","correlation_id":9223372036854775807}"#,
            "bad_request",
        ),
        (
            "agent.call.caller",
            "{\"to\":\"callee\",\"message\":\"x\",\"correlation_id\":\"a\r\nb\"}",
            "bad_request",
        ),
    ] {
        assert_eq!(
            raw(&client, subject, payload).await.error_kind(),
            want,
            "{subject} {payload}"
        );
    }
}

#[tokio::test]
async fn parked_calls_survive_a_correlator_restart() {
    let fabric = Fabric::start().await;
    let url = fabric.url();
    let (callee, callee_goal) = fabric.agent_with_goal("callee").await;
    let (caller, goal) = fabric.agent_with_goal("caller").await;
    let parked = caller
        .call_parked("callee", "before the restart", LONG)
        .await
        .unwrap();
    let request = next(&callee_goal).await;

    let Fabric { correlator, .. } = fabric;
    correlator.stop().await;
    let replacement = start_correlator(&url, fast_calls()).await;
    assert_eq!(caller.pending_calls().await.unwrap().outgoing.len(), 1);
    callee
        .reply(request.correlation_id.unwrap(), "after the restart")
        .await
        .unwrap();
    let response = next(&goal).await;
    assert_eq!(response.correlation_id, Some(parked.correlation_id));
    assert_eq!(response.body, "after the restart");
    replacement.stop().await;
}

#[tokio::test]
async fn with_two_replicas_every_call_times_out_exactly_once() {
    let fabric = Fabric::start().await;
    let second = start_correlator(&fabric.url(), fast_calls()).await;
    let (_silent, _silent_goal) = fabric.agent_with_goal("silent").await;
    let (caller, goal) = fabric.agent_with_goal("caller").await;
    let mut ids = BTreeSet::new();
    for i in 0..8 {
        let parked = caller
            .call_parked("silent", &format!("q{i}"), Duration::from_millis(150))
            .await
            .unwrap();
        ids.insert(parked.correlation_id);
    }
    let notices = std::sync::Mutex::new(Vec::new());
    assert_eventually!(Duration::from_secs(10), async {
        let got = goal.drain().await.unwrap();
        let mut all = notices.lock().unwrap();
        all.extend(got);
        all.len() >= 8
    });
    let mut notices = notices.into_inner().unwrap();
    // A real wait: both sweepers keep running; give them time to (wrongly) notify twice.
    tokio::time::sleep(Duration::from_millis(500)).await;
    notices.extend(goal.drain().await.unwrap());
    assert_eq!(notices.len(), 8, "one notice per call");
    assert!(notices.iter().all(|n| n.kind == MessageKind::Notify));
    let got: BTreeSet<uuid::Uuid> = notices.iter().map(|n| n.correlation_id.unwrap()).collect();
    assert_eq!(got, ids);
    second.stop().await;
}

#[tokio::test]
async fn ended_calls_leave_nothing_in_the_open_call_index() {
    let fabric = Fabric::start().await;
    let (_callee, _serve) = fabric.answering("echo", |q| q).await;
    let (_silent, _silent_goal) = fabric.agent_with_goal("silent").await;
    let (caller, goal) = fabric.agent_with_goal("caller").await;
    for i in 0..20 {
        caller.call("echo", &format!("q{i}"), LONG).await.unwrap();
    }
    caller
        .call_parked("silent", "will time out", Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(next(&goal).await.kind, MessageKind::Notify);
    let still_open = caller
        .call_parked("silent", "stays open", LONG)
        .await
        .unwrap();
    let js = async_nats::jetstream::new(fabric.nats.client().await);
    let mut index = js
        .get_stream(switchboard_proto::CALLS_OPEN_STREAM)
        .await
        .unwrap();
    // One open call: its outgoing and incoming entries, nothing from the 21 that ended.
    assert_eq!(index.info().await.unwrap().state.messages, 2);
    let pending = caller.pending_calls().await.unwrap();
    assert_eq!(pending.outgoing.len(), 1);
    assert_eq!(
        pending.outgoing[0].correlation_id,
        still_open.correlation_id
    );
}

#[tokio::test]
async fn racing_replies_deliver_one_answer_and_oversized_ones_do_not_consume_the_call() {
    let fabric = Fabric::start().await;
    let callee = std::sync::Arc::new(fabric.agent("callee").await);
    let callee_goal = callee.open_goal().await.unwrap();
    let caller = std::sync::Arc::new(fabric.agent("caller").await);
    let goal = caller.open_goal().await.unwrap();

    let asking = std::sync::Arc::clone(&caller);
    let waiting = tokio::spawn(async move { asking.call("callee", "q", LONG).await });
    let cid = next(&callee_goal).await.correlation_id.unwrap();

    // Too big to store as an answer: refused before the call is claimed.
    let huge = "a".repeat(65_000);
    let reply = switchboard_proto::call::ReplyRequest {
        correlation_id: Some(cid),
        message: Some(huge.clone()),
        parts: vec![switchboard_proto::Part::Text { text: huge }],
        ..Default::default()
    };
    let client = fabric.nats.client().await;
    let raw_reply = raw(
        &client,
        "agent.reply.callee",
        serde_json::to_vec(&reply).unwrap(),
    )
    .await;
    assert_eq!(raw_reply.error_kind(), "body_too_large");

    // Two replies race: one answer reaches the waiting caller, nothing lands in its inbox.
    let (a, b) = (
        std::sync::Arc::clone(&callee),
        std::sync::Arc::clone(&callee),
    );
    let (first, second) = tokio::join!(a.reply(cid, "one"), b.reply(cid, "two"));
    let answer = waiting.await.unwrap().unwrap();
    assert!(answer.body == "one" || answer.body == "two");
    let fresh = [&first, &second]
        .iter()
        .filter(|r| matches!(r, Ok(ack) if !ack.duplicate))
        .count();
    assert_eq!(
        fresh, 1,
        "exactly one reply delivered: {first:?} / {second:?}"
    );
    assert_no_more(&goal).await;
}

/// Counts what is handed over through NATS on `_SB.calls.answer.*` (a waiting replica's
/// listener); an answer handed over in process never appears there.
struct NatsHandOvers(async_nats::Subscriber);

impl NatsHandOvers {
    async fn watch(fabric: &Fabric) -> Self {
        let client = fabric.nats.client().await;
        let subscriber = client
            .subscribe(format!(
                "{}.>",
                switchboard_proto::subject::CALL_ANSWER_PREFIX
            ))
            .await
            .unwrap();
        client.flush().await.unwrap();
        Self(subscriber)
    }

    async fn count(mut self) -> usize {
        use futures::StreamExt;
        let mut seen = 0;
        while let Ok(Some(_)) =
            tokio::time::timeout(Duration::from_millis(300), self.0.next()).await
        {
            seen += 1;
        }
        seen
    }
}

/// `calls` waiting calls to `echo` in a row, each answered with its own question.
async fn echo_calls(caller: &Agent, calls: usize) {
    for i in 0..calls {
        let answer = caller.call("echo", &format!("q{i}"), LONG).await.unwrap();
        assert_eq!(answer.body, format!("re: q{i}"));
    }
}

/// Every call has exactly one `answered` event (its opening has none: the request message is
/// its record).
async fn answered_once(fabric: &Fabric, calls: usize) {
    // The `answered` event is stored after the caller has its answer: wait for all of them.
    let client = fabric.nats.client().await;
    assert_eventually!(
        Duration::from_secs(10),
        async {
            let events: Vec<CallEvent> = stored_json(&client, "agent.calls.events.>").await;
            events
                .iter()
                .filter(|e| e.event == CallEventKind::Answered)
                .count()
                >= calls
        },
        "fewer than {calls} answered events were stored"
    );
    let events: Vec<CallEvent> = stored_json(&client, "agent.calls.events.>").await;
    let answered: BTreeSet<uuid::Uuid> = events
        .iter()
        .filter(|e| e.event == CallEventKind::Answered)
        .map(|e| e.correlation_id)
        .collect();
    assert_eq!(answered.len(), calls, "one answered event per call");
    assert_eq!(
        events
            .iter()
            .filter(|e| e.event == CallEventKind::Answered)
            .count(),
        calls,
        "no call answered twice"
    );
}

#[tokio::test]
async fn the_replica_holding_the_caller_takes_the_answer_in_process() {
    let fabric = Fabric::start().await;
    let (_callee, _serve) = fabric.answering("echo", |q| format!("re: {q}")).await;
    let (caller, goal) = fabric.agent_with_goal("caller").await;
    let hand_overs = NatsHandOvers::watch(&fabric).await;
    echo_calls(&caller, 10).await;
    assert_eq!(
        hand_overs.count().await,
        0,
        "one replica: nothing through NATS"
    );
    assert!(goal.drain().await.unwrap().is_empty());
    answered_once(&fabric, 10).await;
}

#[tokio::test]
async fn with_two_replicas_every_waiting_call_gets_its_answer_whichever_takes_the_reply() {
    // A call is held by the replica that took it; its reply goes to either replica (queue
    // group): the same one hands the answer over in process, the other through NATS. Over 40
    // calls both ways are taken (all in one way has odds of 2^-39).
    let fabric = Fabric::start().await;
    let second = start_correlator(&fabric.url(), fast_calls()).await;
    let (_callee, _serve) = fabric.answering("echo", |q| format!("re: {q}")).await;
    let (caller, goal) = fabric.agent_with_goal("caller").await;
    let hand_overs = NatsHandOvers::watch(&fabric).await;
    echo_calls(&caller, 40).await;
    let through_nats = hand_overs.count().await;
    assert!(
        (1..40).contains(&through_nats),
        "both ways taken: {through_nats} of 40 through NATS"
    );
    // Every answer reached the waiting caller; none fell back to the inbox.
    assert!(goal.drain().await.unwrap().is_empty());
    answered_once(&fabric, 40).await;
    second.stop().await;
}

#[tokio::test]
async fn an_answer_claims_a_call_whose_record_changed_since_the_replica_stored_it() {
    // The replica holding a waiting caller claims on the revision it stored, without reading
    // the call. Here the record is rewritten (same content, next revision) before the answer:
    // that claim must fail its compare-and-set, and the call be read and claimed anew — the
    // answer still reaches the waiting caller, once.
    let fabric = Fabric::start().await;
    let client = fabric.nats.client().await;
    let calls = async_nats::jetstream::new(client)
        .get_key_value(switchboard_proto::CALLS_BUCKET)
        .await
        .unwrap();
    let callee = std::sync::Arc::new(fabric.agent("echo").await);
    let inbox = callee.open_goal().await.unwrap();
    let (caller, goal) = fabric.agent_with_goal("caller").await;
    let serve = {
        let callee = std::sync::Arc::clone(&callee);
        tokio::spawn(async move {
            let mut rewritten = Vec::new();
            for _ in 0..5 {
                let message = next(&inbox).await;
                let id = message.correlation_id.expect("a call request");
                let key = switchboard_proto::call::call_key(&id);
                let entry = calls.entry(&key).await.unwrap().expect("the call's record");
                let revision = calls
                    .update(&key, entry.value, entry.revision)
                    .await
                    .unwrap();
                assert!(revision > entry.revision);
                rewritten.push(revision);
                callee
                    .reply(id, &format!("re: {}", message.body))
                    .await
                    .unwrap();
            }
            rewritten
        })
    };
    let hand_overs = NatsHandOvers::watch(&fabric).await;
    echo_calls(&caller, 5).await;
    assert_eq!(serve.await.unwrap().len(), 5, "every record was rewritten");
    assert_eq!(hand_overs.count().await, 0, "still handed over in process");
    assert!(
        goal.drain().await.unwrap().is_empty(),
        "nothing fell back to the inbox"
    );
    answered_once(&fabric, 5).await;
}

/// A call's id is scoped to its caller (docs/protocol.md §9, "Call ids"): the id a caller
/// chooses names its own call only, so another caller choosing the same one makes a call of
/// its own — it can neither join nor block the first — and the first caller's retry with it is
/// the same call: one request, one answer.
#[tokio::test]
async fn two_callers_choosing_one_call_id_make_two_calls_and_a_retry_joins_its_own() {
    use switchboard_proto::call::{CallRequest, scoped_call_id};
    let fabric = Fabric::start().await;
    let (callee, callee_goal) = fabric.agent_with_goal("callee").await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let (mallory, _mallory_goal) = fabric.agent_with_goal("mallory").await;
    let id = switchboard_proto::new_id();
    let request = |message: &str| CallRequest {
        to: Some("callee".into()),
        message: Some(message.into()),
        wait: Some(false),
        timeout_ms: Some(30_000),
        correlation_id: Some(id),
        ..CallRequest::default()
    };
    let parked = alice
        .call_parked_with(request("alice's question"))
        .await
        .unwrap();
    let alices = scoped_call_id(&"alice".parse().unwrap(), id);
    assert_eq!(parked.correlation_id, alices);
    // Mallory names the same id: a call of its own, alice's untouched.
    let theirs = mallory
        .call_parked_with(request("mallory's question"))
        .await
        .unwrap();
    assert_eq!(
        theirs.correlation_id,
        scoped_call_id(&"mallory".parse().unwrap(), id)
    );
    assert_ne!(theirs.correlation_id, alices);
    // Naming alice's call by its own id makes mallory another call too, and neither id reads
    // alice's call back for mallory: each names one of mallory's own calls.
    let named = CallRequest {
        correlation_id: Some(alices),
        ..request("mallory again")
    };
    let third = mallory.call_parked_with(named).await.unwrap();
    assert_ne!(third.correlation_id, alices);
    let client = fabric.nats.client().await;
    for (named, own) in [(id, theirs.correlation_id), (alices, third.correlation_id)] {
        let read = raw(
            &client,
            "agent.calls.parts.mallory",
            serde_json::to_vec(&serde_json::json!({"correlation_id": named})).unwrap(),
        )
        .await;
        assert_eq!(
            read.body["correlation_id"],
            serde_json::json!(own),
            "{:?}",
            read.body
        );
    }
    // Alice's retry is the same call: still one request of hers.
    let again = alice
        .call_parked_with(request("alice's question"))
        .await
        .unwrap();
    assert_eq!(again.correlation_id, alices);
    let page = callee_goal.fetch(64, Duration::ZERO, None).await.unwrap();
    let bodies: Vec<&str> = page
        .messages
        .iter()
        .map(|m| m.message.body.as_str())
        .collect();
    assert_eq!(
        bodies,
        ["alice's question", "mallory's question", "mallory again"],
        "{page:?}"
    );
    assert_eq!(page.messages[0].message.correlation_id, Some(alices));
    assert_eq!(alice.pending_calls().await.unwrap().outgoing.len(), 1);
    assert_eq!(mallory.pending_calls().await.unwrap().outgoing.len(), 2);
    assert_eq!(callee.pending_calls().await.unwrap().incoming.len(), 3);
    // Each is answered once, to its own caller.
    assert!(!callee.reply(alices, "to alice").await.unwrap().duplicate);
    assert!(callee.reply(alices, "to alice").await.unwrap().duplicate);
    assert!(
        !callee
            .reply(theirs.correlation_id, "to mallory")
            .await
            .unwrap()
            .duplicate
    );
}

#[tokio::test]
async fn a_waiting_call_enters_the_open_call_index_only_once_it_lasts() {
    let fabric = Fabric::start().await;
    let (callee, callee_goal) = fabric.agent_with_goal("thinker").await;
    let caller = std::sync::Arc::new(fabric.agent("asker").await);
    let _goal = caller.open_goal().await.unwrap();
    let js = async_nats::jetstream::new(fabric.nats.client().await);
    let entries = || async {
        let index = js.get_stream(switchboard_proto::CALLS_OPEN_STREAM).await;
        index.unwrap().cached_info().state.messages
    };
    let asking = std::sync::Arc::clone(&caller);
    let call = tokio::spawn(async move { asking.call("thinker", "a long one", LONG).await });
    let request = next(&callee_goal).await;
    // Young: held (and listed) by its replica, in no index.
    assert_eq!(entries().await, 0);
    assert_eq!(caller.pending_calls().await.unwrap().outgoing.len(), 1);
    assert_eq!(callee.pending_calls().await.unwrap().incoming.len(), 1);
    // Past 5 s: indexed (so the sweep would end it, should its replica stop).
    assert_eventually!(
        Duration::from_secs(10),
        async { entries().await == 2 },
        "a long waiting call was not indexed"
    );
    callee
        .reply(request.correlation_id.unwrap(), "done at last")
        .await
        .unwrap();
    assert_eq!(call.await.unwrap().unwrap().body, "done at last");
    assert_eventually!(
        Duration::from_secs(5),
        async { entries().await == 0 },
        "an answered call stayed in the index"
    );
    assert!(caller.pending_calls().await.unwrap().outgoing.is_empty());
}

#[tokio::test]
async fn waiting_calls_past_the_cap_are_refused_until_one_ends() {
    let fabric = Fabric::start().await;
    let (callee, callee_goal) = fabric.agent_with_goal("busy").await;
    let caller = std::sync::Arc::new(fabric.agent("eager").await);
    let _goal = caller.open_goal().await.unwrap();
    let cap = switchboard_proto::MAX_OPEN_CALLS_PER_AGENT;
    let calls: Vec<_> = (0..cap)
        .map(|i| {
            let caller = std::sync::Arc::clone(&caller);
            tokio::spawn(async move { caller.call("busy", &format!("q{i}"), LONG).await })
        })
        .collect();
    let mut requests = Vec::new();
    let mut acked = None;
    while requests.len() < cap {
        let page = callee_goal
            .fetch(64, Duration::from_secs(5), acked)
            .await
            .unwrap();
        assert!(
            !page.messages.is_empty(),
            "{} of {cap} requests",
            requests.len()
        );
        acked = page.messages.last().map(|m| m.seq);
        requests.extend(page.messages.into_iter().map(|m| m.message));
    }
    assert_eq!(
        kind(caller.call("busy", "one more", LONG).await),
        ErrorKind::TooManyCalls
    );
    callee
        .reply(requests[0].correlation_id.unwrap(), "first done")
        .await
        .unwrap();
    let more = std::sync::Arc::clone(&caller);
    let another = tokio::spawn(async move { more.call("busy", "one more again", LONG).await });
    let page = callee_goal
        .fetch(64, Duration::from_secs(5), acked)
        .await
        .unwrap();
    let last = page
        .messages
        .iter()
        .find(|m| m.message.body == "one more again")
        .expect("the call after one ended was made");
    callee
        .reply(last.message.correlation_id.unwrap(), "ok")
        .await
        .unwrap();
    assert_eq!(another.await.unwrap().unwrap().body, "ok");
    for request in &requests[1..] {
        callee
            .reply(request.correlation_id.unwrap(), "done")
            .await
            .unwrap();
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
}

/// Issue 38, the Rust client: `Agent::serve` survives its handler. A call whose handler
/// fails, or panics, is answered at once with `handler_error` (the caller does not wait for
/// its 10 s deadline); a task whose handler fails is rejected for its requester; a plain
/// message whose handler fails goes to the dead letters with the reason; the loop goes on; and a stop lets the handler in progress finish and be
/// acknowledged — nothing is handed out again to the next reader of the goal.
#[tokio::test]
async fn a_served_handler_that_fails_or_panics_answers_the_caller_and_serving_goes_on() {
    use std::sync::Arc;
    use switchboard_client::{HANDLER_ERROR, ServeOptions};
    let fabric = Fabric::start().await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let worker = Arc::new(fabric.agent("worker").await);
    let goal = worker.open_named_goal("main").await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = {
        let worker = Arc::clone(&worker);
        let stop = stop.clone();
        tokio::spawn(async move {
            let replier = Arc::clone(&worker);
            worker
                .serve(
                    &goal,
                    stop,
                    ServeOptions {
                        max_concurrent: 4,
                        ..ServeOptions::default()
                    },
                    move |message| {
                        let replier = Arc::clone(&replier);
                        async move {
                            match message.body.as_str() {
                                "boom" => return Err("no such thing".to_owned()),
                                "take, then boom" => {
                                    // Taken (accepted, not started) before it fails.
                                    let task = message.task.as_ref().map(|task| task.id);
                                    replier
                                        .accept_task(task.unwrap_or_default())
                                        .await
                                        .map_err(|err| err.to_string())?;
                                    return Err("gave up".to_owned());
                                }
                                "panic" => panic!("the model returned garbage"),
                                "slow" => tokio::time::sleep(Duration::from_millis(800)).await,
                                _ => {}
                            }
                            if let Some(call) = message.correlation_id {
                                replier
                                    .reply(call, &format!("done: {}", message.body))
                                    .await
                                    .map_err(|err| err.to_string())?;
                            }
                            Ok(())
                        }
                    },
                )
                .await
                .map(|served| (served, goal))
        })
    };

    for (question, text) in [
        ("boom", "no such thing"),
        ("panic", "the model returned garbage"),
    ] {
        let started = tokio::time::Instant::now();
        let answer = alice
            .call("worker", question, Duration::from_secs(10))
            .await
            .unwrap();
        let error = answer.error.expect("an error answer");
        assert_eq!(error.kind, HANDLER_ERROR);
        assert!(error.message.contains(text), "{}", error.message);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "answered at once, not at the deadline: {:?}",
            started.elapsed()
        );
    }
    let answer = alice
        .call("worker", "hello", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(answer.body, "done: hello", "the loop goes on");

    // A plain message whose handler fails: in the dead letters with its reason.
    alice.send_to_peer("worker", "boom").await.unwrap();
    let nats = fabric.nats.client().await;
    assert_eventually!(Duration::from_secs(5), async {
        switchboard_client::dlq_list(&nats, 10)
            .await
            .is_ok_and(|letters| letters.iter().any(|l| l.reason.contains("no such thing")))
    });

    // A task whose handler fails: its requester sees it rejected, with the reason.
    let task = alice
        .give_task("worker", "boom")
        .await
        .unwrap()
        .task
        .task_id;
    assert_eventually!(Duration::from_secs(5), async {
        alice.get_task(task).await.is_ok_and(|record| {
            record.state == switchboard_proto::TaskState::Rejected
                && record
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.contains("no such thing"))
        })
    });

    // Taken first: failed (started first: only a working task can fail), with the reason.
    let task = alice
        .give_task("worker", "take, then boom")
        .await
        .unwrap()
        .task
        .task_id;
    assert_eventually!(Duration::from_secs(5), async {
        alice.get_task(task).await.is_ok_and(|record| {
            record.state == switchboard_proto::TaskState::Failed
                && record.reason.as_deref() == Some("gave up")
        })
    });

    // A stop while a handler runs: it finishes, and its message is acknowledged.
    alice.send_to_peer("worker", "slow").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    let (served, goal) = serving.await.unwrap().unwrap();
    assert_eq!(served.answered_with_error, 2, "{served:?}");
    assert_eq!(served.rejected, 1, "{served:?}");
    assert_eq!(served.tasks_ended, 2, "{served:?}");
    assert_eq!(served.handled, 2, "hello and slow: {served:?}");
    assert!(
        goal.recv(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none(),
        "nothing is handed out again"
    );
}

/// A UUID v7 made `ago` before now.
fn v7_made(ago: time::Duration) -> uuid::Uuid {
    let ms = (time::OffsetDateTime::now_utc() - ago).unix_timestamp_nanos() / 1_000_000;
    let ms = u64::try_from(ms).unwrap();
    uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        ms / 1000,
        u32::try_from(ms % 1000).unwrap() * 1_000_000,
    ))
}

/// A waiting call whose chosen id was made moments ago has its record created beside its
/// request's delivery; a v4 or an old v7 id records first (protocol §9, "Call ids"). Either
/// way two attempts racing are one request to the callee and one answer to both; and a reply
/// that overtakes its call's record is read again, not refused.
#[tokio::test]
async fn a_call_records_beside_its_request_and_two_attempts_stay_one_request() {
    use switchboard_proto::call::{CallRequest, scoped_call_id};
    let fabric = Fabric::start().await;
    let (callee, callee_goal) = fabric.agent_with_goal("callee").await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let alice = std::sync::Arc::new(alice);
    let alice_id: switchboard_proto::AgentId = "alice".parse().unwrap();
    let v4 = uuid::Uuid::from_u128(
        (uuid::Uuid::now_v7().as_u128() & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62),
    );
    assert_eq!(v4.get_version_num(), 4);
    let ids = [
        ("a fresh v7", switchboard_proto::new_id()),
        ("a v4", v4),
        ("a v7 of 45 s ago", v7_made(time::Duration::seconds(45))),
    ];
    for (what, chosen) in ids {
        let request = CallRequest {
            to: Some("callee".into()),
            message: Some(format!("with {what}")),
            timeout_ms: Some(30_000),
            correlation_id: Some(chosen),
            ..CallRequest::default()
        };
        let attempts: Vec<_> = (0..2)
            .map(|_| {
                let (alice, request) = (alice.clone(), request.clone());
                tokio::spawn(async move { alice.call_with(request).await })
            })
            .collect();
        let id = scoped_call_id(&alice_id, chosen);
        let delivery = callee_goal.recv(LONG).await.unwrap().unwrap();
        assert_eq!(delivery.message.correlation_id, Some(id), "{what}");
        delivery.ack().await.unwrap();
        callee.reply(id, &format!("answer {what}")).await.unwrap();
        for attempt in attempts {
            let answer = attempt.await.unwrap().unwrap();
            assert_eq!(
                (answer.correlation_id, answer.body.as_str()),
                (id, format!("answer {what}").as_str())
            );
        }
        assert_eq!(callee_goal.waiting().await.unwrap(), 0, "{what}: twice");
    }

    // The callee answers a call whose record is not stored yet (its reply overtook it): the
    // reply is read again until the call is there, and answers it.
    let chosen = switchboard_proto::new_id();
    let id = scoped_call_id(&alice_id, chosen);
    let early = {
        let callee = std::sync::Arc::new(callee);
        tokio::spawn(async move { callee.reply(id, "before you asked").await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let answer = alice
        .call_with(CallRequest {
            to: Some("callee".into()),
            message: Some("overtaken".into()),
            timeout_ms: Some(30_000),
            correlation_id: Some(chosen),
            ..CallRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(answer.body, "before you asked");
    assert!(!early.await.unwrap().unwrap().duplicate);
    // An id dated further ahead than 90 s is refused: its call could record now and deliver
    // beside its record once the id turned fresh, past the duplicate window.
    let ahead = alice
        .call_with(CallRequest {
            to: Some("callee".into()),
            message: Some("from the future".into()),
            timeout_ms: Some(1_000),
            correlation_id: Some(v7_made(time::Duration::seconds(-100))),
            ..CallRequest::default()
        })
        .await;
    assert_eq!(kind(ahead), ErrorKind::BadRequest);
    // A reply naming a call that never comes is not_found once the rereads are spent.
    let started = std::time::Instant::now();
    let never = fabric.agent("nobody").await;
    let err = kind(never.reply(switchboard_proto::new_id(), "to nobody").await);
    assert_eq!(err, ErrorKind::NotFound);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_retry_waiting_on_another_replica_gets_the_answer_handed_to_the_first_attempt() {
    use switchboard_proto::call::{CallRequest, scoped_call_id};
    let fabric = Fabric::start().await;
    let second = start_correlator(&fabric.url(), fast_calls()).await;
    let (callee, callee_goal) = fabric.agent_with_goal("callee").await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let alice = std::sync::Arc::new(alice);
    let alice_id: switchboard_proto::AgentId = "alice".parse().unwrap();
    // The answer goes to one attempt: in process when the replier holds it, else over NATS
    // to whichever replica takes it. Each try puts the two attempts on different replicas and
    // the reply on the first attempt's replica one time in four (and then the retry waits
    // the 10 s its record's answer takes to settle): six tries show a retry left to its
    // deadline four times in five.
    for i in 0..6 {
        let chosen = switchboard_proto::new_id();
        let id = scoped_call_id(&alice_id, chosen);
        let request = CallRequest {
            to: Some("callee".into()),
            message: Some(format!("try {i}")),
            timeout_ms: Some(60_000),
            correlation_id: Some(chosen),
            ..CallRequest::default()
        };
        let attempt = |request: CallRequest| {
            let alice = alice.clone();
            tokio::spawn(async move { alice.call_with(request).await })
        };
        let first = attempt(request.clone());
        // The first attempt's request is in the callee's inbox: its record exists, and the
        // retry joins it.
        let delivery = callee_goal.recv(LONG).await.unwrap().unwrap();
        assert_eq!(delivery.message.correlation_id, Some(id));
        let retry = attempt(request);
        assert_eventually!(Duration::from_secs(10), async {
            let pending = callee.pending_calls().await.unwrap();
            pending
                .incoming
                .iter()
                .any(|call| call.correlation_id == id)
        });
        // A real wait: the retry reaches its replica and joins before the answer.
        tokio::time::sleep(Duration::from_millis(200)).await;
        delivery.ack().await.unwrap();
        callee.reply(id, &format!("answer {i}")).await.unwrap();
        // The record's answer is taken once its hand-over is settled (10 s after the claim).
        let answer = tokio::time::timeout(Duration::from_secs(25), retry)
            .await
            .unwrap_or_else(|_| panic!("try {i}: the retry waited for its deadline"))
            .unwrap()
            .unwrap();
        assert_eq!(answer.body, format!("answer {i}"));
        first.abort();
        assert_eq!(callee_goal.waiting().await.unwrap(), 0, "try {i}: twice");
    }
    second.stop().await;
}

#[tokio::test]
async fn one_agent_replying_to_made_up_calls_starves_no_real_reply() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use switchboard_proto::call::{CallRequest, scoped_call_id};
    let fabric = Fabric::start().await;
    let callee = std::sync::Arc::new(fabric.agent("callee").await);
    let _callee_goal = callee.open_goal().await.unwrap();
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let alice_id: switchboard_proto::AgentId = "alice".parse().unwrap();
    // The spammer keeps more replies to calls that never come in flight than a replica lets
    // wait (64) all the time; it holds at most 16 of those waits.
    let spammer = std::sync::Arc::new(fabric.agent("spammer").await);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    // Eight loops of sixteen at once, started apart, so the places one loop frees are taken
    // again by the others at once.
    let spam: Vec<_> = (0..8)
        .map(|i| {
            let (spammer, stop) = (spammer.clone(), stop.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(30 * i)).await;
                let mut refused = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    let replies = (0..16).map(|_| spammer.reply(switchboard_proto::new_id(), "x"));
                    for result in futures::future::join_all(replies).await {
                        // Under load the service may also shed or limit the spam: no answer.
                        let refusal = kind(result);
                        assert!(
                            matches!(
                                refusal,
                                ErrorKind::NotFound
                                    | ErrorKind::RateLimited
                                    | ErrorKind::Unavailable
                            ),
                            "{refusal:?}"
                        );
                        refused += 1;
                    }
                }
                refused
            })
        })
        .collect();
    // A real wait: the spam fills the rereads before the real reply comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..5 {
        let chosen = switchboard_proto::new_id();
        let id = scoped_call_id(&alice_id, chosen);
        let early = {
            let callee = callee.clone();
            tokio::spawn(async move { callee.reply(id, "before you asked").await })
        };
        // Long enough that the reply usually waits for the record; well inside its 250 ms of
        // rereads, so a slow machine has 190 ms to make the record.
        tokio::time::sleep(Duration::from_millis(60)).await;
        let answer = alice
            .call_with(CallRequest {
                to: Some("callee".into()),
                message: Some(format!("overtaken {i}")),
                timeout_ms: Some(30_000),
                correlation_id: Some(chosen),
                ..CallRequest::default()
            })
            .await
            .unwrap();
        assert_eq!(answer.body, "before you asked", "try {i}");
        early.await.unwrap().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let mut refused = 0;
    for spam in spam {
        refused += spam.await.unwrap();
    }
    assert!(
        refused >= 128,
        "the spam ran: {refused} made-up replies refused"
    );
}

/// `Agent::serve` under a steady run of calls: each handled message's ack rides on the read
/// loop's next fetch instead of a request and a cursor write of its own (issue 40: the SDK's
/// read loop is the cheapest the protocol allows), and the last one, with nothing more to
/// carry it, goes on its own within `ACK_LINGER`. Every message is acknowledged: a peek finds
/// the goal empty, and a second reader of it is handed nothing again.
#[tokio::test]
async fn served_acks_ride_on_the_next_fetch_and_the_last_goes_on_its_own() {
    use futures::StreamExt;
    use std::sync::Arc;
    use switchboard_client::{ACK_LINGER, ServeOptions};
    let fabric = Fabric::start().await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let worker = Arc::new(fabric.agent("worker").await);
    let goal = Arc::new(worker.open_named_goal("main").await.unwrap());
    let tap = fabric.nats.client().await;
    let mut acks = tap
        .subscribe(switchboard_proto::subject::inbox_ack(worker.id()))
        .await
        .unwrap();
    tap.flush().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = {
        let (worker, goal, stop) = (Arc::clone(&worker), Arc::clone(&goal), stop.clone());
        tokio::spawn(async move {
            let replier = Arc::clone(&worker);
            worker
                .serve(&goal, stop, ServeOptions::default(), move |message| {
                    let replier = Arc::clone(&replier);
                    async move {
                        let call = message.correlation_id.ok_or("not a call")?;
                        replier
                            .reply(call, &message.body)
                            .await
                            .map(|_| ())
                            .map_err(|err| err.to_string())
                    }
                })
                .await
        })
    };
    const CALLS: usize = 40;
    for n in 0..CALLS {
        let answer = alice
            .call("worker", &format!("q{n}"), Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(answer.body, format!("q{n}"));
    }
    // The last ack has nothing to ride on: it goes on its own, shortly.
    assert_eventually!(ACK_LINGER * 40, async {
        goal.waiting().await.is_ok_and(|unread| unread == 0)
    });
    let mut sent_alone = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(50), acks.next()).await {
        sent_alone += 1;
    }
    assert!(
        (1..CALLS / 4).contains(&sent_alone),
        "{sent_alone} of {CALLS} acks went on their own"
    );
    stop.cancel();
    let served = serving.await.unwrap().unwrap();
    assert_eq!(served.handled, CALLS as u64);
    // Nothing comes again to the goal's next reader.
    assert!(
        goal.recv(Duration::from_millis(200))
            .await
            .unwrap()
            .is_none()
    );
}

/// `Agent::serve` with two handlers at once: a later message handled first, then the earlier
/// one's handler fails and it is rejected into the dead letters. The dead letter is written,
/// the goal ends empty (the later message's ack, held back behind the rejected one, is sent),
/// and nothing comes again. (It passes without c307d3f too: the race that commit closes, an
/// ack carried past a reject still on its way, is not forced here.)
#[tokio::test]
async fn an_ack_held_back_by_a_rejected_message_goes_once_the_reject_lands() {
    use std::sync::Arc;
    use switchboard_client::ServeOptions;
    let fabric = Fabric::start().await;
    let sender = fabric.agent("sender").await;
    let worker = Arc::new(fabric.agent("worker").await);
    let goal = Arc::new(worker.open_named_goal("main").await.unwrap());
    sender
        .send_to_peer("worker", "slow, then fails")
        .await
        .unwrap();
    sender.send_to_peer("worker", "quick").await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = {
        let (worker, goal, stop) = (Arc::clone(&worker), Arc::clone(&goal), stop.clone());
        tokio::spawn(async move {
            let options = ServeOptions {
                max_concurrent: 2,
                ..ServeOptions::default()
            };
            worker
                .serve(&goal, stop, options, |message| async move {
                    if message.body.starts_with("slow") {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        return Err("it broke".to_owned());
                    }
                    Ok(())
                })
                .await
        })
    };
    let nats = fabric.nats.client().await;
    assert_eventually!(Duration::from_secs(5), async {
        switchboard_client::dlq_list(&nats, 10)
            .await
            .is_ok_and(|letters| letters.iter().any(|l| l.reason.contains("it broke")))
    });
    // The quick one's ack, held back behind the rejected one, goes on its own shortly.
    assert_eventually!(Duration::from_secs(2), async {
        goal.waiting().await.is_ok_and(|unread| unread == 0)
    });
    stop.cancel();
    let served = serving.await.unwrap().unwrap();
    assert_eq!((served.handled, served.rejected), (1, 1));
    assert!(
        goal.recv(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none()
    );
}
