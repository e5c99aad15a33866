//! The routes people steer the fabric with: task trees and their cancel (`operator`), and
//! talking to an agent (`operator`, see `talk.rs`). Reading needs `viewer`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method};
use serde::Deserialize;
use serde_json::Value;
use switchboard_proto::AgentId;
use switchboard_proto::message::TaskState;
use switchboard_proto::task::ListRole;
use switchboard_proto::task::ops::{OpsCancel, OpsListTasks, TaskOpsOp, TreeQuery};
use switchboard_runtime::people_book::Access;
use uuid::Uuid;

use crate::Console;
use crate::auth::body;
use crate::error::ApiError;
use crate::talk::{Mode, check_input};

#[derive(Deserialize)]
pub(crate) struct TaskParams {
    agent: String,
    #[serde(default)]
    state: Option<TaskState>,
    #[serde(default)]
    cursor: Option<Uuid>,
}

/// One agent's tasks, newest first (a page of 50).
pub(crate) async fn tasks(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
    Query(params): Query<TaskParams>,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    console.needs(&signed, Access::Viewer)?;
    let agent = AgentId::parse(params.agent.trim())
        .map_err(|err| ApiError::BadRequest(format!("agent: {err}")))?;
    let request = OpsListTasks {
        agent,
        role: ListRole::Any,
        state: params.state,
        limit: Some(50),
        cursor: params.cursor,
    };
    Ok(Json(
        console.fabric(&TaskOpsOp::List.subject(), &request).await?,
    ))
}

/// The tree a task belongs to, root first.
pub(crate) async fn tree(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
    Path(task_id): Path<Uuid>,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    console.needs(&signed, Access::Viewer)?;
    Ok(Json(
        console
            .fabric(&TaskOpsOp::Tree.subject(), &TreeQuery { task_id })
            .await?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    #[serde(default)]
    reason: Option<String>,
}

/// Cancels a task and its open descendants in the signed-in person's name.
pub(crate) async fn cancel(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
    Path(task_id): Path<Uuid>,
    bytes: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    console.needs(&signed, Access::Operator)?;
    let body: CancelBody = body(&bytes)?;
    let request = OpsCancel {
        task_id,
        person: format!("person:{}", signed.person.id),
        reason: body.reason,
    };
    let done = console
        .fabric(&TaskOpsOp::Cancel.subject(), &request)
        .await?;
    tracing::info!(person = %signed.person.id, %task_id, "task tree canceled from the console");
    Ok(Json(done))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpeakBody {
    to: String,
    mode: Mode,
    message: String,
}

/// Sends, calls or gives a task to an agent as the signed-in person.
pub(crate) async fn speak(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    console.needs(&signed, Access::Operator)?;
    let body: SpeakBody = body(&bytes)?;
    check_input(&body.to, &body.message)?;
    let said = console
        .talk
        .speak(
            &console.client,
            &signed.person,
            body.mode,
            body.to.trim(),
            &body.message,
        )
        .await?;
    Ok(Json(said))
}

/// The signed-in person's conversation with agents: what they sent and what came back.
pub(crate) async fn heard(
    State(console): State<Arc<Console>>,
    method: Method,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let signed = console.signed(&headers, &method)?;
    console.needs(&signed, Access::Operator)?;
    Ok(Json(
        console.talk.read(&console.client, &signed.person).await?,
    ))
}
