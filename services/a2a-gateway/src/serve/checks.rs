//! What every A2A request passes before a method runs, in both bindings: the bearer token,
//! the body's size and content type, the `A2A-Version`, the agent named in the path; the
//! request's span (continuing the client's W3C trace) and its metrics point; and the error
//! answers for requests that reach no method.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use switchboard_proto::AgentId;

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::serve::auth::{self, Refusal};

/// How long a request body may take to arrive (a trickled body holds a connection).
const BODY_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) fn not_found(message: &str) -> Response {
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
    let Some(id) = agent_id(agent) else {
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
    let method = served_method(method);
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
            out.insert(name, switchboard_request::headers::safe_value(value));
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

/// The method name a span or a metric may carry: one of the A2A methods, else `unknown`.
/// Only the methods the gateway serves become a span name or a label: a client's made-up
/// method (with line breaks, or a new one per request) must not mint a span name or a time
/// series (issue 37).
pub(crate) fn served_method(method: &str) -> &str {
    if a2a::methods::is_valid(method) {
        method
    } else {
        "unknown"
    }
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
    let method = served_method(method);
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
pub(crate) fn http_error(status: StatusCode, name: &str, message: &str) -> String {
    serde_json::json!({"error": {"code": status.as_u16(), "status": name, "message": message}})
        .to_string()
}

/// The agent a path names, if the gateway serves it: a valid agent id that is not a client
/// agent (`a2a-…`), so one client can never address another or pose as one.
pub fn agent_id(id: &str) -> Option<AgentId> {
    if id.starts_with(crate::gateway::CLIENT_PREFIX) {
        return None;
    }
    AgentId::parse(id).ok()
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
}
