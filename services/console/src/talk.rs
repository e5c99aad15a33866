//! Talk to an agent (docs/console.md): a person with `operator` access sends a message, makes
//! a call or gives a task to any agent, and reads the answers in the page.
//!
//! The person speaks as the agent `people-<person id>` ([`switchboard_proto::PERSON_AGENT_PREFIX`]),
//! which the console registers for them the way the A2A gateway registers its clients: every
//! request goes out on that agent's own subjects, so the agent's `allow_from`, the request
//! budgets and the audit trail all see who asked, and no agent key is ever issued for it
//! (`switchboard nats-config` refuses the prefix). Answers, call results and task updates come
//! to its goal `console` (opened by name, so a console restart reads on where it stopped);
//! the page reads them through [`Talk::read`], which keeps the last [`SHOWN`] for the person.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_nats::Client;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use switchboard_proto::call::CallRequest;
use switchboard_proto::inbox::{FetchReply, FetchRequest};
use switchboard_proto::registry::{GoalOpenReply, GoalOpenRequest};
use switchboard_proto::send::SendRequest;
use switchboard_proto::subject::{self, RegistryOp};
use switchboard_proto::task::{CreateTask, TaskRequestOp};
use switchboard_proto::{AgentCard, AgentId, ErrorKind, ErrorReply, GoalId};
use switchboard_request::request::{RequestFailure, request_json};

use switchboard_runtime::people_book::Person;

use crate::error::ApiError;

/// Messages kept per person for the page (older ones are in the conversation view).
pub(crate) const SHOWN: usize = 200;
/// Persons whose conversations one console keeps; past it the least recent is forgotten.
const PERSONS: usize = 1024;
/// The goal every person's agent reads its answers from.
const GOAL_NAME: &str = "console";
/// How long a call made from the page waits for its answer before the callee is told it
/// timed out (the answer still comes to the page as the timeout notice).
const CALL_TIMEOUT_MS: u64 = 120_000;
/// Requests to the services wait this long.
const WAIT: Duration = Duration::from_secs(10);

/// What a person does from the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Mode {
    /// A message; nothing waits.
    Send,
    /// A call: the answer (or the timeout notice) comes to the page.
    Call,
    /// A task: its updates come to the page.
    Task,
}

/// One person's conversation as the page shows it.
#[derive(Debug, Default)]
struct Conversation {
    goal: Option<GoalId>,
    /// The highest sequence read from the goal (acknowledged on the next read).
    read_through: u64,
    shown: VecDeque<Value>,
    used: u64,
}

/// The people talking from this console.
#[derive(Debug, Default)]
pub(crate) struct Talk {
    /// The card each person's agent was registered with by this console.
    registered: Mutex<HashMap<AgentId, AgentCard>>,
    conversations: Mutex<HashMap<AgentId, Conversation>>,
    clock: std::sync::atomic::AtomicU64,
}

/// The agent a person speaks as: `people-<id>`.
pub(crate) fn agent_of(person: &AgentId) -> Result<AgentId, ApiError> {
    AgentId::parse(&format!(
        "{}{person}",
        switchboard_proto::PERSON_AGENT_PREFIX
    ))
    .map_err(|_| {
        ApiError::BadRequest(format!(
            "person:{person} has an id too long to talk to agents (at most {} characters)",
            64 - switchboard_proto::PERSON_AGENT_PREFIX.len()
        ))
    })
}

impl Talk {
    fn with<T>(&self, agent: &AgentId, f: impl FnOnce(&mut Conversation) -> T) -> T {
        let mut all = self
            .conversations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !all.contains_key(agent) && all.len() >= PERSONS {
            let oldest = all
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                all.remove(&oldest);
            }
        }
        let conversation = all.entry(agent.clone()).or_default();
        conversation.used = self
            .clock
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f(conversation)
    }

    /// Registers the person's agent (again when the person's reach in the people file
    /// changed) and opens its goal.
    async fn ready(
        &self,
        client: &Client,
        person: &Person,
        agent: &AgentId,
    ) -> Result<GoalId, ApiError> {
        let mut card = AgentCard::new(agent.clone());
        card.description = format!(
            "person:{}, talking through the Switchboard console",
            person.id
        );
        // Whom the person may reach is the people file's, enforced by the fabric's own ACLs.
        card.can_talk_to = person.can_talk_to.clone();
        card.deny_talk_to = person.deny_talk_to.clone();
        card.metadata
            .insert("person".to_owned(), json!(format!("person:{}", person.id)));
        let known = self
            .registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(agent)
            .is_some_and(|registered| *registered == card);
        if !known {
            let _: Value = fabric(client, &RegistryOp::Register.subject(agent), &card).await?;
            self.registered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(agent.clone(), card);
        }
        if let Some(goal) = self.with(agent, |c| c.goal) {
            return Ok(goal);
        }
        let opened: GoalOpenReply = fabric(
            client,
            &RegistryOp::GoalOpen.subject(agent),
            &GoalOpenRequest {
                name: Some(GOAL_NAME.to_owned()),
                ..GoalOpenRequest::default()
            },
        )
        .await?;
        self.with(agent, |c| c.goal = Some(opened.goal_id));
        Ok(opened.goal_id)
    }

    /// Sends, calls or gives a task as `person`; what the fabric answered, kept for the page
    /// too.
    pub(crate) async fn speak(
        &self,
        client: &Client,
        person: &Person,
        mode: Mode,
        to: &str,
        message: &str,
    ) -> Result<Value, ApiError> {
        let agent = agent_of(&person.id)?;
        let goal = self.ready(client, person, &agent).await?;
        let attempt = self.attempt(client, &agent, goal, mode, to, message).await;
        let reply = match attempt {
            // The directory lost the agent (a deregister, a purge): register again, once.
            Err(ApiError::Fabric(reply)) if reply.kind() == ErrorKind::NotRegistered => {
                self.forget(&agent);
                let goal = self.ready(client, person, &agent).await?;
                self.attempt(client, &agent, goal, mode, to, message)
                    .await?
            }
            other => other?,
        };
        let mode_name = match mode {
            Mode::Send => "send",
            Mode::Call => "call",
            Mode::Task => "task",
        };
        let entry = json!({
            "outgoing": true,
            "mode": mode_name,
            "to": to,
            "body": message,
            "at": switchboard_proto::timestamp::format(switchboard_proto::timestamp::now()),
            "reply": reply,
        });
        self.with(&agent, |c| push(&mut c.shown, entry));
        Ok(json!({"as": agent, "reply": reply}))
    }

    async fn attempt(
        &self,
        client: &Client,
        agent: &AgentId,
        goal: GoalId,
        mode: Mode,
        to: &str,
        message: &str,
    ) -> Result<Value, ApiError> {
        match mode {
            Mode::Send => {
                let request = SendRequest {
                    to: Some(to.to_owned()),
                    message: Some(message.to_owned()),
                    from_goal_id: Some(goal),
                    ..SendRequest::default()
                };
                let report: Value = fabric(client, &subject::send(agent), &request).await?;
                // A send reaches whom it can and says why not the others; from the page, a
                // message that reached nobody is an error the person sees.
                let nobody = report["delivered_to"]
                    .as_array()
                    .is_some_and(|goals| goals.is_empty());
                if nobody {
                    let why = report["unreachable_reasons"]
                        .as_array()
                        .map(|reasons| {
                            reasons
                                .iter()
                                .filter_map(Value::as_str)
                                .collect::<Vec<_>>()
                                .join("; ")
                        })
                        .unwrap_or_default();
                    return Err(ApiError::Fabric(ErrorReply::new(
                        ErrorKind::Unreachable,
                        format!("the message reached nobody: {why}"),
                    )));
                }
                Ok(report)
            }
            Mode::Call => {
                let request = CallRequest {
                    to: Some(to.to_owned()),
                    message: Some(message.to_owned()),
                    from_goal_id: Some(goal),
                    timeout_ms: Some(CALL_TIMEOUT_MS),
                    wait: Some(false),
                    ..CallRequest::default()
                };
                fabric(client, &subject::call(agent), &request).await
            }
            Mode::Task => {
                let request = CreateTask {
                    to: Some(to.to_owned()),
                    message: Some(message.to_owned()),
                    from_goal_id: Some(goal),
                    ..CreateTask::default()
                };
                fabric(client, &TaskRequestOp::Create.subject(agent), &request).await
            }
        }
    }

    fn forget(&self, agent: &AgentId) {
        self.registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(agent);
        self.with(agent, |c| c.goal = None);
    }

    /// What came back to the person's agent since the last read (acknowledged as read), with
    /// what they sent: the last [`SHOWN`], oldest first.
    pub(crate) async fn read(&self, client: &Client, person: &Person) -> Result<Value, ApiError> {
        let agent = agent_of(&person.id)?;
        let goal = self.ready(client, person, &agent).await?;
        let through = self.with(&agent, |c| c.read_through);
        let request = FetchRequest {
            goal_id: goal,
            max: Some(64),
            ack_through: (through > 0).then_some(through),
            ..FetchRequest::default()
        };
        let fetched: FetchReply =
            match fabric(client, &subject::inbox_fetch(&agent), &request).await {
                Ok(fetched) => fetched,
                // The goal was closed or lost (a restart of the directory's data): open it again.
                Err(ApiError::Fabric(reply))
                    if matches!(
                        reply.kind(),
                        ErrorKind::NotRegistered | ErrorKind::InvalidGoalId | ErrorKind::NotFound
                    ) =>
                {
                    self.forget(&agent);
                    self.with(&agent, |c| c.read_through = 0);
                    return Err(ApiError::Fabric(reply));
                }
                Err(err) => return Err(err),
            };
        let shown = self.with(&agent, |c| {
            for fetched in &fetched.messages {
                if fetched.seq <= c.read_through {
                    continue;
                }
                c.read_through = fetched.seq;
                let entry = json!({
                    "outgoing": false,
                    "seq": fetched.seq,
                    "message": fetched.message,
                });
                push(&mut c.shown, entry);
            }
            c.shown.iter().cloned().collect::<Vec<_>>()
        });
        Ok(json!({"as": agent, "goal_id": goal, "messages": shown}))
    }
}

fn push(shown: &mut VecDeque<Value>, entry: Value) {
    if shown.len() >= SHOWN {
        shown.pop_front();
    }
    shown.push_back(entry);
}

/// A request to a service; a refusal keeps its kind.
async fn fabric<Req, Resp>(client: &Client, subject: &str, body: &Req) -> Result<Resp, ApiError>
where
    Req: Serialize + ?Sized,
    Resp: DeserializeOwned,
{
    request_json(client, subject, body, WAIT)
        .await
        .map_err(|failure: RequestFailure| match failure {
            RequestFailure::Service(reply) => ApiError::Fabric(reply),
            other => ApiError::from(other),
        })
}

/// Checks what a person typed before anything goes out.
pub(crate) fn check_input(to: &str, message: &str) -> Result<(), ApiError> {
    let to = to.trim();
    if to.is_empty() || to.len() > 128 {
        return Err(ApiError::BadRequest(
            "`to` must name an agent (or skill:<name>), at most 128 characters".to_owned(),
        ));
    }
    if message.trim().is_empty() {
        return Err(ApiError::BadRequest("write a message first".to_owned()));
    }
    if message.len() > switchboard_proto::MAX_BODY_BYTES {
        return Err(ApiError::Fabric(ErrorReply::new(
            ErrorKind::BodyTooLarge,
            format!(
                "the message is {} bytes; the most is {}",
                message.len(),
                switchboard_proto::MAX_BODY_BYTES
            ),
        )));
    }
    Ok(())
}
