//! Provider limits (docs/protocol.md §15) against a real nats-server: a fleet never holds more
//! leases than declared across three service replicas, waiting acquires are served fairly, a
//! silent holder's lease returns at its expiry, a limit changes at run time, and a hostile agent
//! can neither take another's lease, refund itself, hold every lease, flood the queue nor crash
//! the service.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard_client::{ClientError, limits_list, limits_set};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_never_holds_more_leases_than_declared_across_three_replicas() {
    let fabric = Fabric::start().await;
    let _replicas = [
        start_limits(&fabric.url()).await,
        start_limits(&fabric.url()).await,
        start_limits(&fabric.url()).await,
    ];
    let ops = fabric.nats.client().await;
    limits_set(
        &ops,
        &LimitSpec {
            per_agent: Some(5),
            ..spec("openai:gpt-4.1", 5)
        },
    )
    .await
    .unwrap();

    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut agents = Vec::new();
    for n in 0..40 {
        let agent = fabric.agent(&format!("fleet-{n}")).await;
        let (in_flight, most) = (Arc::clone(&in_flight), Arc::clone(&most));
        agents.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            for _ in 0..5 {
                let lease = agent
                    .limit("openai:gpt-4.1", 0, Duration::from_secs(30))
                    .await
                    .unwrap();
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                waits.push(lease.lease().waited_ms);
                // The provider call.
                tokio::time::sleep(Duration::from_millis(10)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                assert!(lease.release(None).await.unwrap().released);
            }
            waits
        }));
    }
    let mut waits = Vec::new();
    for agent in agents {
        waits.extend(agent.await.unwrap());
    }
    assert_eq!(waits.len(), 200);
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 5, "{most} leases out at once");
    assert!(most >= 2, "the leases were never used together ({most})");
    let listed = limits_list(&ops).await.unwrap();
    assert_eq!(listed.limits.len(), 1);
    assert_eq!(listed.limits[0].in_use, 0, "{listed:?}");
    // The replicas raced for the key, and the losers sent their batches to its writer (one
    // writer per contended key, protocol §15) rather than racing on.
    let forwarded: u64 = keepers(&ops).await.iter().map(|(_, n)| n).sum();
    assert!(forwarded > 0, "no batch was forwarded to the key's writer");
}

/// Each limits replica's forwarding subject (`_SB.limits.keeper.<replica>`) and the batches
/// other replicas sent it, from `$SRV.STATS.limits` (every replica answers within 1 s).
async fn keepers(client: &async_nats::Client) -> Vec<(String, u64)> {
    use futures::StreamExt;
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply("$SRV.STATS.limits", inbox, "".into())
        .await
        .unwrap();
    let mut found = Vec::new();
    while let Ok(Some(reply)) = tokio::time::timeout(Duration::from_secs(1), replies.next()).await {
        let stats: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
        for endpoint in stats["endpoints"].as_array().unwrap() {
            if endpoint["name"] == "keeper_forward" {
                found.push((
                    endpoint["subject"].as_str().unwrap().to_owned(),
                    endpoint["num_requests"].as_u64().unwrap(),
                ));
            }
        }
    }
    found
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

/// `switchboard limits …` with `--json`, against `url`: its parsed output.
async fn cli(url: &str, args: &[&str]) -> serde_json::Value {
    let out = tokio::process::Command::new(switchboard_tests::service_bin("switchboard"))
        .arg("--json")
        .arg("limits")
        .args(args)
        .env("NATS_URL", url)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "switchboard limits {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
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

/// Issue 41: correct whatever dies. Two limits processes serve 12 agents taking and giving back
/// leases on a limit of 3 (waiting for them); one process is SIGKILLed in the middle, holding
/// whatever acquires it held, and started again. The leases out, sampled all along, never pass
/// 3; an acquire lost with the process is taken again by its agent, and the lease it may have
/// been granted unseen returns at its expiry (1 s); every agent finishes its leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_never_lets_the_fleet_past_the_limit() {
    use std::sync::atomic::AtomicBool;
    use switchboard_testkit::process::ServiceProcess;
    let fabric = Fabric::start().await;
    let url = fabric.url();
    let bin = switchboard_tests::service_bin("limits");
    let first = ServiceProcess::start(&bin, "limits", &url, &[]).await;
    let second = ServiceProcess::start(&bin, "limits", &url, &[]).await;
    let ops = fabric.nats.client().await;
    limits_set(
        &ops,
        &LimitSpec {
            max_hold_ms: Some(1_000),
            per_agent: Some(1),
            ..spec("crash:llm", 3)
        },
    )
    .await
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (ops, stop, most) = (ops.clone(), Arc::clone(&stop), Arc::clone(&most));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(listed) = limits_list(&ops).await
                    && let Some(limit) = listed.limits.first()
                {
                    most.fetch_max(limit.in_use as usize, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let done = Arc::new(AtomicUsize::new(0));
    let mut agents = Vec::new();
    for n in 0..12 {
        let agent = fabric.agent(&format!("crash-{n}")).await;
        let done = Arc::clone(&done);
        agents.push(tokio::spawn(async move {
            let mut taken = 0;
            while taken < 8 {
                // A lost acquire (its replica killed) times out or finds no one: take again.
                match agent.limit("crash:llm", 0, Duration::from_secs(3)).await {
                    Ok(lease) => {
                        tokio::time::sleep(Duration::from_millis(15)).await;
                        let _ = lease.release(None).await;
                        taken += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }))
    }
    // The kill, in the middle of the run.
    let halfway = switchboard_testkit::eventually(Duration::from_secs(30), || async {
        done.load(Ordering::Relaxed) >= 30
    })
    .await;
    assert!(halfway, "{} leases in 30 s", done.load(Ordering::Relaxed));
    // The first replica's id sorts first (ids are UUID v7s), so it is the writer the other
    // sends its batches to once they race: the kill takes the key's writer.
    let forwarding = switchboard_testkit::eventually(Duration::from_secs(30), || async {
        keepers(&ops).await.iter().any(|(_, n)| *n > 0)
    })
    .await;
    assert!(
        forwarding,
        "no batch was forwarded: {:?}",
        keepers(&ops).await
    );
    first.signal("KILL").await;
    let again = ServiceProcess::start(&bin, "limits", &url, &[]).await;
    for agent in agents {
        tokio::time::timeout(Duration::from_secs(60), agent)
            .await
            .expect("every agent finishes its leases within 60 s")
            .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    assert_eq!(done.load(Ordering::Relaxed), 96);
    let most = most.load(Ordering::Relaxed);
    assert!(most <= 3, "{most} leases out of 3");
    futures::future::join_all([again.terminate(), second.terminate()]).await;
}

/// The forwarding subject is for services (the generated accounts keep agents off `_SB.`), but
/// in an open deployment anyone can publish there: a forged batch is bounded like an agent's
/// request — ops out of range, too many, none, or not JSON are `bad_request`, an unknown key
/// `not_found` — and the replica keeps serving.
#[tokio::test]
async fn a_forged_forwarded_batch_is_refused() {
    let fabric = Fabric::start().await;
    let _limits = start_limits(&fabric.url()).await;
    let ops = fabric.nats.client().await;
    limits_set(&ops, &spec("shared", 2)).await.unwrap();
    let (subject, _) = keepers(&ops)
        .await
        .pop()
        .expect("the replica's forwarding subject");
    let acquire = |hold_ms: u64, tokens: u64, deadline_ms: u64| {
        json!({"op": "acquire", "id": uuid::Uuid::now_v7(), "agent": "mallory", "tokens": tokens,
               "hold_ms": hold_ms, "at_ms": 0, "deadline_ms": deadline_ms})
    };
    let cases = [
        json!({"key": "shared", "ops": [acquire(u64::MAX, 0, 0)]}).to_string(),
        json!({"key": "shared", "ops": [acquire(1_000, u64::MAX, 0)]}).to_string(),
        json!({"key": "shared", "ops": [acquire(1_000, 0, u64::MAX)]}).to_string(),
        json!({"key": "shared", "ops": []}).to_string(),
        json!({"key": "shared", "ops": vec![acquire(1_000, 0, 0); 513]}).to_string(),
        json!({"key": "x".repeat(100_000), "ops": [acquire(1_000, 0, 0)]}).to_string(),
        json!({"key": "shared", "ops": [{"op": "steal"}]}).to_string(),
        "not json".to_owned(),
    ];
    for case in cases {
        let reply = raw(&ops, &subject, case.clone()).await;
        assert_eq!(reply.error_kind(), "bad_request", "{:.200}", case);
    }
    let reply = raw(
        &ops,
        &subject,
        json!({"key": "nobody:declared", "ops": [acquire(1_000, 0, 0)]}).to_string(),
    )
    .await;
    assert_eq!(reply.error_kind(), "not_found");
    // Nothing was granted by the forged batches, and agents are still served.
    let agent = fabric.agent("honest").await;
    assert_eq!(agent.limit_view("shared").await.unwrap().in_use, 0);
    agent
        .limit("shared", 0, Duration::ZERO)
        .await
        .unwrap()
        .release(None)
        .await
        .unwrap();
}
