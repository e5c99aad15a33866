//! JetStream streams and KV buckets, declared once and applied idempotently at start-up
//! (create-or-update; never delete-and-recreate on drift). Any service may apply a shared
//! resource (e.g. `AGENT_INBOX`): whichever starts first creates it, the rest converge on it.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use switchboard_proto::subject::{self, INBOX_ALL, INBOX_STORED_TEMPLATE, REGISTRY_EVENTS_ALL};
use switchboard_proto::{
    CALLS_BUCKET, CALLS_OPEN_STREAM, CURSORS_BUCKET, EVENTS_STREAM, GOALS_BUCKET,
    INBOX_STORED_PER_GOAL, INBOX_STREAM, MAX_INBOX_MESSAGE_BYTES, REGISTRY_BUCKET, TASKS_BUCKET,
    TASKS_INDEX_STREAM,
};

use crate::config::JetStreamConfig;

/// A stream or bucket could not be applied.
#[derive(Debug, thiserror::Error)]
#[error("applying {name}: {message}")]
pub struct ResourceError {
    /// Stream or bucket name.
    pub name: String,
    /// What failed.
    pub message: String,
    /// The configuration cannot work against this server or cluster (e.g. more replicas than
    /// JetStream servers): retrying will not help, the setting must change.
    pub misconfigured: bool,
}

/// JetStream's "replicas > 1 not supported in non-clustered mode".
const REPLICAS_NOT_SUPPORTED: u64 = 10074;

/// When JetStream refused a stream or bucket because of its replica count, the clear reason.
/// A placement refused because a server is "offline" is not one: a cluster that has just
/// formed says so for a moment (about 100 ms, seen about 1 s after start-up) although every
/// server is up, and a server that is down comes back — a state of the cluster, retried.
fn replicas_refusal(code: u64, wanted: usize, server_said: &str) -> Option<String> {
    let hint = "set jetstream.replicas (SWITCHBOARD_JETSTREAM__REPLICAS) to at most the number of \
                JetStream servers in the cluster";
    if code == REPLICAS_NOT_SUPPORTED {
        Some(format!(
            "jetstream.replicas is {wanted}, but the NATS server is not part of a JetStream \
             cluster (server said: {server_said}); {hint}, i.e. 1 for a single server"
        ))
    } else if (code == jetstream::ErrorCode::CLUSTER_NO_PEERS.0
        || code == jetstream::ErrorCode::INSUFFICIENT_RESOURCES.0)
        && wanted > 1
        && !server_said.contains("offline")
    {
        Some(format!(
            "jetstream.replicas is {wanted}, but the cluster cannot place {wanted} replicas \
             (server said: {server_said}): it has fewer than {wanted} JetStream servers, or some \
             are down; {hint}"
        ))
    } else {
        None
    }
}

/// Checks `jetstream.replicas` against the cluster before a service starts: applies the
/// shared inbox stream (every service uses it) and confirms JetStream placed exactly that many
/// replicas. A single server with `replicas > 1`, or a cluster with fewer JetStream servers
/// than `replicas`, gives a [`ResourceError`] with `misconfigured` set and a message that names
/// the setting.
pub async fn check_replicas(
    js: &jetstream::Context,
    config: &JetStreamConfig,
) -> Result<(), ResourceError> {
    ensure_stream(js, inbox_stream(config)).await
}

/// How many replicas of a stream the server reports: the leader (once elected) and the
/// others. A stream whose leader is not elected yet — seen when several services apply it at
/// once on a cluster that has just formed — lists every peer among `replicas`.
fn placed(info: &stream::Info) -> usize {
    info.cluster.as_ref().map_or(1, |cluster| {
        cluster.replicas.len()
            + usize::from(cluster.leader.as_deref().is_some_and(|l| !l.is_empty()))
    })
}

/// How long a stream that reports fewer replicas than asked for is looked at again before
/// that counts as a too-small cluster (placement is reported while peers are still joining).
const PLACEMENT_SETTLE: Duration = Duration::from_secs(5);

/// Whether the stream as the server reports it has (at least) the replicas its config asked
/// for, looking again for a few seconds while it reports fewer.
async fn placed_replicas(
    js: &jetstream::Context,
    info: stream::Info,
    wanted: usize,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + PLACEMENT_SETTLE;
    let mut placed_now = placed(&info);
    while wanted > 1 && placed_now < wanted && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(RETRY_PAUSE).await;
        if let Ok(mut stream) = js.get_stream(&info.config.name).await
            && let Ok(info) = stream.info().await
        {
            placed_now = placed(info);
        }
    }
    if placed_now >= wanted || wanted == 1 {
        Ok(())
    } else {
        Err(format!(
            "jetstream.replicas is {wanted}, but JetStream placed {placed_now} replica(s) of the \
             stream; the cluster has fewer than {wanted} JetStream servers"
        ))
    }
}

/// `AGENT_INBOX`: every goal inbox (`agent.inbox.*`: one token, the goal id). Keeps the newest
/// 64 messages of each goal (discard old), de-duplicates retried publishes by `Nats-Msg-Id`,
/// expires unread messages after a max age. Each stored message's headers are republished to
/// `_SB.inbox.stored.<goal_id>`: the signal that wakes a held fetch on any inbox-fanout
/// replica, sent only once the message can be read.
pub fn inbox_stream(config: &JetStreamConfig) -> stream::Config {
    stream::Config {
        name: INBOX_STREAM.to_owned(),
        description: Some("Switchboard goal inboxes (agent.inbox.<goal_id>)".to_owned()),
        subjects: vec![INBOX_ALL.to_owned()],
        republish: Some(stream::Republish {
            source: INBOX_ALL.to_owned(),
            destination: INBOX_STORED_TEMPLATE.to_owned(),
            // The whole message: a held fetch answers with it instead of reading it back.
            headers_only: false,
        }),
        // A full goal refuses the next message instead of dropping its oldest unseen: the
        // publisher then removes the oldest not handed out itself and tells its sender, or
        // refuses the message under the goal's `overflow: refuse` (`room.rs`).
        max_messages_per_subject: INBOX_STORED_PER_GOAL,
        discard: stream::DiscardPolicy::New,
        discard_new_per_subject: true,
        duplicate_window: Duration::from_secs(config.duplicate_window_secs),
        max_age: Duration::from_secs(config.inbox_max_age_secs),
        // A body of 64 KiB plus the envelope fits; a runaway payload does not.
        max_message_size: i32::try_from(MAX_INBOX_MESSAGE_BYTES).unwrap_or(i32::MAX),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        allow_direct: true,
        ..Default::default()
    }
}

/// `AGENT_EVENTS`: directory, call and task events, kept so auditors can replay them. One
/// definition for every service that publishes into it (they must agree on its subjects).
pub fn events_stream(config: &JetStreamConfig) -> stream::Config {
    stream::Config {
        name: EVENTS_STREAM.to_owned(),
        description: Some(
            "Switchboard registry, call, task, refusal, people and budget events".to_owned(),
        ),
        subjects: vec![
            REGISTRY_EVENTS_ALL.to_owned(),
            subject::below(subject::CALL_EVENTS_PREFIX),
            subject::below(subject::TASK_EVENTS_PREFIX),
            subject::below(subject::REFUSALS_PREFIX),
            subject::below(subject::PEOPLE_EVENTS_PREFIX),
            subject::below(subject::BUDGET_EVENTS_PREFIX),
            subject::below(subject::FILES_EVENTS_PREFIX),
        ],
        duplicate_window: Duration::from_secs(config.duplicate_window_secs),
        max_age: Duration::from_secs(config.events_max_age_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `AGENT_DLQ`: dead letters (`agent.dlq.AGENT_INBOX.inbox-<goal_id>`), each the original message with
/// `Switchboard-Dlq-*` headers saying why and where from; kept as long as the events
/// (`jetstream.events_max_age_secs`). A replayed letter is deleted.
pub fn dlq_stream(config: &JetStreamConfig) -> stream::Config {
    stream::Config {
        name: switchboard_proto::DLQ_STREAM.to_owned(),
        description: Some("Switchboard dead letters, with their reasons".to_owned()),
        subjects: vec![subject::below(subject::DLQ_PREFIX)],
        duplicate_window: Duration::from_secs(config.duplicate_window_secs),
        max_age: Duration::from_secs(config.events_max_age_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        allow_direct: true,
        ..Default::default()
    }
}

/// `agent_registry`: agent cards and runtime state, key = agent id.
pub fn registry_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: REGISTRY_BUCKET.to_owned(),
        description: "Switchboard agent cards and status".to_owned(),
        history: 1,
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `agent_goals`: live goals, key = `<agent_id>.<goal_id>`.
pub fn goals_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: GOALS_BUCKET.to_owned(),
        description: "Switchboard live goals".to_owned(),
        history: 1,
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `agent_cursors`: one [`CursorRecord`](switchboard_proto::inbox::CursorRecord) per live goal,
/// key = goal id, moved by compare-and-set (docs/protocol.md §12). A goal's whole cost at rest.
pub fn cursors_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: CURSORS_BUCKET.to_owned(),
        description: "Switchboard goal inbox cursors".to_owned(),
        history: 1,
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `agent_receipts`: one [`ReceiptRecord`](switchboard_proto::receipt::ReceiptRecord) per
/// message sent with `receipt`, key = message id, moved by compare-and-set; kept 7 days and
/// at most [`RECEIPTS_MAX_BYTES`](switchboard_proto::receipt::RECEIPTS_MAX_BYTES) (a sender
/// cannot grow it without bound: once full, new records are refused, logged, until old ones
/// age out).
pub fn receipts_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: switchboard_proto::RECEIPTS_BUCKET.to_owned(),
        description: "Switchboard message receipts".to_owned(),
        history: 1,
        max_bytes: switchboard_proto::receipt::RECEIPTS_MAX_BYTES,
        max_age: Duration::from_secs(switchboard_proto::receipt::RECEIPT_RECORD_TTL_SECS),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `agent_calls`: call records, key = `call.<correlation_id>`. Records stay after they are
/// answered or expired (so a retried or late reply gets the right answer) and age out after
/// `max_age`. Open calls are indexed in [`calls_open_stream`].
pub fn calls_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: CALLS_BUCKET.to_owned(),
        description: "Switchboard pending calls".to_owned(),
        history: 1,
        max_age: Duration::from_secs(config.calls_max_age_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `agent_people_items`: the items agents address to people, key = `item.<item_id>`
/// (docs/protocol.md §14). Every state change is a compare-and-set on the record; records stay
/// after they end (a retried answer or use is told what happened) and age out after
/// `people_max_age_secs`.
pub fn people_items_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: switchboard_proto::PEOPLE_ITEMS_BUCKET.to_owned(),
        description: "Switchboard notes, asks and approvals addressed to people".to_owned(),
        history: 1,
        max_age: Duration::from_secs(config.people_max_age_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `agent_limits`: declared provider limits and their leases (docs/protocol.md §15). One
/// value per key; every change to a key's leases is a compare-and-set. Nothing ages out: a
/// limit lives until an operator deletes it, and its state prunes expired leases itself.
pub fn limits_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: switchboard_proto::LIMITS_BUCKET.to_owned(),
        description: "Switchboard provider limits and their leases".to_owned(),
        history: 1,
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `OBJ_agent_files`: the Object Store bucket `agent_files` holding every file's bytes once
/// (docs/protocol.md §17), configured as the Object Store makes it (chunks on
/// `$O.agent_files.C.<nuid>`, object info on `$O.agent_files.M.<name>`, roll-ups, direct
/// gets) so any NATS tool reads a finished file. Nothing ages out here: the files service
/// removes a file when its time runs out.
pub fn files_object_stream(config: &JetStreamConfig) -> stream::Config {
    stream::Config {
        name: switchboard_proto::FILES_STREAM.to_owned(),
        description: Some("Switchboard files (Object Store bucket agent_files)".to_owned()),
        subjects: vec![
            format!("$O.{}.C.>", switchboard_proto::FILES_BUCKET),
            format!("$O.{}.M.>", switchboard_proto::FILES_BUCKET),
        ],
        duplicate_window: Duration::from_secs(config.duplicate_window_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        discard: stream::DiscardPolicy::New,
        allow_rollup: true,
        allow_direct: true,
        ..Default::default()
    }
}

/// `agent_files_index`: the files' records, grants and quotas (docs/protocol.md §17). Nothing
/// ages out: the files service removes a file's keys with the file.
pub fn files_index_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: switchboard_proto::FILES_INDEX_BUCKET.to_owned(),
        description: "Switchboard files: records, grants, quotas".to_owned(),
        history: 1,
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `AGENT_CALLS_OPEN`: the open-call index. Entries are removed with a subject-filtered purge
/// (a KV delete would leave a marker that listings read forever), so it is a plain stream;
/// max age bounds any entry a crash leaves behind.
pub fn calls_open_stream(config: &JetStreamConfig) -> stream::Config {
    stream::Config {
        name: CALLS_OPEN_STREAM.to_owned(),
        description: Some("Switchboard open-call index".to_owned()),
        subjects: vec![subject::CALLS_OPEN_INDEX.all()],
        max_messages_per_subject: 1,
        max_age: Duration::from_secs(config.calls_max_age_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        allow_direct: true,
        ..Default::default()
    }
}

/// `agent_tasks`: task records (`task.<task_id>`, the compare-and-set target of every
/// transition) and per-assignee active sets (`load.<agent_id>`), kept `tasks_max_age_secs`
/// after their last change.
pub fn tasks_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: TASKS_BUCKET.to_owned(),
        description: "Switchboard tasks".to_owned(),
        history: 1,
        max_age: Duration::from_secs(config.tasks_max_age_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `a2a_push`: the A2A gateway's push-notification configs, one key per task (the key is the
/// task id), kept as long as tasks are.
pub fn a2a_push_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: switchboard_proto::A2A_PUSH_BUCKET.to_owned(),
        description: "Switchboard A2A gateway push-notification configs".to_owned(),
        history: 1,
        max_age: Duration::from_secs(config.tasks_max_age_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `a2a_remotes`: the remote A2A agents the gateway carries onto the fabric, one key per agent
/// id (written by `switchboard a2a add`, removed by `switchboard a2a remove`).
pub fn a2a_remotes_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: switchboard_proto::A2A_REMOTES_BUCKET.to_owned(),
        description: "Switchboard A2A gateway remote agents".to_owned(),
        history: 1,
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `a2a_paused`: Switchboard tasks waiting on a remote A2A task's question, one key per task,
/// kept as long as tasks are.
pub fn a2a_paused_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: switchboard_proto::A2A_PAUSED_BUCKET.to_owned(),
        description: "Switchboard A2A gateway paused remote tasks".to_owned(),
        history: 1,
        max_age: Duration::from_secs(config.tasks_max_age_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `a2a_history`: the follow-up messages of A2A tasks (questions and their answers), one key
/// per task id, kept as long as tasks.
pub fn a2a_history_bucket(config: &JetStreamConfig) -> kv::Config {
    kv::Config {
        bucket: switchboard_proto::A2A_HISTORY_BUCKET.to_owned(),
        description: "Switchboard A2A gateway task follow-ups".to_owned(),
        history: 1,
        max_age: Duration::from_secs(config.tasks_max_age_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `a2a_leases`: which gateway replica reads which remote agent's inbox, one key per agent
/// that expires `ttl` after its last renewal.
pub fn a2a_leases_bucket(config: &JetStreamConfig, ttl: Duration) -> kv::Config {
    kv::Config {
        bucket: switchboard_proto::A2A_LEASES_BUCKET.to_owned(),
        description: "Switchboard A2A gateway remote-agent leases".to_owned(),
        history: 1,
        max_age: ttl,
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// `AGENT_TASKS_INDEX`: tasks by requester, by assignee (kept with the task) and the open set
/// (removed with a filtered purge when a task ends, like the open-call index).
pub fn tasks_index_stream(config: &JetStreamConfig) -> stream::Config {
    stream::Config {
        name: TASKS_INDEX_STREAM.to_owned(),
        description: Some("Switchboard task index".to_owned()),
        subjects: vec![subject::TASKS_INDEX.all()],
        max_messages_per_subject: 1,
        max_age: Duration::from_secs(config.tasks_max_age_secs),
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        allow_direct: true,
        ..Default::default()
    }
}

/// `AGENT_AUDIT`: the append-only trail, one subject per writer, written only by the audit
/// service with an expected last sequence (so the hash chain has one order). Retention by age and size
/// (`jetstream.audit_max_age_secs`, `audit_max_bytes`; 0 = unlimited); deletes and purges are
/// denied.
pub fn audit_stream(config: &JetStreamConfig) -> stream::Config {
    stream::Config {
        name: switchboard_proto::AUDIT_STREAM.to_owned(),
        description: Some("Switchboard audit trail (hash-chained)".to_owned()),
        subjects: vec![
            subject::AUDIT_RECORDS.to_owned(),
            subject::AUDIT_RECORDS_ALL.to_owned(),
        ],
        max_age: Duration::from_secs(config.audit_max_age_secs),
        max_bytes: if config.audit_max_bytes == 0 {
            -1
        } else {
            i64::try_from(config.audit_max_bytes).unwrap_or(i64::MAX)
        },
        duplicate_window: Duration::from_secs(config.duplicate_window_secs),
        deny_delete: true,
        deny_purge: true,
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        allow_direct: true,
        ..Default::default()
    }
}

/// `audit_lease`: the audit writer lease, one key that expires `ttl` after its last renewal.
pub fn audit_lease_bucket(config: &JetStreamConfig, ttl: Duration) -> kv::Config {
    kv::Config {
        bucket: switchboard_proto::AUDIT_LEASE_BUCKET.to_owned(),
        description: "Switchboard audit writer lease".to_owned(),
        history: 1,
        max_age: ttl,
        num_replicas: config.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// The first pause after a failed apply; it doubles up to [`RETRY_PAUSE_MAX`]. A resource that
/// fails for any reason but a setting (see [`replicas_refusal`]) is retried until JetStream
/// answers, however long that takes: concurrent replicas racing to create the same resource
/// converge after a retry, a cluster that has just formed refuses placement as "peer offline"
/// for a moment, and seven processes applying their streams at once against a fresh R3
/// cluster see `jetstream request timed out` for seconds. Meanwhile the service is not
/// serving, so its health check fails; SIGTERM still stops it (the start has the grace period).
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between attempts.
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(5);
/// After this many failed attempts each further failure is logged as a warning (earlier ones at
/// debug: a race between replicas is normal).
const RETRY_QUIET_ATTEMPTS: u32 = 5;

/// Waits before attempt `attempt + 1` of applying `name`, logging why the last one failed.
/// How long one attempt to apply a stream or bucket waits for JetStream. A fresh cluster
/// answers nothing until its meta leader is elected: each attempt used to wait out the whole
/// request timeout (10 s), so services started with a cluster answered after ~40 s in 10 s
/// steps; now they try again every few seconds.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

/// What a timed-out attempt logs.
const NO_ANSWER: &str = "JetStream did not answer within 3 s (a cluster electing its leader?)";

async fn retry_pause(name: &str, attempt: u32, error: &dyn std::fmt::Display) {
    if attempt >= RETRY_QUIET_ATTEMPTS {
        tracing::warn!(resource = %name, attempt, %error, "JetStream resource not applied yet; retrying");
    } else {
        tracing::debug!(resource = %name, attempt, %error, "JetStream resource apply failed; retrying");
    }
    let pause = RETRY_PAUSE.saturating_mul(1 << attempt.min(6));
    tokio::time::sleep(pause.min(RETRY_PAUSE_MAX)).await;
}

/// Creates or updates a stream. A refusal because of its replica count (see
/// [`check_replicas`]) is returned at once, with `misconfigured` set; other failures are
/// retried with backoff until JetStream answers.
pub async fn ensure_stream(
    js: &jetstream::Context,
    config: stream::Config,
) -> Result<(), ResourceError> {
    let mut attempt = 0;
    loop {
        let applied =
            tokio::time::timeout(ATTEMPT_TIMEOUT, js.create_or_update_stream(config.clone())).await;
        let Ok(applied) = applied else {
            retry_pause(&config.name, attempt, &NO_ANSWER).await;
            attempt += 1;
            continue;
        };
        let failed = match applied {
            Ok(info) => {
                return placed_replicas(js, info, config.num_replicas)
                    .await
                    .map_err(|message| ResourceError {
                        name: config.name.clone(),
                        message,
                        misconfigured: true,
                    });
            }
            Err(err) => err,
        };
        if let jetstream::context::CreateStreamErrorKind::JetStream(api) = failed.kind()
            && let Some(message) =
                replicas_refusal(api.error_code().0, config.num_replicas, &api.to_string())
        {
            return Err(ResourceError {
                name: config.name,
                message,
                misconfigured: true,
            });
        }
        retry_pause(&config.name, attempt, &failed).await;
        attempt += 1;
    }
}

/// Creates or updates a KV bucket and returns it; failures are retried with backoff until
/// JetStream answers.
pub async fn ensure_bucket(
    js: &jetstream::Context,
    config: kv::Config,
) -> Result<kv::Store, ResourceError> {
    let mut attempt = 0;
    loop {
        match tokio::time::timeout(
            ATTEMPT_TIMEOUT,
            js.create_or_update_key_value(config.clone()),
        )
        .await
        {
            Ok(Ok(store)) => return Ok(store),
            Ok(Err(err)) => retry_pause(&config.bucket, attempt, &err).await,
            Err(_) => retry_pause(&config.bucket, attempt, &NO_ANSWER).await,
        }
        attempt += 1;
    }
}

/// Opens a bucket another service makes (the console reads the directory's), waiting with
/// backoff until it exists: a user allowed to read a bucket but not to create one (the
/// console's `console.nk`) never asks to create it.
pub async fn bind_bucket(
    js: &jetstream::Context,
    bucket: &str,
) -> Result<kv::Store, ResourceError> {
    let mut attempt = 0;
    loop {
        match tokio::time::timeout(ATTEMPT_TIMEOUT, js.get_key_value(bucket)).await {
            Ok(Ok(store)) => return Ok(store),
            Ok(Err(err)) => retry_pause(bucket, attempt, &err).await,
            Err(_) => retry_pause(bucket, attempt, &NO_ANSWER).await,
        }
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_PEERS: u64 = jetstream::ErrorCode::CLUSTER_NO_PEERS.0;

    #[test]
    fn a_peer_offline_is_retried_and_a_cluster_too_small_is_a_setting() {
        // What nats-server 2.15 answered right after a 3-node cluster formed (every node up).
        let transient = "no suitable peers for placement, peer offline";
        assert_eq!(replicas_refusal(NO_PEERS, 3, transient), None);
        // R5 on three nodes: no peer is offline, the setting is wrong.
        let too_few = "no suitable peers for placement";
        assert!(
            replicas_refusal(NO_PEERS, 5, too_few).is_some_and(|m| m.contains("cannot place 5"))
        );
        // A single server refuses any R > 1, whatever else it says.
        assert!(replicas_refusal(REPLICAS_NOT_SUPPORTED, 3, "peer offline").is_some());
    }
}
