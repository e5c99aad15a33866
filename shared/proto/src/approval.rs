//! Approvals of one exact action (docs/protocol.md §14, "Approvals").
//!
//! An approval is bound to `action_hash`: the lowercase hex SHA-256 of the action's RFC 8785
//! canonical JSON, `{"arguments": …, "tool": …}`. Canonical JSON alone would let two different
//! texts hash alike, so the arguments are parsed strictly first: a duplicated object key (which
//! one tool runtime reads as the first value and another as the last) and an integer past
//! ±(2^53 − 1) (which JCS, whose numbers are doubles, would round) are refused.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::ids::{GoalId, Party};

/// Longest tool name, in characters.
pub const MAX_TOOL_CHARS: usize = 128;
/// Largest canonical action, in bytes.
pub const MAX_ACTION_BYTES: usize = 64 * 1024;
/// Deepest nesting of an action's arguments.
pub const MAX_ARGUMENT_DEPTH: usize = 32;
/// Largest integer JSON numbers hold exactly as doubles: 2^53 − 1.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The action a person approves: a tool and its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// The tool the agent will call (1–128 characters, no control characters).
    pub tool: String,
    /// Its arguments, exactly as they will be passed: any JSON, with no duplicated keys and no
    /// integer beyond ±(2^53 − 1) (send such numbers as strings).
    #[schemars(with = "Value")]
    #[serde(deserialize_with = "strict_value")]
    pub arguments: Value,
}

/// Why an action cannot be bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// The tool name is empty, too long or holds control characters.
    #[error("`tool` must be 1-128 characters without control characters")]
    Tool,
    /// The canonical action is over [`MAX_ACTION_BYTES`].
    #[error("the action is {0} bytes as canonical JSON; at most 65536")]
    TooLarge(usize),
    /// Canonicalising failed (a number JCS cannot write, such as NaN).
    #[error("the action cannot be written as canonical JSON: {0}")]
    Canonical(String),
}

impl Action {
    /// Checks the tool name and size, and returns the binding hash.
    pub fn hash(&self) -> Result<String, ActionError> {
        let chars = self.tool.chars().count();
        if chars == 0 || chars > MAX_TOOL_CHARS || self.tool.chars().any(char::is_control) {
            return Err(ActionError::Tool);
        }
        let canonical = self.canonical()?;
        if canonical.len() > MAX_ACTION_BYTES {
            return Err(ActionError::TooLarge(canonical.len()));
        }
        let digest = Sha256::digest(&canonical);
        Ok(digest.iter().map(|byte| format!("{byte:02x}")).collect())
    }

    /// The RFC 8785 bytes of `{"arguments": …, "tool": …}`.
    pub fn canonical(&self) -> Result<Vec<u8>, ActionError> {
        let mut object = Map::new();
        object.insert("arguments".to_owned(), self.arguments.clone());
        object.insert("tool".to_owned(), Value::String(self.tool.clone()));
        serde_json_canonicalizer::to_vec(&Value::Object(object))
            .map_err(|err| ActionError::Canonical(err.to_string()))
    }
}

/// Reads a JSON value refusing duplicated keys, unsafe integers and deep nesting.
pub fn strict_value<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
    deserializer.deserialize_any(StrictVisitor { depth: 0 })
}

struct StrictVisitor {
    depth: usize,
}

struct StrictSeed {
    depth: usize,
}

impl<'de> de::DeserializeSeed<'de> for StrictSeed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(StrictVisitor { depth: self.depth })
    }
}

fn unsafe_integer<E: de::Error>(shown: &dyn std::fmt::Display) -> E {
    E::custom(format!(
        "the integer {shown} is beyond ±(2^53-1): JSON numbers past it are not exact; send it as a string"
    ))
}

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        if v.unsigned_abs() > MAX_SAFE_INTEGER {
            return Err(unsafe_integer(&v));
        }
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        if v > MAX_SAFE_INTEGER {
            return Err(unsafe_integer(&v));
        }
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number must be finite"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        if self.depth >= MAX_ARGUMENT_DEPTH {
            return Err(de::Error::custom(
                "the arguments nest deeper than 32 levels",
            ));
        }
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(StrictSeed {
            depth: self.depth + 1,
        })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        if self.depth >= MAX_ARGUMENT_DEPTH {
            return Err(de::Error::custom(
                "the arguments nest deeper than 32 levels",
            ));
        }
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                let shown: String = key.chars().take(80).collect();
                return Err(de::Error::custom(format!(
                    "the key `{shown}` appears twice in one object: an approved action must read one way only"
                )));
            }
            let value = map.next_value_seed(StrictSeed {
                depth: self.depth + 1,
            })?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// `agent.people.approval.request.<agent>`: ask a person or a role to approve one action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequest {
    /// The exact action to approve.
    pub action: Action,
    /// Why the agent wants to do it (shown to the person).
    pub reason: String,
    /// `person:<id>` or `role:<name>`; the person, or a member of the role, needs approver
    /// access.
    pub to: String,
    /// The caller's goal the decision goes to.
    pub from_goal_id: GoalId,
    /// How long the request may wait and an approval stay usable (at most seven days).
    pub expires_in_ms: u64,
    /// Undecided this long, it goes to `escalate_to` (once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate_after_ms: Option<u64>,
    /// Who gets it then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate_to: Option<String>,
    /// A client-chosen id: a retry with it joins the first request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<Uuid>,
}

/// `agent.people.approval.use.<agent>`: before acting, check the approval for this exact
/// action and spend it (single use).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalUse {
    /// The approval.
    pub approval_id: Uuid,
    /// The action about to be done: it must hash to what was approved.
    pub action: Action,
    /// A client-chosen id: a retry with it gets the first use's reply back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_id: Option<Uuid>,
}

/// The reply to a successful use: go ahead, once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalUsed {
    /// The approval.
    pub approval_id: Uuid,
    /// The hash it is bound to.
    pub action_hash: String,
    /// The person who approved.
    pub decided_by: Party,
    /// When they did.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub decided_at: OffsetDateTime,
    /// Their note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// When it was used.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub used_at: OffsetDateTime,
    /// True when this reply repeats an earlier use with the same `use_id`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(json: &str) -> Result<Action, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn key_order_and_spacing_do_not_change_the_hash() {
        let a = action(r#"{"tool":"deploy","arguments":{"b":1,"a":[true,null,"x"]}}"#).unwrap();
        let b = action(
            r#"{ "arguments" : { "a" : [ true , null , "x" ] , "b" : 1 }, "tool":"deploy"}"#,
        )
        .unwrap();
        assert_eq!(a.hash().unwrap(), b.hash().unwrap());
        assert_eq!(
            String::from_utf8(a.canonical().unwrap()).unwrap(),
            r#"{"arguments":{"a":[true,null,"x"],"b":1},"tool":"deploy"}"#
        );
    }

    #[test]
    fn changed_arguments_change_the_hash() {
        let a = action(r#"{"tool":"pay","arguments":{"amount":10}}"#).unwrap();
        let b = action(r#"{"tool":"pay","arguments":{"amount":11}}"#).unwrap();
        let c = action(r#"{"tool":"refund","arguments":{"amount":10}}"#).unwrap();
        assert_ne!(a.hash().unwrap(), b.hash().unwrap());
        assert_ne!(a.hash().unwrap(), c.hash().unwrap());
    }

    #[test]
    fn numbers_are_canonical_doubles() {
        // 1.0 and 1 are one number in JSON's model; -0 writes as 0 (RFC 8785 §3.2.2.3).
        let a = action(r#"{"tool":"t","arguments":[1.0, -0, 1e3]}"#).unwrap();
        let b = action(r#"{"tool":"t","arguments":[1, 0, 1000]}"#).unwrap();
        assert_eq!(a.hash().unwrap(), b.hash().unwrap());
    }

    #[test]
    fn duplicate_keys_and_unsafe_integers_are_refused() {
        let dup = action(r#"{"tool":"t","arguments":{"to":"alice","to":"mallory"}}"#);
        assert!(dup.unwrap_err().to_string().contains("appears twice"));
        let nested = action(r#"{"tool":"t","arguments":[{"a":{"k":1,"k":2}}]}"#);
        assert!(nested.is_err());
        let big = action(r#"{"tool":"t","arguments":{"n":9007199254740993}}"#);
        assert!(big.unwrap_err().to_string().contains("2^53"));
        let neg = action(r#"{"tool":"t","arguments":{"n":-9007199254740993}}"#);
        assert!(neg.is_err());
        assert!(action(r#"{"tool":"t","arguments":{"n":9007199254740991}}"#).is_ok());
    }

    #[test]
    fn deep_nesting_and_bad_tools_are_refused() {
        let deep = format!(
            r#"{{"tool":"t","arguments":{}{}}}"#,
            "[".repeat(40),
            "]".repeat(40)
        );
        assert!(action(&deep).is_err());
        for tool in ["", "a\u{7}b", &"x".repeat(129)] {
            let bad = Action {
                tool: tool.to_owned(),
                arguments: Value::Null,
            };
            assert_eq!(bad.hash(), Err(ActionError::Tool));
        }
        let huge = Action {
            tool: "t".to_owned(),
            arguments: Value::String("x".repeat(70_000)),
        };
        assert!(matches!(huge.hash(), Err(ActionError::TooLarge(_))));
    }

    #[test]
    fn unicode_is_hashed_as_utf8_with_sorted_utf16_keys() {
        // RFC 8785 sorts keys by UTF-16 code units: U+00E9, then U+1F600 (surrogates 0xD83D
        // 0xDE00), then U+FF61 — not by code point, where U+FF61 would come before U+1F600.
        let a =
            action("{\"tool\":\"t\",\"arguments\":{\"\u{ff61}\":1,\"\u{1f600}\":2,\"\u{e9}\":3}}")
                .unwrap();
        let text = String::from_utf8(a.canonical().unwrap()).unwrap();
        assert_eq!(
            text,
            "{\"arguments\":{\"\u{e9}\":3,\"\u{1f600}\":2,\"\u{ff61}\":1},\"tool\":\"t\"}"
        );
    }
}
