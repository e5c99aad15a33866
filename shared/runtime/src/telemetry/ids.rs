//! The Switchboard ids a request or its answer names, recorded on the span that handles it:
//! `switchboard.correlation_id`, `switchboard.task_id`, `switchboard.goal_id` and
//! `messaging.message.id`, so an id from a send report, a call or a task finds its trace; and
//! `switchboard.duplicate` on an answer that says `duplicate: true`, so a repeat of a request
//! (a hedged copy, a retry) is told apart from the one that did the work.

use serde::Deserialize;
use serde_json::Value;

/// Bodies longer than this are not scanned (a fetch reply of 64 messages, a large send): the
/// ids that matter sit in the requests and answers that are small.
const SCAN_MAX: usize = 16 * 1024;
/// The longest value recorded: ids are UUIDs or agent-chosen names of at most this.
const VALUE_MAX: usize = 128;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Ids {
    correlation_id: Option<Value>,
    task_id: Option<Value>,
    goal_id: Option<Value>,
    from_goal_id: Option<Value>,
    message_id: Option<Value>,
    /// A send's own id (the message id the sender chose).
    id: Option<Value>,
    /// An answer to a repeat of a request already done.
    duplicate: Option<Value>,
}

/// The span fields `body` (a JSON object) names ids for, with their values: only string
/// values of 1 to [`VALUE_MAX`] printable ASCII characters (no spaces, CR or LF), so nothing
/// a caller writes in a body becomes a malformed or oversized attribute.
pub fn found(body: &[u8]) -> Vec<(&'static str, String)> {
    if body.len() > SCAN_MAX || body.first() != Some(&b'{') {
        return Vec::new();
    }
    let Ok(ids) = serde_json::from_slice::<Ids>(body) else {
        return Vec::new();
    };
    let duplicate = matches!(ids.duplicate, Some(Value::Bool(true)))
        .then(|| ("switchboard.duplicate", "true".to_owned()));
    [
        ("switchboard.correlation_id", ids.correlation_id),
        ("switchboard.task_id", ids.task_id),
        ("switchboard.goal_id", ids.goal_id.or(ids.from_goal_id)),
        ("messaging.message.id", ids.message_id.or(ids.id)),
    ]
    .into_iter()
    .filter_map(|(field, value)| match value {
        Some(Value::String(text))
            if !text.is_empty()
                && text.len() <= VALUE_MAX
                && text.chars().all(|c| c.is_ascii_graphic()) =>
        {
            Some((field, text))
        }
        _ => None,
    })
    .chain(duplicate)
    .collect()
}

/// Records on `span` the ids `body` names (see [`found`]); a field already recorded keeps
/// its value only if `body` names none for it.
pub fn record(span: &tracing::Span, body: &[u8]) {
    for (field, value) in found(body) {
        span.record(field, value.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_taken_from_a_body_and_hostile_values_are_not() {
        let got = found(
            br#"{"correlation_id":"0193a1b2-0000-7000-8000-000000000a01","from_goal_id":"g-1","id":"m-1","task_id":{"a":1}}"#,
        );
        assert_eq!(
            got,
            vec![
                (
                    "switchboard.correlation_id",
                    "0193a1b2-0000-7000-8000-000000000a01".to_owned()
                ),
                ("switchboard.goal_id", "g-1".to_owned()),
                ("messaging.message.id", "m-1".to_owned()),
            ]
        );
        // CR/LF, spaces, control and non-ASCII characters, an over-long value, a number as
        // large as 2^63, null, an empty string: none becomes an attribute.
        let long = "x".repeat(VALUE_MAX + 1);
        for value in [
            r#""a\r\nforged: header""#.to_owned(),
            "\"two words\"".to_owned(),
            r#""\u0007bell""#.to_owned(),
            r#""caf\u00e9""#.to_owned(),
            format!("\"{long}\""),
            "9223372036854775808".to_owned(),
            "null".to_owned(),
            "\"\"".to_owned(),
        ] {
            let body = format!(r#"{{"correlation_id": {value}}}"#);
            assert!(found(body.as_bytes()).is_empty(), "{value}");
        }
        // Not an object, not JSON, or too long to scan: nothing.
        assert!(found(b"").is_empty());
        assert!(found(br#"[{"id":"m"}]"#).is_empty());
        assert!(found(b"{not json").is_empty());
        let mut big = br#"{"id":"m","pad":""#.to_vec();
        big.extend(std::iter::repeat_n(b'x', SCAN_MAX));
        big.extend(br#""}"#);
        assert!(found(&big).is_empty());
        // A repeat's answer is marked; anything but `true` is not.
        assert_eq!(
            found(br#"{"task":{"task_id":"t"},"duplicate":true}"#),
            vec![("switchboard.duplicate", "true".to_owned())]
        );
        assert!(found(br#"{"duplicate":"true"}"#).is_empty());
        assert!(found(br#"{"duplicate":false}"#).is_empty());
    }
}
