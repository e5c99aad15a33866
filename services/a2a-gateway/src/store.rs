//! What the gateway reads from JetStream: agent records (through the registry view the other
//! services share) and a task's events from `AGENT_EVENTS`, by stream sequence, which is what
//! lets any replica resume a client's stream where it broke off.

use a2a::TaskPushNotificationConfig;
use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, pull};
use async_nats::jetstream::{self, kv, stream};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use switchboard_proto::task::TaskEvent;
use switchboard_proto::{AgentId, AgentRecord, subject};
use switchboard_runtime::registry_view::RegistryView;
use uuid::Uuid;

use crate::error::GatewayError;

/// The gateway's JetStream side.
#[derive(Debug, Clone)]
pub struct Store {
    events: stream::Stream,
    view: RegistryView,
    push: kv::Store,
}

/// A task's webhooks, as `a2a_push` keeps them under the task id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PushConfigs {
    /// The client agent that set them (the task's requester): deliveries read the task as it.
    pub client: String,
    /// The webhooks, each with its id.
    pub configs: Vec<TaskPushNotificationConfig>,
}

/// How often a config write retries a compare-and-set another replica won.
const CAS_ATTEMPTS: usize = 8;

/// One task event as stored: its `AGENT_EVENTS` sequence (the SSE event id) and the event.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    /// Its sequence in `AGENT_EVENTS`: a client resuming after it sends it as `Last-Event-ID`.
    pub seq: u64,
    /// The transition (or the creation) it records.
    pub event: TaskEvent,
}

impl Store {
    /// A store reading `events` (the `AGENT_EVENTS` stream) and agent records through `view`,
    /// keeping webhooks in `push` (the `a2a_push` bucket).
    pub fn new(events: stream::Stream, view: RegistryView, push: kv::Store) -> Self {
        Self { events, view, push }
    }

    /// The webhooks of a task, `None` when it has none.
    pub async fn push_configs(&self, task_id: &Uuid) -> Result<Option<PushConfigs>, GatewayError> {
        Ok(self.push_entry(task_id).await?.map(|(configs, _)| configs))
    }

    async fn push_entry(&self, task_id: &Uuid) -> Result<Option<(PushConfigs, u64)>, GatewayError> {
        let unavailable = |err: String| GatewayError::Unavailable {
            step: "reading the task's push configs",
            message: err,
        };
        match self.push.entry(task_id.to_string()).await {
            Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                let configs = serde_json::from_slice(&entry.value)
                    .map_err(|err| unavailable(err.to_string()))?;
                Ok(Some((configs, entry.revision)))
            }
            Ok(_) => Ok(None),
            Err(err) => Err(unavailable(err.to_string())),
        }
    }

    /// Adds (or replaces, by id) a webhook of `client`'s task; at most `max` per task.
    pub async fn put_push_config(
        &self,
        task_id: &Uuid,
        client: &AgentId,
        config: TaskPushNotificationConfig,
        max: usize,
    ) -> Result<(), GatewayError> {
        self.change_push(task_id, |configs| {
            configs.client = client.to_string();
            configs.configs.retain(|kept| kept.id != config.id);
            if configs.configs.len() >= max {
                return Err(GatewayError::InvalidParams(format!(
                    "a task has at most {max} push configs"
                )));
            }
            configs.configs.push(config.clone());
            Ok(())
        })
        .await
    }

    /// Removes a webhook by id (no such id: nothing to do).
    pub async fn delete_push_config(&self, task_id: &Uuid, id: &str) -> Result<(), GatewayError> {
        self.change_push(task_id, |configs| {
            configs
                .configs
                .retain(|kept| kept.id.as_deref() != Some(id));
            Ok(())
        })
        .await
    }

    /// Read, change, write with compare-and-set; re-read when another replica wrote first.
    async fn change_push(
        &self,
        task_id: &Uuid,
        change: impl Fn(&mut PushConfigs) -> Result<(), GatewayError>,
    ) -> Result<(), GatewayError> {
        let key = task_id.to_string();
        for _ in 0..CAS_ATTEMPTS {
            let (mut configs, revision) = self.push_entry(task_id).await?.unwrap_or_default();
            change(&mut configs)?;
            let value = serde_json::to_vec(&configs).unwrap_or_default();
            let written = if revision == 0 {
                self.push
                    .create(&key, value.into())
                    .await
                    .map(|_| ())
                    .map_err(|err| {
                        (
                            err.kind() == kv::CreateErrorKind::AlreadyExists,
                            err.to_string(),
                        )
                    })
            } else {
                self.push
                    .update(&key, value.into(), revision)
                    .await
                    .map(|_| ())
                    .map_err(|err| {
                        (
                            err.kind() == kv::UpdateErrorKind::WrongLastRevision,
                            err.to_string(),
                        )
                    })
            };
            match written {
                Ok(()) => return Ok(()),
                Err((true, _)) => continue,
                Err((false, message)) => {
                    return Err(GatewayError::Unavailable {
                        step: "writing the task's push configs",
                        message,
                    });
                }
            }
        }
        Err(GatewayError::Unavailable {
            step: "writing the task's push configs",
            message: "other replicas kept changing them".to_owned(),
        })
    }

    /// The registry view (watched by the running gateway).
    pub fn view(&self) -> &RegistryView {
        &self.view
    }

    /// An agent's record, `None` when it is not registered.
    pub async fn agent(&self, agent: &AgentId) -> Result<Option<AgentRecord>, GatewayError> {
        self.view
            .record(agent)
            .await
            .map_err(|err| GatewayError::Unavailable {
                step: "reading the agent's card",
                message: err.to_string(),
            })
    }

    /// The `AGENT_EVENTS` sequence of the task's latest event (0: none stored).
    pub async fn last_event(&self, task_id: &Uuid) -> Result<u64, GatewayError> {
        match self
            .events
            .get_last_raw_message_by_subject(&subject::task_events(task_id))
            .await
        {
            Ok(message) => Ok(message.sequence),
            Err(err) if err.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Err(err) => Err(GatewayError::Unavailable {
                step: "reading the task's latest event",
                message: err.to_string(),
            }),
        }
    }

    /// The events of `task_id` stored after sequence `after` (0: all of them), oldest first,
    /// then each new one as it is stored. An ordered consumer: nothing is skipped or repeated.
    pub async fn task_events(
        &self,
        task_id: &Uuid,
        after: u64,
    ) -> Result<impl Stream<Item = Result<StoredEvent, String>> + use<>, GatewayError> {
        let deliver_policy = if after == 0 {
            DeliverPolicy::All
        } else {
            DeliverPolicy::ByStartSequence {
                start_sequence: after.saturating_add(1),
            }
        };
        let consumer = self
            .events
            .create_consumer(pull::OrderedConfig {
                filter_subject: subject::task_events(task_id),
                deliver_policy,
                replay_policy: ReplayPolicy::Instant,
                ..Default::default()
            })
            .await
            .map_err(|err| GatewayError::Unavailable {
                step: "following the task's events",
                message: err.to_string(),
            })?;
        let messages = consumer
            .messages()
            .await
            .map_err(|err| GatewayError::Unavailable {
                step: "following the task's events",
                message: err.to_string(),
            })?;
        Ok(messages.map(|message| {
            let message = message.map_err(|err| err.to_string())?;
            let seq = message
                .info()
                .map_err(|err| err.to_string())?
                .stream_sequence;
            let event = serde_json::from_slice(&message.payload)
                .map_err(|err| format!("undecodable task event at {seq}: {err}"))?;
            Ok(StoredEvent { seq, event })
        }))
    }
}

/// Opens `AGENT_EVENTS` for reading.
pub async fn events_stream(js: &jetstream::Context) -> Result<stream::Stream, String> {
    js.get_stream(switchboard_proto::EVENTS_STREAM)
        .await
        .map_err(|err| err.to_string())
}
