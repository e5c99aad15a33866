//! What the gateway reads and writes in JetStream: agent records (through the registry view
//! the other services share), a task's stored events from `AGENT_EVENTS` (read one by one,
//! by the task's subject, so no consumer is made per stream or wait), the webhooks of the
//! `a2a_push` bucket, a task's follow-ups (`a2a_history`), the remote agents of
//! `a2a_remotes` and the remote tasks paused on a question (`a2a_paused`).

use a2a::TaskPushNotificationConfig;
use async_nats::jetstream::{self, kv, stream};
use futures::TryStreamExt as _;
use serde::{Deserialize, Serialize};
use switchboard_delivery::registry_view::RegistryView;
use switchboard_proto::GoalId;
use switchboard_proto::task::TaskEvent;
use switchboard_proto::{AgentId, AgentRecord, subject};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::GatewayError;

/// The gateway's JetStream side.
#[derive(Debug, Clone)]
pub struct Store {
    events: stream::Stream,
    view: RegistryView,
    push: kv::Store,
    history: kv::Store,
}

/// The most follow-up messages (questions and answers) a task's history keeps: the latest.
pub const HISTORY_MESSAGES: usize = 32;
/// The most bytes of follow-ups a task's history keeps (encoded): the latest that fit.
pub const HISTORY_BYTES: usize = 256 * 1024;

/// The `a2a_push` key of the secret keying tokenless clients' context goals (never a task id).
pub const ANONYMOUS_KEY: &str = "anonymous-context-key";

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

/// The most stored messages one read of a task's events goes through.
const MAX_EVENTS_READ: usize = 4096;

/// Drops the oldest of `messages` until at most [`HISTORY_MESSAGES`] are left and they encode
/// within [`HISTORY_BYTES`].
fn bound_history(messages: &mut Vec<a2a::Message>) {
    if messages.len() > HISTORY_MESSAGES {
        messages.drain(..messages.len() - HISTORY_MESSAGES);
    }
    while !messages.is_empty()
        && serde_json::to_vec(&messages).map_or(0, |bytes| bytes.len()) > HISTORY_BYTES
    {
        messages.remove(0);
    }
}

/// A JSON value kept under `key`, with its revision; `None` when there is none.
async fn read_json<T: serde::de::DeserializeOwned>(
    bucket: &kv::Store,
    key: &str,
    step: &'static str,
) -> Result<Option<(T, u64)>, GatewayError> {
    let unavailable = |message: String| GatewayError::unavailable(step, message);
    match bucket.entry(key).await {
        Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
            let value =
                serde_json::from_slice(&entry.value).map_err(|err| unavailable(err.to_string()))?;
            Ok(Some((value, entry.revision)))
        }
        Ok(_) => Ok(None),
        Err(err) => Err(unavailable(err.to_string())),
    }
}

/// Read, change, write the JSON value under `key` with compare-and-set (a create when there
/// is none); re-read when another replica wrote first. `steps`: what reading and writing are
/// called in an error.
async fn change_json<T: Default + Serialize + serde::de::DeserializeOwned>(
    bucket: &kv::Store,
    key: &str,
    steps: (&'static str, &'static str),
    mut change: impl FnMut(&mut T) -> Result<(), GatewayError>,
) -> Result<(), GatewayError> {
    let (read, step) = steps;
    for _ in 0..CAS_ATTEMPTS {
        let (mut value, revision) = read_json(bucket, key, read).await?.unwrap_or_default();
        change(&mut value)?;
        let bytes = serde_json::to_vec(&value).unwrap_or_default();
        let written = if revision == 0 {
            bucket
                .create(key, bytes.into())
                .await
                .map(|_| ())
                .map_err(|err| {
                    (
                        switchboard_request::kv::already_exists(&err),
                        err.to_string(),
                    )
                })
        } else {
            let update = bucket.update(key, bytes.into(), revision).await;
            update.map(|_| ()).map_err(|err| {
                (
                    switchboard_request::kv::lost_revision(&err),
                    err.to_string(),
                )
            })
        };
        match written {
            Ok(()) => return Ok(()),
            Err((true, _)) => continue,
            Err((false, message)) => return Err(GatewayError::unavailable(step, message)),
        }
    }
    Err(GatewayError::unavailable(
        step,
        "other replicas kept changing it",
    ))
}

/// The `a2a_history` key recording the last question of a task that was answered.
fn answered_key(task_id: &Uuid) -> String {
    format!("{task_id}.answered")
}

/// An event's number within its task: `n` of its id `<task_id>:<n>` (0 is the creation). The
/// SSE id of the event's stream item, and what a client resumes after.
pub fn event_number(event: &TaskEvent) -> Option<u32> {
    event.id.rsplit(':').next()?.parse().ok()
}

impl Store {
    /// A store reading `events` (the `AGENT_EVENTS` stream) and agent records through `view`,
    /// keeping webhooks in `push` (the `a2a_push` bucket) and follow-ups in `history`
    /// (`a2a_history`).
    pub fn new(
        events: stream::Stream,
        view: RegistryView,
        push: kv::Store,
        history: kv::Store,
    ) -> Self {
        Self {
            events,
            view,
            push,
            history,
        }
    }

    /// The follow-up messages of a task, oldest first (none when it has had none).
    pub async fn follow_ups(&self, task_id: &Uuid) -> Result<Vec<a2a::Message>, GatewayError> {
        let key = task_id.to_string();
        let read = read_json(&self.history, &key, "reading the task's history").await?;
        Ok(read.map(|(messages, _)| messages).unwrap_or_default())
    }

    /// Appends `messages` to a task's follow-ups, keeping the latest [`HISTORY_MESSAGES`]
    /// within [`HISTORY_BYTES`].
    pub async fn add_follow_ups(
        &self,
        task_id: &Uuid,
        messages: &[a2a::Message],
    ) -> Result<(), GatewayError> {
        change_json(
            &self.history,
            &task_id.to_string(),
            ("reading the task's history", "writing the task's history"),
            |kept: &mut Vec<a2a::Message>| {
                kept.extend(messages.iter().cloned());
                bound_history(kept);
                Ok(())
            },
        )
        .await
    }

    /// Claims the answer to a task's question number `question` (the task's transition count
    /// when it asked): `Ok(true)` for the first claim, `Ok(false)` when that question (or a
    /// later one) was claimed before — by this or another replica, with compare-and-set on
    /// the `<task>.answered` key of `a2a_history`.
    pub async fn claim_answer(&self, task_id: &Uuid, question: u32) -> Result<bool, GatewayError> {
        // Claimed already: refused before any write, so forty answers at once cost one write
        // and thirty-nine reads, not a contest of writes.
        let claimed = change_json(
            &self.history,
            &answered_key(task_id),
            ("reading the task's answers", "recording the task's answer"),
            |answered: &mut Option<u32>| {
                if answered.is_some_and(|last| last >= question) {
                    return Err(GatewayError::AlreadyAnswered {
                        task: task_id.to_string(),
                    });
                }
                *answered = Some(question);
                Ok(())
            },
        )
        .await;
        match claimed {
            Ok(()) => Ok(true),
            Err(GatewayError::AlreadyAnswered { .. }) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Gives back a claim of [`Store::claim_answer`] whose answer could not be sent, so the
    /// client may answer again (best effort: a failure leaves the question answered).
    pub async fn release_answer(&self, task_id: &Uuid, question: u32) {
        let released = change_json(
            &self.history,
            &answered_key(task_id),
            ("reading the task's answers", "releasing the task's answer"),
            |answered: &mut Option<u32>| {
                if *answered == Some(question) {
                    *answered = question.checked_sub(1);
                }
                Ok(())
            },
        )
        .await;
        if let Err(err) = released {
            tracing::warn!(task_id = %task_id, error = %err, "an unsent answer stays claimed");
        }
    }

    /// The webhooks of a task, `None` when it has none.
    pub async fn push_configs(&self, task_id: &Uuid) -> Result<Option<PushConfigs>, GatewayError> {
        Ok(self.push_entry(task_id).await?.map(|(configs, _)| configs))
    }

    async fn push_entry(&self, task_id: &Uuid) -> Result<Option<(PushConfigs, u64)>, GatewayError> {
        read_json(
            &self.push,
            &task_id.to_string(),
            "reading the task's push configs",
        )
        .await
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

    /// The secret that keys the context goals of clients without a token: random, made by
    /// the first replica that starts and read by every other, kept in `a2a_push` under
    /// [`ANONYMOUS_KEY`].
    pub async fn anonymous_context_key(&self) -> Result<String, GatewayError> {
        let unavailable =
            |err: String| GatewayError::unavailable("reading the anonymous context key", err);
        for _ in 0..CAS_ATTEMPTS {
            if let Some(value) = self
                .push
                .get(ANONYMOUS_KEY)
                .await
                .map_err(|err| unavailable(err.to_string()))?
                && value.len() >= 32
            {
                return Ok(String::from_utf8_lossy(&value).into_owned());
            }
            let mut secret = [0u8; 32];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
                .map_err(|_| unavailable("no randomness".to_owned()))?;
            let secret: String = secret.iter().map(|byte| format!("{byte:02x}")).collect();
            // Another replica may create it first: then its secret is read.
            if self
                .push
                .create(ANONYMOUS_KEY, secret.clone().into())
                .await
                .is_ok()
            {
                return Ok(secret);
            }
        }
        Err(unavailable("the key kept changing".to_owned()))
    }

    /// Removes every webhook of a task that was never made (its creation was refused).
    pub async fn forget_push_configs(&self, task_id: &Uuid) -> Result<(), GatewayError> {
        self.push.purge(task_id.to_string()).await.map_err(|err| {
            GatewayError::unavailable("removing the push configs of a task not made", err)
        })
    }

    /// Read, change, write the push configs with compare-and-set.
    async fn change_push(
        &self,
        task_id: &Uuid,
        change: impl FnMut(&mut PushConfigs) -> Result<(), GatewayError>,
    ) -> Result<(), GatewayError> {
        change_json(
            &self.push,
            &task_id.to_string(),
            (
                "reading the task's push configs",
                "writing the task's push configs",
            ),
            change,
        )
        .await
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
            .map_err(|err| GatewayError::unavailable("reading the agent's card", err))
    }

    /// The events of `task_id` numbered after `after` (`<task_id>:<n>`), oldest first, as
    /// `AGENT_EVENTS` stores them: read message by message (`next_by_subject`), no consumer,
    /// so any number of streams and waits cost the server nothing to keep.
    pub async fn task_events_after(
        &self,
        task_id: &Uuid,
        after: Option<u32>,
    ) -> Result<Vec<TaskEvent>, GatewayError> {
        let subject = subject::task_events(task_id);
        let mut events = Vec::new();
        let mut next = 1;
        // A task has at most a few hundred transitions; the bound keeps a damaged stream
        // from looping.
        for _ in 0..MAX_EVENTS_READ {
            let found = self
                .events
                .raw_message_builder()
                .sequence(next)
                .next_by_subject(subject.clone())
                .send()
                .await;
            let message = match found {
                Ok(message) => message,
                Err(err) if err.kind() == stream::RawMessageErrorKind::NoMessageFound => break,
                Err(err) => {
                    return Err(GatewayError::unavailable("reading the task's events", err));
                }
            };
            next = message.sequence.saturating_add(1);
            if let Ok(event) = serde_json::from_slice::<TaskEvent>(&message.payload)
                && after.is_none_or(|after| event_number(&event).is_some_and(|n| n > after))
            {
                events.push(event);
            }
        }
        events.sort_by_key(event_number);
        Ok(events)
    }
}

/// Opens `AGENT_EVENTS` for reading.
pub async fn events_stream(js: &jetstream::Context) -> Result<stream::Stream, async_nats::Error> {
    Ok(js.get_stream(switchboard_proto::EVENTS_STREAM).await?)
}

/// A paused task: a Switchboard task whose remote task asked a question.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PausedTask {
    /// The remote task's id.
    pub remote_task_id: String,
    /// Its context id.
    pub context_id: String,
    /// The Switchboard task's requester: only its answer resumes the task.
    pub requester: AgentId,
}

/// The remote tasks that asked a question, by the Switchboard task they carry: when the
/// requester answers, the answer goes into the same remote task (docs/a2a.md, "Outbound").
#[derive(Debug, Clone)]
pub struct Paused(jetstream::kv::Store);

impl Paused {
    /// Paused tasks kept in `bucket` (`a2a_paused`).
    pub fn new(bucket: jetstream::kv::Store) -> Self {
        Self(bucket)
    }

    /// The remote task Switchboard task `task_id` waits on, if any.
    pub async fn get(&self, task_id: &Uuid) -> Option<PausedTask> {
        let value = self.0.get(task_id.to_string()).await.ok()??;
        serde_json::from_slice(&value).ok()
    }

    /// Records that `task_id` waits on `paused` (a failure is logged: the answer then starts
    /// a new remote task).
    pub async fn put(&self, task_id: &Uuid, paused: &PausedTask) {
        let Ok(value) = serde_json::to_vec(paused) else {
            return;
        };
        if let Err(err) = self.0.put(task_id.to_string(), value.into()).await {
            tracing::warn!(%task_id, error = %err, "paused remote task not recorded");
        }
    }

    /// Forgets `task_id`'s pause.
    pub async fn delete(&self, task_id: &Uuid) {
        if let Err(err) = self.0.purge(task_id.to_string()).await {
            tracing::debug!(%task_id, error = %err, "paused remote task not forgotten");
        }
    }
}

// The remote agents the gateway carries: KV `a2a_remotes`, one record per agent id.

/// A remote A2A agent the gateway carries: the value stored under its agent id in
/// `a2a_remotes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteAgent {
    /// Its id on the fabric (`--as`, or made from the card's name).
    pub agent_id: AgentId,
    /// Where its card is fetched from (and refreshed).
    pub card_url: String,
    /// The goal whose inbox holds what the fabric sends it (chosen once, so any replica that
    /// takes the agent over reads the same inbox).
    pub goal_id: GoalId,
    /// When it was added.
    #[serde(with = "time::serde::rfc3339")]
    pub added_at: OffsetDateTime,
    /// The skill ids its card listed when it was added: a refresh of the card may drop one,
    /// never add one (a card that gains a skill later does not get its work). `None` on a
    /// record from before pinning: the card is taken as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skills: Option<Vec<String>>,
    /// Whether `skill:` work may be routed to it: only when the operator said so at `add`
    /// (`--route-skills`); otherwise its skills are listed for agents to read, and only work
    /// sent to it by name reaches it.
    #[serde(default)]
    pub route_skills: bool,
}

/// The `a2a_remotes` bucket.
pub async fn remotes_bucket(
    js: &jetstream::Context,
) -> Result<jetstream::kv::Store, async_nats::Error> {
    js.get_key_value(switchboard_proto::A2A_REMOTES_BUCKET)
        .await
        .map_err(async_nats::Error::from)
}

/// Every remote agent recorded (unreadable entries are skipped with a warning).
pub async fn remotes(
    remotes: &jetstream::kv::Store,
) -> Result<Vec<RemoteAgent>, async_nats::Error> {
    let keys: Vec<String> = remotes
        .keys()
        .await
        .map_err(async_nats::Error::from)?
        .try_collect()
        .await
        .map_err(async_nats::Error::from)?;
    let mut agents = Vec::with_capacity(keys.len());
    for key in keys {
        let Some(value) = remotes.get(&key).await.map_err(async_nats::Error::from)? else {
            continue;
        };
        match serde_json::from_slice(&value) {
            Ok(agent) => agents.push(agent),
            Err(err) => tracing::warn!(key, error = %err, "unreadable remote-agent record"),
        }
    }
    agents.sort_by(|a: &RemoteAgent, b| a.agent_id.as_str().cmp(b.agent_id.as_str()));
    Ok(agents)
}

/// Records `agent` (replacing an earlier record of the same id, whose goal it keeps).
pub async fn put_remote(
    remotes: &jetstream::kv::Store,
    agent: &RemoteAgent,
) -> Result<(), async_nats::Error> {
    let value = serde_json::to_vec(agent).map_err(async_nats::Error::from)?;
    remotes
        .put(agent.agent_id.as_str(), value.into())
        .await
        .map(|_| ())
        .map_err(async_nats::Error::from)
}

/// Forgets remote agent `id`; false when it was not recorded.
pub async fn remove_remote(
    remotes: &jetstream::kv::Store,
    id: &AgentId,
) -> Result<bool, async_nats::Error> {
    let known = remotes
        .get(id.as_str())
        .await
        .map_err(async_nats::Error::from)?
        .is_some();
    if known {
        remotes
            .purge(id.as_str())
            .await
            .map_err(async_nats::Error::from)?;
    }
    Ok(known)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(n: usize, bytes: usize) -> a2a::Message {
        crate::mapping::agent_message("t", "c", &"x".repeat(bytes), format!("m{n}"))
    }

    #[test]
    fn a_history_keeps_the_latest_32_messages_within_256_kib() {
        // By count: 40 short messages, the latest 32 stay, in order.
        let mut short: Vec<a2a::Message> = (0..40).map(|n| said(n, 10)).collect();
        bound_history(&mut short);
        assert_eq!(short.len(), HISTORY_MESSAGES);
        assert_eq!(short[0].message_id, "m8");
        assert_eq!(short[31].message_id, "m39");

        // By size: six of 60 KiB are 360 KiB; the oldest go until the rest fit.
        let mut long: Vec<a2a::Message> = (0..6).map(|n| said(n, 60 * 1024)).collect();
        bound_history(&mut long);
        let kept = serde_json::to_vec(&long).unwrap().len();
        assert!(kept <= HISTORY_BYTES, "{kept} bytes kept");
        assert_eq!(long.len(), 4, "four of 60 KiB fit, five do not");
        assert_eq!(long.last().unwrap().message_id, "m5");

        // One message larger than the whole bound is not kept at all.
        let mut huge = vec![said(0, HISTORY_BYTES + 1)];
        bound_history(&mut huge);
        assert!(huge.is_empty());
    }
}
