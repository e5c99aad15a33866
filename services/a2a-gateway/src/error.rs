//! Gateway errors, named after the step that failed, and their one mapping to an A2A JSON-RPC
//! error (the spec's code, an `ErrorInfo` with the A2A reason, and for a refusal by the fabric
//! the Switchboard `kind` in its metadata, so a client can tell `acl_denied` from `at_capacity`).

use std::collections::HashMap;

use a2a::{A2AError, JsonRpcError, TypedDetail, error_code};
use switchboard_proto::{ErrorKind, ErrorReply};
use switchboard_request::request::RequestFailure;

/// Caller text as an error message shows it: at most 80 characters, control characters
/// dropped, so an error never reflects a megabyte (or a line break) back.
pub fn shown(text: &str) -> String {
    let mut out: String = text.chars().filter(|c| !c.is_control()).take(80).collect();
    if text.chars().count() > 80 {
        out.push('…');
    }
    out
}

/// Why a JSON-RPC request failed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body is not JSON.
    #[error("the body is not JSON: {}", shown(.0))]
    Parse(String),
    /// The body is JSON but not a JSON-RPC 2.0 request.
    #[error("not a JSON-RPC 2.0 request: {}", shown(.0))]
    InvalidRequest(String),
    /// No such method.
    #[error("method not found: {}", shown(.0))]
    MethodNotFound(String),
    /// The params do not fit the method.
    #[error("invalid params: {}", shown(.0))]
    InvalidParams(String),
    /// The client asked for a protocol version the gateway does not speak.
    #[error("A2A version {} is not supported (the gateway speaks 1.0)", shown(.0))]
    Version(String),
    /// The task does not exist, or the caller is not a party of it.
    #[error("task not found: {}", shown(.0))]
    TaskNotFound(String),
    /// The task has ended (or cannot be canceled by this caller).
    #[error("task {task} cannot be canceled: {why}")]
    NotCancelable {
        /// The task.
        task: String,
        /// The fabric's reason.
        why: String,
    },
    /// No extended card is configured.
    #[error("no extended agent card is configured")]
    ExtendedCardNotConfigured,
    /// A message naming a task that does not ask for input (it has ended, or is at work).
    #[error(
        "task {task} is {state}: only a task asking for input takes a message (send one \
         without taskId to start a new task)"
    )]
    NotAnswerable {
        /// The task.
        task: String,
        /// Its Switchboard state.
        state: &'static str,
    },
    /// The task's current question has been answered already (one answer per question;
    /// the task asks again with a new `input_required` if it needs more).
    #[error("task {task}'s question has been answered already: wait for it to ask again")]
    AlreadyAnswered {
        /// The task.
        task: String,
    },
    /// The task has no push config by that id: invalid params in JSON-RPC (A2A names no
    /// code of its own), 404 over HTTP+JSON.
    #[error("task {} has no push config `{}`", shown(.task), shown(.id))]
    NoPushConfig {
        /// The task.
        task: String,
        /// The config id asked for.
        id: String,
    },
    /// A subscription to a task that has already ended.
    #[error("task {0} has ended; use GetTask")]
    SubscribeEnded(String),
    /// No agent by that name is registered.
    #[error("no agent `{}` is served here", shown(.0))]
    UnknownAgent(String),
    /// The body is larger than the gateway takes.
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    /// The body is not `application/json`.
    #[error("the body must be application/json (got {})", shown(.0))]
    ContentType(String),
    /// `Last-Event-ID` is not a stream position of this task.
    #[error("Last-Event-ID `{}` is not an event of this task (send the id of an event you received)", shown(.0))]
    BadLastEvent(String),
    /// The request body did not arrive in time.
    #[error("the body did not arrive within {0} s")]
    SlowBody(u64),
    /// The caller holds as many streams as it may.
    #[error("too many open streams for this client (at most {0})")]
    TooManyStreams(usize),
    /// The fabric refused the request (ACL, capacity, unknown agent, budget…).
    #[error("{}", .0.error.message)]
    Refused(ErrorReply),
    /// The fabric did not answer or could not be reached.
    #[error("the fabric did not answer {step}: {source}")]
    Unavailable {
        /// What the gateway was doing.
        step: &'static str,
        /// What went wrong: the NATS error, or a description.
        #[source]
        source: async_nats::Error,
    },
}

impl GatewayError {
    /// The fabric failed `step`: `err` is the NATS error (kept as the source) or what went
    /// wrong in words.
    pub fn unavailable(step: &'static str, err: impl Into<async_nats::Error>) -> Self {
        Self::Unavailable {
            step,
            source: err.into(),
        }
    }

    /// From a failed request to a service: a typed refusal stays one; silence is `Unavailable`.
    pub fn from_request(step: &'static str, failure: RequestFailure) -> Self {
        match failure {
            RequestFailure::Service(reply) => Self::Refused(reply),
            other => Self::unavailable(step, other),
        }
    }

    /// The A2A error: the spec's code for the failure, the Switchboard kind beside it.
    pub fn to_a2a(&self) -> A2AError {
        let (code, kind) = match self {
            Self::Parse(_) => (error_code::PARSE_ERROR, None),
            Self::InvalidRequest(_) | Self::TooLarge(_) | Self::UnknownAgent(_) => {
                (error_code::INVALID_REQUEST, None)
            }
            Self::ContentType(_) => (error_code::CONTENT_TYPE_NOT_SUPPORTED, None),
            Self::MethodNotFound(_) => (error_code::METHOD_NOT_FOUND, None),
            Self::InvalidParams(_) | Self::BadLastEvent(_) | Self::NoPushConfig { .. } => {
                (error_code::INVALID_PARAMS, None)
            }
            Self::SlowBody(_) => (error_code::INVALID_REQUEST, None),
            Self::Version(_) => (error_code::VERSION_NOT_SUPPORTED, None),
            Self::TaskNotFound(_) => (error_code::TASK_NOT_FOUND, None),
            Self::SubscribeEnded(_) | Self::NotAnswerable { .. } | Self::AlreadyAnswered { .. } => {
                (error_code::UNSUPPORTED_OPERATION, None)
            }
            Self::NotCancelable { .. } => (error_code::TASK_NOT_CANCELABLE, None),
            Self::ExtendedCardNotConfigured => (error_code::EXTENDED_CARD_NOT_CONFIGURED, None),
            Self::TooManyStreams(_) => (error_code::INTERNAL_ERROR, Some("rate_limited")),
            Self::Refused(reply) => match reply.kind() {
                ErrorKind::BadRequest | ErrorKind::BodyTooLarge | ErrorKind::SelfSend => {
                    (error_code::INVALID_PARAMS, Some(reply.kind().as_str()))
                }
                ErrorKind::NotFound => (error_code::TASK_NOT_FOUND, Some(reply.kind().as_str())),
                _ => (error_code::INTERNAL_ERROR, Some(reply.kind().as_str())),
            },
            Self::Unavailable { .. } => (error_code::INTERNAL_ERROR, Some("unavailable")),
        };
        let error = A2AError::new(code, self.to_string());
        match kind {
            Some(kind) => error.with_details(vec![TypedDetail::error_info(
                a2a::error_reason(code),
                a2a::PROTOCOL_DOMAIN,
                Some(HashMap::from([(
                    "switchboardKind".to_owned(),
                    kind.to_owned(),
                )])),
            )]),
            None => error,
        }
    }

    /// The JSON-RPC `error` object.
    pub fn to_jsonrpc(&self) -> JsonRpcError {
        self.to_a2a().to_jsonrpc_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_keep_their_switchboard_kind() {
        let refused = GatewayError::Refused(ErrorReply::new(ErrorKind::AclDenied, "no"));
        let json = serde_json::to_value(refused.to_jsonrpc()).unwrap_or_default();
        assert_eq!(json["code"], error_code::INTERNAL_ERROR);
        let info = &json["data"][0];
        assert_eq!(info["reason"], "INTERNAL_ERROR");
        assert_eq!(info["metadata"]["switchboardKind"], "acl_denied");
        let missing = GatewayError::TaskNotFound("t".into()).to_jsonrpc();
        assert_eq!(missing.code, error_code::TASK_NOT_FOUND);
    }
}
