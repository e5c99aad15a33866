//! send_to_peer: the request, the delivery report, and the pure rules every send passes —
//! the seed's gates and the anti-loop rules (docs/protocol.md §8, "Order of checks").
//!
//! Pure functions so the fan-out service, the call path and property tests share one
//! definition.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::error::{ErrorKind, ErrorReply};
use crate::ids::{AgentId, GoalId};
use crate::message::{Callback, MessageKind, Part};
use crate::names::{
    BROADCAST_TARGET, DEFAULT_TTL, MAX_BODY_BYTES, MIN_BODY_CHARS, SKILL_NAME_MAX,
    SKILL_TARGET_PREFIX,
};
use crate::receipt::ReceiptLevel;

/// Body of `agent.send.<agent_id>`.
///
/// `to` and `message` are optional in the type so that a missing field fails its gate with the
/// gate's own error instead of a generic decode error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendRequest {
    /// The peer's agent id, or `*` for a broadcast.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The text (becomes the inbox message's `body`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Client-chosen message id: a retry with the same id is stored once per goal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
    /// Correlation id carried to the receiver (omitted when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
    /// The sending goal; a fresh id when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_goal_id: Option<GoalId>,
    /// Message kind (default `message`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<MessageKind>,
    /// The message this one answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<Uuid>,
    /// Marks the message as wanting an answer; carried unchanged, nothing tracks it (calls do).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expects_reply: bool,
    /// Hop budget of a forwarded message (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u8>,
    /// Agents a forwarded message has already passed through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<AgentId>,
    /// A2A message parts, carried unchanged; they count toward the encoded size limit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Routing info of the originating conversation, carried unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<Callback>,
    /// Free-form JSON object, carried unchanged to every stored copy.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// The sender, if the body names one: it must be the subject's identity
    /// (`sender_mismatch` otherwise). The identity always comes from the subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_agent_id: Option<String>,
    /// Receipts to get back in `from_goal_id` (required with it): `delivered`, or `read`
    /// (delivered, then read). See [`crate::receipt`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<ReceiptLevel>,
    /// Files to carry by reference (at most 16), each as `agent.files` returned it: the
    /// sender must be its uploader or have been delivered it, and every field must match the
    /// file (docs/protocol.md §17).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
}

/// Reply to a send: which goals got the message, and why others did not.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeliveryReport {
    /// The message id (one per send, shared by every goal's copy). Absent when nothing was
    /// attempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<Uuid>,
    /// Goals whose inbox stored the message (JetStream acknowledged).
    pub delivered_to: Vec<GoalId>,
    /// Why a target (or a goal) did not get it.
    pub unreachable_reasons: Vec<String>,
    /// The agent a `skill:<name>` send was routed to; omitted for a send by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_to: Option<AgentId>,
}

/// Who a send is for, once the first four gates passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One peer, by id text (it may still be unknown: gate 5).
    Peer(String),
    /// Every peer the sender may reach.
    Broadcast,
    /// One reachable agent with this skill, picked by the directory (`skill:<name>`).
    Skill(String),
}

/// Gates 1–4 of the seed, in order, for an agent's send. Returns the target and the body.
///
/// 1. `to` present and non-empty after trim (`missing_to`);
/// 2. `to` is not the caller (`self_send`);
/// 3. `message` present and non-empty after trim (`empty_message`);
/// 4. body ≤ [`MAX_BODY_BYTES`] UTF-8 bytes (`body_too_large`, naming the limit).
///
/// It is [`check_target`], the send's own rules (no `kind: receipt`, receipts need a goal),
/// then [`check_body`]: a service opening a call or a task runs the two checks on its own
/// request instead of dressing it up as a send. Gates 5 (unknown agent) and 6 (no live goals)
/// need the registry and produce unreachable reasons, see [`unknown_agent`] and
/// [`no_live_goals`].
pub fn check_gates<'a>(
    caller: &AgentId,
    request: &'a SendRequest,
) -> Result<(Target, &'a str), ErrorReply> {
    let target = check_target(
        caller,
        request.from_agent_id.as_deref(),
        request.to.as_deref(),
    )?;
    if request.kind == Some(MessageKind::Receipt) {
        return Err(ErrorReply::new(
            ErrorKind::BadRequest,
            "`kind: receipt` is written by the inbox service only; ask for receipts with \
             `receipt: \"delivered\"` or `\"read\"`",
        ));
    }
    check_receipt(request.receipt, request.from_goal_id)?;
    check_attachments(&request.attachments)?;
    Ok((target, check_body(request.message.as_deref())?))
}

/// The target check of a send, a call or a task: the body names no other sender
/// (`sender_mismatch`), `to` is present (`missing_to`), is not the caller (`self_send`) and,
/// as `skill:<name>`, names a well-formed skill. `*` is [`Target::Broadcast`]; whether the
/// operation allows it is the caller's rule.
pub fn check_target(
    caller: &AgentId,
    from_agent_id: Option<&str>,
    to: Option<&str>,
) -> Result<Target, ErrorReply> {
    check_sender(caller, from_agent_id)?;
    let to = to.map(str::trim).unwrap_or("");
    if to.is_empty() {
        return Err(ErrorReply::new(
            ErrorKind::MissingTo,
            "`to` is required: the peer's agent_id (see list_peers), or `*` to broadcast",
        ));
    }
    if to == caller.as_str() {
        return Err(ErrorReply::new(
            ErrorKind::SelfSend,
            format!("`{caller}` cannot send to itself"),
        ));
    }
    Ok(if to == BROADCAST_TARGET {
        Target::Broadcast
    } else if let Some(skill) = to.strip_prefix(SKILL_TARGET_PREFIX) {
        Target::Skill(check_skill(skill)?.to_owned())
    } else {
        Target::Peer(to.to_owned())
    })
}

/// The body check of a send, a call or a task: `message` present and non-empty after trim
/// (`empty_message`) and at most [`MAX_BODY_BYTES`] UTF-8 bytes (`body_too_large`).
pub fn check_body(message: Option<&str>) -> Result<&str, ErrorReply> {
    let body = message.unwrap_or("");
    if body.trim().chars().count() < MIN_BODY_CHARS {
        return Err(ErrorReply::new(
            ErrorKind::EmptyMessage,
            "`message` is required and must not be empty",
        ));
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(ErrorReply::new(
            ErrorKind::BodyTooLarge,
            format!(
                "`message` is {} bytes; the limit is {MAX_BODY_BYTES} bytes (64 KiB)",
                body.len()
            ),
        ));
    }
    Ok(body)
}

/// A request's `receipt`: receipts go to the goal the sender names, so asking for them
/// without `from_goal_id` is `bad_request` (there would be nowhere to tell).
pub fn check_receipt(
    receipt: Option<ReceiptLevel>,
    from_goal: Option<GoalId>,
) -> Result<(), ErrorReply> {
    if receipt.is_some() && from_goal.is_none() {
        return Err(ErrorReply::new(
            ErrorKind::BadRequest,
            "`receipt` needs `from_goal_id`: receipts arrive in the goal you send from",
        ));
    }
    Ok(())
}

/// A skill name from a `skill:<name>` target or a `list_peers` filter: 1 to
/// [`SKILL_NAME_MAX`] characters, none of them a space or a control character.
pub fn check_skill(skill: &str) -> Result<&str, ErrorReply> {
    let skill = skill.trim();
    let ok = !skill.is_empty()
        && skill.chars().count() <= SKILL_NAME_MAX
        && !skill.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(skill)
    } else {
        Err(ErrorReply::new(
            ErrorKind::BadRequest,
            format!(
                "a skill is 1 to {SKILL_NAME_MAX} characters without spaces, as `skill:translate`"
            ),
        ))
    }
}

/// A body that names its sender must name the subject's identity: a spoofed `from_agent_id`
/// is refused with `sender_mismatch` (and, being a refusal, recorded by the audit).
pub fn check_sender(caller: &AgentId, named: Option<&str>) -> Result<(), ErrorReply> {
    match named {
        Some(named) if named != caller.as_str() => Err(ErrorReply::new(
            ErrorKind::SenderMismatch,
            format!(
                "the body says it is from `{}`, but the request came from `{caller}`",
                printable(named)
            ),
        )),
        _ => Ok(()),
    }
}

/// Room kept for an inbox message's envelope (ids, agent names, timestamps, task reference)
/// when content is checked before the message is built.
pub const INBOX_ENVELOPE_ALLOWANCE: usize = 2048;

/// Whether content a service will put into one inbox message — the text, the parts and any
/// other JSON it carries (metadata, callback) — fits a stored inbox message with its envelope
/// and headers, measured as encoded JSON (escaping can make a 64 KiB body much longer).
/// Checked before anything is claimed or recorded; `what` names the content in the error.
pub fn check_content_fits(
    what: &str,
    text: &str,
    parts: &[crate::message::Part],
    extra: &[&Value],
) -> Result<(), ErrorReply> {
    let encoded = |value: Result<Vec<u8>, serde_json::Error>| value.map_or(usize::MAX, |b| b.len());
    let mut size = encoded(serde_json::to_vec(text))
        .saturating_add(encoded(serde_json::to_vec(parts)))
        .saturating_add(INBOX_ENVELOPE_ALLOWANCE);
    for value in extra {
        size = size.saturating_add(encoded(serde_json::to_vec(value)));
    }
    let limit = crate::MAX_INBOX_MESSAGE_BYTES - crate::INBOX_HEADER_ALLOWANCE;
    if size > limit {
        return Err(ErrorReply::new(
            ErrorKind::BodyTooLarge,
            format!("{what} is over {limit} bytes as one inbox message"),
        ));
    }
    Ok(())
}

/// The form of a message's attachments (at most 16, each name, media type and digest well
/// formed): `bad_request`. Whether the sender may pass each on is the door's check.
pub fn check_attachments(attachments: &[crate::files::Attachment]) -> Result<(), ErrorReply> {
    crate::files::check_attachments(attachments)
        .map_err(|err| ErrorReply::new(ErrorKind::BadRequest, format!("attachments: {err}")))
}

/// Gate 5's reason.
pub fn unknown_agent(to: &str) -> String {
    format!("unknown agent_id `{}`", printable(to))
}

/// Gate 6's reason.
pub fn no_live_goals(to: &AgentId) -> String {
    format!("no live goals for `{to}`")
}

/// Keeps reasons readable when `to` is garbage (long or with control characters).
fn printable(raw: &str) -> String {
    let clean: String = raw.chars().filter(|c| !c.is_control()).take(80).collect();
    if raw.chars().count() > 80 {
        format!("{clean}…")
    } else {
        clean
    }
}

/// The anti-loop state a delivered message carries: the hop budget left and the path so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// `ttl` written on the delivered message.
    pub ttl: u8,
    /// `trace` written on the delivered message (the incoming trace plus the sender).
    pub trace: Vec<AgentId>,
}

/// Why a hop is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoopRefusal {
    /// The hop budget is spent.
    TtlExhausted,
    /// The target already handled this message.
    AlreadyInTrace,
}

impl LoopRefusal {
    /// The unreachable reason, naming the rule.
    pub fn reason(&self, to: &AgentId) -> String {
        match self {
            Self::TtlExhausted => {
                format!("ttl exhausted: message to `{to}` refused after its last hop (ttl 0)")
            }
            Self::AlreadyInTrace => {
                format!("loop: `{to}` is already in this message's trace")
            }
        }
    }
}

/// The anti-loop rules: a message arriving with `ttl` (default [`DEFAULT_TTL`]) may make one
/// more hop only while `ttl > 0`, and never to an agent already in its `trace`. The delivered
/// copy carries `ttl - 1` and the trace extended with the sender, so a receiver that forwards
/// it passes both along.
pub fn next_hop(
    from: &AgentId,
    to: &AgentId,
    ttl: Option<u8>,
    trace: &[AgentId],
) -> Result<Hop, LoopRefusal> {
    let ttl = ttl.unwrap_or(DEFAULT_TTL);
    if ttl == 0 {
        return Err(LoopRefusal::TtlExhausted);
    }
    if trace.contains(to) {
        return Err(LoopRefusal::AlreadyInTrace);
    }
    let mut next = trace.to_vec();
    if !next.contains(from) {
        next.push(from.clone());
    }
    Ok(Hop {
        ttl: ttl - 1,
        trace: next,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_must_fit_one_inbox_message_as_encoded_json() {
        let text = "x".repeat(MAX_BODY_BYTES);
        assert!(check_content_fits("it", &text, &[], &[]).is_ok());
        // Escaping doubles a body of quotes: over the limit though under 64 KiB of text.
        let quotes = "\"".repeat(MAX_BODY_BYTES);
        let err = check_content_fits("the answer", &quotes, &[], &[]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BodyTooLarge);
        assert!(err.error.message.starts_with("the answer is over"));
        // Parts and other JSON count too.
        let part = crate::message::Part::Text {
            text: "y".repeat(MAX_BODY_BYTES),
        };
        let metadata = json!({"blob": "z".repeat(10_000)});
        assert!(check_content_fits("it", &text, &[part], &[&metadata]).is_err());
    }

    fn id(raw: &str) -> AgentId {
        AgentId::parse(raw).unwrap()
    }

    fn request(to: Option<&str>, message: Option<&str>) -> SendRequest {
        SendRequest {
            to: to.map(str::to_owned),
            message: message.map(str::to_owned),
            ..SendRequest::default()
        }
    }

    fn kind(result: Result<(Target, &str), ErrorReply>) -> ErrorKind {
        result.unwrap_err().kind()
    }

    #[test]
    fn gates_in_order() {
        let me = id("writer");
        assert_eq!(
            kind(check_gates(&me, &request(None, None))),
            ErrorKind::MissingTo
        );
        assert_eq!(
            kind(check_gates(&me, &request(Some("  "), Some("x")))),
            ErrorKind::MissingTo
        );
        // Gate 2 before gate 3: a self-send with no message is a self-send.
        assert_eq!(
            kind(check_gates(&me, &request(Some(" writer "), None))),
            ErrorKind::SelfSend
        );
        assert_eq!(
            kind(check_gates(&me, &request(Some("r"), None))),
            ErrorKind::EmptyMessage
        );
        assert_eq!(
            kind(check_gates(&me, &request(Some("r"), Some(" \n")))),
            ErrorKind::EmptyMessage
        );
        let at_limit = "a".repeat(MAX_BODY_BYTES);
        assert!(check_gates(&me, &request(Some("r"), Some(&at_limit))).is_ok());
        let over = "a".repeat(MAX_BODY_BYTES + 1);
        let err = check_gates(&me, &request(Some("r"), Some(&over))).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BodyTooLarge);
        assert!(err.error.message.contains("65536"), "{}", err.error.message);
        // Bytes, not characters.
        let wide = "é".repeat(MAX_BODY_BYTES / 2 + 1);
        assert_eq!(
            kind(check_gates(&me, &request(Some("r"), Some(&wide)))),
            ErrorKind::BodyTooLarge
        );
        assert_eq!(
            check_gates(&me, &request(Some(" researcher "), Some("hi"))).unwrap(),
            (Target::Peer("researcher".into()), "hi")
        );
        assert_eq!(
            check_gates(&me, &request(Some("*"), Some("all")))
                .unwrap()
                .0,
            Target::Broadcast
        );
    }

    #[test]
    fn reasons_have_the_seed_wording() {
        assert_eq!(unknown_agent("ghost"), "unknown agent_id `ghost`");
        assert_eq!(no_live_goals(&id("x")), "no live goals for `x`");
        assert_eq!(
            unknown_agent(&"g".repeat(200)).chars().count(),
            "unknown agent_id ``".len() + 81
        );
    }

    #[test]
    fn ttl_counts_down_and_stops_at_zero() {
        let (a, b, c, d) = (id("a"), id("b"), id("c"), id("d"));
        let first = next_hop(&a, &b, None, &[]).unwrap();
        assert_eq!(
            first,
            Hop {
                ttl: 2,
                trace: vec![a.clone()]
            }
        );
        let second = next_hop(&b, &c, Some(first.ttl), &first.trace).unwrap();
        assert_eq!(
            second,
            Hop {
                ttl: 1,
                trace: vec![a.clone(), b.clone()]
            }
        );
        let third = next_hop(&c, &d, Some(second.ttl), &second.trace).unwrap();
        assert_eq!(third.ttl, 0);
        assert_eq!(
            next_hop(&d, &id("e"), Some(third.ttl), &third.trace),
            Err(LoopRefusal::TtlExhausted)
        );
    }

    #[test]
    fn trace_refuses_cycles() {
        let (a, b, c) = (id("a"), id("b"), id("c"));
        // A→B, B forwards back to A.
        let hop = next_hop(&a, &b, None, &[]).unwrap();
        assert_eq!(
            next_hop(&b, &a, Some(hop.ttl), &hop.trace),
            Err(LoopRefusal::AlreadyInTrace)
        );
        // A→B→C→A.
        let hop2 = next_hop(&b, &c, Some(hop.ttl), &hop.trace).unwrap();
        assert_eq!(
            next_hop(&c, &a, Some(hop2.ttl), &hop2.trace),
            Err(LoopRefusal::AlreadyInTrace)
        );
        assert!(LoopRefusal::AlreadyInTrace.reason(&a).contains("trace"));
        assert!(LoopRefusal::TtlExhausted.reason(&a).contains("ttl"));
    }

    #[test]
    fn request_and_report_round_trip() {
        let literal = json!({"to": "researcher", "message": "task #1 ready for handoff",
            "correlation_id": "7a3b2f00-0000-4000-8000-000000000000"});
        let req: SendRequest = serde_json::from_value(literal.clone()).unwrap();
        assert_eq!(serde_json::to_value(&req).unwrap(), literal);
        assert!(
            serde_json::from_value::<SendRequest>(json!({"to": "x", "mesage": "typo"})).is_err()
        );
        let Ok(me) = AgentId::parse("me") else {
            panic!("valid id")
        };
        let skill = |to: &str| {
            let request = SendRequest {
                to: Some(to.into()),
                message: Some("hi".into()),
                ..SendRequest::default()
            };
            check_gates(&me, &request).map(|(target, _)| target)
        };
        assert_eq!(
            skill("skill:translate").ok(),
            Some(Target::Skill("translate".into()))
        );
        assert_eq!(skill("skill: fr ").ok(), Some(Target::Skill("fr".into())));
        for bad in [
            "skill:",
            "skill:two words",
            "skill:tr\r\nNats-Msg-Id: x",
            "skill:a\u{0}b",
            &format!("skill:{}", "x".repeat(65)),
        ] {
            assert_eq!(
                skill(bad).err().map(|err| err.kind()),
                Some(ErrorKind::BadRequest),
                "{bad}"
            );
        }
        let report = DeliveryReport {
            message_id: None,
            delivered_to: vec![],
            unreachable_reasons: vec!["unknown agent_id `ghost`".into()],
            routed_to: None,
        };
        assert_eq!(
            serde_json::to_value(&report).unwrap(),
            json!({"delivered_to": [], "unreachable_reasons": ["unknown agent_id `ghost`"]})
        );
    }
}
