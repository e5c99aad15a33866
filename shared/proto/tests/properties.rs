//! Property tests of the wire decoder and the pure rules, each against a simple reference model
//! written here independently: agent ids, ACL globs (deny beats allow), the send gates, the
//! anti-loop hop (ttl/trace) and call chains (cycle, depth). 100,000 cases per property by
//! default (`SB_PROPTEST_CASES` overrides); a failure prints proptest's seed and the shrunk
//! input.

#![allow(clippy::unwrap_used, missing_docs)]

use proptest::prelude::*;
use switchboard_proto::acl::{self, Denial};
use switchboard_proto::call::{CallState, PendingCall, derive_chain};
use switchboard_proto::registry::AgentCard;
use switchboard_proto::send::{LoopRefusal, SendRequest, Target, check_gates, next_hop};
use switchboard_proto::{AgentId, ErrorKind, GoalId, MAX_BODY_BYTES};

fn cases() -> u32 {
    std::env::var("SB_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---- reference models -------------------------------------------------------------------

/// Agent ids: 1–64 characters of `[a-z0-9_-]`, the first a letter or digit.
fn valid_agent_id(raw: &str) -> bool {
    let chars: Vec<char> = raw.chars().collect();
    !chars.is_empty()
        && chars.len() <= 64
        && (chars[0].is_ascii_lowercase() || chars[0].is_ascii_digit())
        && chars
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == '-')
}

/// Globs: `*` any run (also empty), `?` exactly one character, anything else itself.
fn glob(pattern: &[char], text: &[char]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some(('*', rest)) => (0..=text.len()).any(|skip| glob(rest, &text[skip..])),
        Some(('?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && glob(rest, &text[1..]),
    }
}

fn any_glob(patterns: &[String], id: &str) -> bool {
    let text: Vec<char> = id.chars().collect();
    patterns
        .iter()
        .any(|p| glob(&p.chars().collect::<Vec<_>>(), &text))
}

/// Who may talk: the sender's deny list wins, then its allow list, then the receiver's.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Ok,
    SenderDenies,
    SenderNotAllowed,
    ReceiverRefuses,
}

fn acl_model(from: &AgentCard, to: &AgentCard) -> Verdict {
    if any_glob(&from.deny_talk_to, to.agent_id.as_str()) {
        Verdict::SenderDenies
    } else if !any_glob(&from.can_talk_to, to.agent_id.as_str()) {
        Verdict::SenderNotAllowed
    } else if !any_glob(&to.allow_from, from.agent_id.as_str()) {
        Verdict::ReceiverRefuses
    } else {
        Verdict::Ok
    }
}

/// The send gates, in the seed's order.
fn gates_model(caller: &str, to: Option<&str>, message: Option<&str>) -> Result<bool, ErrorKind> {
    let to = to.map(str::trim).unwrap_or("");
    if to.is_empty() {
        return Err(ErrorKind::MissingTo);
    }
    if to == caller {
        return Err(ErrorKind::SelfSend);
    }
    let body = message.unwrap_or("");
    if body.trim().is_empty() {
        return Err(ErrorKind::EmptyMessage);
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(ErrorKind::BodyTooLarge);
    }
    Ok(to == "*")
}

// ---- strategies -------------------------------------------------------------------------

/// Small ids so that globs, traces and chains collide often.
fn small_id() -> impl Strategy<Value = AgentId> {
    "[ab][ab-]{0,3}".prop_map(|raw| AgentId::parse(&raw).unwrap())
}

fn small_glob() -> impl Strategy<Value = String> {
    "[ab*?-]{0,5}"
}

fn card() -> impl Strategy<Value = AgentCard> {
    (
        small_id(),
        prop::collection::vec(small_glob(), 0..3),
        prop::collection::vec(small_glob(), 0..3),
        prop::collection::vec(small_glob(), 0..3),
    )
        .prop_map(|(id, allow_from, can_talk_to, deny_talk_to)| {
            let mut card = AgentCard::new(id);
            card.allow_from = allow_from;
            card.can_talk_to = can_talk_to;
            card.deny_talk_to = deny_talk_to;
            card
        })
}

/// Text that is sometimes empty, blank, `*`, an id, or long.
fn field() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        Just(Some(String::new())),
        Just(Some(" \t\n".to_owned())),
        Just(Some("*".to_owned())),
        Just(Some(" * ".to_owned())),
        "[ab][ab-]{0,3}".prop_map(Some),
        " ?[ab][ab-]{0,3} ?".prop_map(Some),
        "\\PC{0,20}".prop_map(Some),
        (MAX_BODY_BYTES - 2..MAX_BODY_BYTES + 3).prop_map(|n| Some("é".repeat(n / 2))),
    ]
}

fn pending_call(callee: AgentId, chain: Vec<AgentId>) -> PendingCall {
    let now = time::OffsetDateTime::now_utc();
    PendingCall {
        correlation_id: switchboard_proto::new_id(),
        caller: chain.last().cloned().unwrap_or_else(|| callee.clone()),
        caller_goal: GoalId::new(),
        callee,
        chain,
        parent: None,
        request_id: switchboard_proto::new_id(),
        wait: true,
        state: CallState::Open,
        answered_via: None,
        claimed_at: None,
        created_at: now,
        deadline: now,
        stream: false,
        streamed: Vec::new(),
        answer: None,
        traceparent: None,
        budget: None,
    }
}

/// JSON values of every shape, nested a few levels, with the field names the requests use.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        "\\PC{0,12}".prop_map(serde_json::Value::from),
        Just(serde_json::Value::from(
            "01a201e1-eb75-7524-bb18-2a515875213b"
        )),
        Just(serde_json::Value::from("2026-11-22T00:00:00Z")),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        let key = prop::sample::select(vec![
            "to",
            "message",
            "id",
            "kind",
            "ttl",
            "trace",
            "parts",
            "task_id",
            "goal_id",
            "correlation_id",
            "timeout_ms",
            "wait",
            "agent_id",
            "metadata",
            "text",
            "type",
            "x",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(key, inner, 0..6).prop_map(|map| {
                serde_json::Value::Object(map.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

/// Decodes `bytes` as `T`; when that works, encoding and decoding again is stable.
fn decodes_stably<T>(bytes: &[u8]) -> Result<(), TestCaseError>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    if let Ok(value) = serde_json::from_slice::<T>(bytes) {
        let once = serde_json::to_vec(&value).unwrap();
        let again: T = serde_json::from_slice(&once)
            .map_err(|err| TestCaseError::fail(format!("re-decoding failed: {err}")))?;
        prop_assert_eq!(serde_json::to_vec(&again).unwrap(), once);
    }
    Ok(())
}

fn every_request(bytes: &[u8]) -> Result<(), TestCaseError> {
    use switchboard_proto::{call, registry, send, task};
    decodes_stably::<send::SendRequest>(bytes)?;
    decodes_stably::<call::CallRequest>(bytes)?;
    decodes_stably::<call::ReplyRequest>(bytes)?;
    decodes_stably::<task::CreateTask>(bytes)?;
    decodes_stably::<task::TaskAction>(bytes)?;
    decodes_stably::<task::ListTasks>(bytes)?;
    decodes_stably::<registry::AgentCard>(bytes)?;
    decodes_stably::<registry::GoalOpenRequest>(bytes)?;
    decodes_stably::<registry::LookupRequest>(bytes)?;
    decodes_stably::<switchboard_proto::InboxMessage>(bytes)?;
    decodes_stably::<switchboard_proto::audit::HistoryRequest>(bytes)?;
    Ok(())
}

// ---- properties -------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn agent_ids_are_valid_exactly_as_the_model_says(raw in "[a-zA-Z0-9_ .*>\\-é]{0,70}") {
        prop_assert_eq!(AgentId::parse(&raw).is_ok(), valid_agent_id(&raw), "{:?}", raw);
    }

    #[test]
    fn globs_match_exactly_as_the_model_says(pattern in small_glob(), id in "[ab-]{0,6}") {
        let model = glob(&pattern.chars().collect::<Vec<_>>(), &id.chars().collect::<Vec<_>>());
        prop_assert_eq!(acl::glob_matches(&pattern, &id), model, "{:?} vs {:?}", pattern, id);
    }

    #[test]
    fn acl_decides_as_the_model_and_deny_beats_allow(from in card(), to in card()) {
        let verdict = match acl::check(&from, &to) {
            Ok(()) => Verdict::Ok,
            Err(Denial::SenderDenies { pattern }) => {
                // The reported pattern really is one of the sender's denies, and matches.
                prop_assert!(from.deny_talk_to.contains(&pattern));
                prop_assert!(acl::glob_matches(&pattern, to.agent_id.as_str()));
                Verdict::SenderDenies
            }
            Err(Denial::SenderNotAllowed) => Verdict::SenderNotAllowed,
            Err(Denial::ReceiverRefuses) => Verdict::ReceiverRefuses,
        };
        prop_assert_eq!(verdict, acl_model(&from, &to));
    }

    #[test]
    fn send_gates_refuse_in_the_seeds_order(
        caller in small_id(),
        to in field(),
        message in field(),
    ) {
        let request = SendRequest {
            to: to.clone(),
            message: message.clone(),
            ..SendRequest::default()
        };
        let got = check_gates(&caller, &request)
            .map(|(target, _)| target == Target::Broadcast)
            .map_err(|err| err.kind());
        prop_assert_eq!(got, gates_model(caller.as_str(), to.as_deref(), message.as_deref()));
    }

    #[test]
    fn a_hop_spends_ttl_and_never_revisits_the_trace(
        from in small_id(),
        to in small_id(),
        ttl in prop::option::of(0u8..6),
        trace in prop::collection::vec(small_id(), 0..5),
    ) {
        let got = next_hop(&from, &to, ttl, &trace);
        let budget = ttl.unwrap_or(switchboard_proto::DEFAULT_TTL);
        if budget == 0 {
            prop_assert_eq!(got, Err(LoopRefusal::TtlExhausted));
        } else if trace.contains(&to) {
            prop_assert_eq!(got, Err(LoopRefusal::AlreadyInTrace));
        } else {
            let hop = got.unwrap();
            prop_assert_eq!(hop.ttl, budget - 1);
            // The trace keeps what it had, in order, and names the sender once.
            prop_assert_eq!(&hop.trace[..trace.len()], &trace[..]);
            prop_assert_eq!(hop.trace.iter().filter(|id| **id == from).count(), 1.max(trace.iter().filter(|id| **id == from).count()));
            prop_assert!(hop.trace.contains(&from));
        }
    }

    #[test]
    fn call_chains_refuse_cycles_and_depth_as_the_model_says(
        caller in small_id(),
        callee in small_id(),
        parent in prop::option::of((small_id(), prop::collection::vec(small_id(), 0..6))),
        limit in 1usize..7,
        answering_parent in any::<bool>(),
    ) {
        let parent = parent.map(|(parent_callee, chain)| pending_call(parent_callee, chain));
        // In reply to the parent's request, or to nothing.
        let in_reply_to = parent.as_ref().filter(|_| answering_parent).map(|p| p.request_id);
        let got = derive_chain(&caller, &callee, parent.as_ref(), limit, in_reply_to);
        let model = match &parent {
            Some(parent) if parent.callee != caller => Err(ErrorKind::IdentityMismatch),
            _ => {
                let mut chain = parent.as_ref().map(|p| p.chain.clone()).unwrap_or_default();
                chain.push(caller.clone());
                // Asking back: to the parent's caller, in reply to the parent's request.
                let asks_back = answering_parent
                    && parent.as_ref().is_some_and(|p| p.caller == callee);
                if chain.contains(&callee) && !asks_back {
                    Err(ErrorKind::Cycle)
                } else if chain.len() >= limit {
                    Err(ErrorKind::DepthExceeded)
                } else {
                    Ok(chain)
                }
            }
        };
        prop_assert_eq!(got.map_err(|err| err.kind()), model);
    }

    #[test]
    fn any_bytes_decode_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        every_request(&bytes)?;
    }

    #[test]
    fn any_json_decodes_or_fails_cleanly_and_round_trips(value in json_value()) {
        let bytes = serde_json::to_vec(&value).unwrap();
        every_request(&bytes)?;
        // Truncated JSON is refused, never half-read.
        if bytes.len() > 1 {
            every_request(&bytes[..bytes.len() / 2])?;
        }
    }
}
