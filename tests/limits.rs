//! Provider limits (docs/protocol.md §15) against a real nats-server: waiting acquires are
//! served fairly, a silent holder's lease returns at its expiry, a limit changes at run time,
//! a hostile agent can neither take another's lease, refund itself, hold every lease, flood the
//! queue nor crash the service, and operators and agents use limits on the command line. Across
//! replicas: `limits_replicas.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard_client::{ClientError, limits_set};
use switchboard_proto::ErrorKind;
use switchboard_proto::limits::{LimitSpec, LimitsOp, WAITING_PER_AGENT_MAX};
use switchboard_tests::Fabric;
use switchboard_tests::services::start_limits;
use switchboard_tests::wire::raw;

fn spec(key: &str, concurrent: u32) -> LimitSpec {
    LimitSpec::concurrent(key, concurrent)
}

fn kind(err: &ClientError) -> ErrorKind {
    match err {
        ClientError::Service(reply) => reply.kind(),
        other => panic!("not a service error: {other:?}"),
    }
}

#[tokio::test]
async fn a_silent_holders_lease_returns_at_its_expiry_and_a_waiter_gets_it() {
    let fabric = Fabric::start().await;
    let _limits = start_limits(&fabric.url()).await;
    let ops = fabric.nats.client().await;
    limits_set(
        &ops,
        &LimitSpec {
            max_hold_ms: Some(1_000),
            ..spec("local:llm", 1)
        },
    )
    .await
    .unwrap();
    let silent = fabric.agent("silent").await;
    let other = fabric.agent("other").await;
    let held = silent.limit("local:llm", 0, Duration::ZERO).await.unwrap();
    // The holder goes silent: no release, no renew.
    std::mem::forget(held);
    let started = Instant::now();
    let lease = other
        .limit("local:llm", 0, Duration::from_secs(10))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(4),
        "granted after {waited:?}"
    );
    assert!(lease.lease().waited_ms >= 700, "{:?}", lease.lease());
    lease.release(None).await.unwrap();
}

#[tokio::test]
async fn a_waiting_acquire_of_an_agent_holding_none_goes_before_a_greedy_ones() {
    let fabric = Fabric::start().await;
    let _limits = start_limits(&fabric.url()).await;
    let ops = fabric.nats.client().await;
    limits_set(
        &ops,
        &LimitSpec {
            per_agent: Some(2),
            ..spec("k", 2)
        },
    )
    .await
    .unwrap();
    let greedy = Arc::new(fabric.agent("greedy").await);
    let modest = fabric.agent("modest").await;
    let first = greedy.limit("k", 0, Duration::ZERO).await.unwrap();
    let _second = greedy.limit("k", 0, Duration::ZERO).await.unwrap();
    // Holding its share, a third is refused at once without a wait…
    let err = greedy.limit("k", 0, Duration::ZERO).await.unwrap_err();
    assert_eq!(kind(&err), ErrorKind::Limited, "{err}");
    assert!(err.to_string().contains("share"), "{err}");
    // …and with one, waits behind the agent holding none.
    let queued = {
        let greedy = Arc::clone(&greedy);
        tokio::spawn(async move { greedy.limit("k", 0, Duration::from_secs(3)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let modest_wait = tokio::spawn(async move {
        let lease = modest.limit("k", 0, Duration::from_secs(10)).await;
        (modest, lease)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.release(None).await.unwrap();
    let (_modest, lease) = modest_wait.await.unwrap();
    let lease = lease.unwrap();
    // The greedy agent's own third never came: it held its share until the end of its wait.
    let third = queued.await.unwrap().unwrap_err();
    assert_eq!(kind(&third), ErrorKind::Limited, "{third}");
    lease.release(None).await.unwrap();
}

#[tokio::test]
async fn the_rate_and_the_tokens_bound_grants_and_a_limit_changes_at_run_time() {
    let fabric = Fabric::start().await;
    let _limits = start_limits(&fabric.url()).await;
    let ops = fabric.nats.client().await;
    // 600 a minute: 10 a second, a burst of 10.
    limits_set(
        &ops,
        &LimitSpec {
            concurrent: None,
            requests_per_minute: Some(600),
            ..spec("rate", 1)
        },
    )
    .await
    .unwrap();
    let agents = [
        fabric.agent("r1").await,
        fabric.agent("r2").await,
        fabric.agent("r3").await,
    ];
    let mut granted = 0;
    for n in 0..30 {
        if let Ok(lease) = agents[n % 3].limit("rate", 0, Duration::ZERO).await {
            granted += 1;
            lease.release(None).await.unwrap();
        }
    }
    // A burst of 10, plus what refilled while the 30 requests ran.
    assert!((10..=14).contains(&granted), "{granted} granted");

    // Tokens: 6,000 a minute is 100 a second; an estimate of 80 leaves 20.
    limits_set(
        &ops,
        &LimitSpec {
            concurrent: None,
            tokens_per_minute: Some(6_000),
            ..spec("tokens", 1)
        },
    )
    .await
    .unwrap();
    let lease = agents[0].limit("tokens", 80, Duration::ZERO).await.unwrap();
    let err = agents[1]
        .limit("tokens", 80, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(kind(&err), ErrorKind::Limited, "{err}");
    // It used 10: 70 come back, and the next 80 fits.
    lease.release(Some(10)).await.unwrap();
    agents[1]
        .limit("tokens", 80, Duration::ZERO)
        .await
        .unwrap()
        .release(None)
        .await
        .unwrap();

    // Run time: one lease, then two, without a restart.
    limits_set(&ops, &spec("grow", 1)).await.unwrap();
    let one = agents[0].limit("grow", 0, Duration::ZERO).await.unwrap();
    let err = agents[1]
        .limit("grow", 0, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(kind(&err), ErrorKind::Limited, "{err}");
    limits_set(&ops, &spec("grow", 2)).await.unwrap();
    let two = agents[1]
        .limit("grow", 0, Duration::from_secs(5))
        .await
        .unwrap();
    let view = agents[1].limit_view("grow").await.unwrap();
    assert_eq!(view.in_use, 2);
    assert_eq!(view.leases.len(), 1, "an agent sees its own leases only");
    one.release(None).await.unwrap();
    two.release(None).await.unwrap();
}

#[tokio::test]
async fn a_hostile_agent_cannot_take_refund_hog_flood_or_crash() {
    let fabric = Fabric::start().await;
    let _limits = start_limits(&fabric.url()).await;
    let ops = fabric.nats.client().await;
    limits_set(&ops, &spec("shared", 4)).await.unwrap();
    let victim = fabric.agent("victim").await;
    let _mallory = fabric.agent("mallory").await;
    let client = fabric.nats.client().await;
    let lease = victim.limit("shared", 0, Duration::ZERO).await.unwrap();
    let id = lease.lease().lease_id;
    let acquire = LimitsOp::Acquire.subject(&"mallory".parse().unwrap());
    let release = LimitsOp::Release.subject(&"mallory".parse().unwrap());
    let renew = LimitsOp::Renew.subject(&"mallory".parse().unwrap());

    // Another's lease: not released, not renewed, not claimed by its id.
    let reply = raw(
        &client,
        &release,
        json!({"key": "shared", "lease_id": id}).to_string(),
    )
    .await;
    assert_eq!(reply.body["released"], false, "{:?}", reply.body);
    let reply = raw(
        &client,
        &renew,
        json!({"key": "shared", "lease_id": id}).to_string(),
    )
    .await;
    assert_eq!(reply.error_kind(), "not_found");
    let reply = raw(
        &client,
        &acquire,
        json!({"key": "shared", "lease_id": id}).to_string(),
    )
    .await;
    assert_eq!(reply.error_kind(), "bad_request");
    assert_eq!(victim.limit_view("shared").await.unwrap().in_use, 1);
    // Its own renew asking for 2^63 ms is refused, not held for ever.
    let own_renew = LimitsOp::Renew.subject(&"victim".parse().unwrap());
    let huge = json!({"key": "shared", "lease_id": id, "hold_ms": 1u64 << 63});
    let reply = raw(&client, &own_renew, huge.to_string()).await;
    assert_eq!(reply.error_kind(), "bad_request");

    // Refunds: negative or absurd spend, absurd estimates and waits.
    for body in [
        json!({"key": "shared", "lease_id": id, "tokens_used": -5}),
        json!({"key": "shared", "lease_id": id, "tokens_used": 1e30}),
        json!({"key": "shared", "lease_id": id, "tokens_used": 2_000_000_000u64}),
        json!({"key": "shared", "lease_id": id, "tokens_used": 1u64 << 63}),
    ] {
        let reply = raw(&client, &release, body.to_string()).await;
        assert_eq!(reply.error_kind(), "bad_request", "{body}");
    }
    for body in [
        json!({"key": "shared", "tokens": u64::MAX}),
        json!({"key": "shared", "wait_ms": 3_600_000}),
        json!({"key": "shared", "hold_ms": 0}),
        json!({"key": "shared", "hold_ms": 999_999_999}),
        json!({"key": "no such limit"}),
        json!({"key": "*"}),
        json!({"key": "k".repeat(1_000_000)}),
        json!({"key": "shared\r\nX-Forged: 1"}),
        json!({"key": "shared", "tokens": 1u64 << 63}),
        json!({"key": "shared", "wait_ms": 1u64 << 63}),
        json!({"key": "shared", "hold_ms": 1u64 << 63}),
        json!({"key": "shared", "lease_id": "not-a-uuid"}),
        json!({"key": "shared", "extra": 1}),
    ] {
        let reply = raw(&client, &acquire, body.to_string()).await;
        let kind = reply.error_kind();
        assert!(kind == "bad_request", "{kind} for {:.80}", body.to_string());
    }
    let reply = raw(
        &client,
        &acquire,
        json!({"key": "undeclared:model"}).to_string(),
    )
    .await;
    assert_eq!(reply.error_kind(), "not_found");

    // Hogging: its share is half the limit.
    let mut mine = Vec::new();
    for _ in 0..4 {
        let reply = raw(&client, &acquire, json!({"key": "shared"}).to_string()).await;
        if reply.body.get("lease_id").is_some() {
            mine.push(reply.body["lease_id"].clone());
        }
    }
    assert_eq!(mine.len(), 2, "mallory holds {mine:?}");

    // Flooding the queue: at most 32 wait, the rest are refused at once.
    let flood: Vec<_> = (0..WAITING_PER_AGENT_MAX + 8)
        .map(|_| {
            let client = client.clone();
            let acquire = acquire.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let reply = client
                    .request(
                        acquire,
                        json!({"key": "shared", "wait_ms": 1_500})
                            .to_string()
                            .into(),
                    )
                    .await
                    .unwrap();
                (started.elapsed(), reply.payload)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Meanwhile the victim's next acquire is served.
    let second = victim
        .limit("shared", 0, Duration::from_secs(1))
        .await
        .unwrap();
    let mut quick = 0;
    for reply in flood {
        let (took, payload) = reply.await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(body["error"]["kind"], "limited", "{body}");
        if took < Duration::from_millis(1_000) {
            quick += 1;
        }
    }
    assert!(quick >= 8, "{quick} refused at once");
    // The service still answers.
    assert_eq!(victim.limit_view("shared").await.unwrap().in_use, 4);
    lease.release(None).await.unwrap();
    second.release(None).await.unwrap();
}

/// `switchboard --json limits <args>` against `url`: its parsed output.
async fn cli(url: &str, args: &[&str]) -> serde_json::Value {
    let args: Vec<&str> = std::iter::once("limits")
        .chain(args.iter().copied())
        .collect();
    switchboard_tests::services::switchboard_json(url, &args).await
}

#[tokio::test]
async fn an_operator_declares_lists_and_deletes_limits_and_an_agent_leases_on_the_command_line() {
    let fabric = Fabric::start().await;
    let _limits = start_limits(&fabric.url()).await;
    let url = fabric.url();
    let set = cli(
        &url,
        &[
            "set",
            "openai:gpt-4.1",
            "--concurrent",
            "2",
            "--requests-per-minute",
            "600",
        ],
    )
    .await;
    assert_eq!(set["spec"]["concurrent"], 2, "{set}");
    let lease = cli(
        &url,
        &[
            "acquire",
            "openai:gpt-4.1",
            "--as",
            "cli-agent",
            "--tokens",
            "5",
        ],
    )
    .await;
    let id = lease["lease_id"].as_str().unwrap().to_owned();
    let shown = cli(&url, &["show", "openai:gpt-4.1", "--as", "cli-agent"]).await;
    assert_eq!(shown["in_use"], 1, "{shown}");
    let listed = cli(&url, &["list"]).await;
    assert_eq!(
        listed["limits"][0]["leases"][0]["agent_id"], "cli-agent",
        "{listed}"
    );
    let released = cli(
        &url,
        &[
            "release",
            "openai:gpt-4.1",
            &id,
            "--as",
            "cli-agent",
            "--tokens-used",
            "3",
        ],
    )
    .await;
    assert_eq!(released["released"], true, "{released}");
    cli(&url, &["delete", "openai:gpt-4.1"]).await;
    assert_eq!(cli(&url, &["list"]).await["limits"], json!([]));
}
