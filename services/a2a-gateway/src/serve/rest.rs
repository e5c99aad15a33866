//! The HTTP+JSON (REST) binding of A2A v1.0, under an agent's interface URL
//! `/agents/<agent_id>` (the URL JSON-RPC is posted to; the card declares both):
//!
//! | method | path | A2A method |
//! |---|---|---|
//! | POST | `/message:send` | `SendMessage` |
//! | POST | `/message:stream` | `SendStreamingMessage` (SSE of bare `StreamResponse`s) |
//! | GET | `/tasks/{id}` | `GetTask` (`?historyLength=`) |
//! | GET | `/tasks` | `ListTasks` (`?contextId=&status=&pageSize=&pageToken=&historyLength=&includeArtifacts=`) |
//! | POST | `/tasks/{id}:cancel` | `CancelTask` |
//! | GET, POST | `/tasks/{id}:subscribe` | `SubscribeToTask` |
//! | POST, GET | `/tasks/{id}/pushNotificationConfigs` | create, list |
//! | GET, DELETE | `/tasks/{id}/pushNotificationConfigs/{configId}` | get, delete |
//! | GET | `/extendedAgentCard` | `GetExtendedAgentCard` |
//!
//! Every method runs the same code as its JSON-RPC twin. A failure is the HTTP status of its
//! A2A error with an AIP-193 body: `{"error": {"code", "status", "message", "details":
//! [google.rpc.ErrorInfo]}}`.

use std::collections::HashMap;
use std::sync::Arc;

use a2a::{
    CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest, GetTaskRequest, ListTaskPushNotificationConfigsRequest,
    ListTasksRequest, SendMessageRequest, TaskPushNotificationConfig,
};
use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
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
const BINDING: &str = "http_json";

/// The query parameter that may carry the protocol version instead of the header.
const VERSION_PARAM: &str = "A2A-Version";

/// Query parameters read as numbers and as booleans (JSON and proto names alike); every other
/// one is a string.
const NUMBER_PARAMS: &[&str] = &["pageSize", "page_size", "historyLength", "history_length"];
const BOOL_PARAMS: &[&str] = &["includeArtifacts", "include_artifacts"];

/// The query string, each value as the method's params take it.
type QueryParams = Query<HashMap<String, String>>;

/// A request that passed the checks every REST request passes, in order: token (401),
/// version (400), agent (404). An extractor, so each handler starts from here; with the
/// headers and query the method reads besides its body.
pub(crate) struct Admitted {
    caller: AgentId,
    agent: AgentId,
    headers: HeaderMap,
    query: HashMap<String, String>,
}

impl FromRequestParts<Arc<Gateway>> for Admitted {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        gateway: &Arc<Gateway>,
    ) -> Result<Self, Response> {
        let Path(path) = Path::<HashMap<String, String>>::from_request_parts(parts, gateway)
            .await
            .map_err(IntoResponse::into_response)?;
        let Query(query) = QueryParams::try_from_uri(&parts.uri)
            .map_err(|rejection| error(&GatewayError::InvalidRequest(rejection.body_text())))?;
        let headers = parts.headers.clone();
        let caller = checks::caller(gateway, &headers).map_err(checks::unauthorized)?;
        checks::version(&headers, query.get(VERSION_PARAM).map(String::as_str))
            .map_err(|err| error(&err))?;
        let named = path.get("agent_id").map_or("", String::as_str);
        let agent = checks::agent(gateway, named)
            .await
            .map_err(|(_, err)| error(&err))?;
        Ok(Self {
            caller,
            agent,
            headers,
            query,
        })
    }
}

/// The body of a method that takes one, read as [`body_object`] does (after the checks of
/// [`Admitted`]: an extractor that takes the body runs last).
pub(crate) struct BodyObject(Map<String, Value>);

impl FromRequest<Arc<Gateway>> for BodyObject {
    type Rejection = Response;

    async fn from_request(request: Request, gateway: &Arc<Gateway>) -> Result<Self, Response> {
        let (parts, body) = request.into_parts();
        body_object(gateway, &parts.headers, body).await.map(Self)
    }
}

/// The body as a JSON object (an empty body is an empty object): JSON by its content type
/// (415), within the size and time limits (413, 408), an object (400).
async fn body_object(
    gateway: &Gateway,
    headers: &HeaderMap,
    body: Body,
) -> Result<Map<String, Value>, Response> {
    let bytes = checks::read_body(gateway, body)
        .await
        .map_err(|(_, err)| error(&err))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    checks::json_content(headers).map_err(|err| error(&err))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(error(&GatewayError::InvalidRequest(
            "the body must be a JSON object".to_owned(),
        ))),
        Err(err) => Err(error(&GatewayError::Parse(err.to_string()))),
    }
}

/// The query parameters (less the version) as a params object.
fn query_object(query: HashMap<String, String>) -> Map<String, Value> {
    query
        .into_iter()
        .filter(|(name, _)| name != VERSION_PARAM)
        .map(|(name, value)| {
            let typed = if NUMBER_PARAMS.contains(&name.as_str()) {
                value
                    .parse::<i64>()
                    .map(Value::from)
                    .unwrap_or(Value::String(value))
            } else if BOOL_PARAMS.contains(&name.as_str()) {
                match value.as_str() {
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    _ => Value::String(value),
                }
            } else {
                Value::String(value)
            };
            (name, typed)
        })
        .collect()
}

/// Runs one method: its span, its metric, its answer as JSON or as the REST error.
async fn run<P, R, F, Fut>(
    method: &'static str,
    admitted: &Admitted,
    raw: Map<String, Value>,
    call: F,
) -> Response
where
    P: DeserializeOwned,
    R: Serialize,
    F: FnOnce(P) -> Fut,
    Fut: std::future::Future<Output = Result<R, GatewayError>>,
{
    let span = checks::request_span(
        BINDING,
        method,
        &admitted.agent,
        &admitted.caller,
        &admitted.headers,
    );
    let started = std::time::Instant::now();
    let result = async {
        let request = params::<P>(Value::Object(raw))?;
        call(request).await
    }
    .instrument(span.clone())
    .await;
    let _entered = span.enter();
    checks::record(BINDING, method, started, result.as_ref().err());
    match result {
        Ok(value) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&value).unwrap_or_default(),
        )
            .into_response(),
        Err(err) => error(&err),
    }
}

/// A stream's answer: SSE of bare `StreamResponse`s, or the failure before its first item as
/// a plain error answer.
fn streamed(
    method: &'static str,
    started: std::time::Instant,
    opened: Result<mpsc::Receiver<Result<Item, GatewayError>>, GatewayError>,
) -> Response {
    checks::record(BINDING, method, started, opened.as_ref().err());
    match opened {
        Ok(items) => sse(items, |item| match item {
            Ok(response) => serde_json::to_string(response).unwrap_or_default(),
            Err(err) => body(err, status(err)).to_string(),
        }),
        Err(err) => error(&err),
    }
}

/// `POST /message:send`.
pub(crate) async fn send_message(
    State(gateway): State<Arc<Gateway>>,
    admitted: Admitted,
    BodyObject(raw): BodyObject,
) -> Response {
    let (caller, agent) = (&admitted.caller, &admitted.agent);
    run(
        "SendMessage",
        &admitted,
        raw,
        |request: SendMessageRequest| gateway.send_message(caller, agent, request),
    )
    .await
}

/// `POST /message:stream`.
pub(crate) async fn send_streaming(
    State(gateway): State<Arc<Gateway>>,
    admitted: Admitted,
    BodyObject(raw): BodyObject,
) -> Response {
    let method = "SendStreamingMessage";
    let span = checks::request_span(
        BINDING,
        method,
        &admitted.agent,
        &admitted.caller,
        &admitted.headers,
    );
    let started = std::time::Instant::now();
    let opened = async {
        let request = params::<SendMessageRequest>(Value::Object(raw))?;
        gateway
            .send_streaming(&admitted.caller, &admitted.agent, &request)
            .await
    }
    .instrument(span.clone())
    .await;
    let _entered = span.enter();
    streamed(method, started, opened)
}

/// `GET /tasks`.
pub(crate) async fn list_tasks(
    State(gateway): State<Arc<Gateway>>,
    admitted: Admitted,
) -> Response {
    let raw = query_object(admitted.query.clone());
    let (caller, agent) = (&admitted.caller, &admitted.agent);
    run("ListTasks", &admitted, raw, |request: ListTasksRequest| {
        gateway.list_tasks(caller, agent, request)
    })
    .await
}

/// `GET /tasks/{id}`, and `GET /tasks/{id}:subscribe`.
pub(crate) async fn get_task(
    State(gateway): State<Arc<Gateway>>,
    admitted: Admitted,
    Path((_, task)): Path<(String, String)>,
) -> Response {
    if let Some(id) = task.strip_suffix(":subscribe") {
        return subscribe(&gateway, &admitted, id).await;
    }
    let mut raw = query_object(admitted.query.clone());
    raw.insert("id".to_owned(), Value::String(task));
    let (caller, agent) = (&admitted.caller, &admitted.agent);
    run("GetTask", &admitted, raw, |request: GetTaskRequest| {
        gateway.get_task(caller, agent, request)
    })
    .await
}

/// `POST /tasks/{id}:cancel` and `POST /tasks/{id}:subscribe` (the spec's GET, as clients
/// also send it).
pub(crate) async fn task_action(
    State(gateway): State<Arc<Gateway>>,
    admitted: Admitted,
    Path((_, task)): Path<(String, String)>,
    body: Body,
) -> Response {
    if let Some(id) = task.strip_suffix(":subscribe") {
        return subscribe(&gateway, &admitted, id).await;
    }
    // The method is known before the body is read: a POST to no method is 404 whatever it
    // carries.
    let Some(id) = task.strip_suffix(":cancel") else {
        return error(&GatewayError::MethodNotFound(format!("POST /tasks/{task}")));
    };
    let mut raw = match body_object(&gateway, &admitted.headers, body).await {
        Ok(raw) => raw,
        Err(refused) => return refused,
    };
    raw.insert("id".to_owned(), Value::String(id.to_owned()));
    let (caller, agent) = (&admitted.caller, &admitted.agent);
    run(
        "CancelTask",
        &admitted,
        raw,
        |request: CancelTaskRequest| gateway.cancel_task(caller, agent, request),
    )
    .await
}

/// `SubscribeToTask`: from `Last-Event-ID` when given, else from now.
async fn subscribe(gateway: &Arc<Gateway>, admitted: &Admitted, task: &str) -> Response {
    let method = "SubscribeToTask";
    let span = checks::request_span(
        BINDING,
        method,
        &admitted.agent,
        &admitted.caller,
        &admitted.headers,
    );
    let started = std::time::Instant::now();
    let opened = async {
        let start = checks::last_event(&admitted.headers)?.map_or(Start::Now, Start::After);
        gateway
            .subscribe(&admitted.caller, &admitted.agent, task, start)
            .await
    }
    .instrument(span.clone())
    .await;
    let _entered = span.enter();
    streamed(method, started, opened)
}

/// `POST /tasks/{id}/pushNotificationConfigs`.
pub(crate) async fn create_push_config(
    State(gateway): State<Arc<Gateway>>,
    admitted: Admitted,
    Path((_, task)): Path<(String, String)>,
    BodyObject(mut raw): BodyObject,
) -> Response {
    // The path names the task; a body naming another is overruled, not obeyed.
    raw.remove("task_id");
    raw.insert("taskId".to_owned(), Value::String(task));
    let (caller, agent) = (&admitted.caller, &admitted.agent);
    run(
        "CreateTaskPushNotificationConfig",
        &admitted,
        raw,
        |config: TaskPushNotificationConfig| gateway.create_push_config(caller, agent, config),
    )
    .await
}

/// `GET /tasks/{id}/pushNotificationConfigs`.
pub(crate) async fn list_push_configs(
    State(gateway): State<Arc<Gateway>>,
    admitted: Admitted,
    Path((_, task)): Path<(String, String)>,
) -> Response {
    let mut raw = query_object(admitted.query.clone());
    raw.insert("taskId".to_owned(), Value::String(task));
    let (caller, agent) = (&admitted.caller, &admitted.agent);
    run(
        "ListTaskPushNotificationConfigs",
        &admitted,
        raw,
        |request: ListTaskPushNotificationConfigsRequest| {
            gateway.list_push_configs(caller, agent, request)
        },
    )
    .await
}

/// `GET /tasks/{id}/pushNotificationConfigs/{configId}`.
pub(crate) async fn get_push_config(
    State(gateway): State<Arc<Gateway>>,
    admitted: Admitted,
    Path((_, task, config)): Path<(String, String, String)>,
) -> Response {
    let raw = config_params(task, config);
    let (caller, agent) = (&admitted.caller, &admitted.agent);
    run(
        "GetTaskPushNotificationConfig",
        &admitted,
        raw,
        |request: GetTaskPushNotificationConfigRequest| {
            gateway.get_push_config(caller, agent, request)
        },
    )
    .await
}

/// `DELETE /tasks/{id}/pushNotificationConfigs/{configId}`: `{}` when done (also when there
/// was no such config: deleting is idempotent).
pub(crate) async fn delete_push_config(
    State(gateway): State<Arc<Gateway>>,
    admitted: Admitted,
    Path((_, task, config)): Path<(String, String, String)>,
) -> Response {
    let raw = config_params(task, config);
    let (caller, agent) = (&admitted.caller, &admitted.agent);
    run(
        "DeleteTaskPushNotificationConfig",
        &admitted,
        raw,
        |request: DeleteTaskPushNotificationConfigRequest| async move {
            gateway.delete_push_config(caller, agent, request).await?;
            Ok(serde_json::json!({}))
        },
    )
    .await
}

fn config_params(task: String, config: String) -> Map<String, Value> {
    Map::from_iter([
        ("taskId".to_owned(), Value::String(task)),
        ("id".to_owned(), Value::String(config)),
    ])
}

/// `GET /extendedAgentCard`: none is configured.
pub(crate) async fn extended_card(_admitted: Admitted) -> Response {
    error(&GatewayError::ExtendedCardNotConfigured)
}

/// The HTTP status of a failure: its A2A error's (A2A v1.0, "HTTP+JSON error mapping"), the
/// fabric's own code for a refusal, and the transport's for a request that never reached a
/// method.
fn status(err: &GatewayError) -> StatusCode {
    let code = match err {
        GatewayError::TooLarge(_) => 413,
        GatewayError::SlowBody(_) => 408,
        GatewayError::UnknownAgent(_)
        | GatewayError::MethodNotFound(_)
        | GatewayError::NoPushConfig { .. } => 404,
        GatewayError::ContentType(_) => 415,
        GatewayError::NotCancelable { .. } => 409,
        GatewayError::TooManyStreams(_) => 429,
        GatewayError::Unavailable { .. } => 503,
        GatewayError::Refused(reply) if (400..600).contains(&reply.error.code) => reply.error.code,
        other => other.to_a2a().http_status_code(),
    };
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The `google.rpc.Code` name AIP-193 pairs with an HTTP status.
fn status_name(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 415 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        408 | 504 => "DEADLINE_EXCEEDED",
        409 => "ABORTED",
        410 => "FAILED_PRECONDITION",
        429 => "RESOURCE_EXHAUSTED",
        501 => "UNIMPLEMENTED",
        502 | 503 => "UNAVAILABLE",
        _ => "INTERNAL",
    }
}

/// The AIP-193 error body: code, status, message and the `ErrorInfo` details.
fn body(err: &GatewayError, status: StatusCode) -> Value {
    let details = err.to_jsonrpc().data.unwrap_or(Value::Array(Vec::new()));
    serde_json::json!({
        "error": {
            "code": status.as_u16(),
            "status": status_name(status),
            "message": err.to_string(),
            "details": details,
        }
    })
}

/// A failure as the REST answer.
fn error(err: &GatewayError) -> Response {
    let status = status(err);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body(err, status).to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_proto::{ErrorKind, ErrorReply};

    #[test]
    fn failures_get_their_http_status_and_an_aip_193_body() {
        let missing = GatewayError::TaskNotFound("t".to_owned());
        assert_eq!(status(&missing), StatusCode::NOT_FOUND);
        let json = body(&missing, status(&missing));
        assert_eq!(json["error"]["code"], 404);
        assert_eq!(json["error"]["status"], "NOT_FOUND");
        assert_eq!(json["error"]["details"][0]["reason"], "TASK_NOT_FOUND");
        assert_eq!(json["error"]["details"][0]["domain"], "a2a-protocol.org");
        let version = GatewayError::Version("99.0".to_owned());
        assert_eq!(status(&version), StatusCode::BAD_REQUEST);
        let limited = GatewayError::Refused(ErrorReply::new(ErrorKind::RateLimited, "slow down"));
        assert_eq!(status(&limited), StatusCode::TOO_MANY_REQUESTS);
        let ended = GatewayError::NotCancelable {
            task: "t".to_owned(),
            why: "completed".to_owned(),
        };
        assert_eq!(status(&ended), StatusCode::CONFLICT);
    }

    #[test]
    fn query_values_are_typed_as_the_params_take_them() {
        let query = HashMap::from([
            ("pageSize".to_owned(), "2".to_owned()),
            ("includeArtifacts".to_owned(), "false".to_owned()),
            ("contextId".to_owned(), "42".to_owned()),
            ("A2A-Version".to_owned(), "1.0".to_owned()),
        ]);
        let raw = query_object(query);
        assert_eq!(raw["pageSize"], 2);
        assert_eq!(raw["includeArtifacts"], false);
        assert_eq!(raw["contextId"], "42");
        assert!(!raw.contains_key("A2A-Version"));
    }
}
