//! The Switchboard ids a request or its answer names, recorded on the span that handles it:
//! `switchboard.correlation_id`, `switchboard.task_id`, `switchboard.goal_id` and
//! `messaging.message.id`, so an id from a send report, a call or a task finds its trace.

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
}

/// Records on `span` the ids `body` (a JSON object) names; the first value wins, so a
/// request's id is not replaced by its answer's.
pub fn record(span: &tracing::Span, body: &[u8]) {
    if body.len() > SCAN_MAX || body.first() != Some(&b'{') {
        return;
    }
    let Ok(ids) = serde_json::from_slice::<Ids>(body) else {
        return;
    };
    let fields = [
        ("switchboard.correlation_id", ids.correlation_id),
        ("switchboard.task_id", ids.task_id),
        ("switchboard.goal_id", ids.goal_id.or(ids.from_goal_id)),
        ("messaging.message.id", ids.message_id.or(ids.id)),
    ];
    for (field, value) in fields {
        if let Some(Value::String(text)) = value
            && !text.is_empty()
            && text.len() <= VALUE_MAX
            && text.chars().all(|c| c.is_ascii_graphic())
        {
            span.record(field, text.as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_bodies_are_skipped_without_a_fuss() {
        let span = tracing::Span::none();
        record(&span, b"");
        record(&span, b"[1,2]");
        record(&span, b"{\"correlation_id\": 7, \"task_id\": {\"a\": 1}}");
        record(&span, b"{not json");
        record(&span, &vec![b'{'; SCAN_MAX + 1]);
    }
}
