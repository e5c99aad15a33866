//! The agent handle: identity, registry requests, heartbeat loop.

use std::time::Duration;

use async_nats::Client;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchboard_proto::call::{CallAnswer, CallParked, CallRequest, PendingCalls};
use switchboard_proto::registry::{
    DeregisterReply, GoalCloseReply, GoalCloseRequest, GoalOpenReply, GoalOpenRequest,
    HeartbeatReply, HeartbeatRequest, LookupReply, LookupRequest, PEERS_PAGE_MAX, PeersReply,
    PeersRequest, RegisterReply,
};
use switchboard_proto::send::{DeliveryReport, SendRequest};
use switchboard_proto::subject::{self, RegistryOp};
use switchboard_proto::{AgentCard, AgentId, GoalId, GoalKind};
use switchboard_request::request::{RequestFailure, request_json, request_json_retrying};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::ClientError;
use crate::goal::Goal;
use crate::request;

/// Tunables of an [`Agent`].
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// How often the heartbeat loop runs (the directory marks an agent offline after 3 misses
    /// of the default 10 s).
    pub heartbeat_interval: Duration,
    /// How long a request may wait for its reply.
    pub request_timeout: Duration,
    /// How often a send is retried when no service answered (no responders or a timeout),
    /// with the same message id so a copy is never stored twice. Pauses start at 100 ms and
    /// double.
    pub send_retries: u32,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            send_retries: switchboard_request::request::IDEMPOTENT_RETRIES,
        }
    }
}

/// A registered agent. Dropping it stops the heartbeat loop (the directory then marks it
/// offline after its timeout); [`Agent::deregister`] leaves explicitly.
#[derive(Debug)]
pub struct Agent {
    nats: Client,
    card: AgentCard,
    options: AgentOptions,
    /// The running heartbeat loop (stopped by deregister, restarted by register).
    heartbeat: std::sync::Mutex<Option<DropGuard>>,
    /// The goal opened most recently: the default `from_goal_id` of sends.
    current_goal: std::sync::Mutex<Option<GoalId>>,
}

/// Connect options for agent `id`: named `agent:<id>`, a 5 s ping, and the reply inbox prefix
/// `_INBOX.<id>` (docs/protocol.md §1, "Reply subjects") — the only inboxes the generated NATS config lets the
/// agent subscribe to. Add credentials on top (`.nkey(seed)`), then [`Agent::connect_with`].
pub fn agent_connect_options(id: &AgentId) -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::new()
        .name(format!("agent:{id}"))
        .ping_interval(Duration::from_secs(5))
        .custom_inbox_prefix(switchboard_proto::subject::agent_inbox_prefix(id))
}

/// The servers of a NATS URL list as NATS tools take it: `nats://a:4222,nats://b:4222` is two
/// (spaces around the commas and empty entries are ignored), so a client fails over between
/// them.
pub fn server_list(nats_url: &str) -> Vec<String> {
    nats_url
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Agent {
    /// Connects to NATS at `nats_url` (no credentials; a comma-separated list is several
    /// servers, see [`server_list`]) and registers `agent_id` with a default card.
    pub async fn connect(nats_url: &str, agent_id: &str) -> Result<Self, ClientError> {
        let id = AgentId::parse(agent_id)?;
        let nats = agent_connect_options(&id)
            .connect(server_list(nats_url).as_slice())
            .await
            .map_err(|err| ClientError::Connect(err.to_string()))?;
        Self::connect_with(nats, AgentCard::new(id), AgentOptions::default()).await
    }

    /// Registers `card` over an existing connection and starts the heartbeat loop.
    ///
    /// The connection must use the agent's reply inbox prefix (see [`agent_connect_options`]);
    /// one that does not is refused with [`ClientError::InboxPrefix`] rather than left to time
    /// out on its first request under a secured server.
    pub async fn connect_with(
        nats: Client,
        card: AgentCard,
        options: AgentOptions,
    ) -> Result<Self, ClientError> {
        let prefix = switchboard_proto::subject::agent_inbox_prefix(&card.agent_id);
        let inbox = nats.new_inbox();
        if !inbox
            .strip_prefix(prefix.as_str())
            .is_some_and(|rest| rest.starts_with('.'))
        {
            return Err(ClientError::InboxPrefix {
                agent: card.agent_id.to_string(),
                expected: prefix,
                got: inbox,
            });
        }
        let agent = Self {
            nats,
            card,
            options,
            heartbeat: std::sync::Mutex::new(None),
            current_goal: std::sync::Mutex::new(None),
        };
        agent.register().await?;
        Ok(agent)
    }

    /// Starts the heartbeat loop unless it runs already.
    fn ensure_heartbeat(&self) {
        let Ok(mut slot) = self.heartbeat.lock() else {
            return;
        };
        if slot.is_none() {
            let stop = CancellationToken::new();
            tokio::spawn(heartbeat_loop(
                self.nats.clone(),
                self.card.clone(),
                self.options.clone(),
                stop.clone(),
            ));
            *slot = Some(stop.drop_guard());
        }
    }

    fn stop_heartbeat(&self) {
        if let Ok(mut slot) = self.heartbeat.lock() {
            slot.take();
        }
    }

    /// This agent's id.
    pub fn id(&self) -> &AgentId {
        &self.card.agent_id
    }

    /// The card this agent registered.
    pub fn card(&self) -> &AgentCard {
        &self.card
    }

    /// The NATS connection (for publishing to other Switchboard subjects).
    pub fn nats(&self) -> &Client {
        &self.nats
    }

    async fn registry<Req, Resp>(&self, op: RegistryOp, body: &Req) -> Result<Resp, ClientError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        request(
            &self.nats,
            op.subject(self.id()),
            body,
            self.options.request_timeout,
        )
        .await
    }

    /// (Re-)registers the card (also brings an offline agent back online) and keeps the
    /// heartbeat loop running.
    pub async fn register(&self) -> Result<RegisterReply, ClientError> {
        let reply = self.registry(RegistryOp::Register, &self.card).await?;
        self.ensure_heartbeat();
        Ok(reply)
    }

    /// Sends one heartbeat now (the loop does this every interval).
    pub async fn heartbeat(&self, beat: &HeartbeatRequest) -> Result<HeartbeatReply, ClientError> {
        self.registry(RegistryOp::Heartbeat, beat).await
    }

    /// Goes offline and closes every goal; the heartbeat loop stops (so the agent stays
    /// offline) until [`Agent::register`] is called again.
    pub async fn deregister(&self) -> Result<DeregisterReply, ClientError> {
        self.stop_heartbeat();
        self.registry(RegistryOp::Deregister, &serde_json::json!({}))
            .await
    }

    /// list_peers: every other agent with `reachable`, in agent-id order (all pages, asked
    /// one after another; see [`Agent::peers_page`] for one page).
    pub async fn peers(&self) -> Result<PeersReply, ClientError> {
        let mut all = self
            .peers_page(&PeersRequest {
                after: None,
                limit: Some(PEERS_PAGE_MAX),
                skill: None,
            })
            .await?;
        while let Some(after) = all.next.take() {
            let page = self
                .peers_page(&PeersRequest {
                    after: Some(after),
                    limit: Some(PEERS_PAGE_MAX),
                    skill: None,
                })
                .await?;
            all.peers.extend(page.peers);
            all.next = page.next;
        }
        Ok(all)
    }

    /// One page of list_peers: up to `limit` peers (default 100) after `after`; the reply's
    /// `next` is the `after` of the following page.
    pub async fn peers_page(&self, request: &PeersRequest) -> Result<PeersReply, ClientError> {
        self.registry(RegistryOp::Peers, request).await
    }

    /// One agent's card, status and live goals.
    pub async fn lookup(&self, agent_id: &str) -> Result<LookupReply, ClientError> {
        self.registry(
            RegistryOp::Lookup,
            &LookupRequest {
                agent_id: agent_id.to_owned(),
            },
        )
        .await
    }

    /// Sends a message (send_to_peer, or a broadcast when `to` is `*`) and returns the
    /// delivery report. The message id is chosen here when absent, so retries after a lost
    /// reply are stored once per goal.
    ///
    /// Without a `from_goal_id`, the send is attributed to the goal this agent opened most
    /// recently (so replies can find the conversation), or a fresh one if it has none.
    pub async fn send(&self, mut send: SendRequest) -> Result<DeliveryReport, ClientError> {
        send.id.get_or_insert_with(switchboard_proto::new_id);
        if send.from_goal_id.is_none() {
            send.from_goal_id = self.current_goal.lock().ok().and_then(|goal| *goal);
        }
        request_json_retrying(
            &self.nats,
            &subject::send(self.id()),
            &send,
            self.options.request_timeout,
            self.options.send_retries,
        )
        .await
        .map_err(ClientError::from)
    }

    /// send_to_peer: `message` to every live goal of `to`.
    pub async fn send_to_peer(
        &self,
        to: &str,
        message: &str,
    ) -> Result<DeliveryReport, ClientError> {
        self.send(SendRequest {
            to: Some(to.to_owned()),
            message: Some(message.to_owned()),
            ..SendRequest::default()
        })
        .await
    }

    /// Broadcast: `message` to every peer this agent may reach (capped by the service).
    pub async fn broadcast(&self, message: &str) -> Result<DeliveryReport, ClientError> {
        self.send_to_peer(switchboard_proto::BROADCAST_TARGET, message)
            .await
    }

    /// call_agent / talk_to_agent, waiting: asks `to` and returns its answer, or an error of
    /// kind `timeout` at the deadline (also `cycle`, `depth_exceeded`, `too_many_calls`,
    /// `unreachable`).
    pub async fn call(
        &self,
        to: &str,
        message: &str,
        timeout: Duration,
    ) -> Result<CallAnswer, ClientError> {
        self.call_with(self.call_request(to, message, timeout, true))
            .await
    }

    /// [`Agent::call`] with every option of the request (e.g. `receipt`, `parts`): waits for
    /// the answer. `from_goal_id` defaults to the goal opened most recently, the chain to
    /// the call being served ([`crate::serving`]).
    pub async fn call_with(&self, mut body: CallRequest) -> Result<CallAnswer, ClientError> {
        body.wait = Some(true);
        if body.from_goal_id.is_none() {
            body.from_goal_id = self.current_goal.lock().ok().and_then(|goal| *goal);
        }
        if body.parent_correlation_id.is_none() {
            body.parent_correlation_id = crate::serving::current();
        }
        let timeout = Duration::from_millis(
            body.timeout_ms
                .unwrap_or(switchboard_proto::CALL_TIMEOUT_DEFAULT_MS),
        );
        let wait = timeout + self.options.request_timeout;
        self.call_retrying(body, wait).await
    }

    /// Sends a call request, named with a `correlation_id` minted before the first attempt, and
    /// sends it again with the same id while no correlator answers (no responders, or no reply
    /// within `wait`: the replica holding it went away): the correlator recognises the id, so
    /// a retry is the same call — one request to the callee, one answer — and gets its outcome.
    async fn call_retrying<Resp: DeserializeOwned>(
        &self,
        mut body: CallRequest,
        wait: Duration,
    ) -> Result<Resp, ClientError> {
        body.correlation_id
            .get_or_insert_with(switchboard_proto::new_id);
        let subject = subject::call(self.id());
        let mut pause = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            match request_json(&self.nats, &subject, &body, wait).await {
                Err(RequestFailure::NoResponders { .. } | RequestFailure::Timeout { .. })
                    if attempt < self.options.send_retries =>
                {
                    attempt += 1;
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                outcome => return outcome.map_err(ClientError::from),
            }
        }
    }

    /// A parked call: returns at once; the answer (or a timeout notice) lands in the calling
    /// goal's inbox as `kind: response` (or `notify`) with the returned `correlation_id`.
    pub async fn call_parked(
        &self,
        to: &str,
        message: &str,
        timeout: Duration,
    ) -> Result<CallParked, ClientError> {
        let body = self.call_request(to, message, timeout, false);
        self.call_retrying(body, self.options.request_timeout).await
    }

    /// [`Agent::call_parked`] with every option of the request (a `correlation_id` of your own,
    /// `receipt`, `parts`, …): parks; `from_goal_id` and the parent default as for
    /// [`Agent::call_with`].
    pub async fn call_parked_with(&self, mut body: CallRequest) -> Result<CallParked, ClientError> {
        body.wait = Some(false);
        if body.from_goal_id.is_none() {
            body.from_goal_id = self.current_goal.lock().ok().and_then(|goal| *goal);
        }
        if body.parent_correlation_id.is_none() {
            body.parent_correlation_id = crate::serving::current();
        }
        self.call_retrying(body, self.options.request_timeout).await
    }

    /// A call with every option (`wait` decides the reply type: use [`Agent::call`] or
    /// [`Agent::call_parked`] unless you need the raw shape).
    fn call_request(&self, to: &str, message: &str, timeout: Duration, wait: bool) -> CallRequest {
        CallRequest {
            to: Some(to.to_owned()),
            message: Some(message.to_owned()),
            from_goal_id: self.current_goal.lock().ok().and_then(|goal| *goal),
            timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            wait: Some(wait),
            parent_correlation_id: crate::serving::current(),
            ..CallRequest::default()
        }
    }

    /// Where a message this agent sent with `receipt` is, per receiving goal (`stored`,
    /// `delivered`, `read`, `expired_unread`); `not_found` for any other message id.
    pub async fn send_status(
        &self,
        message_id: uuid::Uuid,
    ) -> Result<switchboard_proto::receipt::SendStatusReply, ClientError> {
        request(
            &self.nats,
            subject::send_status(self.id()),
            &switchboard_proto::receipt::SendStatusRequest { message_id },
            self.options.request_timeout,
        )
        .await
    }

    /// How long a request waits for its reply ([`AgentOptions::request_timeout`]).
    pub(crate) fn request_timeout(&self) -> Duration {
        self.options.request_timeout
    }

    /// A request the service may take twice (it carries its own id, or only reads), retried
    /// and hedged as a send is: the request timeout per attempt, `send_retries` attempts.
    pub(crate) async fn repeatable<Req, Resp>(
        &self,
        subject: &str,
        body: &Req,
    ) -> Result<Resp, ClientError>
    where
        Req: serde::Serialize + ?Sized,
        Resp: serde::de::DeserializeOwned,
    {
        request_json_retrying(
            self.nats(),
            subject,
            body,
            self.options.request_timeout,
            self.options.send_retries,
        )
        .await
        .map_err(ClientError::from)
    }

    /// Open calls this agent made and must answer.
    pub async fn pending_calls(&self) -> Result<PendingCalls, ClientError> {
        request(
            &self.nats,
            subject::calls_pending(self.id()),
            &serde_json::json!({}),
            self.options.request_timeout,
        )
        .await
    }

    /// Opens a fresh interactive goal.
    pub async fn open_goal(&self) -> Result<Goal, ClientError> {
        self.open_goal_with(GoalOpenRequest::default()).await
    }

    /// Opens a goal of a given kind, or re-opens an existing one by id (after a restart).
    pub async fn open_goal_with(&self, request: GoalOpenRequest) -> Result<Goal, ClientError> {
        let reply: GoalOpenReply = self.registry(RegistryOp::GoalOpen, &request).await?;
        let goal = Goal::attach(
            reply,
            self.id().clone(),
            self.nats().clone(),
            self.options().request_timeout,
            self.options().send_retries,
        );
        if let Ok(mut current) = self.current_goal.lock() {
            *current = Some(goal.id());
        }
        Ok(goal)
    }

    /// Opens a goal of `kind`.
    pub async fn open_goal_of(&self, kind: GoalKind) -> Result<Goal, ClientError> {
        self.open_goal_with(GoalOpenRequest {
            kind: Some(kind),
            ..GoalOpenRequest::default()
        })
        .await
    }

    /// Opens, or re-opens, the goal named `name` (1–64 of `[a-z0-9_.-]`): the same name
    /// always opens the same goal of this agent, so after a restart the agent reads what was
    /// sent while it was down, and no second live goal is left behind.
    pub async fn open_named_goal(&self, name: &str) -> Result<Goal, ClientError> {
        self.open_goal_with(GoalOpenRequest {
            name: Some(name.to_owned()),
            ..GoalOpenRequest::default()
        })
        .await
    }

    /// Closes a goal by id (purges its inbox).
    pub async fn close_goal(&self, goal_id: GoalId) -> Result<GoalCloseReply, ClientError> {
        if let Ok(mut current) = self.current_goal.lock()
            && *current == Some(goal_id)
        {
            *current = None;
        }
        self.registry(RegistryOp::GoalClose, &GoalCloseRequest { goal_id })
            .await
    }

    /// The goal opened most recently (the default `from_goal_id`).
    pub fn current_goal(&self) -> Option<GoalId> {
        self.current_goal.lock().ok().and_then(|goal| *goal)
    }

    pub(crate) fn options(&self) -> &AgentOptions {
        &self.options
    }
}

async fn heartbeat_loop(
    nats: Client,
    card: AgentCard,
    options: AgentOptions,
    stop: CancellationToken,
) {
    let id = card.agent_id.clone();
    let mut ticker = tokio::time::interval(options.heartbeat_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // registration just counted as one
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = stop.cancelled() => return,
        }
        let beat: Result<HeartbeatReply, _> = request(
            &nats,
            RegistryOp::Heartbeat.subject(&id),
            &HeartbeatRequest::default(),
            options.request_timeout,
        )
        .await;
        match beat {
            Ok(_) => {}
            // The registry lost us (e.g. the bucket was recreated): register again.
            Err(err) if err.kind() == Some(switchboard_proto::ErrorKind::NotRegistered) => {
                let again: Result<RegisterReply, _> = request(
                    &nats,
                    RegistryOp::Register.subject(&id),
                    &card,
                    options.request_timeout,
                )
                .await;
                if let Err(err) = again {
                    tracing::warn!(agent_id = %id, error = %err, "re-registering failed");
                }
            }
            Err(err) => tracing::warn!(agent_id = %id, error = %err, "heartbeat failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_every_10_s_so_three_misses_are_the_directory_timeout() {
        let options = AgentOptions::default();
        assert_eq!(options.heartbeat_interval, Duration::from_secs(10));
        assert_eq!(options.send_retries, 5);
    }
}
