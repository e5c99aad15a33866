//! `switchboard people …`: people in the fabric (docs/protocol.md §14). Agent side (`--as`):
//! note a person, ask, request and use approvals, list people, the agent's pending items.
//! Person side (`--person`): the inbox, one item, answer, approve, deny, mark read; these go
//! over the operator endpoints `_SB.ops.people.*`, so they need Switchboard's own credentials
//! (`--nkey services.nk` under the generated accounts; nothing on an open server).

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use switchboard_client::proto::people::PeopleOp;
use switchboard_client::proto::people::ops::PeopleOpsOp;
use uuid::Uuid;

use super::args::{Acting, Connection};
use crate::nats::request_json;
use crate::output::View;

/// People: agents note, ask and request approvals of persons and roles; persons answer.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  switchboard people list --as deployer\n  switchboard people note --as deployer --to person:alice \"deploy 42 started\"\n  switchboard people ask --as deployer --goal <goal_id> --to role:oncall \"roll back?\" --timeout-ms 600000\n  switchboard people approval request --as deployer --goal <goal_id> --to person:alice --tool deploy --arguments '{\"version\":\"42\"}' --reason \"release\" --expires-in-ms 3600000\n  switchboard people approval use --as deployer <approval_id> --tool deploy --arguments '{\"version\":\"42\"}'\n  switchboard people inbox --person alice\n  switchboard people answer --person alice <item_id> \"yes, roll back\"\n  switchboard people approve --person alice <item_id> --note \"go\"\n  switchboard people token",
    mut_args(super::args::global_nats_url)
)]
pub struct PeopleArgs {
    #[command(subcommand)]
    command: PeopleCommand,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Debug, Subcommand)]
enum PeopleCommand {
    /// The persons and roles configured, and whether the agent may reach each.
    List {
        #[command(flatten)]
        acting: Acting,
    },
    /// Note a person or a role: recorded in their inbox; nothing waits.
    Note {
        #[command(flatten)]
        acting: Acting,
        /// `person:<id>` or `role:<name>`.
        #[arg(long)]
        to: String,
        /// The note.
        message: String,
    },
    /// Ask a person or a role; the answer arrives in the goal's inbox (`kind: response`,
    /// `from_person`).
    Ask {
        #[command(flatten)]
        acting: Acting,
        /// `person:<id>` or `role:<name>`.
        #[arg(long)]
        to: String,
        /// The agent's goal the answer goes to.
        #[arg(long)]
        goal: String,
        /// The question.
        message: String,
        /// How long the answer may take (default one hour).
        #[arg(long)]
        timeout_ms: Option<u64>,
        /// Unanswered this long, the question goes to --escalate-to.
        #[arg(long, requires = "escalate_to")]
        escalate_after_ms: Option<u64>,
        /// Who gets it then.
        #[arg(long, requires = "escalate_after_ms")]
        escalate_to: Option<String>,
    },
    /// Approvals: request one for an exact action, or use one before acting.
    #[command(subcommand)]
    Approval(ApprovalCommand),
    /// The agent's asks and approvals waiting for a person, and approvals not used yet.
    Pending {
        #[command(flatten)]
        acting: Acting,
    },
    /// A person's inbox: what waits for them or their roles (or, --done, what ended).
    Inbox {
        /// The person (`alice` or `person:alice`).
        #[arg(long)]
        person: String,
        /// Answered, read, expired and used items instead of waiting ones.
        #[arg(long)]
        done: bool,
        /// Only this agent's items.
        #[arg(long)]
        sender: Option<String>,
        /// At most this many (1-100).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Skip this many (the page's `next`).
        #[arg(long)]
        after: Option<usize>,
    },
    /// One item, whole (the action to approve with its hash).
    Show {
        /// The person looking.
        #[arg(long)]
        person: String,
        /// The item.
        item_id: Uuid,
    },
    /// Answer a question.
    Answer {
        /// The person answering.
        #[arg(long)]
        person: String,
        /// The question's item id.
        item_id: Uuid,
        /// The answer.
        message: String,
    },
    /// Approve an action (shown first: the hash approved is the one shown).
    Approve {
        /// The approver.
        #[arg(long)]
        person: String,
        /// The approval's item id.
        item_id: Uuid,
        /// A note for the agent.
        #[arg(long)]
        note: Option<String>,
    },
    /// Deny an action.
    Deny {
        /// The approver.
        #[arg(long)]
        person: String,
        /// The approval's item id.
        item_id: Uuid,
        /// Why, for the agent.
        #[arg(long)]
        note: Option<String>,
    },
    /// A fresh sign-in token for the console, and the hash to put in the person's `tokens` in
    /// the people file (the token is shown once; only its hash is kept).
    Token,
    /// Mark a note read.
    Read {
        /// The person.
        #[arg(long)]
        person: String,
        /// The note's item id.
        item_id: Uuid,
    },
}

#[derive(Debug, Subcommand)]
enum ApprovalCommand {
    /// Ask a person or a role to approve one exact action (tool and arguments).
    Request {
        #[command(flatten)]
        acting: Acting,
        /// `person:<id>` or `role:<name>` (an approver).
        #[arg(long)]
        to: String,
        /// The agent's goal the decision goes to.
        #[arg(long)]
        goal: String,
        /// The tool the agent will call.
        #[arg(long)]
        tool: String,
        /// Its arguments, as JSON.
        #[arg(long, default_value = "{}")]
        arguments: String,
        /// Why.
        #[arg(long)]
        reason: String,
        /// How long the request may wait and the approval stay usable.
        #[arg(long)]
        expires_in_ms: u64,
        /// Undecided this long, it goes to --escalate-to.
        #[arg(long, requires = "escalate_to")]
        escalate_after_ms: Option<u64>,
        /// Who gets it then.
        #[arg(long, requires = "escalate_after_ms")]
        escalate_to: Option<String>,
    },
    /// Check an approval for this exact action and spend it (once).
    Use {
        #[command(flatten)]
        acting: Acting,
        /// The approval.
        approval_id: Uuid,
        /// The tool about to be called.
        #[arg(long)]
        tool: String,
        /// Its arguments, as JSON.
        #[arg(long, default_value = "{}")]
        arguments: String,
    },
}

impl PeopleArgs {
    /// How the reply reads for a person.
    pub fn view(&self) -> View {
        match self.command {
            PeopleCommand::Inbox { .. } => View::PeopleInbox,
            PeopleCommand::Show { .. } => View::PersonItem,
            _ => View::Json,
        }
    }
}

/// Reads `--arguments` as JSON (the service checks it strictly).
fn arguments(raw: &str) -> anyhow::Result<Value> {
    serde_json::from_str(raw).map_err(|err| anyhow::anyhow!("--arguments is not JSON: {err}"))
}

/// Runs the command.
pub async fn run(args: PeopleArgs) -> anyhow::Result<Value> {
    let url = &args.conn.nats_url;
    let ops = |op: PeopleOpsOp| op.subject();
    match args.command {
        PeopleCommand::List { acting } => {
            request_json(url, &PeopleOp::List.subject(&acting.id()?), &json!({})).await
        }
        PeopleCommand::Note {
            acting,
            to,
            message,
        } => {
            let body = json!({"to": to, "message": message});
            request_json(url, &PeopleOp::Note.subject(&acting.id()?), &body).await
        }
        PeopleCommand::Ask {
            acting,
            to,
            goal,
            message,
            timeout_ms,
            escalate_after_ms,
            escalate_to,
        } => {
            let body = json!({"to": to, "from_goal_id": goal, "message": message,
                "timeout_ms": timeout_ms, "escalate_after_ms": escalate_after_ms,
                "escalate_to": escalate_to});
            request_json(
                url,
                &PeopleOp::Ask.subject(&acting.id()?),
                &without_nulls(body),
            )
            .await
        }
        PeopleCommand::Approval(ApprovalCommand::Request {
            acting,
            to,
            goal,
            tool,
            arguments: raw,
            reason,
            expires_in_ms,
            escalate_after_ms,
            escalate_to,
        }) => {
            let body = json!({"action": {"tool": tool, "arguments": arguments(&raw)?},
                "reason": reason, "to": to, "from_goal_id": goal,
                "expires_in_ms": expires_in_ms, "escalate_after_ms": escalate_after_ms,
                "escalate_to": escalate_to});
            let subject = PeopleOp::ApprovalRequest.subject(&acting.id()?);
            request_json(url, &subject, &without_nulls(body)).await
        }
        PeopleCommand::Approval(ApprovalCommand::Use {
            acting,
            approval_id,
            tool,
            arguments: raw,
        }) => {
            let body = json!({"approval_id": approval_id,
                "action": {"tool": tool, "arguments": arguments(&raw)?}});
            request_json(url, &PeopleOp::ApprovalUse.subject(&acting.id()?), &body).await
        }
        PeopleCommand::Pending { acting } => {
            request_json(url, &PeopleOp::Pending.subject(&acting.id()?), &json!({})).await
        }
        PeopleCommand::Inbox {
            person,
            done,
            sender,
            limit,
            after,
        } => {
            let body = json!({"person": person, "state": if done { "done" } else { "open" },
                "sender": sender, "limit": limit, "after": after});
            request_json(url, &ops(PeopleOpsOp::Inbox), &without_nulls(body)).await
        }
        PeopleCommand::Show { person, item_id } => {
            let body = json!({"person": person, "item_id": item_id});
            request_json(url, &ops(PeopleOpsOp::Item), &body).await
        }
        PeopleCommand::Answer {
            person,
            item_id,
            message,
        } => {
            let body = json!({"person": person, "item_id": item_id, "message": message});
            request_json(url, &ops(PeopleOpsOp::Answer), &body).await
        }
        PeopleCommand::Approve {
            person,
            item_id,
            note,
        } => decide(url, person, item_id, "approved", note).await,
        PeopleCommand::Deny {
            person,
            item_id,
            note,
        } => decide(url, person, item_id, "denied", note).await,
        PeopleCommand::Token => {
            let (token, hash) = console::one_time_token();
            Ok(json!({"token": token, "hash": format!("sha256:{hash}"),
                "people_toml": format!("tokens = [\"sha256:{hash}\"]")}))
        }
        PeopleCommand::Read { person, item_id } => {
            let body = json!({"person": person, "item_id": item_id});
            request_json(url, &ops(PeopleOpsOp::Answer), &body).await
        }
    }
}

/// Approve or deny: reads the item first, so the hash decided on is the one shown to the
/// person (the service refuses another).
async fn decide(
    url: &str,
    person: String,
    item_id: Uuid,
    decision: &str,
    note: Option<String>,
) -> anyhow::Result<Value> {
    let shown = request_json(
        url,
        &PeopleOpsOp::Item.subject(),
        &json!({"person": person, "item_id": item_id}),
    )
    .await?;
    let hash = shown
        .get("action_hash")
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("item {item_id} is not an approval"))?;
    if let Some(action) = shown.get("action") {
        eprintln!(
            "{decision}: {}",
            crate::people_text::inert(&action.to_string())
        );
    }
    let body = json!({"person": person, "item_id": item_id, "decision": decision,
        "message": note, "action_hash": hash});
    request_json(url, &PeopleOpsOp::Answer.subject(), &without_nulls(body)).await
}

/// Drops `null` fields (the services refuse none, but the JSON reads cleaner).
fn without_nulls(mut value: Value) -> Value {
    if let Value::Object(map) = &mut value {
        map.retain(|_, v| !v.is_null());
    }
    value
}
