//! A generated corpus of bad input against every endpoint that reads a body: empty, oversized,
//! invalid UTF-8, truncated JSON, deep nesting, wrong types, unknown fields, non-objects,
//! `*` / `>` / `.` / spaces in ids, huge tokens, and invalid caller ids in the subject.
//!
//! `SB_BAD_INPUTS` per endpoint (default 4,000; a fresh seed each run, so the corpus grows across
//! runs), generated from a printed seed
//! (`SB_BAD_INPUT_SEED` replays one). Asserted: no input is accepted, every one is answered with
//! a typed error (micro error headers, a known `kind`) or — never here — dropped; every service
//! still answers `$SRV.PING` afterwards; and valid traffic between two agents keeps flowing the
//! whole time, every message delivered.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use switchboard_proto::{ErrorKind, HEADER_SERVICE_ERROR, HEADER_SERVICE_ERROR_CODE};
use switchboard_tests::{Fabric, fast_audit, start_audit};

/// A tiny deterministic generator (xorshift64*), so a seed replays a corpus exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Ids no endpoint accepts (wildcards, separators, spaces, case, length, non-UUIDs).
const BAD_IDS: &[&str] = &[
    "",
    " ",
    "*",
    ">",
    "a.b",
    "a b",
    "A",
    "-lead",
    "_x",
    "é",
    "a*",
    "a>",
    "\u{0}",
    "00000000",
    "not-a-uuid",
    "01a201e1-eb75-7524-bb18",
    "{}",
];

/// The fields each endpoint's body has, so "wrong types" hits real fields.
const FIELDS: &[&str] = &[
    "to",
    "message",
    "id",
    "goal_id",
    "agent_id",
    "task_id",
    "correlation_id",
    "timeout_ms",
    "wait",
    "kind",
    "ttl",
    "trace",
    "parts",
    "role",
    "state",
    "limit",
    "cursor",
    "since",
    "description",
    "allow_from",
    "deadline_in_ms",
    "parent_task_id",
    "metadata",
];

/// One bad body for an endpoint (the subject may be made bad separately). `empty_ok`: an empty
/// body is valid there (all fields optional), so it is not used.
fn bad_body(rng: &mut Rng, empty_ok: bool) -> Vec<u8> {
    let field = *rng.pick(FIELDS);
    let bad_id = *rng.pick(BAD_IDS);
    match rng.below(12) {
        0 if !empty_ok => Vec::new(),
        0 => b"[]".to_vec(),
        // Invalid UTF-8, sometimes inside a JSON string.
        1 => {
            let mut bytes = b"{\"to\": \"".to_vec();
            bytes.extend((0..1 + rng.below(8)).map(|_| 0x80 | (rng.next() as u8 & 0x3f)));
            bytes.extend(b"\"}");
            bytes
        }
        // Truncated JSON.
        2 => {
            let full = format!("{{\"{field}\": \"{}\", \"message\": \"hello\"}}", "x".repeat(rng.below(40)));
            let cut = 1 + rng.below(full.len() - 1);
            full.as_bytes()[..cut].to_vec()
        }
        // Deep nesting (beyond serde_json's recursion limit).
        3 => {
            let depth = 129 + rng.below(2_000);
            format!("{{\"{field}\": {}{}}}", "[".repeat(depth), "]".repeat(depth)).into_bytes()
        }
        // Wrong types for a real field.
        4 => {
            let value = *rng.pick(&["5", "-1", "1e309", "true", "[]", "{}", "[1,2]", "null", "\"\""]);
            format!("{{\"{field}\": {value}, \"to\": 7, \"allow_from\": 7}}").into_bytes()
        }
        // Oversized: over the 64 KiB body and 16 KiB card limits.
        5 => {
            let huge = "x".repeat(70_000 + rng.below(10_000));
            format!("{{\"message\": \"{huge}\", \"description\": \"{huge}\", \"to\": 1}}").into_bytes()
        }
        // A huge token as an id.
        6 => format!(
            "{{\"{field}\": \"{}\", \"to\": [], \"capabilities\": \"x\"}}",
            "a".repeat(70 + rng.below(100_000))
        )
        .into_bytes(),
        // Not an object.
        7 => rng.pick(&["123", "\"text\"", "null", "true", "[]", "[{}]", "1.5", "-0"]).as_bytes().to_vec(),
        // Unknown fields beside a bad one.
        8 => format!("{{\"gaol_id\": \"x\", \"{field}\": {{\"nested\": [1, {{}}]}}, \"to\": false, \"description\": []}}").into_bytes(),
        // Ids with wildcards, separators, spaces.
        9 => format!(
            "{{\"to\": \"{bad_id}\", \"agent_id\": \"{bad_id}\", \"goal_id\": \"{bad_id}\", \"task_id\": \"{bad_id}\", \"correlation_id\": \"{bad_id}\", \"message\": 1}}"
        )
        .into_bytes(),
        // Random bytes.
        // (never empty or blank, which some endpoints read as `{}`; 0xff starts no JSON)
        10 => std::iter::once(0xff)
            .chain((0..rng.below(200)).map(|_| rng.next() as u8))
            .collect(),
        // Valid JSON with every field the wrong shape.
        _ => {
            let mut object = serde_json::Map::new();
            for field in FIELDS {
                object.insert((*field).to_owned(), serde_json::json!({"x": [bad_id]}));
            }
            serde_json::to_vec(&object).unwrap()
        }
    }
}

/// Endpoints whose body may be empty (every field optional): docs/protocol.md sections 4, 10, 11.
const EMPTY_OK: &[&str] = &[
    "agent.registry.register",
    "agent.registry.goal.open",
    "agent.task.list",
    "agent.audit.history",
];

/// A subject token no endpoint accepts as the caller (publishable: no wildcards or dots).
const BAD_CALLERS: &[&str] = &[
    "UPPER",
    "-lead",
    "_x",
    "caf\u{e9}",
    "a:b",
    "0123456789012345678901234567890123456789012345678901234567890123456789",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_corpus_of_bad_input_is_refused_with_typed_errors_while_traffic_flows() {
    let per_endpoint: usize = std::env::var("SB_BAD_INPUTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(4_000);
    let seed: u64 = std::env::var("SB_BAD_INPUT_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!(
        "bad-input corpus: seed {seed} (SB_BAD_INPUT_SEED={seed} replays it), {per_endpoint} per endpoint"
    );

    let fabric = Fabric::start().await;
    let (_audit, _trail) = start_audit(&fabric.url(), fast_audit()).await;
    // The fuzzer is a registered agent, so bodies are checked (an unknown caller would be
    // refused before its body is read).
    let _fuzzer = fabric.agent("fuzzer").await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let (_bob, bob_goal) = fabric.agent_with_goal("bob").await;

    // Valid traffic the whole time: alice → bob every 20 ms, every message read by bob.
    let done = Arc::new(AtomicBool::new(false));
    let traffic = {
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut sent = Vec::new();
            let mut n = 0;
            while !done.load(Ordering::Relaxed) {
                let report = alice
                    .send_to_peer("bob", &format!("still here #{n}"))
                    .await
                    .unwrap();
                assert_eq!(report.delivered_to.len(), 1, "{report:?}");
                sent.push(report.message_id.unwrap());
                n += 1;
                // A real wait: the valid traffic is paced at one message per 20 ms.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            sent
        })
    };
    let reader = tokio::spawn(async move {
        let mut read = Vec::new();
        loop {
            match bob_goal.recv(Duration::from_secs(3)).await.unwrap() {
                Some(delivery) => read.push(delivery.ack().await.unwrap().id.unwrap()),
                None => return read,
            }
        }
    });

    let endpoints = [
        "agent.registry.register",
        "agent.registry.goal.open",
        "agent.registry.goal.close",
        "agent.registry.lookup",
        "agent.send",
        "agent.call",
        "agent.reply",
        "agent.task.create",
        "agent.task.spawn",
        "agent.task.accept",
        "agent.task.complete",
        "agent.task.get",
        "agent.task.list",
    ];
    let audit_endpoints = ["agent.audit.thread", "agent.audit.history"];
    let client = fabric.nats.client().await;
    let mut rng = Rng(seed);
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut accepted = Vec::new();
    let mut dropped = 0usize;
    for endpoint in endpoints.iter().copied().chain(audit_endpoints) {
        let mut requests = Vec::with_capacity(per_endpoint);
        for _ in 0..per_endpoint {
            let body = bad_body(&mut rng, EMPTY_OK.contains(&endpoint));
            // One in eight names an invalid caller in the subject instead (the audit's
            // subjects name no caller).
            let subject = if endpoint.starts_with("agent.audit.") {
                endpoint.to_owned()
            } else if rng.below(8) == 0 {
                format!("{endpoint}.{}", rng.pick(BAD_CALLERS))
            } else {
                format!("{endpoint}.fuzzer")
            };
            requests.push((subject, Bytes::from(body)));
        }
        let outcomes: Vec<_> = futures::stream::iter(requests)
            .map(|(subject, body)| {
                let client = client.clone();
                async move {
                    let reply = tokio::time::timeout(
                        Duration::from_secs(10),
                        client.request(subject.clone(), body.clone()),
                    )
                    .await;
                    (subject, body, reply)
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        for (subject, body, reply) in outcomes {
            let reply = match reply {
                Ok(Ok(reply)) => reply,
                // Refused by the server (e.g. over max_payload): the client sees the error.
                Ok(Err(err)) if body.len() > 200_000 => {
                    *kinds
                        .entry(format!("server refused: {}", err.kind()))
                        .or_default() += 1;
                    continue;
                }
                Ok(Err(err)) => panic!("{subject}: request failed: {err}"),
                Err(_) => {
                    dropped += 1;
                    continue;
                }
            };
            let headers = reply.headers.as_ref();
            let code = headers.and_then(|h| h.get(HEADER_SERVICE_ERROR_CODE));
            let described = headers.and_then(|h| h.get(HEADER_SERVICE_ERROR));
            if code.is_none() || described.is_none() {
                accepted.push((
                    subject,
                    String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
                    String::from_utf8_lossy(&reply.payload).into_owned(),
                ));
                continue;
            }
            let error: serde_json::Value = serde_json::from_slice(&reply.payload)
                .unwrap_or_else(|err| panic!("{subject}: error reply is not JSON: {err}"));
            let kind = error["error"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(
                serde_json::from_value::<ErrorKind>(serde_json::Value::String(kind.clone()))
                    .is_ok(),
                "{subject}: unknown error kind {kind:?}"
            );
            assert!(
                !error["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .is_empty()
            );
            *kinds.entry(kind).or_default() += 1;
        }
    }
    done.store(true, Ordering::Relaxed);
    let sent = traffic.await.unwrap();
    let read = reader.await.unwrap();

    println!("  answered by kind: {kinds:?}");
    println!(
        "  dropped (no reply in 10 s): {dropped}; accepted: {}",
        accepted.len()
    );
    println!(
        "  valid traffic meanwhile: {} sent, {} read",
        sent.len(),
        read.len()
    );
    assert!(
        accepted.is_empty(),
        "bad input accepted: {:?}",
        &accepted[..accepted.len().min(5)]
    );
    assert_eq!(dropped, 0, "every bad input is answered");
    for id in &sent {
        assert!(read.contains(id), "valid message {id} not delivered");
    }
    for service in [
        "directory",
        "inbox-fanout",
        "reply-correlator",
        "task-lifecycle",
        "audit",
    ] {
        let ping = client
            .request(format!("$SRV.PING.{service}"), Bytes::new())
            .await;
        assert!(ping.is_ok(), "{service} stopped answering");
    }
}
