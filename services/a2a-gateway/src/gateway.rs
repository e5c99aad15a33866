//! The gateway: what every rule works with (the NATS connection, the settings, the registry
//! view, the event stream) and how it speaks to the fabric as an A2A client's agent.
//!
//! Each A2A client is an agent of the fabric, `a2a-<name>`: the gateway registers it before
//! its first request, and every request it makes for the client is published on the client's
//! own subjects, so the services' ACLs, request budgets and the audit trail see who asked.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::Client;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchboard_proto::subject::RegistryOp;
use switchboard_proto::{AgentCard, AgentId, ErrorKind};
use switchboard_runtime::request::{RequestFailure, request_json};

use crate::config::GatewayConfig;
use crate::error::GatewayError;
use crate::store::Store;

/// The prefix of every client agent (`a2a-<name>`): such an agent is never served as an A2A
/// agent, and `switchboard nats-config` refuses to key one.
pub const CLIENT_PREFIX: &str = switchboard_proto::A2A_CLIENT_PREFIX;

/// How long a request to a service may take before the gateway answers `unavailable`.
pub(crate) const SERVICE_TIMEOUT: Duration = Duration::from_secs(10);

/// The A2A gateway: serves every registered agent over A2A.
#[derive(Debug)]
pub struct Gateway {
    pub(crate) client: Client,
    pub(crate) config: GatewayConfig,
    pub(crate) store: Store,
    /// The client agents registered by this replica (registration is idempotent; this only
    /// saves a request per call).
    registered: Mutex<HashSet<AgentId>>,
    /// Cancelled when the gateway stops: open streams and blocking waits end with it.
    pub(crate) stopping: switchboard_runtime::CancellationToken,
    /// Open streams (and blocking waits) per client agent.
    streams: Arc<Mutex<HashMap<AgentId, usize>>>,
}

impl Gateway {
    /// A gateway over `client`.
    pub fn new(client: Client, config: GatewayConfig, store: Store) -> Self {
        Self {
            client,
            config,
            store,
            registered: Mutex::new(HashSet::new()),
            streams: Arc::default(),
            stopping: switchboard_runtime::CancellationToken::new(),
        }
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
        self.ensure_registered(caller).await?;
        match request_json(&self.client, subject, body, SERVICE_TIMEOUT).await {
            Err(RequestFailure::Service(reply)) if reply.kind() == ErrorKind::NotRegistered => {
                self.lock_registered().remove(caller);
                self.ensure_registered(caller).await?;
                request_json(&self.client, subject, body, SERVICE_TIMEOUT)
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
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let open = streams.entry(caller.clone()).or_default();
        if *open >= self.config.max_streams_per_client {
            return None;
        }
        *open += 1;
        Some(StreamSlot {
            streams: Arc::clone(&self.streams),
            caller: caller.clone(),
        })
    }

    fn lock_registered(&self) -> std::sync::MutexGuard<'_, HashSet<AgentId>> {
        self.registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One open stream of a client; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    streams: Arc<Mutex<HashMap<AgentId, usize>>>,
    caller: AgentId,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = streams.get_mut(&self.caller) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                streams.remove(&self.caller);
            }
        }
    }
}
