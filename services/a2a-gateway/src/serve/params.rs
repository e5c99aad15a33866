//! Reading a JSON-RPC request's params as ProtoJSON: a parser accepts the proto field names
//! (`task_id`) beside the JSON names (`taskId`) the A2A types take, and a message's parts are
//! counted before anything is built from them.

use serde::de::DeserializeOwned;
use serde_json::Value;

use a2a::SendMessageRequest;

use crate::error::GatewayError;
use crate::mapping;

/// The longest `contextId` or `messageId` kept, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// The params of a request as `T`: `-32602` (invalid params) when they do not fit.
pub(crate) fn params<T: DeserializeOwned>(mut params: Value) -> Result<T, GatewayError> {
    // Counted before the A2A types are built (they read every part through a map of its
    // own): a message of a million empty parts is refused for the cost of counting them.
    if params
        .get("message")
        .and_then(|message| message.get("parts"))
        .and_then(Value::as_array)
        .is_some_and(|parts| parts.len() > crate::serve::params::MAX_PARTS)
    {
        return Err(GatewayError::InvalidParams(format!(
            "a message has at most {} parts",
            crate::serve::params::MAX_PARTS
        )));
    }
    // ProtoJSON: a parser accepts the proto field name (`task_id`) as well as its JSON name
    // (`taskId`); the A2A types take the JSON names. (After the count: a flood of parts is
    // refused before any of it is walked.)
    json_names(&mut params, 0);
    serde_json::from_value(params).map_err(|err| GatewayError::InvalidParams(err.to_string()))
}

/// How deep [`json_names`] renames keys: the A2A params nest a few levels (a message, its
/// parts, a push config's authentication); below that nothing the gateway reads.
const JSON_NAMES_DEPTH: usize = 8;

/// Renames every `snake_case` key of `value` to its `lowerCamelCase` JSON name, as ProtoJSON
/// parsers accept either, unless the JSON name is there too. `metadata` and a data part's
/// `data` are free-form (`google.protobuf.Struct`): their keys are the client's and stay.
fn json_names(value: &mut Value, depth: usize) {
    if depth > JSON_NAMES_DEPTH {
        return;
    }
    match value {
        Value::Object(map) => {
            let renames: Vec<(String, String)> = map
                .keys()
                .filter(|key| is_proto_name(key))
                .map(|key| (key.clone(), lower_camel(key)))
                .filter(|(_, camel)| !map.contains_key(camel))
                .collect();
            for (snake, camel) in renames {
                if let Some(moved) = map.remove(&snake) {
                    map.insert(camel, moved);
                }
            }
            for (key, nested) in map.iter_mut() {
                if key != "metadata" && key != "data" {
                    json_names(nested, depth + 1);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                json_names(item, depth + 1);
            }
        }
        _ => {}
    }
}

/// A proto field name with an underscore in it: `task_id`, `history_length` (lowercase words
/// joined by single underscores, starting with a letter); other keys are left alone.
fn is_proto_name(key: &str) -> bool {
    key.starts_with(|c: char| c.is_ascii_lowercase())
        && key.contains('_')
        && key.split('_').all(|word| {
            !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        })
}

/// `task_id` → `taskId`, `history_length` → `historyLength`.
fn lower_camel(snake: &str) -> String {
    let mut camel = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = !camel.is_empty();
        } else if upper {
            camel.extend(c.to_uppercase());
            upper = false;
        } else {
            camel.push(c);
        }
    }
    camel
}

/// The most parts one message may carry.
pub const MAX_PARTS: usize = 256;

/// The message's context: `(its contextId, true)`, or `(a fresh one, false)` without one.
pub(crate) fn message_context(
    request: &SendMessageRequest,
) -> Result<(String, bool), GatewayError> {
    match request.message.context_id.as_deref() {
        None | Some("") => Ok((switchboard_proto::new_id().to_string(), false)),
        Some(context) if context.len() <= MAX_ID_BYTES => Ok((context.to_owned(), true)),
        Some(_) => Err(GatewayError::InvalidParams(format!(
            "contextId is longer than {MAX_ID_BYTES} bytes"
        ))),
    }
}

/// The most parts a message may have (checked before anything is read or uploaded).
pub(crate) fn check_part_count(request: &SendMessageRequest) -> Result<(), GatewayError> {
    if request.message.parts.len() > MAX_PARTS {
        return Err(GatewayError::InvalidParams(format!(
            "a message has at most {MAX_PARTS} parts"
        )));
    }
    Ok(())
}

/// The text and parts of a message's `kept` parts (those not uploaded as `files`), refused
/// when it carries none of them.
pub(crate) fn message_content(
    kept: &[a2a::Part],
    files: usize,
) -> Result<(String, Vec<switchboard_proto::Part>), GatewayError> {
    let (text, parts) = mapping::inbound(kept);
    if text.trim().is_empty() && parts.is_empty() && files == 0 {
        return Err(GatewayError::InvalidParams(
            "the message has no text and no parts".to_owned(),
        ));
    }
    // The fabric's messages have text; one of parts alone says so in words (and the task's
    // history shows the parts as they came: `mapping::TEXTLESS`).
    if text.trim().is_empty() {
        return Ok((mapping::textless(parts.len() + files), parts));
    }
    Ok((text, parts))
}

/// A `messageId` the gateway carries: at most [`MAX_ID_BYTES`].
pub(crate) fn check_message_id(id: &str) -> Result<(), GatewayError> {
    if id.len() > MAX_ID_BYTES {
        return Err(GatewayError::InvalidParams(format!(
            "messageId is longer than {MAX_ID_BYTES} bytes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_field_names_become_json_names_but_free_form_keys_stay() {
        let mut params = serde_json::json!({
            "task_id": "t",
            "push_notification_config": {"push_url": "https://x", "auth_info": {"scheme_name": "b"}},
            "message": {"message_id": "m", "parts": [{"data": {"snake_key": 1}}],
                        "metadata": {"user_key": true}},
            "historyLength": 2,
            "history_length": 9,
            "__": 1,
        });
        json_names(&mut params, 0);
        assert_eq!(
            params,
            serde_json::json!({
                "taskId": "t",
                "pushNotificationConfig": {"pushUrl": "https://x", "authInfo": {"schemeName": "b"}},
                "message": {"messageId": "m", "parts": [{"data": {"snake_key": 1}}],
                            "metadata": {"user_key": true}},
                // Both names given: the JSON name wins, the proto name is left as it was.
                "historyLength": 2,
                "history_length": 9,
                "__": 1,
            })
        );
    }

    #[test]
    fn names_are_renamed_only_so_deep_however_deep_a_body_nests() {
        // A hostile body nested far below anything the gateway reads: renamed down to
        // JSON_NAMES_DEPTH, left alone below, no recursion past it.
        let mut deep = serde_json::json!({"page_size": 1});
        for _ in 0..64 {
            deep = serde_json::json!({"inner_level": deep});
        }
        json_names(&mut deep, 0);
        let mut level = &deep;
        let mut renamed = 0;
        while let Some(next) = level.get("innerLevel") {
            renamed += 1;
            level = next;
        }
        assert_eq!(renamed, JSON_NAMES_DEPTH + 1);
        assert!(level.get("inner_level").is_some(), "{level}");
    }
}
