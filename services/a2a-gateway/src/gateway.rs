//! The gateway: what every rule works with (the NATS connection, the settings, the registry
//! view, the event stream) and how it speaks to the fabric as an A2A client's agent.
//!
//! Each A2A client is an agent of the fabric, `a2a-<name>`: the gateway registers it before
//! its first request, and every request it makes for the client is published on the client's
//! own subjects, so the services' ACLs, request budgets and the audit trail see who asked.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_nats::Client;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchboard_proto::inbox::{AckRequest, FetchReply, FetchRequest};
use switchboard_proto::registry::{GoalCloseRequest, GoalOpenRequest};
use switchboard_proto::subject::{self, RegistryOp};
use switchboard_proto::{AgentCard, AgentId, ErrorKind, GoalId};
use switchboard_request::request::{RequestFailure, request_json};

use crate::config::GatewayConfig;
use crate::error::GatewayError;
use crate::store::Store;

/// The prefix of every client agent (`a2a-<name>`): such an agent is never served as an A2A
/// agent, and `switchboard nats-config` refuses to key one.
pub const CLIENT_PREFIX: &str = switchboard_proto::A2A_CLIENT_PREFIX;

/// Context goals a replica keeps open per client (below the directory's default cap of 16
/// live goals per agent); opening one more closes the one used least recently.
pub const CONTEXT_GOALS_PER_CLIENT: usize = 8;

/// Every this many uses of a context goal, what piled up in it is acknowledged.
const DRAIN_EVERY: u32 = 8;

/// How long a request to a service may take before the gateway answers `unavailable`.
pub(crate) const SERVICE_TIMEOUT: Duration = Duration::from_secs(10);

/// The A2A gateway: serves every registered agent over A2A.
pub struct Gateway {
    pub(crate) client: Client,
    pub(crate) config: GatewayConfig,
    pub(crate) store: Store,
    /// Extra CA certificates (`ca_file`) the HTTP clients trust beside the platform's.
    pub(crate) roots: Vec<reqwest::Certificate>,
    /// The client agents registered by this replica (registration is idempotent; this only
    /// saves a request per call).
    registered: Mutex<HashSet<AgentId>>,
    /// Cancelled when the gateway stops: open streams and blocking waits end with it.
    pub(crate) stopping: switchboard_runtime::CancellationToken,
    /// Open streams (and blocking waits) per client agent.
    streams: switchboard_runtime::places::Places<AgentId>,
    /// The context goals this replica opened per client, least recently used first, with how
    /// often each was used.
    contexts: Mutex<HashMap<AgentId, VecDeque<(GoalId, u32)>>>,
    /// The secret that keys the context goals of clients without a token.
    anonymous_key: String,
    /// Signs and checks the file links the gateway hands its clients.
    pub(crate) links: crate::links::FileLinks,
}

impl std::fmt::Debug for Gateway {
    // Not the secrets (the anonymous key signs links too).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("config", &self.config)
            .field("links", &self.links)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway over `client`; its HTTP clients trust `roots` beside the platform's, and
    /// `anonymous_key` ([`Store::anonymous_context_key`]) keys tokenless clients' contexts.
    pub fn new(
        client: Client,
        config: GatewayConfig,
        store: Store,
        roots: Vec<reqwest::Certificate>,
        anonymous_key: String,
    ) -> Self {
        // The links are keyed by the shared secret too, under a domain of their own (see
        // `serve::files`), so every replica checks what any replica signed.
        let links = crate::links::FileLinks::new(
            &anonymous_key,
            config.base_url(),
            std::time::Duration::from_secs(config.file_link_ttl_secs),
        );
        Self {
            client,
            config,
            store,
            roots,
            registered: Mutex::new(HashSet::new()),
            streams: Default::default(),
            contexts: Mutex::default(),
            stopping: switchboard_runtime::CancellationToken::new(),
            anonymous_key,
            links,
        }
    }

    /// The file links the gateway hands out (`GET /files/<token>`).
    pub fn links(&self) -> &crate::links::FileLinks {
        &self.links
    }

    /// The settings it runs with.
    pub fn config(&self) -> &GatewayConfig {
        &self.config
    }

    /// Makes sure `caller` (an `a2a-<name>` agent) is registered, so the task service takes
    /// its requests.
    pub(crate) async fn ensure_registered(&self, caller: &AgentId) -> Result<(), GatewayError> {
        if self.lock_registered().contains(caller) {
            return Ok(());
        }
        let mut card = AgentCard::new(caller.clone());
        // A client agent takes nothing from the fabric: no agent may message or task it (its
        // task updates come from the task service, which no ACL gates).
        card.allow_from = Vec::new();
        card.description = format!(
            "A2A client `{}` through the Switchboard A2A gateway",
            caller.as_str().trim_start_matches("a2a-")
        );
        let _: serde_json::Value = request_json(
            &self.client,
            &RegistryOp::Register.subject(caller),
            &card,
            SERVICE_TIMEOUT,
        )
        .await
        .map_err(|failure| GatewayError::from_request("registering the client", failure))?;
        self.lock_registered().insert(caller.clone());
        Ok(())
    }

    /// A request to a service as `caller`; a `not_registered` refusal (the directory lost the
    /// client, e.g. after a deregister) registers it again and retries once.
    pub(crate) async fn request<Req, Resp>(
        &self,
        caller: &AgentId,
        subject: &str,
        body: &Req,
        step: &'static str,
    ) -> Result<Resp, GatewayError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        self.request_within(caller, subject, body, step, SERVICE_TIMEOUT)
            .await
    }

    /// [`Gateway::request`] waiting up to `within` for the reply (a call held open until the
    /// agent answers).
    pub(crate) async fn request_within<Req, Resp>(
        &self,
        caller: &AgentId,
        subject: &str,
        body: &Req,
        step: &'static str,
        within: Duration,
    ) -> Result<Resp, GatewayError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        self.ensure_registered(caller).await?;
        match request_json(&self.client, subject, body, within).await {
            Err(RequestFailure::Service(reply)) if reply.kind() == ErrorKind::NotRegistered => {
                self.lock_registered().remove(caller);
                self.ensure_registered(caller).await?;
                request_json(&self.client, subject, body, within)
                    .await
                    .map_err(|failure| GatewayError::from_request(step, failure))
            }
            other => other.map_err(|failure| GatewayError::from_request(step, failure)),
        }
    }

    /// Counts a stream (or a blocking wait) `caller` opens; `Err` past its cap. The slot is
    /// given back when the returned guard drops.
    pub(crate) fn open_stream(&self, caller: &AgentId) -> Result<StreamSlot, GatewayError> {
        self.try_stream_slot(caller)
            .ok_or(GatewayError::TooManyStreams(
                self.config.max_streams_per_client,
            ))
    }

    /// [`Gateway::open_stream`], `None` past the cap.
    pub(crate) fn try_stream_slot(&self, caller: &AgentId) -> Option<StreamSlot> {
        self.streams
            .take(caller, self.config.max_streams_per_client)
    }

    /// The goal of `caller`'s A2A context `context` (one Switchboard goal per context, so the
    /// agent sees every task of one conversation come from the same goal): opened on first
    /// use; the least recently used of the client's goals is closed past
    /// [`CONTEXT_GOALS_PER_CLIENT`]. `None` when no goal can be had (the directory refuses, or
    /// the id is held by another agent): the task is then made without one.
    pub(crate) async fn context_goal(&self, caller: &AgentId, context: &str) -> Option<GoalId> {
        let goal = context_goal_id(&self.config, &self.anonymous_key, caller, context);
        let evicted = {
            let mut contexts = self.contexts.lock().unwrap_or_else(PoisonError::into_inner);
            let open = contexts.entry(caller.clone()).or_default();
            if let Some(at) = open.iter().position(|(known, _)| *known == goal) {
                let (_, uses) = open.remove(at).unwrap_or((goal, 0));
                let uses = uses.wrapping_add(1);
                open.push_back((goal, uses));
                if uses % DRAIN_EVERY == 0 {
                    self.drain_goal(caller, goal);
                }
                return Some(goal);
            }
            open.push_back((goal, 0));
            if open.len() > CONTEXT_GOALS_PER_CLIENT {
                open.pop_front().map(|(old, _)| old)
            } else {
                None
            }
        };
        if let Some(old) = evicted {
            self.close_goal(caller, old).await;
        }
        let open = GoalOpenRequest {
            goal_id: Some(goal),
            name: None,
            kind: None,
            overflow: None,
        };
        let subject = RegistryOp::GoalOpen.subject(caller);
        match self
            .request::<_, serde_json::Value>(caller, &subject, &open, "opening the context's goal")
            .await
        {
            Ok(_) => Some(goal),
            Err(err) => {
                tracing::warn!(client = %caller, %goal, error = %err, "task made without a context goal");
                let mut contexts = self.contexts.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(open) = contexts.get_mut(caller) {
                    open.retain(|(known, _)| *known != goal);
                }
                None
            }
        }
    }

    /// Acknowledges what piled up in a context goal (the task service's `task_update`
    /// messages: the client follows its tasks by their events, so nobody reads them), in the
    /// background, so a busy context never reaches the goal's cap of 64.
    fn drain_goal(&self, caller: &AgentId, goal: GoalId) {
        let client = self.client.clone();
        let caller = caller.clone();
        tokio::spawn(async move {
            let fetch = FetchRequest {
                goal_id: goal,
                max: Some(64),
                ..Default::default()
            };
            let fetched: Result<FetchReply, _> = request_json(
                &client,
                &subject::inbox_fetch(&caller),
                &fetch,
                SERVICE_TIMEOUT,
            )
            .await;
            let Some(last) = fetched
                .ok()
                .and_then(|reply| reply.messages.last().map(|m| m.seq))
            else {
                return;
            };
            let ack = AckRequest {
                goal_id: goal,
                through: Some(last),
                ..Default::default()
            };
            let acked: Result<serde_json::Value, _> =
                request_json(&client, &subject::inbox_ack(&caller), &ack, SERVICE_TIMEOUT).await;
            if let Err(err) = acked {
                tracing::debug!(client = %caller, %goal, error = %err, "context goal not drained");
            }
        });
    }

    async fn close_goal(&self, caller: &AgentId, goal: GoalId) {
        let close = GoalCloseRequest { goal_id: goal };
        let subject = RegistryOp::GoalClose.subject(caller);
        if let Err(err) = self
            .request::<_, serde_json::Value>(caller, &subject, &close, "closing a context's goal")
            .await
        {
            tracing::debug!(client = %caller, %goal, error = %err, "context goal not closed");
        }
    }

    fn lock_registered(&self) -> std::sync::MutexGuard<'_, HashSet<AgentId>> {
        self.registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The goal id of `caller`'s context `context`: the same on every replica and after a
/// restart, and not guessable by an agent (keyed with the client's token hash from the
/// config, or for a client without a token with `anonymous_key`, a random secret every replica
/// shares through the `a2a_push` bucket), so no agent can take a client's context goal first.
/// It is a UUID of version 8, a form the directory opens for `a2a-` agents only
/// ([`GoalId::is_a2a_context`]), so no agent can take it either once the LRU closed it
/// (`lookup` of the client lists it).
pub fn context_goal_id(
    config: &GatewayConfig,
    anonymous_key: &str,
    caller: &AgentId,
    context: &str,
) -> GoalId {
    let key = config
        .clients
        .iter()
        .find(|client| caller.as_str().strip_prefix(CLIENT_PREFIX) == Some(client.name.as_str()))
        .map_or(anonymous_key, |client| client.sha256.as_str());
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.as_bytes());
    let tag = ring::hmac::sign(&key, format!("{caller}\0{context}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&tag.as_ref()[..16]);
    GoalId::from(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}

/// One open stream of a client; dropping it frees the slot.
pub(crate) type StreamSlot = switchboard_runtime::places::Place<AgentId>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 26, item 7: a tokenless client's context goal was keyed with an empty key, so an
    /// agent could compute its id and open it first. With the shared random key it cannot.
    #[test]
    fn a_tokenless_clients_context_goal_is_not_computable_without_the_secret() {
        let config = GatewayConfig::default();
        let anonymous = AgentId::parse("a2a-anonymous").unwrap_or_else(|_| unreachable!());
        let computed = context_goal_id(&config, "", &anonymous, "ctx-1");
        let actual = context_goal_id(&config, &"ab".repeat(32), &anonymous, "ctx-1");
        assert_ne!(computed, actual);
        assert_eq!(
            actual,
            context_goal_id(&config, &"ab".repeat(32), &anonymous, "ctx-1"),
            "the same on every replica that shares the key"
        );
        assert_ne!(
            actual,
            context_goal_id(&config, &"ab".repeat(32), &anonymous, "ctx-2")
        );
    }

    /// Issue 37, item 3: a context goal id has the form only `a2a-` agents may open, so an
    /// agent cannot take one its client's LRU closed.
    #[test]
    fn a_context_goal_id_has_the_form_reserved_to_clients() {
        let config = GatewayConfig::default();
        let client = AgentId::parse("a2a-planner").unwrap_or_else(|_| unreachable!());
        for context in ["ctx-1", "", "a context of any length and text"] {
            assert!(context_goal_id(&config, &"ab".repeat(32), &client, context).is_a2a_context());
        }
        assert!(!GoalId::new().is_a2a_context(), "minted goals are not");
    }
}
