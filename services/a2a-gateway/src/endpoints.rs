//! The HTTP surface, the gateway's endpoints: agent cards (GET) and the two A2A bindings on one
//! interface URL per agent, `/agents/<agent_id>`: JSON-RPC 2.0 (`serve/jsonrpc.rs`, POST to
//! the URL) and HTTP+JSON (`serve/rest.rs`, the A2A v1.0 REST paths under it). The handlers
//! are in `serve/`; what every request passes first is `serve/checks.rs`.

use std::sync::Arc;

use axum::Router;
use axum::response::Response;
use axum::routing::{get, post};

use crate::gateway::Gateway;
use crate::serve::cards::{agent_card, default_card};
use crate::serve::checks::not_found;
use crate::serve::{jsonrpc, rest};

/// The gateway's routes.
pub fn router(gateway: Arc<Gateway>) -> Router {
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
        // The files of a client's tasks and answers, by signed, short-lived link.
        .route("/files/{token}", get(crate::serve::files::download))
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
