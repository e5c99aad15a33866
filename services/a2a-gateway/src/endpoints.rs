//! The HTTP surface: agent cards (GET) and JSON-RPC 2.0 (POST `/agents/<agent_id>`), with the
//! checks every request passes before a method runs: the bearer token, the body's size and
//! content type, the `A2A-Version`, the JSON-RPC envelope, the agent named in the path.
//!
//! A JSON-RPC failure is answered with the spec's code (`error.rs`); the HTTP status is 200
//! for method errors, as JSON-RPC has it, and 401/404/413/415 when the request never reached
//! a method.

use std::sync::Arc;

use a2a::{
    CancelTaskRequest, DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest, GetTaskRequest, JsonRpcId, JsonRpcResponse,
    ListTaskPushNotificationConfigsRequest, ListTasksRequest, SendMessageRequest,
    SubscribeToTaskRequest, TaskPushNotificationConfig, methods,
};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use serde_json::Value;
use switchboard_proto::AgentId;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::auth::{self, Refusal};
use crate::cards;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::messages::CalledStream;
use crate::params::params;
use crate::stream::{Item, Start, Subscription};

/// The protocol version the gateway speaks.
pub const VERSION: &str = "1.0";

/// How long a request body may take to arrive (a trickled body holds a connection).
const BODY_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a client may cache a card, in seconds.
const CARD_MAX_AGE_SECS: u32 = 60;

/// The gateway's routes.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/.well-known/agent-card.json", get(default_card))
        .route(
            "/agents/{agent_id}/.well-known/agent-card.json",
            get(agent_card),
        )
        .route("/agents/{agent_id}", post(json_rpc))
        // The interface URL with a trailing slash is the same endpoint (the A2A conformance
        // kit posts there).
        .route("/agents/{agent_id}/", post(json_rpc))
        .fallback(no_route)
        .with_state(gateway)
}

/// Anything the gateway does not serve: 404 with a body that says what it does serve (an
/// empty 404 leaves a client guessing).
async fn no_route() -> Response {
    not_found(
        "not served here: A2A JSON-RPC is POST /agents/<agent_id>, its card GET \
         /agents/<agent_id>/.well-known/agent-card.json",
    )
}

async fn default_card(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let agent = gateway.config().default_agent.clone();
    if agent.is_empty() {
        return not_found(
            "no default agent is configured; cards are at /agents/<agent_id>/.well-known/agent-card.json",
        );
    }
    card_response(&gateway, &agent, &headers).await
}

async fn agent_card(
    State(gateway): State<Arc<Gateway>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> Response {
    card_response(&gateway, &agent, &headers).await
}

async fn card_response(gateway: &Gateway, agent: &str, headers: &HeaderMap) -> Response {
    let Some(id) = cards::agent_id(agent) else {
        return not_found("not an agent id");
    };
    let record = match gateway.store.agent(&id).await {
        Ok(Some(record)) => record,
        Ok(None) => return not_found(&format!("no agent `{id}` is registered")),
        Err(err) => {
            return (StatusCode::SERVICE_UNAVAILABLE, err.to_string()).into_response();
        }
    };
    let card = cards::card(&record, gateway.config());
    let json = serde_json::to_vec(&card).unwrap_or_default();
    let etag = cards::etag(&json);
    let cache = format!("public, max-age={CARD_MAX_AGE_SECS}");
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|seen| seen.split(',').any(|tag| tag.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, "application/json")], json).into_response()
    };
    let out = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&etag) {
        out.insert(header::ETAG, value);
    }
    if let Ok(value) = HeaderValue::from_str(&cache) {
        out.insert(header::CACHE_CONTROL, value);
    }
    // No earlier than the card's last change: an online agent's card changes only when it
    // registers or comes back (its latest register or heartbeat); an offline one's changed
    // when the directory marked it, which the record does not date.
    let modified = match record.status {
        switchboard_proto::registry::AgentStatus::Offline => time::OffsetDateTime::now_utc(),
        _ => record.last_heartbeat,
    };
    if let Some(value) = http_date(modified).and_then(|date| HeaderValue::from_str(&date).ok()) {
        out.insert(header::LAST_MODIFIED, value);
    }
    response
}

/// `at` as an HTTP date (IMF-fixdate, RFC 9110: `Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date(at: time::OffsetDateTime) -> Option<String> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    at.to_offset(time::UtcOffset::UTC).format(&format).ok()
}

fn not_found(message: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({"error": message}).to_string(),
    )
        .into_response()
}

/// The query string's `A2A-Version` (the spec allows it there as well as in a header).
#[derive(Debug, serde::Deserialize)]
struct VersionQuery {
    #[serde(rename = "A2A-Version")]
    version: Option<String>,
}

async fn json_rpc(
    State(gateway): State<Arc<Gateway>>,
    Path(agent): Path<String>,
    Query(query): Query<VersionQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // An Authorization header that is not text is a wrong token, never "no token".
    let caller = match headers
        .get(header::AUTHORIZATION)
        .map(|value| value.to_str())
    {
        Some(Err(_)) => Err(Refusal::Unknown),
        Some(Ok(value)) => auth::caller(gateway.config(), Some(value)),
        None => auth::caller(gateway.config(), None),
    };
    let caller = match caller {
        Ok(caller) => caller,
        Err(refusal) => return unauthorized(refusal),
    };
    let limit = gateway.config().max_body_bytes;
    let read = tokio::time::timeout(BODY_WITHIN, axum::body::to_bytes(body, limit)).await;
    let Ok(read) = read else {
        let err = GatewayError::SlowBody(BODY_WITHIN.as_secs());
        return rpc_error(StatusCode::REQUEST_TIMEOUT, JsonRpcId::Null, &err);
    };
    let Ok(bytes) = read else {
        return rpc_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            JsonRpcId::Null,
            &GatewayError::TooLarge(limit),
        );
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case("application/json")
        && !media.eq_ignore_ascii_case("application/a2a+json")
    {
        let err = GatewayError::ContentType(if media.is_empty() {
            "none".to_owned()
        } else {
            media.to_owned()
        });
        return rpc_error(StatusCode::UNSUPPORTED_MEDIA_TYPE, JsonRpcId::Null, &err);
    }
    let (id, method, params) = match envelope(&bytes) {
        Ok(parts) => parts,
        Err((id, err)) => return rpc_error(StatusCode::OK, id, &err),
    };
    let version = headers
        .get("A2A-Version")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
        .or(query.version)
        .unwrap_or_default();
    if !supported(&version) {
        let shown = if version.trim().is_empty() {
            "0.3 (none given)".to_owned()
        } else {
            version
        };
        return rpc_error(StatusCode::OK, id, &GatewayError::Version(shown));
    }
    let Some(agent) = cards::agent_id(&agent) else {
        return rpc_error(
            StatusCode::NOT_FOUND,
            id,
            &GatewayError::UnknownAgent(agent),
        );
    };
    match gateway.store.agent(&agent).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return rpc_error(
                StatusCode::NOT_FOUND,
                id,
                &GatewayError::UnknownAgent(agent.to_string()),
            );
        }
        Err(err) => return rpc_error(StatusCode::OK, id, &err),
    }
    let last_event = match headers.get("Last-Event-ID").map(|value| value.to_str()) {
        None => None,
        Some(Ok(text)) => match text.trim().parse::<u32>() {
            Ok(seq) => Some(seq),
            Err(_) => {
                let err = GatewayError::BadLastEvent(text.to_owned());
                return rpc_error(StatusCode::OK, id, &err);
            }
        },
        Some(Err(_)) => {
            let err = GatewayError::BadLastEvent("(not text)".to_owned());
            return rpc_error(StatusCode::OK, id, &err);
        }
    };
    // The request's span continues the client's W3C trace (`traceparent`/`tracestate` over
    // HTTP); every NATS request made under it carries the trace on to the services.
    let span = tracing::info_span!(
        "a2a",
        otel.name = %format!("a2a-gateway.{method}"),
        otel.kind = "server",
        rpc.system = "jsonrpc",
        rpc.method = %method,
        switchboard.service = crate::SPEC.name,
        switchboard.agent_id = %agent,
        switchboard.client = %caller,
        otel.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    switchboard_runtime::telemetry::set_parent_from(&span, Some(&trace_headers(&headers)));
    dispatch(&gateway, &caller, &agent, id, &method, params, last_event)
        .instrument(span)
        .await
}

/// The W3C trace context of an HTTP request, as the NATS headers the telemetry reads it from
/// (each value made safe: at most a header's worth of printable text).
fn trace_headers(headers: &HeaderMap) -> async_nats::HeaderMap {
    let mut out = async_nats::HeaderMap::new();
    for name in [
        switchboard_proto::HEADER_TRACEPARENT,
        switchboard_proto::HEADER_TRACESTATE,
    ] {
        if let Some(value) = headers.get(name).and_then(|value| value.to_str().ok()) {
            out.insert(name, switchboard_runtime::headers::safe_value(value));
        }
    }
    out
}

/// Whether `version` is one the gateway speaks: 1.x. Empty means 0.3 (the spec's rule).
fn supported(version: &str) -> bool {
    let version = version.trim();
    version == "1"
        || version
            .strip_prefix("1.")
            .is_some_and(|minor| minor.parse::<u32>().is_ok())
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
            return match params::<SendMessageRequest>(raw) {
                Ok(request) => send_streaming(gateway, caller, agent, id, request).await,
                Err(err) => rpc_error(StatusCode::OK, id, &err),
            };
        }
        methods::SUBSCRIBE_TO_TASK => {
            let start = last_event.map_or(Start::Now, Start::After);
            return subscribe(gateway, caller, agent, id, raw, start).await;
        }
        methods::GET_EXTENDED_AGENT_CARD => Err(GatewayError::ExtendedCardNotConfigured),
        other => Err(GatewayError::MethodNotFound(other.to_owned())),
    };
    record(method, started, result.as_ref().err());
    match result {
        Ok(value) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&JsonRpcResponse::success(id, value)).unwrap_or_default(),
        )
            .into_response(),
        Err(err) => rpc_error(StatusCode::OK, id, &err),
    }
}

/// One point of `messaging.process.duration` for a JSON-RPC request answered at once, and
/// the request span's status when it failed (`error.type` = the A2A error reason).
fn record(method: &str, started: std::time::Instant, err: Option<&GatewayError>) {
    use switchboard_runtime::telemetry::metrics;
    // Only the methods the gateway serves become a label: a client's made-up method name
    // must not mint a time series.
    let method = match err {
        Some(GatewayError::MethodNotFound(_)) => "unknown",
        _ => method,
    };
    let mut attributes = vec![
        metrics::service(crate::SPEC.name),
        metrics::KeyValue::new("rpc.system", "jsonrpc"),
        metrics::KeyValue::new("rpc.method", method.to_owned()),
    ];
    if let Some(err) = err {
        let reason = a2a::error_reason(err.to_a2a().code);
        let span = tracing::Span::current();
        span.record("otel.status_code", "ERROR");
        span.record("error.type", reason);
        attributes.push(metrics::KeyValue::new("error.type", reason));
    }
    metrics::instruments()
        .process_duration
        .record(started.elapsed().as_secs_f64(), &attributes);
}

/// `SubscribeToTask`: a stream slot, then the task's stream from `start`.
async fn subscribe(
    gateway: &Arc<Gateway>,
    caller: &AgentId,
    agent: &AgentId,
    id: JsonRpcId,
    raw: Value,
    start: Start,
) -> Response {
    let opened = params::<SubscribeToTaskRequest>(raw)
        .and_then(|request| crate::tasks::task_id(&request.id))
        .and_then(|task_id| Ok((task_id, gateway.open_stream(caller)?)));
    match opened {
        Ok((task_id, slot)) => {
            let subscription = Subscription {
                task_id,
                start,
                slot,
                live: None,
            };
            stream(gateway, caller, agent, id, subscription).await
        }
        Err(err) => rpc_error(StatusCode::OK, id, &err),
    }
}

/// `SendStreamingMessage`: the stream's slot first (a client at its cap makes no task it
/// cannot follow), then the task, then its stream.
async fn send_streaming(
    gateway: &Arc<Gateway>,
    caller: &AgentId,
    agent: &AgentId,
    id: JsonRpcId,
    request: SendMessageRequest,
) -> Response {
    let slot = match gateway.open_stream(caller) {
        Ok(slot) => slot,
        Err(err) => return rpc_error(StatusCode::OK, id, &err),
    };
    if gateway.as_call(agent, &request).await {
        match gateway.call_streamed(caller, agent, &request).await {
            Ok(CalledStream::Items(items)) => return sse(id, items),
            Ok(CalledStream::Task) => {}
            Err(err) => return rpc_error(StatusCode::OK, id, &err),
        }
    }
    // Followed from where the message took effect, not from "now": a task that finished
    // before the stream opened still streams every event.
    match gateway.submit(caller, agent, &request).await {
        Ok(submitted) => {
            let start = match submitted.after {
                Some(after) => Start::After(after),
                None => Start::Beginning,
            };
            let subscription = Subscription {
                task_id: submitted.id,
                start,
                slot,
                live: Some(submitted.live),
            };
            stream(gateway, caller, agent, id, subscription).await
        }
        Err(err) => rpc_error(StatusCode::OK, id, &err),
    }
}

async fn stream(
    gateway: &Arc<Gateway>,
    caller: &AgentId,
    agent: &AgentId,
    id: JsonRpcId,
    subscription: Subscription,
) -> Response {
    match gateway.follow(caller, agent, subscription).await {
        Ok(items) => sse(id, items),
        Err(err) => rpc_error(StatusCode::OK, id, &err),
    }
}

/// The items as SSE: each a JSON-RPC response carrying a `StreamResponse`, its `id` the
/// event's number within its task (none on a result artifact); a failure mid-stream is the last
/// item, a JSON-RPC error.
fn sse(id: JsonRpcId, mut items: mpsc::Receiver<Result<Item, GatewayError>>) -> Response {
    let events = futures::stream::poll_fn(move |cx| items.poll_recv(cx)).map(move |item| {
        let event = match item {
            Ok(Item { seq, response }) => {
                let result = serde_json::to_value(&response).unwrap_or_default();
                let event = match seq {
                    Some(seq) => Event::default().id(seq.to_string()),
                    // No id: the client's last id stays the event before (see `Item`).
                    None => Event::default(),
                };
                event.data(
                    serde_json::to_string(&JsonRpcResponse::success(id.clone(), result))
                        .unwrap_or_default(),
                )
            }
            Err(err) => Event::default().data(
                serde_json::to_string(&JsonRpcResponse::error(id.clone(), err.to_jsonrpc()))
                    .unwrap_or_default(),
            ),
        };
        Ok::<_, std::convert::Infallible>(event)
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

use futures::StreamExt as _;

fn rpc_error(status: StatusCode, id: JsonRpcId, err: &GatewayError) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&JsonRpcResponse::error(id, err.to_jsonrpc())).unwrap_or_default(),
    )
        .into_response()
}

fn unauthorized(refusal: Refusal) -> Response {
    let message = match refusal {
        Refusal::Missing => "a bearer token is required (Authorization: Bearer <token>)",
        Refusal::Unknown => "the bearer token is not one this gateway knows",
    };
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::WWW_AUTHENTICATE, "Bearer"),
            (header::CONTENT_TYPE, "application/json"),
        ],
        serde_json::json!({"error": message}).to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_one_point_anything_are_spoken_and_none_means_0_3() {
        assert!(supported("1.0"));
        assert!(supported("1"));
        assert!(supported("1.1"));
        assert!(!supported(""));
        assert!(!supported("0.3"));
        assert!(!supported("2.0"));
        assert!(!supported("1.x"));
    }

    #[test]
    fn last_modified_is_an_imf_fixdate() {
        let at = time::macros::datetime!(1994-11-06 08:49:37 +02:00);
        assert_eq!(
            http_date(at).as_deref(),
            Some("Sun, 06 Nov 1994 06:49:37 GMT")
        );
    }

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
