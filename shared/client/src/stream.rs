//! Streamed calls: a waiting call whose answer arrives part by part (the callee's partial
//! replies), then the final answer. The parts come on the call request's reply subject, in
//! order; one that did not arrive (the connection dropped a moment) is read back from the
//! correlator (`agent.calls.parts.<agent_id>`), so the stream misses none.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use switchboard_proto::call::{CallAnswer, CallPart, CallParts, CallPartsRequest, CallRequest};
use switchboard_proto::{ErrorReply, HEADER_SERVICE_ERROR_CODE, subject};
use uuid::Uuid;

use crate::Agent;
use crate::error::ClientError;
use crate::request;

/// What a streamed call yields: its parts in order, then its final answer (the last item).
#[derive(Debug, Clone, PartialEq)]
pub enum CallEvent {
    /// A partial reply, numbered from 1.
    Part(CallPart),
    /// The final answer: `body` joins every part's text and the final reply's.
    Answer(CallAnswer),
}

/// The state of one streamed call while it is read.
struct Reading {
    nats: async_nats::Client,
    caller: switchboard_proto::AgentId,
    replies: async_nats::Subscriber,
    request_timeout: Duration,
    deadline: tokio::time::Instant,
    /// Known from the first part or answer that arrives.
    correlation_id: Option<Uuid>,
    /// The next part to yield.
    next: u32,
    ready: VecDeque<Result<CallEvent, ClientError>>,
    done: bool,
}

impl Reading {
    /// Reads back the parts after the last one yielded (and the answer, once there is one).
    async fn read_back(&mut self) -> Result<Option<CallAnswer>, ClientError> {
        let Some(correlation_id) = self.correlation_id else {
            return Ok(None);
        };
        let back: CallParts = request(
            &self.nats,
            subject::calls_parts(&self.caller),
            &CallPartsRequest {
                correlation_id,
                after: self.next.saturating_sub(1),
            },
            self.request_timeout,
        )
        .await?;
        for part in back.parts {
            self.take_part(part);
        }
        Ok(back.answer)
    }

    fn take_part(&mut self, part: CallPart) {
        if part.part == self.next {
            self.next += 1;
            self.ready.push_back(Ok(CallEvent::Part(part)));
        }
    }

    fn finish(&mut self, outcome: Result<CallEvent, ClientError>) {
        self.ready.push_back(outcome);
        self.done = true;
    }

    /// Waits for the next message on the reply subject and turns it into items.
    async fn step(&mut self) {
        let message = tokio::time::timeout_at(self.deadline, self.replies.next()).await;
        let message = match message {
            Ok(Some(message)) => message,
            Ok(None) | Err(_) => {
                // Nothing more came in time: the answer may have been given while this
                // connection was away; read back what the correlator kept.
                match self.read_back().await {
                    Ok(Some(answer)) => self.finish(Ok(CallEvent::Answer(answer))),
                    Ok(None) => self.finish(Err(ClientError::Timeout {
                        subject: subject::call(&self.caller),
                    })),
                    Err(err) => self.finish(Err(err)),
                }
                return;
            }
        };
        let is_error = message
            .headers
            .as_ref()
            .is_some_and(|headers| headers.get(HEADER_SERVICE_ERROR_CODE).is_some());
        if is_error {
            let outcome = serde_json::from_slice::<ErrorReply>(&message.payload)
                .map(ClientError::Service)
                .unwrap_or_else(|err| decode_error(&self.caller, &err));
            self.finish(Err(outcome));
            return;
        }
        if let Ok(part) = serde_json::from_slice::<CallPart>(&message.payload) {
            self.correlation_id.get_or_insert(part.correlation_id);
            if part.part > self.next {
                // One went missing on the way: read it back first.
                if let Err(err) = self.read_back().await {
                    self.finish(Err(err));
                    return;
                }
            }
            self.take_part(part);
            return;
        }
        match serde_json::from_slice::<CallAnswer>(&message.payload) {
            Ok(answer) => {
                self.correlation_id.get_or_insert(answer.correlation_id);
                if answer.streamed >= self.next
                    && let Err(err) = self.read_back().await
                {
                    self.finish(Err(err));
                    return;
                }
                self.finish(Ok(CallEvent::Answer(answer)));
            }
            Err(err) => self.finish(Err(decode_error(&self.caller, &err))),
        }
    }
}

fn decode_error(caller: &switchboard_proto::AgentId, err: &serde_json::Error) -> ClientError {
    ClientError::Decode {
        subject: subject::call(caller),
        message: err.to_string(),
    }
}

impl Agent {
    /// A waiting call whose answer streams: yields the callee's parts as they come, in order,
    /// then the final answer (always the last item; its `body` joins everything). An error
    /// (a refusal, a timeout) is the last item too. `from_goal_id` defaults to the goal
    /// opened most recently, the chain to the call being served ([`crate::serving`]).
    pub async fn call_streamed(
        &self,
        mut body: CallRequest,
    ) -> Result<impl Stream<Item = Result<CallEvent, ClientError>> + use<>, ClientError> {
        if body.from_goal_id.is_none() {
            body.from_goal_id = self.current_goal();
        }
        if body.parent_correlation_id.is_none() {
            body.parent_correlation_id = crate::serving::current();
        }
        call_streamed_on(self.nats(), self.id(), body, self.request_timeout()).await
    }
}

/// [`Agent::call_streamed`] on a connection of agent `caller` that is not an [`Agent`] (the
/// command line's): the request as given, each request to the correlator waiting
/// `request_timeout` for its reply.
pub async fn call_streamed_on(
    nats: &async_nats::Client,
    caller: &switchboard_proto::AgentId,
    mut body: CallRequest,
    request_timeout: Duration,
) -> Result<impl Stream<Item = Result<CallEvent, ClientError>> + use<>, ClientError> {
    {
        body.wait = Some(true);
        body.stream = true;
        let timeout = Duration::from_millis(
            body.timeout_ms
                .unwrap_or(switchboard_proto::CALL_TIMEOUT_DEFAULT_MS),
        );
        let subject = subject::call(caller);
        let failed = |message: String| ClientError::Request {
            subject: subject.clone(),
            message,
        };
        let nats = nats.clone();
        let inbox = nats.new_inbox();
        let replies = nats
            .subscribe(inbox.clone())
            .await
            .map_err(|err| failed(err.to_string()))?;
        let payload = serde_json::to_vec(&body).map_err(|err| failed(err.to_string()))?;
        nats.publish_with_reply_and_headers(
            subject.clone(),
            inbox,
            switchboard_request::trace::traced_headers(),
            Bytes::from(payload),
        )
        .await
        .map_err(|err| failed(err.to_string()))?;
        let reading = Reading {
            nats,
            caller: caller.clone(),
            replies,
            request_timeout,
            deadline: tokio::time::Instant::now() + timeout + request_timeout,
            correlation_id: None,
            next: 1,
            ready: VecDeque::new(),
            done: false,
        };
        Ok(futures::stream::unfold(reading, |mut reading| async move {
            loop {
                if let Some(item) = reading.ready.pop_front() {
                    return Some((item, reading));
                }
                if reading.done {
                    return None;
                }
                reading.step().await;
            }
        }))
    }
}
