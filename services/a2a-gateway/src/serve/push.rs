//! Push notifications: a client registers a webhook for a task, and every event of the task is
//! POSTed to it as an A2A `StreamResponse` (a `statusUpdate`; before the final status of a
//! completed task, an `artifactUpdate` with the result), at least once.
//!
//! The configs are in the KV bucket `a2a_push`, one key per task. Deliveries come from one
//! durable consumer on `AGENT_EVENTS` shared by every replica: an event is acknowledged when
//! every webhook of its task answered 2xx, and otherwise redelivered with backoff, so a
//! webhook that is down, or a gateway replica that dies mid-delivery, loses nothing. Each
//! client has its own lane per replica (a few POSTs at once, a bounded number of events held,
//! 5 s per POST), so one client's slow or hanging webhooks delay only its own pushes.
//!
//! A webhook URL is where the gateway writes, so it is checked like any caller-chosen target:
//! `http` only (this build's HTTP client has no TLS), no redirects followed, and no loopback, private, link-local or otherwise
//! internal address (checked when set and again at every delivery, after DNS) unless the
//! operator allows it (`push_allow_private`, for a laptop or a test).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use a2a::{
    DeleteTaskPushNotificationConfigRequest, GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest, ListTaskPushNotificationConfigsResponse,
    StreamResponse, TaskPushNotificationConfig,
};
use async_nats::jetstream;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use futures::StreamExt;
use switchboard_proto::task::TaskEvent;
use switchboard_proto::{AgentId, TaskState, subject};
use switchboard_runtime::CancellationToken;
use uuid::Uuid;

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::mapping;
use crate::serve::webhook_target::{Target, allowed_target};
use crate::store::PushConfigs;

/// The most webhooks one task may have.
pub const MAX_CONFIGS_PER_TASK: usize = 8;
/// The longest webhook URL, token or credentials, in bytes.
const MAX_URL_BYTES: usize = 2048;
const MAX_SECRET_BYTES: usize = 512;
/// The longest config id, in bytes (`[A-Za-z0-9._-]`).
const MAX_ID_BYTES: usize = 64;
/// How long a webhook may take to answer: a webhook takes a POST and answers; one that
/// hangs is failed fast and tried again later, holding only its own client's lane.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);
/// Redelivery delays of an event whose webhook failed, by attempt; after the last it is given
/// up (logged).
const BACKOFF_SECS: [u64; 6] = [1, 2, 5, 10, 30, 60];
/// How long one delivery may take before JetStream hands the event to another replica: every
/// webhook of a task (at most 8), two POSTs each, at their timeout.
const DELIVERY_WITHIN: Duration = Duration::from_secs(8 * 2 * 5 + 20);
/// Events in delivery per replica, every client's together.
const IN_FLIGHT: usize = 256;
/// Events one client holds in delivery per replica (posting or waiting to): past it, the
/// client's next event comes back after [`HELD_BACKOFF`], so a client whose webhooks hang
/// never holds the places other clients' events need.
const HELD_PER_CLIENT: usize = 32;
/// Events of one client posted at once per replica.
const POSTING_PER_CLIENT: usize = 4;
/// When an event of a client that holds its share comes back.
const HELD_BACKOFF: Duration = Duration::from_secs(2);

/// A webhook as a read shows it to `caller`: anonymous callers share one identity, so one
/// of them never reads another's secrets (the token and the credentials are left out).
fn shown_to(
    caller: &AgentId,
    mut config: TaskPushNotificationConfig,
) -> TaskPushNotificationConfig {
    if caller.as_str() == crate::serve::auth::ANONYMOUS {
        config.token = None;
        if let Some(authentication) = config.authentication.as_mut() {
            authentication.credentials = None;
        }
    }
    config
}

/// Checks a webhook config a client sent, and completes it (its id, its task).
pub(crate) async fn checked(
    mut config: TaskPushNotificationConfig,
    task_id: &Uuid,
    allow_private: bool,
) -> Result<TaskPushNotificationConfig, GatewayError> {
    let id = match config.id.take().filter(|id| !id.is_empty()) {
        Some(id) => id,
        None => Uuid::now_v7().to_string(),
    };
    let id_ok = id.len() <= MAX_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !id_ok {
        return Err(GatewayError::InvalidParams(format!(
            "a push config id is 1-{MAX_ID_BYTES} characters of A-Z, a-z, 0-9, ., _ and -"
        )));
    }
    if config.url.len() > MAX_URL_BYTES {
        return Err(GatewayError::InvalidParams(format!(
            "the webhook URL is longer than {MAX_URL_BYTES} bytes"
        )));
    }
    let secrets = config.token.iter().map(String::len).sum::<usize>()
        + config
            .authentication
            .as_ref()
            .map(|auth| auth.scheme.len() + auth.credentials.as_deref().map_or(0, str::len))
            .unwrap_or(0);
    if secrets > MAX_SECRET_BYTES {
        return Err(GatewayError::InvalidParams(format!(
            "token and credentials are longer than {MAX_SECRET_BYTES} bytes"
        )));
    }
    let header_safe = |text: &str| text.bytes().all(|b| (0x20..0x7f).contains(&b));
    let headers_ok = config.token.as_deref().is_none_or(header_safe)
        && config.authentication.as_ref().is_none_or(|auth| {
            !auth.scheme.is_empty()
                && auth
                    .scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && auth.credentials.as_deref().is_none_or(header_safe)
        });
    if !headers_ok {
        return Err(GatewayError::InvalidParams(
            "token, scheme and credentials must be printable ASCII (they become headers)"
                .to_owned(),
        ));
    }
    allowed_target(&config.url, allow_private).await?;
    config.id = Some(id);
    config.task_id = task_id.to_string();
    config.tenant = None;
    Ok(config)
}

impl Gateway {
    /// `CreateTaskPushNotificationConfig`: a webhook for one of the caller's tasks (a config
    /// with the same id replaces it).
    pub async fn create_push_config(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        config: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig, GatewayError> {
        let task_id = crate::mapping::task_id(&config.task_id)?;
        self.get_for(caller, agent, &task_id).await?;
        let config = checked(config, &task_id, self.config.push_allow_private).await?;
        self.store
            .put_push_config(&task_id, caller, config.clone(), MAX_CONFIGS_PER_TASK)
            .await?;
        Ok(config)
    }

    /// `GetTaskPushNotificationConfig`.
    pub async fn get_push_config(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: GetTaskPushNotificationConfigRequest,
    ) -> Result<TaskPushNotificationConfig, GatewayError> {
        let configs = self.configs_of(caller, agent, &request.task_id).await?;
        configs
            .configs
            .into_iter()
            .find(|config| config.id.as_deref() == Some(request.id.as_str()))
            .map(|config| shown_to(caller, config))
            .ok_or_else(|| GatewayError::NoPushConfig {
                task: request.task_id.clone(),
                id: request.id.clone(),
            })
    }

    /// `ListTaskPushNotificationConfigs`: every webhook of the task (at most
    /// [`MAX_CONFIGS_PER_TASK`], so one page).
    pub async fn list_push_configs(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: ListTaskPushNotificationConfigsRequest,
    ) -> Result<ListTaskPushNotificationConfigsResponse, GatewayError> {
        let configs = self.configs_of(caller, agent, &request.task_id).await?;
        Ok(ListTaskPushNotificationConfigsResponse {
            configs: configs
                .configs
                .into_iter()
                .map(|config| shown_to(caller, config))
                .collect(),
            next_page_token: None,
        })
    }

    /// `DeleteTaskPushNotificationConfig`.
    pub async fn delete_push_config(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: DeleteTaskPushNotificationConfigRequest,
    ) -> Result<(), GatewayError> {
        let task_id = crate::mapping::task_id(&request.task_id)?;
        self.get_for(caller, agent, &task_id).await?;
        self.store.delete_push_config(&task_id, &request.id).await
    }

    async fn configs_of(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        task: &str,
    ) -> Result<PushConfigs, GatewayError> {
        let task_id = crate::mapping::task_id(task)?;
        self.get_for(caller, agent, &task_id).await?;
        Ok(self.store.push_configs(&task_id).await?.unwrap_or_default())
    }

    /// Delivers push notifications until `shutdown`: pulls the task events of every client's
    /// tasks from the shared durable consumer, POSTs them to the tasks' webhooks, and
    /// acknowledges an event only when every webhook took it.
    pub async fn deliver_pushes(
        self: Arc<Self>,
        js: jetstream::Context,
        shutdown: CancellationToken,
    ) {
        loop {
            let run = self.pull_events(&js, &shutdown);
            match run.await {
                Ok(()) => return,
                Err(err) => {
                    tracing::warn!(error = %err, "push delivery stopped; retrying in 1 s");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    }

    async fn pull_events(
        self: &Arc<Self>,
        js: &jetstream::Context,
        shutdown: &CancellationToken,
    ) -> Result<(), async_nats::Error> {
        let stream = js.get_stream(switchboard_proto::EVENTS_STREAM).await?;
        let consumer = stream
            .get_or_create_consumer(
                switchboard_proto::A2A_PUSH_CONSUMER,
                pull::Config {
                    durable_name: Some(switchboard_proto::A2A_PUSH_CONSUMER.to_owned()),
                    description: Some("A2A gateway push notifications".to_owned()),
                    filter_subject: subject::below(subject::TASK_EVENTS_PREFIX),
                    deliver_policy: DeliverPolicy::New,
                    ack_policy: AckPolicy::Explicit,
                    // No server-side backoff: it would shorten `ack_wait` to its first step and
                    // hand slow deliveries out twice. The delay goes with each NAK instead.
                    ack_wait: DELIVERY_WITHIN,
                    max_deliver: i64::try_from(BACKOFF_SECS.len() + 1).unwrap_or(i64::MAX),
                    max_ack_pending: 1024,
                    ..Default::default()
                },
            )
            .await?;
        let mut messages = consumer.messages().await?;
        let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        let lanes = Lanes::default();
        loop {
            let next = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                next = messages.next() => next,
            };
            let Some(message) = next else {
                return Err("the event consumer ended".into());
            };
            let message = message?;
            let event = match serde_json::from_slice::<TaskEvent>(&message.payload) {
                Ok(event)
                    if event
                        .requester
                        .as_str()
                        .starts_with(crate::gateway::CLIENT_PREFIX) =>
                {
                    event
                }
                // Not a client's task (most events), or not an event: nothing to push.
                _ => {
                    tokio::spawn(
                        async move { ack_logged(&message, jetstream::AckKind::Ack).await },
                    );
                    continue;
                }
            };
            let Some(lane) = lanes.enter(event.requester.as_str()) else {
                tokio::spawn(async move {
                    let later = jetstream::AckKind::Nak(Some(HELD_BACKOFF));
                    ack_logged(&message, later).await;
                });
                continue;
            };
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return Ok(());
            };
            let gateway = Arc::clone(self);
            tokio::spawn(async move {
                let _slot = slot;
                let Ok(_posting) = lane.posting.acquire().await else {
                    return;
                };
                // It may have waited for its client's lane: its ack time starts now.
                let _ = message.ack_with(jetstream::AckKind::Progress).await;
                gateway.deliver(message, &event).await;
            });
        }
    }

    /// One event: to every webhook of its task, then acknowledged; or redelivered later.
    async fn deliver(&self, message: jetstream::Message, event: &TaskEvent) {
        let seq = message.info().map(|info| info.stream_sequence).unwrap_or(0);
        let done = self.push(event, seq).await;
        let attempt = message
            .info()
            .map(|info| usize::try_from(info.delivered).unwrap_or(usize::MAX))
            .unwrap_or(1);
        let ack = if done {
            jetstream::AckKind::Ack
        } else if attempt > BACKOFF_SECS.len() {
            tracing::warn!(
                seq,
                attempts = attempt,
                "push event given up: a webhook kept failing"
            );
            jetstream::AckKind::Term
        } else {
            let delay = BACKOFF_SECS[attempt.saturating_sub(1).min(BACKOFF_SECS.len() - 1)];
            jetstream::AckKind::Nak(Some(Duration::from_secs(delay)))
        };
        ack_logged(&message, ack).await;
    }

    /// POSTs the event to its task's webhooks; `false` when one of them must be retried.
    async fn push(&self, event: &TaskEvent, seq: u64) -> bool {
        let configs = match self.store.push_configs(&event.task_id).await {
            Ok(Some(configs)) if !configs.configs.is_empty() => configs,
            Ok(_) => return true,
            Err(err) => {
                tracing::warn!(error = %err, task_id = %event.task_id, "push configs unreadable");
                return false;
            }
        };
        let Ok(client) = AgentId::parse(&configs.client) else {
            return true;
        };
        let responses = match self.responses(&client, event, seq).await {
            Ok(responses) => responses,
            Err(err) => {
                tracing::warn!(error = %err, task_id = %event.task_id, "push event not built");
                return false;
            }
        };
        let mut all = true;
        for config in &configs.configs {
            for response in &responses {
                if !self.post(config, response).await {
                    all = false;
                    break;
                }
            }
        }
        all
    }

    /// The stream responses an event becomes: its status, after the result for a completion.
    async fn responses(
        &self,
        client: &AgentId,
        event: &TaskEvent,
        seq: u64,
    ) -> Result<Vec<StreamResponse>, GatewayError> {
        let record = self.get(client, &event.task_id).await?;
        // The event's number within its task, as streams number it (the SSE id).
        let seq = crate::store::event_number(event).map_or(seq, u64::from);
        let context = mapping::context_of(&record);
        let completed = (event.to == TaskState::Completed).then_some(&record);
        Ok(crate::serve::events::event_responses(
            &context,
            event,
            seq,
            completed,
            &self.links,
        ))
    }

    /// One POST; `true` when the webhook took it (2xx) or can never take it (refused target).
    async fn post(&self, config: &TaskPushNotificationConfig, response: &StreamResponse) -> bool {
        let target = match allowed_target(&config.url, self.config.push_allow_private).await {
            Ok(target) => target,
            Err(GatewayError::InvalidParams(why)) => {
                tracing::warn!(url = %config.url, why, "push target refused; not retried");
                return true;
            }
            Err(err) => {
                tracing::info!(url = %config.url, error = %err, "webhook host unresolved; will retry");
                return false;
            }
        };
        // Connect to the address just checked, not to whatever a second lookup says.
        let client = match webhook_client(Some(&target), &self.roots) {
            Ok(client) => client,
            Err(err) => {
                tracing::error!(url = %config.url, error = %err, "no HTTP client for webhooks; will retry");
                return false;
            }
        };
        let mut request = client
            .post(&config.url)
            .header("Content-Type", "application/a2a+json")
            .body(serde_json::to_vec(response).unwrap_or_default());
        if let Some(token) = &config.token {
            // The two SDKs name it differently; both are sent.
            request = request
                .header("X-A2A-Notification-Token", token)
                .header("A2A-Notification-Token", token);
        }
        if let Some(auth) = &config.authentication {
            let value = match &auth.credentials {
                Some(credentials) => format!("{} {credentials}", auth.scheme),
                None => auth.scheme.clone(),
            };
            request = request.header("Authorization", value);
        }
        match request.send().await {
            Ok(answer) if answer.status().is_success() => true,
            Ok(answer) => {
                tracing::info!(url = %config.url, status = %answer.status(), "webhook refused a push; will retry");
                false
            }
            Err(err) => {
                tracing::info!(url = %config.url, error = %err, "webhook unreachable; will retry");
                false
            }
        }
    }
}

/// Acknowledges (or gives back) an event; a failure is logged (the event comes back).
async fn ack_logged(message: &jetstream::Message, kind: jetstream::AckKind) {
    if let Err(err) = message.ack_with(kind).await {
        tracing::debug!(error = %err, "push event not acknowledged");
    }
}

/// Each client's share of a replica's push deliveries: at most [`HELD_PER_CLIENT`] events
/// held and [`POSTING_PER_CLIENT`] posted at once, so one client's hanging webhooks delay only
/// that client's pushes.
#[derive(Default)]
struct Lanes {
    held: switchboard_runtime::places::Places<String>,
    posting: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

/// One event's place in its client's lane.
struct Lane {
    _held: switchboard_runtime::places::Place<String>,
    posting: Arc<tokio::sync::Semaphore>,
}

impl Lanes {
    /// A place for an event of `client`, or `None` when the client holds its share.
    fn enter(&self, client: &str) -> Option<Lane> {
        let client = client.to_owned();
        let held = self.held.take(&client, HELD_PER_CLIENT)?;
        let mut posting = self
            .posting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Clients that hold nothing any more are forgotten (their lanes are idle).
        if posting.len() > 1_024 {
            posting.retain(|client, _| self.held.held(client) > 0);
        }
        let lane = posting
            .entry(client)
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(POSTING_PER_CLIENT)));
        Some(Lane {
            _held: held,
            posting: Arc::clone(lane),
        })
    }
}

/// The HTTP client a webhook is posted with: bounded time, no redirects (a redirect could
/// point anywhere, past the address check), pinned to the checked address, TLS with the
/// platform's roots plus `roots`.
fn webhook_client(
    target: Option<&Target>,
    roots: &[reqwest::Certificate],
) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = crate::http::http_builder(roots).timeout(WEBHOOK_TIMEOUT);
    if let Some(target) = target {
        builder = builder.resolve(&target.host, target.address);
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_holds_at_most_its_share_and_posts_four_at_once_others_unaffected() {
        let lanes = Lanes::default();
        let held: Vec<Lane> = (0..HELD_PER_CLIENT)
            .filter_map(|_| lanes.enter("hog"))
            .collect();
        assert_eq!(held.len(), HELD_PER_CLIENT);
        assert!(lanes.enter("hog").is_none(), "past its share: held back");
        // Another client's events are not held behind the hog's.
        let other = lanes.enter("planner");
        assert!(other.is_some());
        // The hog's events share 4 posts at once, the other client's lane its own 4.
        assert_eq!(held[0].posting.available_permits(), POSTING_PER_CLIENT);
        let posting: Vec<_> = (0..POSTING_PER_CLIENT)
            .filter_map(|n| held[n].posting.clone().try_acquire_owned().ok())
            .collect();
        assert_eq!(posting.len(), POSTING_PER_CLIENT);
        assert!(held[0].posting.clone().try_acquire_owned().is_err());
        assert!(
            other
                .as_ref()
                .is_some_and(|lane| lane.posting.available_permits() == POSTING_PER_CLIENT)
        );
        // An event let go gives its place back.
        drop(held);
        assert!(lanes.enter("hog").is_some());
    }
}
