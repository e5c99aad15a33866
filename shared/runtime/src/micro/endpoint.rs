//! An endpoint of the scaffold: its subject, its handler, and how requests reach it (the
//! typed constructors, the caller taken from the subject, the JSON body decoded).

use std::future::Future;
use std::sync::Arc;

use async_nats::Message;
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchboard_proto::subject::caller_from_subject;
use switchboard_proto::{AgentId, ErrorKind, ErrorReply};

/// A decoded request to an agent-facing endpoint.
#[derive(Debug, Clone)]
pub struct AgentRequest<T> {
    /// The caller, from the subject's last token.
    pub caller: AgentId,
    /// The body decoded from a JSON object (empty reads as `{}`); a bad one is `bad_request`.
    pub body: T,
    /// The full request subject, caller token included, e.g. `agent.send.writer`.
    pub subject: String,
    /// Request headers (trace context among them).
    pub headers: Option<async_nats::HeaderMap>,
    /// Where the reply goes: a reply inbox (the scaffold runs no request with another). An
    /// endpoint that answers in several messages (a streamed call's parts) publishes the
    /// earlier ones here itself.
    pub reply: Option<async_nats::Subject>,
}

pub(super) type Handler =
    Arc<dyn Fn(Message) -> BoxFuture<'static, Result<Bytes, ErrorReply>> + Send + Sync>;

/// One endpoint: a name, the subject it subscribes to, and its handler.
pub struct Endpoint {
    pub(super) name: String,
    pub(super) subject: String,
    pub(super) handler: Handler,
    /// Requests draw from the replica's shared bucket (see [`Endpoint::shared_budget`]).
    pub(super) shared_budget: bool,
    /// Subject prefixes below this endpoint's that another endpoint serves (see
    /// [`Endpoint::except`]).
    pub(super) except: Vec<String>,
    /// Subscribed in a queue group of its own (see [`Endpoint::nested`]).
    pub(super) nested: bool,
    /// Starts no trace of its own (see [`Endpoint::quiet`]).
    pub(super) quiet: bool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

/// Decodes a JSON body, which must be an object; an empty (or all-whitespace) body reads as
/// `{}`. (serde would also read a struct from a JSON array, field by field in order: `[]` or
/// `[null, "daemon"]` must not pass for a request.)
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, ErrorReply> {
    let first = payload.iter().find(|byte| !byte.is_ascii_whitespace());
    let payload = match first {
        None => b"{}".as_slice(),
        Some(b'{') => payload,
        Some(_) => {
            return Err(ErrorReply::new(
                ErrorKind::BadRequest,
                "invalid request body: it must be a JSON object",
            ));
        }
    };
    serde_json::from_slice(payload).map_err(|err| {
        ErrorReply::new(
            ErrorKind::BadRequest,
            format!("invalid request body: {err}"),
        )
    })
}

pub(super) fn encode<T: Serialize>(value: &T) -> Result<Bytes, ErrorReply> {
    serde_json::to_vec(value).map(Bytes::from).map_err(|err| {
        ErrorReply::new(
            ErrorKind::Internal,
            format!("encoding the reply failed: {err}"),
        )
    })
}

impl Endpoint {
    /// Makes an endpoint whose subject names no caller (the audit queries) draw every request
    /// from one bucket per replica, so a loop of expensive queries is bounded too. Agent
    /// endpoints always draw from their caller's own bucket.
    pub fn shared_budget(mut self) -> Self {
        self.shared_budget = true;
        self
    }

    /// Leaves the requests below `prefix` (e.g. `agent.send.status` under `agent.send.>`) to
    /// the endpoint that serves them: this one neither runs nor answers them, so the requester
    /// gets exactly one reply.
    pub fn except(mut self, prefix: &str) -> Self {
        self.except.push(format!("{prefix}."));
        self
    }

    /// Marks an endpoint whose subjects lie below another endpoint's wildcard (which leaves
    /// them to it with [`Endpoint::except`]): it is subscribed in a queue group of its own,
    /// `<service>.<endpoint>`. NATS picks one member per queue group name among all matching
    /// subscriptions, so in the service's shared group a request could go to the other
    /// endpoint alone, which would not answer it.
    pub fn nested(mut self) -> Self {
        self.nested = true;
        self
    }

    /// Marks an endpoint an idle agent calls over and over (heartbeats, long polls, acks): a
    /// request that carries no trace context starts no trace (its span is not recorded), so an
    /// idle agent does not fill the tracing backend with one-span traces. A request that
    /// carries one joins its trace as any other.
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// An agent-facing endpoint on `<prefix>.>`: the caller is the subject tail after `prefix`
    /// (a malformed tail is answered with `invalid_agent_id` before the body is read).
    pub fn agent<Req, Resp, F, Fut>(name: &str, prefix: String, handler: F) -> Self
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + 'static,
        F: Fn(AgentRequest<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, ErrorReply>> + Send + 'static,
    {
        let subject = switchboard_proto::subject::below(&prefix);
        let handler = Arc::new(handler);
        Self {
            name: name.to_owned(),
            subject,
            shared_budget: false,
            except: Vec::new(),
            nested: false,
            quiet: false,
            handler: Arc::new(move |message: Message| {
                let handler = Arc::clone(&handler);
                let prefix = prefix.clone();
                async move {
                    let caller =
                        caller_from_subject(message.subject.as_str(), &prefix).map_err(|err| {
                            ErrorReply::new(ErrorKind::InvalidAgentId, err.to_string())
                        })?;
                    let body = decode::<Req>(&message.payload)?;
                    let reply = handler(AgentRequest {
                        caller,
                        body,
                        subject: message.subject.to_string(),
                        headers: message.headers,
                        reply: message.reply,
                    })
                    .await?;
                    encode(&reply)
                }
                .boxed()
            }),
        }
    }

    /// An endpoint that takes the whole request message (to stream several messages to its
    /// reply subject before the final reply, which is what it returns).
    pub fn raw<F, Fut>(name: &str, subject: String, handler: F) -> Self
    where
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, ErrorReply>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        Self {
            name: name.to_owned(),
            subject,
            shared_budget: false,
            except: Vec::new(),
            nested: false,
            quiet: false,
            handler: Arc::new(move |message: Message| {
                let handler = Arc::clone(&handler);
                async move { handler(message).await }.boxed()
            }),
        }
    }

    /// An endpoint without caller identity on exactly `subject`.
    pub fn json<Req, Resp, F, Fut>(name: &str, subject: String, handler: F) -> Self
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + 'static,
        F: Fn(Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, ErrorReply>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        Self {
            name: name.to_owned(),
            subject,
            shared_budget: false,
            except: Vec::new(),
            nested: false,
            quiet: false,
            handler: Arc::new(move |message: Message| {
                let handler = Arc::clone(&handler);
                async move {
                    let body = decode::<Req>(&message.payload)?;
                    encode(&handler(body).await?)
                }
                .boxed()
            }),
        }
    }
}
