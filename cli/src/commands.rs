//! The commands that are one request to a service — the registry (`register`, `heartbeat`,
//! `deregister`, `goal`, `peers`, `agents`, `lookup`) and the messages (`send`, `call`,
//! `reply`, `pending`) — and `nats-config`, which writes files. `main.rs` declares their flags
//! and calls these; the commands with more to them have a module each.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;
use switchboard_client::proto::call::{CallRequest, ReplyRequest};
use switchboard_client::proto::receipt::{ReceiptLevel, SendStatusRequest};
use switchboard_client::proto::registry::{
    GoalCloseRequest, GoalKind, GoalOpenRequest, LookupRequest, PeersRequest,
};
use switchboard_client::proto::send::SendRequest;
use switchboard_client::proto::subject::{self, RegistryOp};
use switchboard_client::proto::{AgentId, GoalId};
use uuid::Uuid;

use crate::card::CardArgs;
use crate::nats::{request_json, request_with_retry};
use futures::StreamExt;
use switchboard_client::CallEvent;

/// `switchboard register`: the agent's card, sent as the agent (also a heartbeat).
pub(crate) async fn register(
    nats_url: &str,
    as_agent: &str,
    card: &CardArgs,
) -> anyhow::Result<Value> {
    let agent = AgentId::parse(as_agent)?;
    let card = card.card(&agent)?;
    request_json(nats_url, &RegistryOp::Register.subject(&agent), &card).await
}

/// Sends a registry request as `as_agent` without registering it (read-only commands).
pub(crate) async fn registry_request<T: serde::Serialize>(
    nats_url: &str,
    op: RegistryOp,
    as_agent: &str,
    body: &T,
) -> anyhow::Result<Value> {
    let agent = AgentId::parse(as_agent)?;
    request_json(nats_url, &op.subject(&agent), body).await
}

/// `switchboard goal open`: a new goal, or `goal` re-opened.
pub(crate) async fn goal_open(
    nats_url: &str,
    as_agent: &str,
    kind: GoalKind,
    overflow: Option<switchboard_proto::inbox::Overflow>,
    goal: Option<&str>,
) -> anyhow::Result<Value> {
    let request = GoalOpenRequest {
        goal_id: goal.map(GoalId::parse).transpose()?,
        kind: Some(kind),
        overflow,
    };
    registry_request(nats_url, RegistryOp::GoalOpen, as_agent, &request).await
}

/// `switchboard goal close`.
pub(crate) async fn goal_close(
    nats_url: &str,
    as_agent: &str,
    goal_id: &str,
) -> anyhow::Result<Value> {
    let request = GoalCloseRequest {
        goal_id: GoalId::parse(goal_id)?,
    };
    registry_request(nats_url, RegistryOp::GoalClose, as_agent, &request).await
}

/// `switchboard peers`: one page of list_peers as `as_agent`.
pub(crate) async fn peers(
    nats_url: &str,
    as_agent: &str,
    after: Option<String>,
    limit: Option<u32>,
    skill: Option<String>,
) -> anyhow::Result<Value> {
    let request = PeersRequest {
        after,
        limit,
        skill,
    };
    registry_request(nats_url, RegistryOp::Peers, as_agent, &request).await
}

/// `switchboard lookup`: one agent's card, status and live goals.
pub(crate) async fn lookup(nats_url: &str, as_agent: &str, agent: String) -> anyhow::Result<Value> {
    let request = LookupRequest { agent_id: agent };
    registry_request(nats_url, RegistryOp::Lookup, as_agent, &request).await
}

/// `switchboard agents`: every registered agent, as an operator.
pub(crate) async fn agents(nats_url: &str) -> anyhow::Result<Value> {
    let client = crate::nats::connect(nats_url).await?;
    let listing = switchboard_client::list_agents(&client).await?;
    Ok(serde_json::to_value(listing)?)
}

/// `switchboard send`: send_to_peer with a minted message id, retried while no fan-out answers
/// (same id, so stored once per goal) — the Rust client's policy, from the same helper.
pub(crate) async fn send(
    nats_url: &str,
    as_agent: &str,
    to: String,
    message: String,
    correlation_id: Option<Uuid>,
    goal: Option<&str>,
    receipt: Option<ReceiptLevel>,
) -> anyhow::Result<Value> {
    let request = SendRequest {
        to: Some(to),
        message: Some(message),
        id: Some(switchboard_client::proto::new_id()),
        correlation_id,
        from_goal_id: goal.map(GoalId::parse).transpose()?,
        receipt,
        ..SendRequest::default()
    };
    let agent = AgentId::parse(as_agent)?;
    request_with_retry(nats_url, &subject::send(&agent), &request).await
}

/// `--receipt`: `delivered` or `read`.
pub(crate) fn receipt_level(text: &str) -> Result<ReceiptLevel, String> {
    match text {
        "delivered" => Ok(ReceiptLevel::Delivered),
        "read" => Ok(ReceiptLevel::Read),
        other => Err(format!("`{other}`: give `delivered` or `read`")),
    }
}

/// `switchboard status`: where a message the agent sent with `--receipt` is.
pub(crate) async fn send_status(
    nats_url: &str,
    as_agent: &str,
    message_id: Uuid,
) -> anyhow::Result<Value> {
    let agent = AgentId::parse(as_agent)?;
    request_json(
        nats_url,
        &subject::send_status(&agent),
        &SendStatusRequest { message_id },
    )
    .await
}

/// `switchboard call`: a correlated call that waits for the answer, or (`park`) returns the
/// correlation id at once and lets the answer land in `goal`'s inbox.
pub(crate) async fn call(
    nats_url: &str,
    as_agent: &str,
    to: String,
    message: String,
    timeout_ms: Option<u64>,
    park: bool,
    goal: Option<&str>,
) -> anyhow::Result<Value> {
    let agent = AgentId::parse(as_agent)?;
    let from_goal_id = goal.map(GoalId::parse).transpose()?;
    let request = CallRequest {
        to: Some(to),
        message: Some(message),
        from_goal_id,
        timeout_ms,
        wait: Some(!park),
        ..CallRequest::default()
    };
    if park {
        return request_json(nats_url, &subject::call(&agent), &request).await;
    }
    // Waiting: the answer streams; each part is printed to stderr as it comes (`[part N]`),
    // and the whole answer is the command's output.
    let client = crate::nats::connect_as(nats_url, Some(&agent)).await?;
    let mut events = Box::pin(
        switchboard_client::call_streamed_on(&client, &agent, request, Duration::from_secs(10))
            .await?,
    );
    while let Some(event) = events.next().await {
        match event? {
            CallEvent::Part(part) => eprintln!("[part {}] {}", part.part, part.body),
            CallEvent::Answer(answer) => return Ok(serde_json::to_value(answer)?),
        }
    }
    anyhow::bail!("the call ended without an answer")
}

/// `switchboard reply`: reply_to_peer, answering the call `correlation_id`.
pub(crate) async fn reply(
    nats_url: &str,
    as_agent: &str,
    correlation_id: Uuid,
    message: String,
) -> anyhow::Result<Value> {
    let request = ReplyRequest {
        correlation_id: Some(correlation_id),
        message: Some(message),
        ..ReplyRequest::default()
    };
    let agent = AgentId::parse(as_agent)?;
    request_json(nats_url, &subject::reply(&agent), &request).await
}

/// `switchboard pending`: the open calls `as_agent` made and must answer.
pub(crate) async fn pending(nats_url: &str, as_agent: &str) -> anyhow::Result<Value> {
    let agent = AgentId::parse(as_agent)?;
    request_json(
        nats_url,
        &subject::calls_pending(&agent),
        &serde_json::json!({}),
    )
    .await
}

/// `switchboard nats-config`: writes the NATS accounts and keys, and says which files it
/// wrote, created and no longer uses.
pub(crate) fn nats_config(agents: &Path, out: &Path) -> ExitCode {
    use switchboard_runtime::permissions;
    let made = permissions::read_agents(agents).and_then(|file| permissions::generate(&file, out));
    match made {
        Ok(done) => {
            crate::output::line(&format!("wrote {}", done.auth_file.display()));
            for path in &done.created {
                crate::output::line(&format!("new key {}", path.display()));
            }
            for path in &done.unused {
                crate::output::line(&format!(
                    "unused key {} (its agent is no longer listed; it cannot connect)",
                    path.display()
                ));
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("switchboard: {err}");
            ExitCode::FAILURE
        }
    }
}
