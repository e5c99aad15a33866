//! The MCP tools for people (docs/protocol.md §14): ask a person or a role, request an
//! approval of an exact action and use it, list the people. A question or an approval parks;
//! with `wait_s` the tool also waits (at most 50 s, under a host's usual tool timeout) for the
//! answer by reading the item's state, and the answer also arrives in the inbox as
//! kind="response" from="person:…", so check_inbox shows it if the wait ends first.

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use switchboard_client::proto::approval::{Action, ApprovalRequest};
use switchboard_client::proto::people::{AskRequest, ItemKind, ItemState, PersonItem};
use uuid::Uuid;

use super::SwitchboardMcp;
use super::tools::{failure, outcome, reply};

/// Longest a tool waits for a person, in seconds.
const WAIT_MAX_S: u64 = 50;
/// How often a waiting tool reads the item's state.
const POLL: Duration = Duration::from_millis(500);

/// `ask_person` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct AskPersonParams {
    /// "person:<id>" or "role:<name>" (the first member of the role to answer answers); see
    /// list_people.
    pub to: String,
    /// Your question, written for a person.
    pub question: String,
    /// How long the person may take, in seconds (default 3600, at most 604800).
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Wait this long for the answer before returning (0-50 s, default 0: return at once; the
    /// answer then arrives in check_inbox as kind="response" from="person:…").
    #[serde(default)]
    pub wait_s: Option<u64>,
    /// Unanswered this long (seconds), the question goes to escalate_to, once.
    #[serde(default)]
    pub escalate_after_s: Option<u64>,
    /// Who gets it then: "person:<id>" or "role:<name>".
    #[serde(default)]
    pub escalate_to: Option<String>,
}

/// `request_approval` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RequestApprovalParams {
    /// The tool you want to call.
    pub tool: String,
    /// Its exact arguments: the approval is for these and no others.
    pub arguments: Value,
    /// Why, for the person deciding.
    pub reason: String,
    /// An approver: "person:<id>" or "role:<name>"; see list_people.
    pub to: String,
    /// How long the request may wait and the approval stay usable, in seconds.
    pub expires_in_s: u64,
    /// Undecided this long (seconds), it goes to escalate_to, once.
    #[serde(default)]
    pub escalate_after_s: Option<u64>,
    /// Who gets it then.
    #[serde(default)]
    pub escalate_to: Option<String>,
    /// Wait this long for the decision before returning (0-50 s, default 0).
    #[serde(default)]
    pub wait_s: Option<u64>,
}

/// `use_approval` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct UseApprovalParams {
    /// The approval_id request_approval returned.
    #[schemars(with = "String")]
    pub approval_id: Uuid,
    /// The tool you are about to call.
    pub tool: String,
    /// The exact arguments you are about to pass.
    pub arguments: Value,
}

fn ms(seconds: u64) -> u64 {
    seconds.saturating_mul(1_000)
}

/// What a waiting tool returns: the item's id, its state and, once answered, the answer.
fn summary(item: &PersonItem) -> Value {
    let id_key = match item.kind {
        ItemKind::Approval => "approval_id",
        _ => "ask_id",
    };
    let mut out = json!({
        "item_id": item.item_id,
        "state": item.state,
        "to": item.to,
        "addressee": item.addressee,
    });
    // What the model calls it: the approval_id use_approval takes, or the ask's id.
    out[id_key] = json!(item.item_id);
    if let Some(answer) = &item.answer {
        out["answered_by"] = json!(answer.by);
        out["answer"] = json!(answer.message);
        if let Some(decision) = answer.decision {
            out["decision"] = json!(decision);
        }
    }
    if let Some(hash) = &item.action_hash {
        out["action_hash"] = json!(hash);
    }
    out
}

impl SwitchboardMcp {
    /// Waits up to `wait_s` for item `id` to leave open/escalated; its summary either way.
    async fn wait_for_person(&self, id: Uuid, wait_s: u64) -> CallToolResult {
        let until = tokio::time::Instant::now() + Duration::from_secs(wait_s.min(WAIT_MAX_S));
        loop {
            let item = match self.agent.person_item(id).await {
                Ok(item) => item,
                Err(err) => return failure(&err),
            };
            let waiting = matches!(item.state, ItemState::Open | ItemState::Escalated);
            if !waiting || tokio::time::Instant::now() >= until {
                return reply(&summary(&item));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

#[tool_router(router = people_router, vis = "pub(super)")]
impl SwitchboardMcp {
    #[tool(
        description = "The people you can ask or notify: persons (person:<id>) with their roles \
                       and whether they can approve, and roles (role:<name>) with their members; \
                       reachable says whether you may address them. Call before ask_person, \
                       request_approval, or send_to_peer to a person."
    )]
    async fn list_people(&self) -> CallToolResult {
        outcome(self.agent.people().await)
    }

    #[tool(
        description = "Ask a person (or a role: its first member to answer answers) and wait for \
                       a human answer. The question is kept until answered or timed out, even \
                       across restarts. With wait_s the tool waits up to 50 s and returns the \
                       answer if it came (state answered, answer, answered_by); otherwise it \
                       returns state open and the answer arrives later in check_inbox as \
                       kind=\"response\" from=\"person:…\" with correlation_id = item_id (or a \
                       kind=\"notify\" timeout notice). To tell a person something without \
                       waiting, use send_to_peer with to=\"person:<id>\"."
    )]
    async fn ask_person(&self, Parameters(params): Parameters<AskPersonParams>) -> CallToolResult {
        let request = AskRequest {
            to: params.to,
            message: params.question,
            from_goal_id: self.goal.id(),
            timeout_ms: params.timeout_s.map(ms),
            escalate_after_ms: params.escalate_after_s.map(ms),
            escalate_to: params.escalate_to,
            ask_id: None,
            metadata: serde_json::Map::new(),
        };
        match self.agent.ask_person_with(request).await {
            Ok(parked) => {
                self.wait_for_person(parked.item_id, params.wait_s.unwrap_or(0))
                    .await
            }
            Err(err) => failure(&err),
        }
    }

    #[tool(
        description = "Ask a person to approve one exact action before you do it (a payment, a \
                       deploy, a deletion): the approval is bound to this tool and these \
                       arguments and no others. Returns approval_id and state (open until a \
                       person decides; with wait_s the tool waits up to 50 s). The decision also \
                       arrives in check_inbox as kind=\"response\" from=\"person:…\". When \
                       approved, call use_approval with the same tool and arguments right before \
                       acting; never act on an approval you have not used."
    )]
    async fn request_approval(
        &self,
        Parameters(params): Parameters<RequestApprovalParams>,
    ) -> CallToolResult {
        let request = ApprovalRequest {
            action: Action {
                tool: params.tool,
                arguments: params.arguments,
            },
            reason: params.reason,
            to: params.to,
            from_goal_id: self.goal.id(),
            expires_in_ms: ms(params.expires_in_s),
            escalate_after_ms: params.escalate_after_s.map(ms),
            escalate_to: params.escalate_to,
            approval_id: None,
        };
        match self.agent.request_approval(request).await {
            Ok(parked) => {
                self.wait_for_person(parked.item_id, params.wait_s.unwrap_or(0))
                    .await
            }
            Err(err) => failure(&err),
        }
    }

    #[tool(
        description = "Spend an approval right before acting: succeeds once, only if a person \
                       approved exactly this tool and these arguments and it has not expired. \
                       Refusals: action_mismatch (the arguments differ from what was approved: \
                       do not act), approval_pending (not decided yet), approval_denied, \
                       approval_used (already spent), expired."
    )]
    async fn use_approval(
        &self,
        Parameters(params): Parameters<UseApprovalParams>,
    ) -> CallToolResult {
        let action = Action {
            tool: params.tool,
            arguments: params.arguments,
        };
        outcome(self.agent.use_approval(params.approval_id, action).await)
    }
}
