//! Names and limits shared by every party: constants from docs/protocol.md §3 plus every stream,
//! bucket, header and service name. A service never spells one of these itself.

/// Smallest accepted message body, in characters (after trimming).
pub const MIN_BODY_CHARS: usize = 1;
/// Largest accepted message body, in UTF-8 bytes (64 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The seed's inbox cap: the most messages one fetch hands out, and the room a goal always has
/// for messages waiting beside one full fetch its reader holds ([`INBOX_STORED_PER_GOAL`]).
pub const INBOX_CAP_PER_GOAL: i64 = 64;
/// How many messages `AGENT_INBOX` stores per goal (`max_msgs_per_subject`): the cap plus one
/// full fetch the reader holds and has not acknowledged yet. Messages handed out to the reader
/// are never the cap's to evict (a full goal evicts the oldest message *not yet handed out*, or
/// refuses under `overflow: refuse`), so a reader that fetches 64 and acks on its next fetch
/// loses nothing to a burst of up to 64 messages while it works on a fetch.
pub const INBOX_STORED_PER_GOAL: i64 = 2 * INBOX_CAP_PER_GOAL;

/// Dead letters: messages given up on, each with its reason and where it came from.
pub const DLQ_STREAM: &str = "AGENT_DLQ";

/// Dead-letter headers: why the message was given up on.
pub const HEADER_DLQ_REASON: &str = "Switchboard-Dlq-Reason";
/// Dead-letter headers: the stream, sequence and subject it was taken from.
pub const HEADER_DLQ_STREAM: &str = "Switchboard-Dlq-Stream";
/// Dead-letter headers: the message's sequence in the stream it was taken from.
pub const HEADER_DLQ_SEQ: &str = "Switchboard-Dlq-Seq";
/// Dead-letter headers: the subject the message was stored under (`agent.inbox.<goal_id>`).
pub const HEADER_DLQ_SUBJECT: &str = "Switchboard-Dlq-Subject";
/// Dead-letter headers: the reader that gave up (`inbox-<goal_id>`), and after how many
/// hand-outs.
pub const HEADER_DLQ_CONSUMER: &str = "Switchboard-Dlq-Consumer";
/// Dead-letter headers: how many times the message was handed out before it was given up on.
pub const HEADER_DLQ_DELIVERIES: &str = "Switchboard-Dlq-Deliveries";
/// Largest agent card the directory stores, in bytes of its JSON (16 KiB): every `list_peers`
/// and every send's ACL check reads cards, and an LLM reads them in its context.
pub const MAX_CARD_BYTES: usize = 16 * 1024;
/// The most entries a heartbeat's `current_tasks` may list (fewer when the card's
/// `max_concurrent_tasks` is lower): 256 entries of at most 64 bytes keep the stored list near
/// the 16 KiB a card may take, so a heartbeat is no way around the card limit.
pub const CURRENT_TASKS_MAX: usize = 256;
/// The longest entry of a heartbeat's `current_tasks`, in bytes (task ids are 36-byte UUIDs).
pub const CURRENT_TASK_MAX_BYTES: usize = 64;
/// Default hop budget of a forwarded message.
pub const DEFAULT_TTL: u8 = 3;
/// Deepest allowed chain of nested calls.
pub const CALL_DEPTH_LIMIT: usize = 5;
/// Default call timeout, in milliseconds.
pub const CALL_TIMEOUT_DEFAULT_MS: u64 = 30_000;
/// Largest call timeout, in milliseconds.
pub const CALL_TIMEOUT_MAX_MS: u64 = 300_000;
/// Open outgoing calls allowed per agent.
pub const MAX_OPEN_CALLS_PER_AGENT: usize = 64;
/// Default cap on the number of peers a broadcast reaches.
pub const BROADCAST_CAP_DEFAULT: usize = 64;
/// The `to` value that means "every peer I may reach".
pub const BROADCAST_TARGET: &str = "*";
/// `to: "skill:<name>"` (send, call, task create) asks the directory for one reachable agent
/// whose card lists the skill: idle before busy, fewest current tasks, then round-robin.
pub const SKILL_TARGET_PREFIX: &str = "skill:";
/// Longest skill name in a `skill:` target.
pub const SKILL_NAME_MAX: usize = 64;

/// Stream holding every goal inbox (`agent.inbox.>`).
pub const INBOX_STREAM: &str = "AGENT_INBOX";
/// Stream holding directory (and later task/call) events, so auditors can replay them.
pub const EVENTS_STREAM: &str = "AGENT_EVENTS";
/// Stream holding the audit trail.
pub const AUDIT_STREAM: &str = "AGENT_AUDIT";
/// KV bucket of agent cards and runtime state, key = agent id.
pub const REGISTRY_BUCKET: &str = "agent_registry";
/// KV bucket of live goals, key = `<agent_id>.<goal_id>`.
pub const GOALS_BUCKET: &str = "agent_goals";
/// KV bucket of goal cursors (docs/protocol.md §12), key = goal id, value a
/// [`crate::inbox::CursorRecord`].
pub const CURSORS_BUCKET: &str = "agent_cursors";
/// KV bucket of receipt records (message id → each receiving goal's state), written by the
/// services that deliver a message sent with `receipt`; read only by its sender's status
/// request.
pub const RECEIPTS_BUCKET: &str = "agent_receipts";
/// KV bucket of calls (records, kept after they end until the bucket's max age).
pub const CALLS_BUCKET: &str = "agent_calls";
/// Stream indexing open calls by caller and callee (one message per open call and side,
/// deleted when the call ends).
pub const CALLS_OPEN_STREAM: &str = "AGENT_CALLS_OPEN";
/// KV bucket of tasks: `task.<task_id>` records and `load.<agent_id>` active-task sets.
pub const TASKS_BUCKET: &str = "agent_tasks";
/// Stream indexing tasks by requester, assignee and openness (services only).
pub const TASKS_INDEX_STREAM: &str = "AGENT_TASKS_INDEX";
/// Deepest nesting of subagent tasks (a root task is depth 1).
pub const TASK_DEPTH_LIMIT: u32 = 3;
/// Open (non-terminal) children one task may have at once.
pub const MAX_OPEN_CHILDREN: usize = 8;
/// KV bucket holding the audit writer lease (one replica appends at a time).
pub const AUDIT_LEASE_BUCKET: &str = "audit_lease";
/// NATS micro service name (and queue group) of the audit service.
pub const AUDIT_SERVICE: &str = "audit";
/// NATS micro service name (and queue group) of the task service.
pub const TASK_LIFECYCLE_SERVICE: &str = "task-lifecycle";

/// JetStream de-duplication header.
pub const HEADER_MSG_ID: &str = "Nats-Msg-Id";
/// W3C trace context header.
pub const HEADER_TRACEPARENT: &str = "traceparent";
/// W3C trace state header.
pub const HEADER_TRACESTATE: &str = "tracestate";
/// NATS micro error description header.
pub const HEADER_SERVICE_ERROR: &str = "Nats-Service-Error";
/// NATS micro error code header.
pub const HEADER_SERVICE_ERROR_CODE: &str = "Nats-Service-Error-Code";
/// What every header the NATS server itself sets starts with (a direct get adds several).
pub const NATS_HEADER_PREFIX: &str = "Nats-";
/// Header of a stored message (as a direct get returns it): its stream sequence.
pub const HEADER_SEQUENCE: &str = "Nats-Sequence";
/// On a message a stream republishes: the sequence of the message stored before it *on the
/// same subject* (0 when none). A held fetch whose goal had nothing after `n` and gets a notice
/// whose last sequence is at most `n` knows the notice's message is all that is unread.
pub const HEADER_LAST_SEQUENCE: &str = "Nats-Last-Sequence";
/// Header of a stored message (as a direct get returns it): the subject it was stored under.
pub const HEADER_SUBJECT: &str = "Nats-Subject";
/// Header of a stored message (as a direct get returns it): when it was stored (RFC 3339).
pub const HEADER_TIME_STAMP: &str = "Nats-Time-Stamp";
/// Header of a batched direct get's messages: how many more match after this one.
pub const HEADER_NUM_PENDING: &str = "Nats-Num-Pending";
/// Publish header: store only if the subject's last sequence is this (compare-and-set).
pub const HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
/// Header of a KV entry that is a delete or purge marker (`DEL`, `PURGE`).
pub const HEADER_KV_OPERATION: &str = "KV-Operation";
/// [`HEADER_KV_OPERATION`] value of a delete marker.
pub const KV_OPERATION_DELETE: &str = "DEL";

/// NATS micro service name (and queue group) of the directory.
pub const DIRECTORY_SERVICE: &str = "directory";
/// NATS micro service name (and queue group) of the correlator.
pub const REPLY_CORRELATOR_SERVICE: &str = "reply-correlator";
/// NATS micro service name (and queue group) of the fan-out.
pub const INBOX_FANOUT_SERVICE: &str = "inbox-fanout";
/// Name (and queue group) of the A2A gateway's micro service (it answers `$SRV.PING` only; its
/// requests are HTTP).
pub const A2A_GATEWAY_SERVICE: &str = "a2a-gateway";
/// What every A2A client's agent id starts with (`a2a-<name>`): the A2A gateway acts as these
/// agents, so no agent key is ever issued for one.
pub const A2A_CLIENT_PREFIX: &str = "a2a-";
/// What the agent a person talks to agents as starts with (`people-<person id>`): the console
/// registers it and acts as it for that person (docs/console.md, "Talk to an agent"), so no
/// agent key is ever issued for one.
pub const PERSON_AGENT_PREFIX: &str = "people-";
/// The reply-subject prefix of the console's own NATS identity (`console.nk` from
/// `switchboard nats-config`): it may subscribe below it and nowhere else replies travel. It
/// starts `_INBOX.` so the services take it for a reply inbox, and lives in the services'
/// account, where no agent's `_INBOX.<agent_id>` exists.
pub const CONSOLE_INBOX_PREFIX: &str = "_INBOX.console";
/// KV bucket of the A2A gateway's push-notification configs, one key per task.
pub const A2A_PUSH_BUCKET: &str = "a2a_push";
/// The A2A gateway's durable consumer on `AGENT_EVENTS` that delivers push notifications
/// (shared by every replica).
pub const A2A_PUSH_CONSUMER: &str = "a2a-push";
/// KV bucket of the remote A2A agents the gateway carries onto the fabric
/// (`switchboard a2a add`), one key per agent id.
pub const A2A_REMOTES_BUCKET: &str = "a2a_remotes";
/// KV bucket of the Switchboard tasks whose remote A2A task asked a question, one key per
/// task id: the requester's answer goes into the same remote task. Kept as long as tasks are.
pub const A2A_PAUSED_BUCKET: &str = "a2a_paused";
/// KV bucket of the follow-up messages of A2A tasks (the client's answers to the agent's
/// questions, each after the question it answers), one key per task id, for `Task.history`.
/// Kept as long as tasks are.
pub const A2A_HISTORY_BUCKET: &str = "a2a_history";
/// KV bucket of the A2A gateway's per-remote-agent leases: the replica holding
/// `<agent_id>` is the one that reads that remote agent's inbox. Keys expire unless renewed.
pub const A2A_LEASES_BUCKET: &str = "a2a_leases";
/// Largest stored inbox message (body plus envelope, parts, metadata), in bytes: twice the
/// body limit, so a full 64 KiB body always fits with room for its envelope.
pub const MAX_INBOX_MESSAGE_BYTES: usize = 2 * MAX_BODY_BYTES;
/// Room kept for headers (`Nats-Msg-Id`, trace context) under [`MAX_INBOX_MESSAGE_BYTES`]:
/// the stream counts headers and payload together against its size limit.
pub const INBOX_HEADER_ALLOWANCE: usize = 1024;

/// The name a goal's reader has in dead letters and logs, `inbox-<goal_id>`; in v1 it was the
/// goal's durable consumer on [`INBOX_STREAM`], which a directory replaces with a cursor when
/// it starts (migration, docs/protocol.md §7).
pub fn inbox_consumer(goal_id: &crate::GoalId) -> String {
    format!("inbox-{goal_id}")
}

/// Metadata key naming the agent that owned a v1 goal inbox consumer (v1 wrote it; migration
/// trusts the goal's record instead).
pub const CONSUMER_META_AGENT: &str = "switchboard.agent_id";

/// NATS micro service name (and queue group) of the people service (docs/protocol.md §14).
pub const PEOPLE_SERVICE: &str = "people";
/// KV bucket of the items agents address to people: `item.<item_id>` → `PersonItem`.
pub const PEOPLE_ITEMS_BUCKET: &str = "agent_people_items";
/// NATS micro service name (and queue group) of the limits service (docs/protocol.md §15).
pub const LIMITS_SERVICE: &str = "limits";
/// KV bucket of the limits service: `spec.<h>` (a declared limit) and `state.<h>` (its leases,
/// waiting acquires and rate buckets), `<h>` the first 32 hex digits of the key's SHA-256.
pub const LIMITS_BUCKET: &str = "agent_limits";
/// NATS micro service name (and queue group) of the files service (docs/protocol.md §17).
pub const FILES_SERVICE: &str = "files";
/// The JetStream Object Store bucket holding every file's bytes, once (stream
/// [`FILES_STREAM`]).
pub const FILES_BUCKET: &str = "agent_files";
/// The stream of the Object Store bucket [`FILES_BUCKET`] (`$O.agent_files.C.>` chunks,
/// `$O.agent_files.M.>` object info).
pub const FILES_STREAM: &str = "OBJ_agent_files";
/// KV bucket of the files' records (`file.<id>`), grants (`grant.<id>.<agent_id>`) and quotas
/// (`quota.<agent_id>`): written by the files service, grants by the door at delivery.
pub const FILES_INDEX_BUCKET: &str = "agent_files_index";
/// The reserved agent id the people service writes answers and notices as: no agent may
/// register it (`nats-config` refuses it in `agents.toml`; the directory refuses it too).
pub const PEOPLE_AGENT: &str = "people";
