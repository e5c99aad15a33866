//! `switchboard mcp --agent <id>`: one agent as a Model Context Protocol server over stdio, so
//! any MCP-capable agent host (an LLM) can use the fabric through tools.
//!
//! On start it registers the agent (card from flags or a TOML file), opens a goal and keeps the
//! agent online with heartbeats; on exit (stdin closed, SIGINT/SIGTERM) it closes the goal.
//! Every tool result is the service's own reply (delivery reports, unreachable reasons, task
//! records) as JSON, or `{"error": {"kind", "message"}}` with the MCP `isError` flag — never a
//! bare "ok". New inbox messages are announced with an MCP log notification (logger
//! `switchboard`, `data.event = "inbox"`), so a host can wake the model instead of polling;
//! the messages stay unacknowledged until `check_inbox` hands them to the model.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceUpdatedNotificationParam, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, UnsubscribeRequestParams,
};
#[allow(deprecated)] // logging is deprecated by SEP-2577, but hosts still show log messages
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{
    ErrorData, Peer, RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router,
};
use schemars::JsonSchema;
use serde::Deserialize;
use switchboard_client::proto::inbox::FETCH_MAX;
use switchboard_client::proto::registry::{GoalKind, GoalOpenRequest};
use switchboard_client::proto::send::SendRequest;
use switchboard_client::proto::task::{CreateTask, TaskAction, TaskOp};
use switchboard_client::proto::{AgentId, InboxMessage, MessageKind};
use switchboard_client::{
    Agent, AgentOptions, ClientError, Goal, TaskOutcome, render_peer_messages_block, serving,
};
use uuid::Uuid;

use crate::DEFAULT_NATS_URL;

/// The resource that tracks the inbox: subscribe to it to hear of new messages.
pub const INBOX_RESOURCE: &str = "switchboard://inbox";

/// `switchboard mcp` options.
#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// The agent this server speaks as (registered on start).
    #[arg(long, value_name = "AGENT")]
    agent: String,
    /// The kind of goal opened for this session: interactive, background or daemon.
    #[arg(long, default_value = "interactive", value_parser = crate::card::parse_goal_kind)]
    goal_kind: GoalKind,
    /// The agent's card.
    #[command(flatten)]
    card: crate::card::CardArgs,
    /// NATS URL.
    #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
    nats_url: String,
}

/// Runs the server until the host closes stdin or a signal arrives.
pub async fn run(args: McpArgs) -> ExitCode {
    // stdout carries the protocol; logs go to stderr (quiet unless RUST_LOG says otherwise).
    let telemetry = switchboard_runtime::telemetry::init(
        "switchboard-mcp",
        &switchboard_runtime::config::TelemetryConfig {
            log: "warn".to_owned(),
            ..Default::default()
        },
    );
    let code = match serve(args).await {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("switchboard mcp: {err:#}");
            1
        }
    };
    if let Ok(telemetry) = telemetry {
        telemetry.shutdown();
    }
    // Exit here: the stdio transport's stdin read blocks a runtime thread until the host
    // closes stdin, and after a signal it may never do so.
    std::process::exit(code)
}

async fn serve(args: McpArgs) -> anyhow::Result<()> {
    // Signals are handled from the start: a SIGTERM while connecting or opening the goal is
    // a clean stop too, not the default action.
    let stop = switchboard_runtime::shutdown::on_signal();
    let id = AgentId::parse(&args.agent)?;
    let card = args.card.card(&id)?;
    let nats = crate::signed_in(switchboard_client::agent_connect_options(&id))
        .name(format!("mcp:{id}"))
        .connect(&args.nats_url)
        .await
        .map_err(|err| anyhow::anyhow!("connecting to {}: {err}", args.nats_url))?;
    let agent = Agent::connect_with(nats, card, AgentOptions::default()).await?;
    let goal = agent
        .open_goal_with(GoalOpenRequest {
            goal_id: None,
            kind: Some(args.goal_kind),
        })
        .await?;
    let server = SwitchboardMcp::new(Arc::new(agent), Arc::new(goal));
    let session = async {
        let running = server.clone().serve(rmcp::transport::stdio()).await?;
        let watch = tokio::spawn(announce_new_messages(
            server.clone(),
            running.peer().clone(),
        ));
        let ended = running.waiting().await;
        watch.abort();
        if let Err(err) = ended {
            tracing::warn!(error = %err, "the MCP session ended with an error");
        }
        anyhow::Ok(())
    };
    // However the session ends (the host closes stdin, a signal, a failed handshake), the
    // goal is closed.
    let outcome = tokio::select! {
        outcome = session => outcome,
        () = stop.cancelled() => Ok(()),
    };
    // A signal can also end the session first (its stdin read is interrupted, possibly a
    // moment before the signal handler runs): that is a requested stop, not a failure.
    if outcome.is_err() && !stop.is_cancelled() {
        let _ = tokio::time::timeout(Duration::from_millis(200), stop.cancelled()).await;
    }
    let outcome = if stop.is_cancelled() { Ok(()) } else { outcome };
    let goal_id = server.goal.id();
    if let Err(err) = server.agent.close_goal(goal_id).await {
        tracing::warn!(%goal_id, error = %err, "closing the goal failed");
    }
    outcome
}

/// Tells the host when messages arrive (they stay unread until `check_inbox`):
/// `notifications/resources/updated` for [`INBOX_RESOURCE`] when the host subscribed to it, and a
/// `notifications/message` log entry (logger `switchboard`, `data.event = "inbox"`, with the
/// unread count) for hosts that show logs.
///
/// What is unread is looked at (a peek: nothing is handed out) every [`ANNOUNCE_EVERY`]: more
/// unread messages than last time, or another oldest one with some unread, means new ones
/// arrived, announced once; messages that arrived before the session started are announced at
/// start. An agent cannot subscribe to inbox subjects (ARCHITECTURE.md §8), so it asks.
async fn announce_new_messages(server: SwitchboardMcp, peer: Peer<RoleServer>) {
    let goal = server.goal.clone();
    let mut seen = (0, None);
    loop {
        match goal.unread().await {
            Ok(now) => {
                let (waiting, oldest) = now;
                let arrived = waiting > seen.0 || (waiting > 0 && oldest != seen.1);
                if arrived && !announce(&server, &peer, &goal, waiting).await {
                    return; // the session is gone
                }
                seen = now;
            }
            Err(err) => tracing::debug!(error = %err, "counting unread messages failed"),
        }
        tokio::time::sleep(ANNOUNCE_EVERY).await;
    }
}

/// How often the unread count is looked at for announcements.
const ANNOUNCE_EVERY: Duration = Duration::from_millis(250);

/// Sends the notifications for `waiting` unread messages; false once the host is gone.
#[allow(deprecated)] // logging: see the import
async fn announce(
    server: &SwitchboardMcp,
    peer: &Peer<RoleServer>,
    goal: &Goal,
    waiting: u64,
) -> bool {
    if server.subscribed.load(std::sync::atomic::Ordering::Relaxed)
        && let Err(err) = peer
            .notify_resource_updated(ResourceUpdatedNotificationParam::new(INBOX_RESOURCE))
            .await
    {
        tracing::debug!(error = %err, "announcing new messages failed");
        return false;
    }
    let note = LoggingMessageNotificationParam::new(
        LoggingLevel::Notice,
        serde_json::json!({
            "event": "inbox",
            "waiting": waiting,
            "goal_id": goal.id(),
            "message": format!("{waiting} unread peer message(s); call check_inbox to read them"),
        }),
    )
    .with_logger("switchboard");
    if let Err(err) = peer.notify_logging_message(note).await {
        tracing::debug!(error = %err, "announcing new messages failed");
        return false;
    }
    true
}

/// The MCP server: one agent, one goal, and the requests it has been shown and not answered.
#[derive(Clone)]
pub struct SwitchboardMcp {
    agent: Arc<Agent>,
    goal: Arc<Goal>,
    /// Correlation ids of requests `check_inbox` showed that wait for an answer, oldest
    /// first: `reply_to_peer` without a target answers the last one.
    unanswered: Arc<Mutex<Vec<Unanswered>>>,
    /// Whether the host subscribed to [`INBOX_RESOURCE`].
    subscribed: Arc<std::sync::atomic::AtomicBool>,
    tool_router: ToolRouter<Self>,
}

/// A request shown by `check_inbox` that waits for this agent's answer.
#[derive(Debug, Clone, Copy)]
struct Unanswered {
    correlation_id: Uuid,
    /// The caller stops waiting then (the correlator's `call_deadline`); after it an answer is
    /// refused `expired`, so the request is no longer "the one to answer".
    deadline: Option<time::OffsetDateTime>,
}

impl Unanswered {
    fn from(message: &InboxMessage) -> Option<Self> {
        if message.kind != MessageKind::Request || !message.expects_reply {
            return None;
        }
        let deadline = message
            .metadata
            .get("call_deadline")
            .and_then(serde_json::Value::as_str)
            .and_then(|text| {
                time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
                    .ok()
            });
        Some(Self {
            correlation_id: message.correlation_id?,
            deadline,
        })
    }

    fn open(&self) -> bool {
        self.deadline
            .is_none_or(|deadline| deadline > time::OffsetDateTime::now_utc())
    }
}

/// A successful tool result: the service's reply as pretty JSON.
fn reply<T: serde::Serialize>(value: &T) -> CallToolResult {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|err| err.to_string());
    CallToolResult::success(vec![ContentBlock::text(text)])
}

/// A failed tool result: `{"error": {"kind", "message"}}` with `isError` set, where `kind` is
/// the service's stable error kind (or `unavailable` / `timeout` / `transport` when no service
/// answered) so the model can decide what to do next.
fn failure(err: &ClientError) -> CallToolResult {
    let kind = match err {
        ClientError::Service(reply) => reply.kind().to_string(),
        ClientError::InvalidId(_) => "bad_request".to_owned(),
        ClientError::NoResponders { .. } => "unavailable".to_owned(),
        ClientError::Timeout { .. } => "timeout".to_owned(),
        _ => "transport".to_owned(),
    };
    refused(&kind, &err.to_string())
}

fn refused(kind: &str, message: &str) -> CallToolResult {
    let body = serde_json::json!({ "error": { "kind": kind, "message": message } });
    CallToolResult::error(vec![ContentBlock::text(body.to_string())])
}

fn outcome<T: serde::Serialize>(result: Result<T, ClientError>) -> CallToolResult {
    match result {
        Ok(value) => reply(&value),
        Err(err) => failure(&err),
    }
}

/// Tools that take nothing.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct NoParams {}

/// `list_peers` parameters (both optional: no arguments lists the first page).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListPeersParams {
    /// Continue after this agent id: the `next` of the previous answer.
    #[serde(default)]
    pub after: Option<String>,
    /// Most peers in the answer (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// `send_to_peer` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendParams {
    /// The peer's agent id from list_peers, or "*" to broadcast to every peer you may reach.
    pub to: String,
    /// The message text.
    pub message: String,
    /// The message id this one answers or follows up (optional; threads the conversation).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub in_reply_to: Option<Uuid>,
    /// A correlation id to carry (optional).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub correlation_id: Option<Uuid>,
}

/// `talk_to_agent` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct TalkParams {
    /// The agent id to consult (from list_peers).
    pub to: String,
    /// Your question or request.
    pub message: String,
    /// How long to wait for the answer, in milliseconds (default 30000, at most 300000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// `reply_to_peer` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReplyParams {
    /// Your answer.
    pub message: String,
    /// The correlation_id of the request you answer; omit it to answer the most recent request
    /// you have not answered yet.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub correlation_id: Option<Uuid>,
}

/// `create_task` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateTaskParams {
    /// The agent id that should do the task (from list_peers).
    pub to: String,
    /// What to do: a complete, self-contained description.
    pub message: String,
    /// Fail the task if it is not finished within this many milliseconds (optional).
    #[serde(default)]
    pub deadline_in_ms: Option<u64>,
}

/// What `update_task` does.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UpdateAction {
    /// Take a task given to you (before starting it).
    Accept,
    /// Decline a task given to you (say why in `message`).
    Reject,
    /// Begin work on an accepted task.
    Start,
    /// Report progress on a task you work on (`message`: the note).
    Progress,
    /// Ask the requester a question and wait for input (`message`: the question).
    InputRequired,
    /// Finish a task with its result (`message`: the result).
    Complete,
    /// Give up on a task (`message`: why).
    Fail,
}

impl UpdateAction {
    fn op(self) -> TaskOp {
        match self {
            Self::Accept => TaskOp::Accept,
            Self::Reject => TaskOp::Reject,
            Self::Start => TaskOp::Start,
            Self::Progress => TaskOp::Progress,
            Self::InputRequired => TaskOp::InputRequired,
            Self::Complete => TaskOp::Complete,
            Self::Fail => TaskOp::Fail,
        }
    }
}

/// `update_task` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct UpdateTaskParams {
    /// The task id (the task_id attribute of the task message in check_inbox).
    #[schemars(with = "String")]
    pub task_id: Uuid,
    /// accept, reject, start, progress, input_required, complete or fail.
    pub action: UpdateAction,
    /// The note, question, result or reason that goes with the action.
    #[serde(default)]
    pub message: Option<String>,
}

/// `spawn_subagent` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SpawnParams {
    /// The task you are working on that this subtask belongs to.
    #[schemars(with = "String")]
    pub parent_task_id: Uuid,
    /// What the subagent should do: a complete, self-contained description.
    pub message: String,
    /// A named agent to delegate to; omit it to spawn a copy of yourself (every live session
    /// of your own agent is offered the subtask).
    #[serde(default)]
    pub agent: Option<String>,
    /// Fail the subtask if it is not finished within this many milliseconds (optional).
    #[serde(default)]
    pub deadline_in_ms: Option<u64>,
}

/// `complete_task` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CompleteParams {
    /// The task (or subtask) you finished.
    #[schemars(with = "String")]
    pub task_id: Uuid,
    /// Your findings: the result handed to whoever gave you the task.
    pub result: String,
}

/// `subagent_status` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct StatusParams {
    /// One task or subtask (the handle spawn_subagent or create_task returned).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub task_id: Option<Uuid>,
    /// A parent task: list all its subtasks and their states.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub parent_task_id: Option<Uuid>,
}

/// `cancel_task` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CancelParams {
    /// A task you created (its open subtasks are canceled too).
    #[schemars(with = "String")]
    pub task_id: Uuid,
    /// Why (optional; the assignee is told).
    #[serde(default)]
    pub reason: Option<String>,
}

#[tool_router]
impl SwitchboardMcp {
    fn new(agent: Arc<Agent>, goal: Arc<Goal>) -> Self {
        Self {
            agent,
            goal,
            unanswered: Arc::new(Mutex::new(Vec::new())),
            subscribed: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            tool_router: Self::tool_router(),
        }
    }

    /// The most recent request shown, not answered, whose caller still waits (requests past
    /// their deadline are forgotten).
    fn last_unanswered(&self) -> Option<Uuid> {
        let mut list = self.unanswered.lock().ok()?;
        list.retain(Unanswered::open);
        list.last().map(|request| request.correlation_id)
    }

    fn answered(&self, correlation_id: Uuid) {
        if let Ok(mut list) = self.unanswered.lock() {
            list.retain(|request| request.correlation_id != correlation_id);
        }
    }

    fn remember_requests(&self, messages: &[InboxMessage]) {
        if let Ok(mut list) = self.unanswered.lock() {
            for request in messages.iter().filter_map(Unanswered::from) {
                if !list
                    .iter()
                    .any(|known| known.correlation_id == request.correlation_id)
                {
                    list.push(request);
                }
            }
        }
    }

    #[tool(
        description = "List the other agents you can talk to: their ids, descriptions, \
                       capabilities, status (idle/busy/offline) and whether you may reach them. \
                       Call this before send_to_peer, talk_to_agent or create_task to find the \
                       right agent id. Peers come in pages in id order; when the answer has \
                       `next`, call again with `after` set to it for more."
    )]
    async fn list_peers(&self, Parameters(params): Parameters<ListPeersParams>) -> CallToolResult {
        outcome(
            self.agent
                .peers_page(&switchboard_proto::registry::PeersRequest {
                    after: params.after,
                    limit: params.limit,
                })
                .await,
        )
    }

    #[tool(
        description = "Send a one-way message to another agent (fire and forget): it lands in \
                       every live session of that agent. Use to=\"*\" to broadcast to every peer \
                       you may reach. Returns the delivery report: which sessions got it and, \
                       for peers it could not reach, why. Call list_peers first to pick the id. \
                       To get an answer back, use talk_to_agent instead."
    )]
    async fn send_to_peer(&self, Parameters(params): Parameters<SendParams>) -> CallToolResult {
        let request = SendRequest {
            to: Some(params.to),
            message: Some(params.message),
            in_reply_to: params.in_reply_to,
            correlation_id: params.correlation_id,
            from_goal_id: Some(self.goal.id()),
            ..SendRequest::default()
        };
        outcome(self.agent.send(request).await)
    }

    #[tool(
        description = "Consult another agent and wait for its answer (a correlated call): \
                       returns the answer text, or an error with kind timeout, cycle, \
                       depth_exceeded or unreachable. Use it when you need the answer before \
                       you can go on; the other agent answers with reply_to_peer."
    )]
    async fn talk_to_agent(&self, Parameters(params): Parameters<TalkParams>) -> CallToolResult {
        let timeout = Duration::from_millis(params.timeout_ms.unwrap_or(30_000));
        let call = self.agent.call(&params.to, &params.message, timeout);
        // A call made while a request to us is open continues that request's chain, so the
        // correlator can refuse cycles (A asks B, B asks A) and over-deep chains.
        let result = match self.last_unanswered() {
            Some(parent) => serving(parent, call).await,
            None => call.await,
        };
        outcome(result)
    }

    #[tool(
        description = "Answer a peer that asked you something (a message with kind=\"request\" \
                       in check_inbox). No target needed: without correlation_id it answers the \
                       most recent request you have not answered yet. Returns the service's \
                       acknowledgement, or an error (e.g. expired when the caller stopped \
                       waiting)."
    )]
    async fn reply_to_peer(&self, Parameters(params): Parameters<ReplyParams>) -> CallToolResult {
        let target = match params.correlation_id.or_else(|| self.last_unanswered()) {
            Some(id) => id,
            None => match self.agent.pending_calls().await {
                Ok(pending) => match pending.incoming.last() {
                    Some(call) => call.correlation_id,
                    None => {
                        return refused(
                            "not_found",
                            "no request is waiting for your answer; use send_to_peer to \
                             message a peer",
                        );
                    }
                },
                Err(err) => return failure(&err),
            },
        };
        let result = self.agent.reply(target, &params.message).await;
        if result.is_ok()
            || matches!(&result, Err(err) if err.kind().is_some_and(|kind| kind.is_refusal()
                || kind == switchboard_client::proto::ErrorKind::NotFound))
        {
            self.answered(target);
        }
        outcome(result)
    }

    #[tool(
        description = "Read the new messages in your inbox (and take them: each is shown once). \
                       Returns a # PEER MESSAGES block of <peer-message> elements with the \
                       sender, time and, where present, correlation_id, kind (request, \
                       response, notify, task, task_update) and task_id. Answer kind=\"request\" \
                       with reply_to_peer; act on kind=\"task\" with update_task."
    )]
    async fn check_inbox(&self, _: Parameters<NoParams>) -> CallToolResult {
        // One page of unread messages is taken (acknowledged) once the block that hands it to
        // the model is ready: that is the moment they are read. A failed fetch or ack leaves
        // them unread, so the next check_inbox shows them again rather than losing them; more
        // than one page waiting is said at the end of the block.
        let page = match self.goal.fetch(FETCH_MAX, Duration::ZERO, None).await {
            Ok(page) => page,
            Err(err) => return failure(&err),
        };
        let through = page.messages.last().map(|m| m.seq);
        let more = page.unread.saturating_sub(page.messages.len() as u64);
        let messages: Vec<InboxMessage> = page.messages.into_iter().map(|m| m.message).collect();
        self.remember_requests(&messages);
        let mut text =
            render_peer_messages_block(&messages).unwrap_or_else(|| "No new messages.".to_owned());
        if more > 0 {
            text.push_str(&format!(
                "\n({more} more unread message(s): call check_inbox again to read them)"
            ));
        }
        if let Some(through) = through
            && let Err(err) = self.goal.ack_through(through).await
        {
            return failure(&err);
        }
        CallToolResult::success(vec![ContentBlock::text(text)])
    }

    #[tool(
        description = "Give a task to another agent and keep working: it gets a kind=\"task\" \
                       message, accepts and works on it, and every change of state comes back \
                       to your inbox as kind=\"task_update\" (the last one carries the result). \
                       Returns the task record with its task_id. Call list_peers first."
    )]
    async fn create_task(
        &self,
        Parameters(params): Parameters<CreateTaskParams>,
    ) -> CallToolResult {
        let task = CreateTask {
            to: Some(params.to),
            message: Some(params.message),
            deadline_in_ms: params.deadline_in_ms,
            from_goal_id: Some(self.goal.id()),
            ..CreateTask::default()
        };
        outcome(self.agent.create_task(task).await)
    }

    #[tool(
        description = "Move a task given to you through its life: accept (take it), reject \
                       (decline, say why), start, progress (a note to the requester), \
                       input_required (ask the requester a question), complete (with the \
                       result), fail (say why). Returns the task record, or an error such as \
                       illegal_transition, at_capacity or task_terminal."
    )]
    async fn update_task(
        &self,
        Parameters(params): Parameters<UpdateTaskParams>,
    ) -> CallToolResult {
        let action = TaskAction {
            task_id: Some(params.task_id),
            message: params.message,
            from_goal_id: Some(self.goal.id()),
            ..TaskAction::default()
        };
        outcome(self.agent.task_op(params.action.op(), action).await)
    }

    #[tool(
        description = "Hand part of the task you are working on to a subagent and keep \
                       working: omit agent to spawn a copy of yourself, or name an expert agent. \
                       The subagent's result returns to your inbox as a task_update. Returns \
                       the subtask record; its task_id is the handle for subagent_status. \
                       Subtasks nest at most 3 deep, with at most 8 open per task."
    )]
    async fn spawn_subagent(&self, Parameters(params): Parameters<SpawnParams>) -> CallToolResult {
        let task = CreateTask {
            to: Some(params.agent.unwrap_or_else(|| "self".to_owned())),
            message: Some(params.message),
            deadline_in_ms: params.deadline_in_ms,
            parent_task_id: Some(params.parent_task_id),
            from_goal_id: Some(self.goal.id()),
            ..CreateTask::default()
        };
        outcome(self.agent.create_task(task).await)
    }

    #[tool(
        description = "Deliver your result for a task or subtask you worked on: the result goes \
                       to whoever gave it to you and the task ends (completed). This is the only \
                       way a subagent's findings reach its parent."
    )]
    async fn complete_task(
        &self,
        Parameters(params): Parameters<CompleteParams>,
    ) -> CallToolResult {
        outcome(
            self.agent
                .complete_task(params.task_id, TaskOutcome::text(params.result))
                .await,
        )
    }

    #[tool(
        description = "Check on tasks: with task_id, that task's record (state, result, \
                       history); with parent_task_id, every subtask of that task and its state. \
                       Read-only."
    )]
    async fn subagent_status(
        &self,
        Parameters(params): Parameters<StatusParams>,
    ) -> CallToolResult {
        match (params.task_id, params.parent_task_id) {
            (Some(task), _) => outcome(self.agent.get_task(task).await),
            (None, Some(parent)) => outcome(self.agent.subtasks(parent).await),
            (None, None) => refused("bad_request", "give task_id or parent_task_id"),
        }
    }

    #[tool(
        description = "Cancel a task you created (its open subtasks are canceled too; the \
                       assignee is told). Returns the task record, or task_terminal if it \
                       already ended."
    )]
    async fn cancel_task(&self, Parameters(params): Parameters<CancelParams>) -> CallToolResult {
        outcome(
            self.agent
                .cancel_task(params.task_id, params.reason.as_deref())
                .await,
        )
    }

    #[tool(
        description = "The open correlated calls: outgoing (you asked, no answer yet) and \
                       incoming (others wait for your reply_to_peer), with correlation ids and \
                       callers. Use it to see what you still owe."
    )]
    async fn pending_requests(&self, _: Parameters<NoParams>) -> CallToolResult {
        outcome(self.agent.pending_calls().await)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SwitchboardMcp {
    #[allow(deprecated)] // enable_logging: see the import
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new(
            "switchboard",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(format!(
            "You are agent \"{}\" on Switchboard, a messaging fabric for agents. Use list_peers \
             to see who is there; send_to_peer for one-way messages; talk_to_agent to ask and \
             wait for an answer; check_inbox to read what others sent you (answer requests \
             with reply_to_peer); create_task / update_task / spawn_subagent / complete_task / \
             subagent_status / cancel_task for delegated work. A log notification with \
             event \"inbox\" means new messages are waiting.",
            self.agent.id()
        ))
    }

    async fn list_resources(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new(INBOX_RESOURCE, "inbox")
                .with_description(
                    "How many peer messages wait unread in this session's inbox (subscribe to \
                     hear when it grows; read them with check_inbox)",
                )
                .with_mime_type("application/json"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if request.uri != INBOX_RESOURCE {
            return Err(ErrorData::resource_not_found(
                format!("no resource {}; there is {INBOX_RESOURCE}", request.uri),
                None,
            ));
        }
        let waiting = self
            .goal
            .waiting()
            .await
            .map_err(|err| ErrorData::internal_error(err.to_string(), None))?;
        let body = serde_json::json!({
            "agent_id": self.agent.id(),
            "goal_id": self.goal.id(),
            "waiting": waiting,
        });
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(body.to_string(), INBOX_RESOURCE)
                .with_mime_type("application/json"),
        ])
        .into())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if request.uri != INBOX_RESOURCE {
            return Err(ErrorData::resource_not_found(
                format!("no resource {}; there is {INBOX_RESOURCE}", request.uri),
                None,
            ));
        }
        self.subscribed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        _: UnsubscribeRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscribed
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
