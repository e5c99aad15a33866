//! Calls across three correlator replicas, one killed (issue 40): 8 callers make 200 waiting
//! calls to one callee through three `reply-correlator` processes, and one of them is killed
//! with SIGKILL (then started again) while calls are in flight. The callers' Rust client sends
//! a call request that got no reply again with the same id, so a call the dead replica held is
//! taken up by another. Every call ends exactly once — its answer, or a timeout — and the
//! callee is asked each call once.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use switchboard_client::{Agent, AgentOptions};
use switchboard_proto::{ErrorKind, MessageKind};
use switchboard_testkit::NatsServer;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::card;
use switchboard_tests::services::{service_bin, start_directory, start_fanout};
use tokio::sync::Mutex;

const CALLERS: usize = 8;
const CALLS_EACH: usize = 25;
/// Calls done before the replica is killed.
const KILL_AFTER: usize = 60;

async fn agent(url: &str, id: &str) -> Agent {
    let card = card(id);
    let client = switchboard_client::agent_connect_options(&card.agent_id)
        .connect(url)
        .await
        .unwrap();
    let options = AgentOptions {
        heartbeat_interval: Duration::from_secs(3600),
        request_timeout: Duration::from_secs(2),
        send_retries: 4,
    };
    Agent::connect_with(client, card, options).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_ends_once_across_three_correlators_with_one_killed() {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let _directory = start_directory(&url, Default::default()).await;
    let _fanout = start_fanout(&url, Default::default()).await;
    let bin = service_bin("reply-correlator");
    let mut correlators = Vec::new();
    for _ in 0..3 {
        correlators.push(ServiceProcess::start(&bin, "reply-correlator", &url, &[]).await);
    }

    // The callee answers each request with its own text, and counts the requests per call.
    let callee = Arc::new(agent(&url, "callee").await);
    let goal = callee.open_goal().await.unwrap();
    let asked: Arc<Mutex<BTreeMap<uuid::Uuid, usize>>> = Arc::default();
    let answering = tokio::spawn({
        let (callee, asked) = (Arc::clone(&callee), Arc::clone(&asked));
        async move {
            loop {
                let Some(delivery) =
                    switchboard_tests::read_or_pause(&goal, Duration::from_millis(500)).await
                else {
                    continue;
                };
                let message = delivery.message.clone();
                if message.kind == MessageKind::Request
                    && let Some(id) = message.correlation_id
                {
                    *asked.lock().await.entry(id).or_default() += 1;
                    let _ = callee.reply(id, &message.body).await;
                }
                let _ = delivery.ack().await;
            }
        }
    });

    let done = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for c in 0..CALLERS {
        let caller = agent(&url, &format!("caller-{c}")).await;
        let done = Arc::clone(&done);
        callers.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for n in 0..CALLS_EACH {
                let text = format!("caller-{c} question {n}");
                let started = std::time::Instant::now();
                let outcome = caller.call("callee", &text, Duration::from_secs(5)).await;
                done.fetch_add(1, Ordering::Relaxed);
                // Longer than the client's request timeout: it was sent again (its replica died).
                let retried = started.elapsed() >= Duration::from_secs(2);
                outcomes.push((text, outcome, retried));
            }
            outcomes
        }));
    }
    // Kill one replica while calls are in flight, then start it again.
    assert!(
        switchboard_testkit::eventually(Duration::from_secs(60), || async {
            done.load(Ordering::Relaxed) >= KILL_AFTER
        })
        .await,
        "calls are being made"
    );
    let victim = correlators.remove(0);
    victim.signal("KILL").await;
    correlators.push(ServiceProcess::start(&bin, "reply-correlator", &url, &[]).await);

    let (mut answered, mut timed_out, mut other, mut retried) = (0, 0, Vec::new(), 0);
    for caller in callers {
        for (text, outcome, again) in caller.await.unwrap() {
            retried += usize::from(again);
            match outcome {
                Ok(answer) => {
                    assert_eq!(answer.body, text, "an answer to another call");
                    answered += 1;
                }
                Err(err) if err.kind() == Some(ErrorKind::Timeout) => timed_out += 1,
                Err(err) => other.push(format!("{text}: {err}")),
            }
        }
    }
    answering.abort();
    let asked = asked.lock().await;
    let twice: Vec<_> = asked.iter().filter(|(_, n)| **n > 1).collect();
    println!(
        "{} calls through 3 correlators, one killed after {KILL_AFTER}: {answered} answered, \
         {timed_out} timed out, {} failed otherwise, {retried} sent again after the kill; the \
         callee was asked {} calls, {} twice",
        CALLERS * CALLS_EACH,
        other.len(),
        asked.len(),
        twice.len()
    );
    assert!(
        other.is_empty(),
        "calls that neither answered nor timed out: {other:?}"
    );
    assert_eq!(answered + timed_out, CALLERS * CALLS_EACH);
    assert!(twice.is_empty(), "requests delivered twice: {twice:?}");
    assert!(
        answered >= CALLERS * CALLS_EACH - CALLERS,
        "at most the calls in flight on the killed replica may time out: {timed_out}"
    );
    for correlator in correlators {
        correlator.signal("TERM").await;
    }
}
