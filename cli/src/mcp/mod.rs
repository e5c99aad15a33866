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
//!
//! Layout: this file starts and stops the session and wires the rmcp handler; `params.rs` has
//! the tools' parameter types (their JSON Schema), `tools.rs` the tools, `resources.rs` the
//! inbox resource and the announcements of new messages.

mod files;
mod params;
mod people;
mod resources;
mod tools;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    Implementation, ListResourcesResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig, SubscribeRequestParams,
    UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool_handler};
use switchboard_client::proto::registry::{GoalKind, GoalOpenRequest};
use switchboard_client::proto::{AgentId, InboxMessage, MessageKind};
use switchboard_client::{Agent, AgentOptions, Goal};
use uuid::Uuid;

use crate::cmd::args::Connection;

/// `switchboard mcp` options.
#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// The agent this server speaks as (registered on start).
    #[arg(long, value_name = "AGENT")]
    agent: String,
    /// The kind of goal opened for this session: interactive, background or daemon.
    #[arg(long, default_value = "interactive", value_parser = crate::card::parse_goal_kind)]
    goal_kind: GoalKind,
    /// A folder the model may upload files from and save attachments into (the
    /// `upload_file` and `save_attachment` tools; without it the model passes files on by
    /// reference and reads text ones, but touches no disk).
    #[arg(long, value_name = "DIR")]
    files_dir: Option<std::path::PathBuf>,
    /// The agent's card.
    #[command(flatten)]
    card: crate::card::CardArgs,
    #[command(flatten)]
    conn: Connection,
}

/// Runs the server until the host closes stdin or a signal arrives.
pub async fn run(args: McpArgs) -> ExitCode {
    // stdout carries the protocol; logs go to stderr (quiet unless RUST_LOG says otherwise).
    // Its spans export under the agent's own name (OTLP endpoint as for every process:
    // `[telemetry]` in switchboard.toml or OTEL_EXPORTER_OTLP_ENDPOINT).
    let telemetry =
        switchboard_runtime::telemetry::init(&args.agent, &crate::traces::quiet_config());
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
    let nats = crate::nats::signed_in(switchboard_client::agent_connect_options(&id))
        .name(format!("mcp:{id}"))
        .connect(switchboard_client::server_list(&args.conn.nats_url).as_slice())
        .await
        .map_err(|err| anyhow::anyhow!("connecting to {}: {err}", args.conn.nats_url))?;
    let agent = Agent::connect_with(nats, card, AgentOptions::default()).await?;
    let goal = agent
        .open_goal_with(GoalOpenRequest {
            goal_id: None,
            name: None,
            kind: Some(args.goal_kind),
            overflow: None,
        })
        .await?;
    if let Some(dir) = &args.files_dir
        && !dir.is_dir()
    {
        anyhow::bail!("--files-dir {}: not a folder", dir.display());
    }
    let server = SwitchboardMcp::new(Arc::new(agent), Arc::new(goal), args.files_dir);
    let session = async {
        let running = server.clone().serve(rmcp::transport::stdio()).await?;
        let watch = tokio::spawn(resources::announce_new_messages(
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

/// The MCP server: one agent, one goal, and the requests it has been shown and not answered.
#[derive(Clone)]
pub struct SwitchboardMcp {
    agent: Arc<Agent>,
    goal: Arc<Goal>,
    /// Correlation ids of requests `check_inbox` showed that wait for an answer, oldest
    /// first: `reply_to_peer` without a target answers the last one.
    unanswered: Arc<Mutex<Vec<Unanswered>>>,
    /// Partial replies sent per request being answered in parts (their next number).
    parts: Arc<Mutex<std::collections::HashMap<Uuid, u32>>>,
    /// Whether the host subscribed to [`INBOX_RESOURCE`](resources::INBOX_RESOURCE).
    subscribed: Arc<std::sync::atomic::AtomicBool>,
    /// The folder `upload_file` and `save_attachment` work in (`--files-dir`).
    files_dir: Option<Arc<std::path::Path>>,
    tool_router: ToolRouter<Self>,
}

/// A request shown by `check_inbox` that waits for this agent's answer.
#[derive(Debug, Clone)]
struct Unanswered {
    correlation_id: Uuid,
    /// Who asked, and the request message's id: a `talk_to_agent` back to them is a
    /// question inside their call (`in_reply_to` the request), not a cycle.
    from: switchboard_client::proto::AgentId,
    request_id: Option<Uuid>,
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
            from: message.from_agent_id.clone(),
            request_id: message.id,
            deadline,
        })
    }

    fn open(&self) -> bool {
        self.deadline
            .is_none_or(|deadline| deadline > time::OffsetDateTime::now_utc())
    }
}

/// The tools `switchboard mcp` offers, as its `tools/list` shows them: name, description and
/// input JSON Schema of each, sorted by name. The SDKs' LLM tool definitions are generated from
/// this list (`docs/mcp-tools.json`, which the contract test keeps equal to it), so an LLM gets
/// the same tools whether it reaches the fabric through MCP or through an SDK.
pub fn tool_definitions() -> serde_json::Value {
    let mut tools = SwitchboardMcp::all_tools().list_all();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    serde_json::Value::Array(
        tools
            .into_iter()
            .map(|tool| {
                serde_json::json!({
                    "name": tool.name,
                    "description": tool.description,
                    "inputSchema": tool.input_schema,
                })
            })
            .collect(),
    )
}

impl SwitchboardMcp {
    fn new(agent: Arc<Agent>, goal: Arc<Goal>, files_dir: Option<std::path::PathBuf>) -> Self {
        let mut tool_router = Self::all_tools();
        if files_dir.is_some() {
            tool_router += Self::disk_router();
        }
        Self {
            agent,
            goal,
            unanswered: Arc::new(Mutex::new(Vec::new())),
            parts: Arc::default(),
            subscribed: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            files_dir: files_dir.map(Arc::from),
            tool_router,
        }
    }

    /// Every tool the SDKs offer too: the agent tools, the people tools and
    /// `read_attachment` (not the disk tools of `--files-dir`, which only a local host has).
    fn all_tools() -> ToolRouter<Self> {
        Self::tool_router() + Self::people_router() + Self::files_router()
    }

    /// The most recent request shown, not answered, whose caller still waits (requests past
    /// their deadline are forgotten).
    fn last_unanswered(&self) -> Option<Uuid> {
        self.last_request().map(|request| request.correlation_id)
    }

    /// [`Self::last_unanswered`], whole.
    fn last_request(&self) -> Option<Unanswered> {
        let mut list = self.unanswered.lock().ok()?;
        list.retain(Unanswered::open);
        list.last().cloned()
    }

    /// The number of the next part of the answer to `correlation_id` (1 for the first).
    fn next_part(&self, correlation_id: Uuid) -> u32 {
        let Ok(mut parts) = self.parts.lock() else {
            return 1;
        };
        let next = parts.entry(correlation_id).or_insert(0);
        *next += 1;
        *next
    }

    /// Takes back the number [`Self::next_part`] gave to a part that was not taken.
    fn part_not_sent(&self, correlation_id: Uuid) {
        if let Ok(mut parts) = self.parts.lock()
            && let Some(next) = parts.get_mut(&correlation_id)
        {
            *next = next.saturating_sub(1);
        }
    }

    fn answered(&self, correlation_id: Uuid) {
        if let Ok(mut parts) = self.parts.lock() {
            parts.remove(&correlation_id);
        }
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
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SwitchboardMcp {
    #[allow(deprecated)] // enable_logging: deprecated by SEP-2577, but hosts still show logs
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

    /// Each tool call is one trace rooted at this agent's span (`service.name` = the agent):
    /// the requests it makes carry it, so the services' spans join it.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        use tracing::Instrument as _;
        let agent = self.agent.id().to_string();
        let span = tracing::info_span!(
            parent: None,
            "tool",
            otel.name = %format!("{agent}: {}", request.name),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            switchboard.agent_id = %agent,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %request.name,
        );
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        let result = self.tool_router.call(call).instrument(span.clone()).await;
        if result.as_ref().is_err() {
            span.record("otel.status_code", "ERROR");
        }
        result
    }

    async fn list_resources(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(resources::list())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.read_inbox(&request.uri).await
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscribe_inbox(&request.uri)
    }

    async fn unsubscribe(
        &self,
        _: UnsubscribeRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.unsubscribe_inbox();
        Ok(())
    }
}
