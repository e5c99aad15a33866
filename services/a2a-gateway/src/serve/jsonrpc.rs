//! The JSON-RPC 2.0 binding: POST `/agents/<agent_id>` (also with a trailing slash), one
//! request object per POST, answered with the spec's codes (`error.rs`). The HTTP status is
//! 200 for method errors, as JSON-RPC has it, and 401/404/413/415 when the request never
//! reached a method; a stream's failure before its first item is a plain JSON answer, not a
//! stream.

use std::sync::Arc;

use a2a::{
    CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest, GetTaskRequest, JsonRpcId, JsonRpcResponse,
    ListTaskPushNotificationConfigsRequest, ListTasksRequest, SendMessageRequest,
    SubscribeToTaskRequest, TaskPushNotificationConfig, methods,
};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::Value;
use switchboard_proto::AgentId;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::serve::checks;
use crate::serve::events::Item;
use crate::serve::params::params;
use crate::serve::sse::sse;
use crate::serve::stream::Start;

/// The binding's name in spans and metrics (`rpc.system`).
const BINDING: &str = "jsonrpc";

/// The query string's `A2A-Version` (the spec allows it there as well as in a header).
#[derive(Debug, serde::Deserialize)]
pub(crate) struct VersionQuery {
    #[serde(rename = "A2A-Version")]
    pub(crate) version: Option<String>,
}

/// POST `/agents/<agent_id>`: the checks in the order a client is told about them (token,
/// body, content type, envelope, version, agent, `Last-Event-ID`), then the method.
pub(crate) async fn json_rpc(
    State(gateway): State<Arc<Gateway>>,
    Path(agent): Path<String>,
    Query(query): Query<VersionQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let caller = match checks::caller(&gateway, &headers) {
        Ok(caller) => caller,
        Err(refusal) => return checks::unauthorized(refusal),
    };
    let bytes = match checks::read_body(&gateway, body).await {
        Ok(bytes) => bytes,
        Err((status, err)) => return rpc_error(status, JsonRpcId::Null, &err),
    };
    // Before parsing: a body that is not JSON by its type is -32005, not a parse error.
    if let Err(err) = checks::json_content(&headers) {
        return rpc_error(StatusCode::UNSUPPORTED_MEDIA_TYPE, JsonRpcId::Null, &err);
    }
    let (id, method, params) = match envelope(&bytes) {
        Ok(parts) => parts,
        Err((id, err)) => return rpc_error(StatusCode::OK, id, &err),
    };
    if let Err(err) = checks::version(&headers, query.version.as_deref()) {
        return rpc_error(StatusCode::OK, id, &err);
    }
    let agent = match checks::agent(&gateway, &agent).await {
        Ok(agent) => agent,
        Err((status, err)) => return rpc_error(status, id, &err),
    };
    let last_event = match checks::last_event(&headers) {
        Ok(last_event) => last_event,
        Err(err) => return rpc_error(StatusCode::OK, id, &err),
    };
    let span = checks::request_span(BINDING, &method, &agent, &caller, &headers);
    dispatch(&gateway, &caller, &agent, id, &method, params, last_event)
        .instrument(span)
        .await
}

/// The JSON-RPC envelope: id, method, params. On failure, the id when one could be read.
fn envelope(bytes: &Bytes) -> Result<(JsonRpcId, String, Value), (JsonRpcId, GatewayError)> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|err| (JsonRpcId::Null, GatewayError::Parse(err.to_string())))?;
    let Value::Object(object) = value else {
        return Err((
            JsonRpcId::Null,
            GatewayError::InvalidRequest(
                "the request must be a JSON object (batches are not supported)".to_owned(),
            ),
        ));
    };
    let id = match object.get("id") {
        None | Some(Value::Null) => JsonRpcId::Null,
        Some(Value::String(id)) if id.len() <= 256 => JsonRpcId::String(id.clone()),
        Some(Value::Number(n)) if n.as_i64().is_some() => {
            JsonRpcId::Number(n.as_i64().unwrap_or(0))
        }
        Some(_) => {
            return Err((
                JsonRpcId::Null,
                GatewayError::InvalidRequest(
                    "id must be a string (≤ 256 bytes) or an integer".to_owned(),
                ),
            ));
        }
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((
            id,
            GatewayError::InvalidRequest("jsonrpc must be \"2.0\"".to_owned()),
        ));
    }
    let Some(method) = object.get("method").and_then(Value::as_str) else {
        return Err((
            id,
            GatewayError::InvalidRequest("method must be a string".to_owned()),
        ));
    };
    let params = object.get("params").cloned().unwrap_or(Value::Null);
    Ok((id, method.chars().take(64).collect(), params))
}

/// Decodes `raw` as the method's params, runs it, and encodes what it returns.
async fn answer<P, R, F, Fut>(raw: Value, run: F) -> Result<Value, GatewayError>
where
    P: DeserializeOwned,
    R: serde::Serialize,
    F: FnOnce(P) -> Fut,
    Fut: std::future::Future<Output = Result<R, GatewayError>>,
{
    let result = run(params::<P>(raw)?).await?;
    Ok(serde_json::to_value(result).unwrap_or_default())
}

async fn dispatch(
    gateway: &Arc<Gateway>,
    caller: &AgentId,
    agent: &AgentId,
    id: JsonRpcId,
    method: &str,
    raw: Value,
    last_event: Option<u32>,
) -> Response {
    let started = std::time::Instant::now();
    let result: Result<Value, GatewayError> = match method {
        methods::SEND_MESSAGE => {
            answer(raw, |request: SendMessageRequest| {
                gateway.send_message(caller, agent, request)
            })
            .await
        }
        methods::GET_TASK => {
            answer(raw, |request: GetTaskRequest| {
                gateway.get_task(caller, agent, request)
            })
            .await
        }
        methods::LIST_TASKS => {
            answer(raw, |request: ListTasksRequest| {
                gateway.list_tasks(caller, agent, request)
            })
            .await
        }
        methods::CANCEL_TASK => {
            answer(raw, |request: CancelTaskRequest| {
                gateway.cancel_task(caller, agent, request)
            })
            .await
        }
        methods::CREATE_PUSH_CONFIG => {
            answer(raw, |config: TaskPushNotificationConfig| {
                gateway.create_push_config(caller, agent, config)
            })
            .await
        }
        methods::GET_PUSH_CONFIG => {
            answer(raw, |request: GetTaskPushNotificationConfigRequest| {
                gateway.get_push_config(caller, agent, request)
            })
            .await
        }
        methods::LIST_PUSH_CONFIGS => {
            answer(raw, |request: ListTaskPushNotificationConfigsRequest| {
                gateway.list_push_configs(caller, agent, request)
            })
            .await
        }
        methods::DELETE_PUSH_CONFIG => {
            answer(raw, |request: DeleteTaskPushNotificationConfigRequest| {
                gateway.delete_push_config(caller, agent, request)
            })
            .await
        }
        methods::SEND_STREAMING_MESSAGE => {
            let opened = match params::<SendMessageRequest>(raw) {
                Ok(request) => gateway.send_streaming(caller, agent, &request).await,
                Err(err) => Err(err),
            };
            return streamed(method, started, id, opened);
        }
        methods::SUBSCRIBE_TO_TASK => {
            let start = last_event.map_or(Start::Now, Start::After);
            let opened = match params::<SubscribeToTaskRequest>(raw) {
                Ok(request) => gateway.subscribe(caller, agent, &request.id, start).await,
                Err(err) => Err(err),
            };
            return streamed(method, started, id, opened);
        }
        methods::GET_EXTENDED_AGENT_CARD => Err(GatewayError::ExtendedCardNotConfigured),
        other => Err(GatewayError::MethodNotFound(other.to_owned())),
    };
    checks::record(BINDING, method, started, result.as_ref().err());
    match result {
        Ok(value) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&JsonRpcResponse::success(id, value)).unwrap_or_default(),
        )
            .into_response(),
        Err(err) => rpc_error(StatusCode::OK, id, &err),
    }
}

/// A stream's answer: SSE of JSON-RPC responses, or the failure before its first item as a
/// plain JSON-RPC error (a client reads it without opening a stream).
fn streamed(
    method: &str,
    started: std::time::Instant,
    id: JsonRpcId,
    opened: Result<mpsc::Receiver<Result<Item, GatewayError>>, GatewayError>,
) -> Response {
    checks::record(BINDING, method, started, opened.as_ref().err());
    match opened {
        Ok(items) => sse(items, move |item| {
            let response = match item {
                Ok(response) => JsonRpcResponse::success(
                    id.clone(),
                    serde_json::to_value(response).unwrap_or_default(),
                ),
                Err(err) => JsonRpcResponse::error(id.clone(), err.to_jsonrpc()),
            };
            serde_json::to_string(&response).unwrap_or_default()
        }),
        Err(err) => rpc_error(StatusCode::OK, id, &err),
    }
}

fn rpc_error(status: StatusCode, id: JsonRpcId, err: &GatewayError) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&JsonRpcResponse::error(id, err.to_jsonrpc())).unwrap_or_default(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_envelope_gets_the_spec_code() {
        let code = |body: &str| match envelope(&Bytes::from(body.to_owned())) {
            Ok(_) => 0,
            Err((_, err)) => err.to_jsonrpc().code,
        };
        assert_eq!(code("{"), a2a::error_code::PARSE_ERROR);
        assert_eq!(code("[]"), a2a::error_code::INVALID_REQUEST);
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":1,"method":"GetTask"}"#),
            a2a::error_code::INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":{},"method":"GetTask"}"#),
            a2a::error_code::INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1}"#),
            a2a::error_code::INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{}}"#),
            0
        );
    }
}
