//! The people service's state, and what every path shares: checking texts and parties,
//! recording items, publishing their events and writing answers and notices into the agent's
//! goal inbox (docs/protocol.md §14).

use std::time::Duration;

use async_nats::jetstream;
use serde_json::{Map, Value, json};
use switchboard_delivery::door::{Address, Door, Letter, Origin};
use switchboard_proto::people::{
    ItemKind, ItemState, Party, PeopleEvent, PeopleEventKind, PersonItem,
};
use switchboard_proto::{AgentId, GoalId, InboxMessage, MessageKind, new_id, timestamp};
use switchboard_runtime::publish::publish_event;
use tracing::Instrument as _;

use crate::book::Books;
use crate::config::PeopleConfig;
use crate::error::PeopleError;
use crate::store::{ItemStore, Stored};
use crate::view::ItemsView;

/// How many times a state change re-reads and tries again after losing a compare-and-set.
pub(crate) const CAS_ROUNDS: usize = 16;
/// Agents whose parks take turns on one replica (striped by agent), so a burst from one agent
/// is counted against its caps one at a time.
const TURNS: usize = 64;

/// The service: its stores, views and settings.
#[derive(Debug)]
pub struct People {
    pub(crate) js: jetstream::Context,
    pub(crate) store: ItemStore,
    pub(crate) view: ItemsView,
    pub(crate) door: Door,
    pub(crate) books: Books,
    pub(crate) config: PeopleConfig,
    /// How long the bucket keeps a record (`jetstream.people_max_age_secs`).
    pub(crate) keep: time::Duration,
    turns: Vec<tokio::sync::Mutex<()>>,
}

/// Checks an agent- or person-written text: not blank, at most `limit` bytes.
pub(crate) fn text(field: &'static str, value: &str, limit: usize) -> Result<(), PeopleError> {
    if value.trim().is_empty() {
        return Err(PeopleError::Empty(field));
    }
    if value.len() > limit {
        return Err(PeopleError::TooLarge {
            field,
            size: value.len(),
            limit,
        });
    }
    Ok(())
}

/// Parses a `to` or `escalate_to`.
pub(crate) fn party(raw: &str) -> Result<Party, PeopleError> {
    Party::parse(raw).map_err(|err| PeopleError::BadRequest(err.to_string()))
}

impl People {
    /// Wraps the applied stores.
    pub fn new(
        js: jetstream::Context,
        store: ItemStore,
        door: Door,
        books: Books,
        config: PeopleConfig,
        keep: std::time::Duration,
    ) -> Self {
        Self {
            js,
            view: ItemsView::new(store.bucket().clone()),
            store,
            door,
            books,
            config,
            keep: time::Duration::try_from(keep).unwrap_or(time::Duration::MAX),
            turns: (0..TURNS).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }

    /// The turn `agent`'s parks take on this replica.
    pub(crate) fn turn(&self, agent: &AgentId) -> &tokio::sync::Mutex<()> {
        let stripe = agent.as_str().bytes().fold(0usize, |acc, b| {
            acc.wrapping_mul(31).wrapping_add(usize::from(b))
        });
        &self.turns[stripe % TURNS]
    }

    /// Publishes what happened to `item` (once per event and item: `Nats-Msg-Id`).
    pub(crate) async fn emit(&self, event: PeopleEventKind, item: &PersonItem) {
        let payload = PeopleEvent {
            id: new_id(),
            event,
            item_id: item.item_id,
            kind: item.kind,
            from_agent: item.from_agent.clone(),
            to: item.to.clone(),
            addressee: item.addressee.clone(),
            by: event
                .by_person()
                .then(|| item.answer.as_ref().map(|answer| answer.by.clone()))
                .flatten(),
            action_hash: item.action_hash.clone(),
            at: timestamp::now(),
        };
        let subject = event.subject(&item.item_id);
        let once = format!("{}:{}", event.as_str(), item.item_id);
        publish_event(&self.js, &subject, &once, &payload).await;
    }

    /// Writes `message` into the item's goal inbox (`Nats-Msg-Id: <purpose>:<item>:<goal>`,
    /// so a retry after a crash stores it once). `Ok(false)` when the goal is no longer its
    /// agent's: nothing is written where the agent no longer reads.
    async fn to_goal(
        &self,
        item: &PersonItem,
        message: &InboxMessage,
        purpose: &str,
    ) -> Result<bool, PeopleError> {
        let Some(goal) = item.from_goal else {
            return Ok(false);
        };
        let owned = self
            .door
            .view()
            .owns_goal(&item.from_agent, &goal)
            .await
            .unwrap_or(true);
        if !owned {
            tracing::info!(item_id = %item.item_id, goal_id = %goal, purpose, "the goal is no longer the agent's; nothing written to it");
            return Ok(false);
        }
        let purpose = format!("{purpose}:{}", item.item_id);
        let letter = Letter {
            to: Address::Goals(item.from_agent.clone(), vec![goal]),
            from_goal: None,
            message: message.clone(),
        };
        let failed = |reason: String| {
            PeopleError::Store(switchboard_runtime::store::StoreError::store(
                "writing into the agent's inbox",
                reason,
            ))
        };
        let report = self
            .door
            .deliver(Origin::Service { purpose: &purpose }, letter)
            .await
            .map_err(|err| failed(err.to_string()))?;
        if report.delivered_to.is_empty() {
            return Err(failed(report.unreachable_reasons.join("; ")));
        }
        Ok(true)
    }

    fn message_to(item: &PersonItem, body: String, kind: MessageKind) -> InboxMessage {
        let mut message =
            InboxMessage::new(people_agent(), GoalId::new(), item.from_agent.clone(), body);
        message.id = Some(new_id());
        message.kind = kind;
        message.correlation_id = Some(item.item_id);
        message.in_reply_to = Some(item.request_id);
        message
    }

    /// The people part of an answer's or notice's metadata.
    fn metadata(item: &PersonItem) -> Map<String, Value> {
        let mut people = json!({
            "item_id": item.item_id,
            "kind": item.kind,
            "to": item.to,
            "addressee": item.addressee,
            "state": item.state,
        });
        if let Some(answer) = &item.answer {
            people["answered_by"] = json!(answer.by);
            if let Some(decision) = answer.decision {
                people["decision"] = json!(decision);
            }
            if let Some(note) = &answer.message {
                people["note"] = json!(note);
            }
        }
        if let Some(hash) = &item.action_hash {
            people["action_hash"] = json!(hash);
        }
        let mut metadata = Map::new();
        metadata.insert("people".to_owned(), people);
        metadata
    }

    /// Delivers the answer of an answered ask or decided approval, as `kind: response` from
    /// `people` with `from_person`, then records it delivered.
    pub(crate) async fn deliver_answer(&self, stored: Stored) -> Result<bool, PeopleError> {
        let item = &stored.item;
        let Some(answer) = &item.answer else {
            return Ok(false);
        };
        let body = match (item.kind, answer.decision) {
            (ItemKind::Approval, Some(decision)) => {
                let verb = match decision {
                    switchboard_proto::people::Decision::Approved => "approved",
                    switchboard_proto::people::Decision::Denied => "denied",
                };
                let tool = item.action.as_ref().map_or("", |a| a.tool.as_str());
                match &answer.message {
                    Some(note) => format!(
                        "{} {verb} `{tool}` (approval {}): {note}",
                        answer.by, item.item_id
                    ),
                    None => format!("{} {verb} `{tool}` (approval {})", answer.by, item.item_id),
                }
            }
            _ => answer.message.clone().unwrap_or_default(),
        };
        let mut message = Self::message_to(item, body, MessageKind::Response);
        message.from_person = Some(answer.by.to_string());
        message.metadata = Self::metadata(item);
        let delivered = self.to_goal(item, &message, "people").await?;
        self.mark_delivered(stored).await;
        Ok(delivered)
    }

    /// Tells the agent its ask timed out or its approval expired undecided.
    pub(crate) async fn deliver_timeout(&self, stored: Stored) -> Result<bool, PeopleError> {
        let item = &stored.item;
        let (what, tag) = match item.kind {
            ItemKind::Approval => ("approval request", "approval_expired"),
            _ => ("question", "ask_timeout"),
        };
        let body = format!(
            "your {what} {} to {} got no answer by {}",
            item.item_id,
            item.addressee,
            item.deadline.map(timestamp::format).unwrap_or_default()
        );
        let mut message = Self::message_to(item, body, MessageKind::Notify);
        message.metadata = Self::metadata(item);
        message
            .metadata
            .insert("switchboard".to_owned(), tag.into());
        let delivered = self.to_goal(item, &message, "people-timeout").await?;
        self.mark_delivered(stored).await;
        Ok(delivered)
    }

    /// Tells the agent its item went to `escalate_to` (not an ending: the answer or the
    /// timeout still comes).
    pub(crate) async fn deliver_escalated(&self, item: &PersonItem) {
        let body = format!(
            "your {} {} to {} was not answered in time and went to {}",
            match item.kind {
                ItemKind::Approval => "approval request",
                _ => "question",
            },
            item.item_id,
            item.to,
            item.addressee
        );
        let mut message = Self::message_to(item, body, MessageKind::Notify);
        message.metadata = Self::metadata(item);
        message
            .metadata
            .insert("switchboard".to_owned(), "escalated".into());
        if let Err(err) = self.to_goal(item, &message, "people-escalated").await {
            tracing::warn!(item_id = %item.item_id, error = %err, "escalation notice not delivered");
        }
    }

    /// Records that the answer or notice is in the agent's inbox (best effort: the sweep
    /// delivers again an item left undelivered, and `Nats-Msg-Id` stores it once).
    async fn mark_delivered(&self, mut stored: Stored) {
        for _ in 0..CAS_ROUNDS {
            if stored.item.delivered {
                return;
            }
            let mut next = stored.item.clone();
            next.delivered = true;
            match self.store.replace(&stored, next).await {
                Ok(Some(written)) => {
                    self.view.note(&written.item, written.revision);
                    return;
                }
                Ok(None) => match self.store.get(&stored.item.item_id).await {
                    Ok(Some(fresh)) if fresh.item.state == stored.item.state => stored = fresh,
                    _ => return,
                },
                Err(err) => {
                    tracing::warn!(item_id = %stored.item.item_id, error = %err, "not marked delivered; the sweep will deliver again");
                    return;
                }
            }
        }
    }

    /// Runs `work` in the trace the item was made in.
    pub(crate) async fn in_trace<F: Future>(
        name: &'static str,
        item: &PersonItem,
        work: F,
    ) -> F::Output {
        let span = switchboard_runtime::telemetry::span_for_record(
            name,
            crate::SPEC.name,
            item.traceparent.as_deref(),
        );
        span.record(
            "switchboard.correlation_id",
            item.item_id.to_string().as_str(),
        );
        work.instrument(span).await
    }

    /// Waits briefly for the view to hold every write (listings and caps read it).
    pub(crate) async fn fresh_view(&self) {
        match self.view.caught_up(Duration::from_millis(500)).await {
            Ok(true) => {}
            Ok(false) => tracing::debug!("items view is behind; answering from what it has"),
            Err(err) => tracing::debug!(error = %err, "items view position unknown"),
        }
    }

    /// Whether `state` is one the item ends in for its agent (answer or notice delivered).
    pub(crate) fn ends(state: ItemState) -> bool {
        matches!(
            state,
            ItemState::Answered | ItemState::Approved | ItemState::Denied | ItemState::Expired
        )
    }
}

/// The reserved agent id answers arrive from.
pub(crate) fn people_agent() -> AgentId {
    AgentId::parse(switchboard_proto::PEOPLE_AGENT)
        .unwrap_or_else(|_| unreachable!("`people` is a valid agent id"))
}
