//! What a foreign client sees: raw requests and replies, a goal's next message, and streams
//! read back (events, audit records, what the source streams hold).

use std::time::Duration;

use async_nats::{Client, HeaderMap};
use bytes::Bytes;
use serde_json::Value;
use switchboard_proto::HEADER_SERVICE_ERROR_CODE;

/// Waits (at most 10 s) for the next message in a goal's inbox and acknowledges it.
pub async fn next(goal: &switchboard_client::Goal) -> switchboard_proto::InboxMessage {
    goal.recv(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("a message within 10 s")
        .ack()
        .await
        .unwrap()
}

/// The next message of `goal` within `wait`, for a reader's loop: `None` when none came, or
/// when the read failed — after a pause, so a loop reading this way never spins on a fabric
/// that is restarting or gone (a read that fails at once never yields, and would hold the
/// test runtime's shutdown for good).
pub async fn read_or_pause(
    goal: &switchboard_client::Goal,
    wait: Duration,
) -> Option<switchboard_client::Delivery> {
    match goal.recv(wait).await {
        Ok(delivery) => delivery,
        Err(_) => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            None
        }
    }
}

/// Asserts that nothing more arrives in `goal`'s inbox (waits 300 ms for a stray message).
pub async fn assert_no_more(goal: &switchboard_client::Goal) {
    let stray = goal.recv(Duration::from_millis(300)).await.unwrap();
    assert!(
        stray.is_none(),
        "unexpected message: {:?}",
        stray.map(|d| d.message.clone())
    );
}

/// A raw reply: headers and JSON body.
#[derive(Debug)]
pub struct Raw {
    pub headers: Option<HeaderMap>,
    pub body: Value,
}

impl Raw {
    /// The error kind, asserting the reply is a well-formed error with micro headers.
    pub fn error_kind(&self) -> String {
        let code = self
            .headers
            .as_ref()
            .and_then(|h| h.get(HEADER_SERVICE_ERROR_CODE))
            .unwrap_or_else(|| panic!("no Nats-Service-Error-Code header on {:?}", self.body))
            .as_str()
            .to_owned();
        assert!(
            self.headers
                .as_ref()
                .and_then(|h| h.get(switchboard_proto::HEADER_SERVICE_ERROR))
                .is_some(),
            "no Nats-Service-Error header"
        );
        assert_eq!(
            code,
            self.body["error"]["code"].to_string(),
            "header code matches body code"
        );
        assert!(
            !self.body["error"]["message"].as_str().unwrap().is_empty(),
            "error message is empty"
        );
        self.body["error"]["kind"].as_str().unwrap().to_owned()
    }
}

/// Every JSON reply to one request on `subject` that arrives within `within` (a request many
/// answer, such as `$SRV.PING` or `$SRV.STATS.<service>`: one reply per service instance).
pub async fn every_reply(
    client: &Client,
    subject: &str,
    within: Duration,
) -> Vec<serde_json::Value> {
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply(subject.to_owned(), inbox, Bytes::new())
        .await
        .unwrap();
    let mut found = Vec::new();
    let collect = async {
        while let Some(reply) = futures::StreamExt::next(&mut replies).await {
            found.push(serde_json::from_slice(&reply.payload).unwrap());
        }
    };
    let _ = tokio::time::timeout(within, collect).await;
    found
}

/// Sends raw bytes to `subject` and returns the decoded reply, as a foreign client would.
pub async fn raw(client: &Client, subject: &str, payload: impl Into<Bytes>) -> Raw {
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(subject.to_owned(), payload.into()),
    )
    .await
    .unwrap_or_else(|_| panic!("no reply on {subject} within 10 s"))
    .unwrap_or_else(|err| panic!("request on {subject} failed: {err}"));
    let body = serde_json::from_slice(&reply.payload).unwrap_or_else(|err| {
        panic!(
            "reply on {subject} is not JSON ({err}): {:?}",
            reply.payload
        )
    });
    Raw {
        headers: reply.headers,
        body,
    }
}

/// Every stored event on `AGENT_EVENTS` whose subject matches `filter`, oldest first.
pub async fn stored_events(
    client: &Client,
    filter: &str,
) -> Vec<switchboard_proto::registry::RegistryEventPayload> {
    stored_json(client, filter).await
}

/// Every stored message on `AGENT_EVENTS` whose subject matches `filter`, decoded as `T`.
pub async fn stored_json<T: serde::de::DeserializeOwned>(client: &Client, filter: &str) -> Vec<T> {
    use async_nats::jetstream::consumer::{AckPolicy, pull};
    use futures::StreamExt;
    let js = async_nats::jetstream::new(client.clone());
    let stream = js
        .get_stream(switchboard_proto::EVENTS_STREAM)
        .await
        .unwrap();
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: filter.to_owned(),
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut messages = consumer
        .fetch()
        .max_messages(1000)
        .messages()
        .await
        .unwrap();
    while let Some(message) = messages.next().await {
        let message = message.unwrap();
        out.push(serde_json::from_slice(&message.payload).unwrap());
    }
    out
}

/// Every record in `AGENT_AUDIT`, read straight from the stream.
pub async fn audit_records(nats: &async_nats::Client) -> Vec<switchboard_proto::audit::AuditEntry> {
    let js = async_nats::jetstream::new(nats.clone());
    let stream = js
        .get_stream(switchboard_proto::AUDIT_STREAM)
        .await
        .unwrap();
    let mut out = Vec::new();
    audit::store::read_range(&stream, 1, |stored| {
        let hash = stored
            .headers
            .as_ref()
            .and_then(|h| h.get(switchboard_proto::audit::HEADER_AUDIT_HASH))
            .unwrap()
            .to_string();
        out.push(switchboard_proto::audit::AuditEntry {
            seq: stored.seq,
            hash,
            record: serde_json::from_slice(&stored.payload).unwrap(),
        });
        Ok(())
    })
    .await
    .unwrap();
    out
}

/// `<stream>:<seq>` of every message the two source streams hold now.
pub async fn source_ids(nats: &async_nats::Client) -> std::collections::BTreeSet<String> {
    let js = async_nats::jetstream::new(nats.clone());
    let mut ids = std::collections::BTreeSet::new();
    for name in [
        switchboard_proto::INBOX_STREAM,
        switchboard_proto::EVENTS_STREAM,
    ] {
        let mut stream = js.get_stream(name).await.unwrap();
        let state = stream.info().await.unwrap().state.clone();
        if state.messages == 0 {
            continue;
        }
        assert_eq!(
            state.messages,
            state.last_sequence + 1 - state.first_sequence,
            "{name} has no gaps in this test"
        );
        for seq in state.first_sequence..=state.last_sequence {
            ids.insert(format!("{name}:{seq}"));
        }
    }
    ids
}

/// `<stream>:<seq>` of every message the two source streams ever stored (sequences
/// `1..=last`), including those evicted or expired since: what the audit must have recorded.
pub async fn stored_ever(nats: &async_nats::Client) -> std::collections::BTreeSet<String> {
    let js = async_nats::jetstream::new(nats.clone());
    let mut ids = std::collections::BTreeSet::new();
    for name in [
        switchboard_proto::INBOX_STREAM,
        switchboard_proto::EVENTS_STREAM,
    ] {
        let mut stream = js.get_stream(name).await.unwrap();
        let last = stream.info().await.unwrap().state.last_sequence;
        for seq in 1..=last {
            ids.insert(format!("{name}:{seq}"));
        }
    }
    ids
}

/// `n` messages of 256 bytes stored straight into `goal`'s inbox at once, as the services
/// store them (every publish sent before any ack is awaited; a full goal makes room through
/// `switchboard_delivery::room`); their message ids, in the order they were sent.
pub async fn store_at_once(
    js: &async_nats::jetstream::Context,
    goal: &switchboard_client::Goal,
    n: usize,
) -> Vec<uuid::Uuid> {
    let ids: Vec<uuid::Uuid> = (0..n).map(|_| switchboard_proto::new_id()).collect();
    let batch: Vec<(String, String, bytes::Bytes)> = ids
        .iter()
        .map(|message_id| {
            let mut message = switchboard_proto::InboxMessage::new(
                switchboard_proto::AgentId::parse("sender").expect("a valid agent id"),
                switchboard_proto::GoalId::new(),
                switchboard_proto::AgentId::parse("reader").expect("a valid agent id"),
                "x".repeat(256),
            );
            message.id = Some(*message_id);
            (
                goal.subject().to_owned(),
                format!("{message_id}:{}", goal.id()),
                serde_json::to_vec(&message)
                    .expect("an inbox message encodes")
                    .into(),
            )
        })
        .collect();
    for stored in switchboard_delivery::deliver::deliver_all(js, &batch).await {
        stored.expect("stored");
    }
    ids
}
