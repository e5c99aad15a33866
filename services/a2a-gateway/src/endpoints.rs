//! The HTTP surface: agent cards (GET) and the two A2A bindings on one interface URL per
//! agent, `/agents/<agent_id>`: JSON-RPC 2.0 (`jsonrpc.rs`, POST to the URL) and HTTP+JSON
//! (`rest.rs`, the A2A v1.0 REST paths under it). What every request passes before a method
//! runs is here: the bearer token, the body's size and content type, the `A2A-Version`, the
//! agent named in the path; and the SSE framing both bindings stream with.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt as _;
use switchboard_proto::AgentId;
use tokio::sync::mpsc;

use crate::auth::{self, Refusal};
use crate::cards;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::stream::Item;

/// The protocol version the gateway speaks.
pub const VERSION: &str = "1.0";

/// How long a request body may take to arrive (a trickled body holds a connection).
const BODY_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a client may cache a card, in seconds.
const CARD_MAX_AGE_SECS: u32 = 60;

/// The gateway's routes.
pub fn router(gateway: Arc<Gateway>) -> Router {
    use crate::{jsonrpc, rest};
    Router::new()
        .route("/.well-known/agent-card.json", get(default_card))
        .route(
            "/agents/{agent_id}/.well-known/agent-card.json",
            get(agent_card),
        )
        .route("/agents/{agent_id}", post(jsonrpc::json_rpc))
        // The interface URL with a trailing slash is the same endpoint (the A2A conformance
        // kit posts there).
        .route("/agents/{agent_id}/", post(jsonrpc::json_rpc))
        .route("/agents/{agent_id}/message:send", post(rest::send_message))
        .route(
            "/agents/{agent_id}/message:stream",
            post(rest::send_streaming),
        )
        .route("/agents/{agent_id}/tasks", get(rest::list_tasks))
        .route(
            "/agents/{agent_id}/tasks/{task}",
            get(rest::get_task).post(rest::task_action),
        )
        .route(
            "/agents/{agent_id}/tasks/{task}/pushNotificationConfigs",
            get(rest::list_push_configs).post(rest::create_push_config),
        )
        .route(
            "/agents/{agent_id}/tasks/{task}/pushNotificationConfigs/{config}",
            get(rest::get_push_config).delete(rest::delete_push_config),
        )
        .route(
            "/agents/{agent_id}/extendedAgentCard",
            get(rest::extended_card),
        )
        .fallback(no_route)
        .with_state(gateway)
}

/// Anything the gateway does not serve: 404 with a body that says what it does serve (an
/// empty 404 leaves a client guessing).
async fn no_route() -> Response {
    not_found(
        "not served here: an agent's A2A interface is /agents/<agent_id> (JSON-RPC: POST to it; \
         HTTP+JSON: the A2A REST paths under it), its card GET \
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
        http_error(StatusCode::NOT_FOUND, "NOT_FOUND", message),
    )
        .into_response()
}

/// The caller the `Authorization` header names; a header that is not text is a wrong token,
/// never "no token". A refusal is answered with [`unauthorized`].
pub(crate) fn caller(gateway: &Gateway, headers: &HeaderMap) -> Result<AgentId, Refusal> {
    match headers
        .get(header::AUTHORIZATION)
        .map(|value| value.to_str())
    {
        Some(Err(_)) => Err(Refusal::Unknown),
        Some(Ok(value)) => auth::caller(gateway.config(), Some(value)),
        None => auth::caller(gateway.config(), None),
    }
}

/// The request body, read within [`BODY_WITHIN`] and `max_body_bytes`; on failure the HTTP
/// status to answer with.
pub(crate) async fn read_body(
    gateway: &Gateway,
    body: Body,
) -> Result<Bytes, (StatusCode, GatewayError)> {
    let limit = gateway.config().max_body_bytes;
    match tokio::time::timeout(BODY_WITHIN, axum::body::to_bytes(body, limit)).await {
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            GatewayError::SlowBody(BODY_WITHIN.as_secs()),
        )),
        Ok(Err(_)) => Err((StatusCode::PAYLOAD_TOO_LARGE, GatewayError::TooLarge(limit))),
        Ok(Ok(bytes)) => Ok(bytes),
    }
}

/// The body must be JSON (`application/json` or `application/a2a+json`).
pub(crate) fn json_content(headers: &HeaderMap) -> Result<(), GatewayError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    if media.eq_ignore_ascii_case("application/json")
        || media.eq_ignore_ascii_case("application/a2a+json")
    {
        return Ok(());
    }
    Err(GatewayError::ContentType(if media.is_empty() {
        "none".to_owned()
    } else {
        media.to_owned()
    }))
}

/// The `A2A-Version` the request speaks (header, else the query's), which must be 1.x.
pub(crate) fn version(headers: &HeaderMap, query: Option<&str>) -> Result<(), GatewayError> {
    let version = headers
        .get("A2A-Version")
        .and_then(|value| value.to_str().ok())
        .or(query)
        .unwrap_or_default();
    if supported(version) {
        return Ok(());
    }
    Err(GatewayError::Version(if version.trim().is_empty() {
        "0.3 (none given)".to_owned()
    } else {
        version.to_owned()
    }))
}

/// The agent the path names, which must be registered; on failure the HTTP status too.
pub(crate) async fn agent(
    gateway: &Gateway,
    agent: &str,
) -> Result<AgentId, (StatusCode, GatewayError)> {
    let Some(id) = cards::agent_id(agent) else {
        return Err((
            StatusCode::NOT_FOUND,
            GatewayError::UnknownAgent(agent.to_owned()),
        ));
    };
    match gateway.store.agent(&id).await {
        Ok(Some(_)) => Ok(id),
        Ok(None) => Err((
            StatusCode::NOT_FOUND,
            GatewayError::UnknownAgent(id.to_string()),
        )),
        Err(err) => Err((StatusCode::OK, err)),
    }
}

/// The stream position a `Last-Event-ID` header names, if any.
pub(crate) fn last_event(headers: &HeaderMap) -> Result<Option<u32>, GatewayError> {
    match headers.get("Last-Event-ID").map(|value| value.to_str()) {
        None => Ok(None),
        Some(Ok(text)) => text
            .trim()
            .parse::<u32>()
            .map(Some)
            .map_err(|_| GatewayError::BadLastEvent(text.to_owned())),
        Some(Err(_)) => Err(GatewayError::BadLastEvent("(not text)".to_owned())),
    }
}

/// The span of one A2A request: it continues the client's W3C trace (`traceparent` and
/// `tracestate` over HTTP), so every NATS request made under it carries the trace on.
pub(crate) fn request_span(
    binding: &'static str,
    method: &str,
    agent: &AgentId,
    caller: &AgentId,
    headers: &HeaderMap,
) -> tracing::Span {
    let span = tracing::info_span!(
        "a2a",
        otel.name = %format!("a2a-gateway.{method}"),
        otel.kind = "server",
        rpc.system = binding,
        rpc.method = %method,
        switchboard.service = crate::SPEC.name,
        switchboard.agent_id = %agent,
        switchboard.client = %caller,
        otel.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    switchboard_runtime::telemetry::set_parent_from(&span, Some(&trace_headers(headers)));
    span
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

/// One point of `messaging.process.duration` for a JSON-RPC request answered at once, and
/// the request span's status when it failed (`error.type` = the A2A error reason).
pub(crate) fn record(
    binding: &'static str,
    method: &str,
    started: std::time::Instant,
    err: Option<&GatewayError>,
) {
    use switchboard_runtime::telemetry::metrics;
    // Only the methods the gateway serves become a label: a client's made-up method name
    // must not mint a time series.
    let method = match err {
        Some(GatewayError::MethodNotFound(_)) => "unknown",
        _ => method,
    };
    let mut attributes = vec![
        metrics::service(crate::SPEC.name),
        metrics::KeyValue::new("rpc.system", binding),
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

/// The items as SSE, each `data` line what `frame` makes of an item (a JSON-RPC response
/// for JSON-RPC, the bare `StreamResponse` for HTTP+JSON). An item's `id` is the event's
/// number within its task (none on an artifact or a call's answer); a failure mid-stream is
/// the last item.
pub(crate) fn sse(
    mut items: mpsc::Receiver<Result<Item, GatewayError>>,
    frame: impl Fn(Result<&a2a::StreamResponse, &GatewayError>) -> String + Send + 'static,
) -> Response {
    let events = futures::stream::poll_fn(move |cx| items.poll_recv(cx)).map(move |item| {
        let event = match &item {
            Ok(Item { seq: Some(seq), .. }) => Event::default().id(seq.to_string()),
            // No id: the client's last id stays the event before (see `Item`).
            _ => Event::default(),
        };
        let data = frame(item.as_ref().map(|item| &item.response));
        Ok::<_, std::convert::Infallible>(event.data(data))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// 401 with `WWW-Authenticate: Bearer`: no token, or one the gateway does not know.
pub(crate) fn unauthorized(refusal: Refusal) -> Response {
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
        http_error(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", message),
    )
        .into_response()
}

/// An error body of a request that reached no method, in the AIP-193 shape the HTTP+JSON
/// binding answers with (`{"error": {"code", "status", "message"}}`).
fn http_error(status: StatusCode, name: &str, message: &str) -> String {
    serde_json::json!({"error": {"code": status.as_u16(), "status": name, "message": message}})
        .to_string()
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
}
