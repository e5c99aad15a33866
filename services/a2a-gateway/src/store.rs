//! What the gateway reads from JetStream: agent records (through the registry view the other
//! services share) and a task's events from `AGENT_EVENTS`, by stream sequence, which is what
//! lets any replica resume a client's stream where it broke off.

use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, pull};
use async_nats::jetstream::{self, stream};
use futures::{Stream, StreamExt};
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
}

/// One task event as stored: its `AGENT_EVENTS` sequence (the SSE event id) and the event.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    /// Its sequence in `AGENT_EVENTS`: a client resuming after it sends it as `Last-Event-ID`.
    pub seq: u64,
    /// The transition (or the creation) it records.
    pub event: TaskEvent,
}

impl Store {
    /// A store reading `events` (the `AGENT_EVENTS` stream) and agent records through `view`.
    pub fn new(events: stream::Stream, view: RegistryView) -> Self {
        Self { events, view }
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
