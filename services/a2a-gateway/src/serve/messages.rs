//! A message that needs no task, carried as a call (docs/a2a.md, "Message or task").
//!
//! An agent whose directory card says `metadata.a2a_messages: "call"` gets each new A2A
//! message (no `taskId`, no `returnImmediately`, no webhook) as a call from the client's
//! agent (docs/protocol.md §9), and chooses how to answer it:
//! - a reply: `SendMessage` answers with a `Message`; a streamed reply (`partial` parts)
//!   streams, in `SendStreamingMessage`, as one artifact sent in chunks (`append`,
//!   `lastChunk`) of a task whose id is the call's;
//! - a reply with the data part `{"switchboard": "task"}`: the gateway makes the message a
//!   task for the agent, as for any other agent, and answers with the task.

use a2a::{
    Artifact, Message, Role, SendMessageRequest, StreamResponse, Task, TaskArtifactUpdateEvent,
    TaskStatus, TaskStatusUpdateEvent,
};
use futures::StreamExt as _;
use serde_json::{Map, Value};
use switchboard_client::CallEvent;
use switchboard_proto::call::{CallAnswer, CallPart, CallRequest};
use switchboard_proto::{AgentId, subject};
use tokio::sync::mpsc;

use crate::error::GatewayError;
use crate::gateway::{Gateway, SERVICE_TIMEOUT, StreamSlot};
use crate::mapping::{self, CONTEXT_KEY, MESSAGE_KEY};
use crate::serve::events::Item;

/// The card `metadata` key by which an agent takes A2A messages as calls ([`AS_CALLS`]).
pub const MESSAGES_KEY: &str = "a2a_messages";
/// [`MESSAGES_KEY`]'s value for an agent that takes A2A messages as calls.
pub const AS_CALLS: &str = "call";
/// The key of the data part by which an agent answering a call asks for a task instead
/// (`{"switchboard": "task"}`).
pub const TASK_MARKER_KEY: &str = "switchboard";
/// [`TASK_MARKER_KEY`]'s value.
pub const TASK_MARKER: &str = "task";
/// The artifact id of a streamed answer's chunks.
pub const ANSWER_ARTIFACT: &str = "answer";

/// What a call made of a message came to.
pub(crate) enum Called {
    /// The agent answered: the answer as an A2A message.
    Message(Message),
    /// The agent asked for a task.
    Task,
}

/// What a streamed call made of a message came to, once its first event arrived.
pub(crate) enum CalledStream {
    /// The agent answers (at once or in parts): the stream's items.
    Items(mpsc::Receiver<Result<Item, GatewayError>>),
    /// The agent asked for a task: the stream slot back, for the task's stream.
    Task(StreamSlot),
}

/// Whether an answer asks for a task: its one part is the data part `{"switchboard":
/// "task"}`, exactly (an answer that passes on the client's parts, a marker among them, is
/// an answer, not a wish).
fn asks_for_task(parts: &[switchboard_proto::Part]) -> bool {
    match parts {
        [
            switchboard_proto::Part::Data {
                data: Value::Object(data),
            },
        ] => {
            data.len() == 1
                && data.get(TASK_MARKER_KEY).and_then(Value::as_str) == Some(TASK_MARKER)
        }
        _ => false,
    }
}

/// The answer as the agent's A2A message in `context` (its id is the call's), its files as
/// `files` (the links its caller reads them by).
fn answer_message(answer: &CallAnswer, context: &str, files: Vec<a2a::Part>) -> Message {
    let mut parts = Vec::with_capacity(1 + answer.parts.len() + files.len());
    if !answer.body.is_empty() || (answer.parts.is_empty() && files.is_empty()) {
        parts.push(a2a::Part::text(answer.body.clone()));
    }
    parts.extend(mapping::outbound(&answer.parts));
    parts.extend(files);
    let mut message = Message::new(Role::Agent, parts);
    message.message_id = answer.correlation_id.to_string();
    message.context_id = Some(context.to_owned());
    message
}

impl Gateway {
    /// Whether `request` goes to `agent` as a call: a new message (no `taskId`) that is to be
    /// waited for (no `returnImmediately`), sets no webhook (a webhook needs a task), to an
    /// agent whose card takes messages as calls.
    pub(crate) async fn as_call(&self, agent: &AgentId, request: &SendMessageRequest) -> bool {
        let configuration = request.configuration.as_ref();
        if request.message.task_id.is_some()
            || configuration.and_then(|c| c.return_immediately) == Some(true)
            || configuration.is_some_and(|c| c.task_push_notification_config.is_some())
        {
            return false;
        }
        matches!(self.store.agent(agent).await, Ok(Some(record))
            if record.card.metadata.get(MESSAGES_KEY).and_then(Value::as_str) == Some(AS_CALLS))
    }

    /// The call a message becomes, and the context it is in (the message's, or a fresh one).
    async fn call_request(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: &SendMessageRequest,
        stream: bool,
    ) -> Result<(CallRequest, String), GatewayError> {
        // The checks that need no upload come first: a refused message leaves no file.
        crate::serve::params::check_message_id(&request.message.message_id)?;
        let (context, continued) = crate::serve::params::message_context(request)?;
        let content = self.message_content(caller, request).await?;
        let (text, parts) = (content.text, content.parts);
        // The marker is the agent's word: a client's copy, echoed back by an agent that
        // passes parts on, would make its message a task behind the agent's back.
        if parts
            .iter()
            .any(|part| asks_for_task(std::slice::from_ref(part)))
        {
            self.forget_files(caller, &content.attachments).await;
            return Err(GatewayError::InvalidParams(format!(
                "the data part {{\"{TASK_MARKER_KEY}\": \"{TASK_MARKER}\"}} is reserved for the \
                 agent's answer"
            )));
        }
        let from_goal_id = if continued {
            self.context_goal(caller, &context).await
        } else {
            None
        };
        let mut metadata = Map::new();
        metadata.insert(CONTEXT_KEY.to_owned(), Value::String(context.clone()));
        metadata.insert(
            MESSAGE_KEY.to_owned(),
            Value::String(request.message.message_id.clone()),
        );
        let call = CallRequest {
            to: Some(agent.to_string()),
            message: Some(text),
            parts,
            metadata,
            from_goal_id,
            wait: Some(true),
            timeout_ms: Some(self.config.blocking_timeout_ms),
            stream,
            correlation_id: Some(switchboard_proto::new_id()),
            attachments: content.attachments,
            ..Default::default()
        };
        Ok((call, context))
    }

    /// A blocking `SendMessage` as a call: the agent's answer, or its wish for a task.
    pub(crate) async fn call(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: &SendMessageRequest,
    ) -> Result<Called, GatewayError> {
        let (call, context) = self.call_request(caller, agent, request, false).await?;
        let within = std::time::Duration::from_millis(self.config.blocking_timeout_ms);
        let subject = subject::call(caller);
        let calling = self.request_within(
            caller,
            &subject,
            &call,
            "calling the agent",
            within + SERVICE_TIMEOUT,
        );
        let answer: CallAnswer = tokio::select! {
            answer = calling => match answer {
                Ok(answer) => answer,
                Err(err) => {
                    // Refused outright, the call carried nothing anywhere: its uploads go.
                    // Anything else (a timeout) may have reached the agent: they stay.
                    if matches!(err, GatewayError::Refused(_)) {
                        self.forget_files(caller, &call.attachments).await;
                    }
                    return Err(err);
                }
            },
            () = self.stopping.cancelled() => {
                return Err(GatewayError::unavailable("calling the agent", "the gateway is stopping"));
            }
        };
        // The agent failed its call (`reply` with `error`): the client gets an error, not an
        // empty message.
        if let Some(error) = &answer.error {
            return Err(GatewayError::unavailable(
                "the agent's answer",
                format!("the agent failed: {} ({})", error.message, error.kind),
            ));
        }
        if asks_for_task(&answer.parts) {
            // The message becomes a task, which uploads its files again.
            self.forget_files(caller, &call.attachments).await;
            return Ok(Called::Task);
        }
        let files = self.links.parts(caller, &answer.attachments);
        Ok(Called::Message(answer_message(&answer, &context, files)))
    }

    /// A `SendStreamingMessage` as a streamed call: waits for the call's first event, then
    /// streams the rest. An answer at once is one `Message`; an answer in parts is a task
    /// (the call's id) working, one artifact in chunks, and its completion.
    pub(crate) async fn call_streamed(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: &SendMessageRequest,
        slot: StreamSlot,
    ) -> Result<CalledStream, GatewayError> {
        let (call, context) = self.call_request(caller, agent, request, true).await?;
        let Some(correlation_id) = call.correlation_id else {
            return Err(GatewayError::InvalidParams("no call id".to_owned()));
        };
        self.ensure_registered(caller).await?;
        let uploaded = call.attachments.clone();
        let mut events =
            switchboard_client::call_streamed_on(&self.client, caller, call, SERVICE_TIMEOUT)
                .await
                .map_err(|err| GatewayError::unavailable("calling the agent", err))?
                .boxed();
        let first = next_event(&mut events).await?;
        let (items, rx) = mpsc::channel(16);
        let chunks = Chunks {
            task_id: correlation_id.to_string(),
            context,
            streamed: String::new(),
            sent: 0,
        };
        match first {
            CallEvent::Answer(answer) if asks_for_task(&answer.parts) => {
                // The message becomes a task, which uploads its files again.
                self.forget_files(caller, &uploaded).await;
                return Ok(CalledStream::Task(slot));
            }
            CallEvent::Answer(answer) => {
                let files = self.links.parts(caller, &answer.attachments);
                let message = answer_message(&answer, &chunks.context, files);
                let item = Item {
                    seq: None,
                    response: StreamResponse::Message(message),
                };
                let _ = items.send(Ok(item)).await;
            }
            CallEvent::Part(part) => {
                let stopping = self.stopping.clone();
                tokio::spawn(async move {
                    // The client's stream slot is held until the answer is through.
                    let _slot = slot;
                    tokio::select! {
                        () = chunks.stream(part, events, &items) => {}
                        () = items.closed() => {}
                        () = stopping.cancelled() => {}
                    }
                });
            }
        }
        Ok(CalledStream::Items(rx))
    }
}

/// The next event of a streamed call, its failure as the gateway's.
async fn next_event(
    events: &mut (
             impl futures::Stream<Item = Result<CallEvent, switchboard_client::ClientError>> + Unpin
         ),
) -> Result<CallEvent, GatewayError> {
    match events.next().await {
        Some(Ok(event)) => Ok(event),
        Some(Err(switchboard_client::ClientError::Service(reply))) => {
            Err(GatewayError::Refused(reply))
        }
        Some(Err(err)) => Err(GatewayError::unavailable("calling the agent", err)),
        None => Err(GatewayError::unavailable(
            "calling the agent",
            "the call ended without an answer",
        )),
    }
}

/// A streamed answer as a task's stream: the task working, its artifact in chunks, then the
/// task completed.
struct Chunks {
    task_id: String,
    context: String,
    /// The parts' text so far (the final answer repeats it before its own).
    streamed: String,
    /// Chunks sent so far.
    sent: usize,
}

impl Chunks {
    async fn stream(
        mut self,
        first: CallPart,
        mut events: impl futures::Stream<Item = Result<CallEvent, switchboard_client::ClientError>>
        + Unpin,
        items: &mpsc::Sender<Result<Item, GatewayError>>,
    ) {
        let working = Task {
            id: self.task_id.clone(),
            context_id: self.context.clone(),
            status: self.status(a2a::TaskState::Working),
            artifacts: None,
            history: None,
            metadata: None,
        };
        if !send(items, StreamResponse::Task(working)).await {
            return;
        }
        let chunk = self.chunk(&first.body, &first.parts, false);
        self.streamed.push_str(&first.body);
        if !send(items, chunk).await {
            return;
        }
        loop {
            match next_event(&mut events).await {
                Ok(CallEvent::Part(part)) => {
                    let chunk = self.chunk(&part.body, &part.parts, false);
                    self.streamed.push_str(&part.body);
                    if !send(items, chunk).await {
                        return;
                    }
                }
                Ok(CallEvent::Answer(answer)) => {
                    let rest = answer
                        .body
                        .strip_prefix(self.streamed.as_str())
                        .unwrap_or(&answer.body)
                        .to_owned();
                    let last = self.chunk(&rest, &answer.parts, true);
                    let completed = StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
                        task_id: self.task_id.clone(),
                        context_id: self.context.clone(),
                        status: self.status(a2a::TaskState::Completed),
                        metadata: None,
                    });
                    if send(items, last).await {
                        send(items, completed).await;
                    }
                    return;
                }
                Err(err) => {
                    let _ = items.send(Err(err)).await;
                    return;
                }
            }
        }
    }

    fn status(&self, state: a2a::TaskState) -> TaskStatus {
        TaskStatus {
            state,
            message: None,
            timestamp: mapping::utc(time::OffsetDateTime::now_utc()),
        }
    }

    /// One chunk of the answer's artifact: the first replaces (`append: false`), the others
    /// append; the final answer's is the last chunk.
    fn chunk(
        &mut self,
        text: &str,
        parts: &[switchboard_proto::Part],
        last: bool,
    ) -> StreamResponse {
        let mut shown = Vec::with_capacity(1 + parts.len());
        if !text.is_empty() || parts.is_empty() {
            shown.push(a2a::Part::text(text));
        }
        shown.extend(mapping::outbound(parts));
        let append = self.sent > 0;
        self.sent += 1;
        StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context.clone(),
            artifact: Artifact {
                artifact_id: ANSWER_ARTIFACT.to_owned(),
                name: Some("answer".to_owned()),
                description: None,
                parts: shown,
                metadata: None,
                extensions: None,
            },
            append: Some(append),
            last_chunk: Some(last),
            metadata: None,
        })
    }
}

/// Sends one item without an event number; `false` when the client is gone.
async fn send(items: &mpsc::Sender<Result<Item, GatewayError>>, response: StreamResponse) -> bool {
    items
        .send(Ok(Item {
            seq: None,
            response,
        }))
        .await
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn only_the_marker_part_asks_for_a_task() {
        let marker = switchboard_proto::Part::Data {
            data: serde_json::json!({"switchboard": "task"}),
        };
        assert!(asks_for_task(std::slice::from_ref(&marker)));
        let other = switchboard_proto::Part::Data {
            data: serde_json::json!({"switchboard": "tasks"}),
        };
        assert!(!asks_for_task(&[other]));
        let more = switchboard_proto::Part::Data {
            data: serde_json::json!({"switchboard": "task", "and": 1}),
        };
        assert!(!asks_for_task(&[more]));
        let text = switchboard_proto::Part::Text {
            text: "hi".to_owned(),
        };
        assert!(!asks_for_task(&[marker.clone(), text]));
        assert!(!asks_for_task(&[switchboard_proto::Part::Text {
            text: "{\"switchboard\": \"task\"}".to_owned()
        }]));
    }

    #[test]
    fn an_answer_is_the_agents_message_in_the_context() {
        let answer = CallAnswer {
            correlation_id: Uuid::nil(),
            from_agent_id: AgentId::parse("tck").unwrap_or_else(|_| unreachable!()),
            body: "Direct message response".to_owned(),
            parts: Vec::new(),
            answered_at: time::OffsetDateTime::UNIX_EPOCH,
            clamped: false,
            streamed: 0,
            error: None,
            attachments: Vec::new(),
        };
        let message = answer_message(&answer, "ctx", Vec::new());
        assert_eq!(message.role, Role::Agent);
        assert_eq!(message.context_id.as_deref(), Some("ctx"));
        assert_eq!(message.task_id, None);
        assert_eq!(
            message.parts,
            vec![a2a::Part::text("Direct message response")]
        );
    }
}
