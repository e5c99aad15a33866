//! The console's HTTP surface: the page (three embedded files) and the JSON API under `/api`.
//!
//! Every response carries a Content-Security-Policy without `unsafe-inline` and the other
//! hardening headers; a request for another `Host` is refused (421). Every `/api` route but
//! `login` needs the session cookie (HttpOnly, SameSite=Strict); every state-changing one also
//! needs the session's CSRF token in `X-CSRF-Token`, a JSON content type and, when the browser
//! says where it comes from, this same origin. The person a request acts as is the session's,
//! never a body field; the people service checks what that person may answer.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use switchboard_proto::audit::{AuditOp, HistoryRequest, ThreadRequest};
use switchboard_proto::people::ops::PeopleOpsOp;
use switchboard_request::request::request_json;
use switchboard_runtime::people_book::Access;
use uuid::Uuid;

use crate::Console;
use crate::auth::{COOKIE, body, cookie, cross_site};
use crate::error::ApiError;
use crate::store::Signed;

/// The page's three files, compiled in: nothing is fetched from elsewhere.
const INDEX: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");

/// The page may load its own script and style and talk to its own origin, nothing else.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                       connect-src 'self'; img-src 'self'; base-uri 'none'; \
                       form-action 'self'; frame-ancestors 'none'";
/// Largest request body.
const MAX_BODY: usize = 256 * 1024;
/// Requests to the fabric wait this long.
const FABRIC_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The router.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { page(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/app.js",
            get(|| async { page(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/app.css",
            get(|| async { page(APP_CSS, "text/css; charset=utf-8") }),
        )
        // Browsers ask for an icon; an empty answer keeps their consoles quiet.
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/api/login", post(login))
        .route("/api/logout", post(logout))
        .route("/api/me", get(me))
        .route("/api/map", get(map))
        .route("/api/events", get(crate::live::events))
        .route("/api/thread", get(thread))
        .route("/api/inbox", get(inbox))
        .route("/api/items/{id}", get(item))
        .route("/api/items/{id}/answer", post(answer))
        .route("/api/dlq", get(dead_letters))
        .route("/api/dlq/{seq}/redrive", post(redrive))
        .route("/api/dlq/{seq}/discard", post(discard))
        .route("/api/tasks", get(crate::steer::tasks))
        .route("/api/tasks/{id}/tree", get(crate::steer::tree))
        .route("/api/tasks/{id}/cancel", post(crate::steer::cancel))
        .route(
            "/api/talk",
            get(crate::steer::heard).post(crate::steer::speak),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&console),
            guard,
        ))
        .with_state(console)
}

fn page(body: &'static str, content_type: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Host check and hardening headers on every response.
async fn guard(State(console): State<Arc<Console>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut response = if console.host_allowed(&host) {
        next.run(request).await
    } else {
        ApiError::MisdirectedHost(host.chars().take(80).collect()).into_response()
    };
    let headers = response.headers_mut();
    for (name, value) in [
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cache-control", "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

impl Console {
    pub(crate) async fn fabric<T: serde::Serialize>(
        &self,
        subject: &str,
        body: &T,
    ) -> Result<Value, ApiError> {
        Ok(request_json(&self.client, subject, body, FABRIC_WAIT).await?)
    }
}

fn who(signed: &Signed, console: &Console) -> Value {
    json!({
        "person": format!("person:{}", signed.person.id),
        "name": signed.person.name,
        "access": signed.person.access,
        "roles": signed.person.roles.iter().map(|r| format!("role:{r}")).collect::<Vec<_>>(),
        "csrf": signed.session.csrf,
        "trace_url_template": console.config.trace_url_template,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    token: String,
}

async fn login(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, ApiError> {
    cross_site(&headers)?;
    let body: Login = body(&bytes)?;
    let (value, signed) = console
        .sessions
        .sign_in(&body.token)
        .ok_or(ApiError::SignIn)?;
    let secure = if console.config.allowed_hosts.is_empty() {
        ""
    } else {
        "; Secure"
    };
    let cookie = format!("{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/{secure}");
    let mut response = Json(who(&signed, &console)).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    Ok(response)
}

async fn logout(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    console.signed(&headers, &method)?;
    if let Some(value) = cookie(&headers) {
        console.sessions.sign_out(&value);
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("sb_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    Ok(response)
}

/// Who is signed in: `{"person": null}` when nobody is (the page then shows the sign-in).
async fn me(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    match console.signed(&headers, &method) {
        Ok(signed) => Ok(Json(who(&signed, &console))),
        Err(ApiError::SignIn) => Ok(Json(json!({"person": null}))),
        Err(err) => Err(err),
    }
}

/// Agents with their status and live goals, and who talked to whom in the last 5 minutes.
async fn map(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    console.needs(&signed, Access::Viewer)?;
    let agents: Vec<Value> = console.registry.with(|snapshot| {
        snapshot
            .records_after(None)
            .map(|(record, _)| {
                let id = record.card.agent_id.as_str();
                json!({
                    "id": id,
                    "status": record.status,
                    "description": record.card.description,
                    "live_goals": snapshot.has_goal(id),
                    "current_tasks": record.current_tasks.len(),
                    "last_heartbeat": switchboard_proto::timestamp::format(record.last_heartbeat),
                })
            })
            .collect()
    });
    let since = switchboard_proto::timestamp::now() - time::Duration::minutes(5);
    let history = HistoryRequest {
        since: Some(since),
        limit: Some(switchboard_proto::audit::HISTORY_LIMIT_MAX),
        ..HistoryRequest::default()
    };
    let mut edges: std::collections::BTreeMap<(String, String), u64> = Default::default();
    // The map still shows the agents when the audit does not answer.
    if let Ok(page) = console.fabric(&AuditOp::History.subject(), &history).await {
        for record in page["records"].as_array().into_iter().flatten() {
            let record = record.get("record").unwrap_or(record);
            let (Some(from), Some(to)) =
                (record["from_agent"].as_str(), record["to_agent"].as_str())
            else {
                continue;
            };
            if from != to {
                *edges.entry((from.to_owned(), to.to_owned())).or_default() += 1;
            }
        }
    }
    let edges: Vec<Value> = edges
        .into_iter()
        .map(|((from, to), count)| json!({"from": from, "to": to, "count": count}))
        .collect();
    Ok(Json(json!({"agents": agents, "edges": edges})))
}

#[derive(Deserialize)]
struct ThreadQuery {
    id: Uuid,
    /// Which id it is (`call`, `task`, `message`), as the first page said; absent: try each.
    #[serde(default)]
    by: Option<String>,
    /// The previous page's `next_cursor`.
    #[serde(default)]
    cursor: Option<u64>,
}

/// A conversation by any of its ids (a call, a message, a task, an item addressed to a
/// person), oldest first, one page at a time (`next_cursor` and `by` fetch the next).
async fn thread(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
    Query(query): Query<ThreadQuery>,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    console.needs(&signed, Access::Viewer)?;
    let subject = AuditOp::Thread.subject();
    let request = |by: &str| {
        let mut request = ThreadRequest {
            cursor: query.cursor,
            ..ThreadRequest::default()
        };
        match by {
            "call" => request.correlation_id = Some(query.id),
            "task" => request.task_id = Some(query.id),
            _ => request.message_id = Some(query.id),
        }
        request
    };
    let kinds: &[&str] = match query.by.as_deref() {
        Some("call") => &["call"],
        Some("task") => &["task"],
        Some("message") => &["message"],
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "by must be call, task or message, not `{}`",
                other.chars().take(40).collect::<String>()
            )));
        }
        None => &["call", "task", "message"],
    };
    for by in kinds {
        let mut found = console.fabric(&subject, &request(by)).await?;
        if found["records"].as_array().is_some_and(|r| !r.is_empty()) {
            found["by"] = json!(by);
            return Ok(Json(found));
        }
    }
    Ok(Json(json!({"records": []})))
}

#[derive(Deserialize)]
struct InboxParams {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    after: Option<usize>,
}

/// The signed-in person's inbox.
async fn inbox(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
    Query(params): Query<InboxParams>,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    let state = match params.state.as_deref() {
        Some("done") => "done",
        _ => "open",
    };
    let body = json!({"person": signed.person.id.as_str(), "state": state,
        "after": params.after, "limit": 50});
    Ok(Json(
        console.fabric(&PeopleOpsOp::Inbox.subject(), &body).await?,
    ))
}

async fn item(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<Uuid>,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    let body = json!({"person": signed.person.id.as_str(), "item_id": id});
    Ok(Json(
        console.fabric(&PeopleOpsOp::Item.subject(), &body).await?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerBody {
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    decision: Option<String>,
    #[serde(default)]
    action_hash: Option<String>,
}

/// Answers as the signed-in person: the people service checks they may.
async fn answer(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<Uuid>,
    bytes: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    let body: AnswerBody = body(&bytes)?;
    let mut request = json!({"person": signed.person.id.as_str(), "item_id": id});
    for (key, value) in [
        ("message", body.message),
        ("decision", body.decision),
        ("action_hash", body.action_hash),
    ] {
        if let Some(value) = value {
            request[key] = json!(value);
        }
    }
    Ok(Json(
        console
            .fabric(&PeopleOpsOp::Answer.subject(), &request)
            .await?,
    ))
}

async fn dead_letters(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    console.needs(&signed, Access::Viewer)?;
    let letters = switchboard_client::dlq_list(&console.client, 100).await?;
    Ok(Json(json!({"letters": letters})))
}

async fn redrive(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
    Path(seq): Path<u64>,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    console.needs(&signed, Access::Operator)?;
    let replayed = switchboard_client::dlq_replay(&console.client, seq).await?;
    tracing::info!(person = %signed.person.id, seq, "dead letter redriven from the console");
    Ok(Json(json!(replayed)))
}

/// Discards a dead letter for good (operator).
async fn discard(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
    Path(seq): Path<u64>,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    console.needs(&signed, Access::Operator)?;
    let discarded = switchboard_client::dlq_discard(&console.client, seq).await?;
    tracing::info!(person = %signed.person.id, seq, discarded, "dead letter discarded from the console");
    Ok(Json(json!({"seq": seq, "discarded": discarded})))
}
