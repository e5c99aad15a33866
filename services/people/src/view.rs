//! Each replica's view of the items bucket, fed by a KV watch: item heads only (no text), for
//! listings, the per-sender caps and the sweep. A write is read back from KV before it is acted
//! on; the view only says where to look.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt as _;
use switchboard_proto::AgentId;
use switchboard_proto::people::{ItemKind, ItemState, Party, PersonItem};
use switchboard_runtime::CancellationToken;
use switchboard_runtime::store::StoreError;
use time::OffsetDateTime;
use uuid::Uuid;

/// What the view keeps of an item.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    /// Note, ask or approval.
    pub kind: ItemKind,
    /// The agent that wrote it.
    pub from_agent: AgentId,
    /// Whom it addressed.
    pub to: Party,
    /// Who must answer now.
    pub addressee: Party,
    /// Where it is.
    pub state: ItemState,
    /// When written.
    pub created_at: OffsetDateTime,
    /// Its deadline.
    pub deadline: Option<OffsetDateTime>,
    /// When it escalates, unless it did.
    pub escalate_at: Option<OffsetDateTime>,
    /// Whether it escalated.
    pub escalated: bool,
    /// The person who answered.
    pub answered_by: Option<Party>,
    /// When the answer was claimed, not yet delivered.
    pub undelivered_since: Option<OffsetDateTime>,
}

impl Head {
    fn of(item: &PersonItem) -> Self {
        let undelivered = matches!(
            item.state,
            ItemState::Answered | ItemState::Approved | ItemState::Denied | ItemState::Expired
        ) && !item.delivered
            && item.kind != ItemKind::Note;
        Self {
            kind: item.kind,
            from_agent: item.from_agent.clone(),
            to: item.to.clone(),
            addressee: item.addressee.clone(),
            state: item.state,
            created_at: item.created_at,
            deadline: item.deadline,
            escalate_at: item.escalate_at,
            escalated: item.escalated_at.is_some(),
            answered_by: item.answer.as_ref().map(|answer| answer.by.clone()),
            undelivered_since: undelivered
                .then(|| item.answer.as_ref().map_or(item.created_at, |a| a.at)),
        }
    }

    /// Whether it waits for a person (an unread note, an open or escalated ask or approval).
    pub fn waiting(&self) -> bool {
        self.state.is_waiting()
    }
}

#[derive(Debug, Default)]
struct Inner {
    heads: HashMap<Uuid, Head>,
    seen: u64,
}

/// The view; cheap to clone.
#[derive(Debug, Clone)]
pub struct ItemsView {
    bucket: kv::Store,
    inner: Arc<RwLock<Inner>>,
    applied: Arc<tokio::sync::watch::Sender<()>>,
}

impl ItemsView {
    /// An empty view; [`ItemsView::watch`] fills it.
    pub fn new(bucket: kv::Store) -> Self {
        Self {
            bucket,
            inner: Arc::default(),
            applied: Arc::new(tokio::sync::watch::channel(()).0),
        }
    }

    fn apply(&self, entry: &kv::Entry) {
        {
            let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
            inner.seen = inner.seen.max(entry.revision);
            let id = entry
                .key
                .strip_prefix("item.")
                .and_then(|id| Uuid::parse_str(id).ok());
            if let Some(id) = id {
                match entry.operation {
                    kv::Operation::Put => {
                        match serde_json::from_slice::<PersonItem>(&entry.value) {
                            Ok(item) => {
                                inner.heads.insert(id, Head::of(&item));
                            }
                            Err(_) => tracing::warn!(key = %entry.key, "undecodable item skipped"),
                        }
                    }
                    kv::Operation::Delete | kv::Operation::Purge => {
                        inner.heads.remove(&id);
                    }
                }
            }
        }
        self.applied.send_replace(());
    }

    /// Notes a write this replica made, before the watch brings it (so a burst from one
    /// agent is counted at once against its caps).
    pub fn note(&self, item: &PersonItem, revision: u64) {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        inner.heads.insert(item.item_id, Head::of(item));
        // `seen` stays: only the watch says everything up to a revision arrived.
        let _ = revision;
    }

    /// Keeps the view in step with the bucket until `shutdown` (a broken watch is set up again
    /// and replays every key's latest value).
    pub async fn watch(self, shutdown: CancellationToken) {
        loop {
            match self.bucket.watch_with_history(">").await {
                Ok(mut watch) => loop {
                    let next = tokio::select! {
                        next = watch.next() => next,
                        () = shutdown.cancelled() => return,
                    };
                    match next {
                        Some(Ok(entry)) => self.apply(&entry),
                        Some(Err(err)) => {
                            tracing::warn!(error = %err, "items watch error");
                            break;
                        }
                        None => break,
                    }
                },
                Err(err) => tracing::warn!(error = %err, "cannot watch the items bucket"),
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Waits (at most `within`) until the view holds every write the server had stored when
    /// this was called; `Ok(false)` when it did not get there in time.
    pub async fn caught_up(&self, within: Duration) -> Result<bool, StoreError> {
        let last = self
            .bucket
            .stream
            .clone()
            .get_info()
            .await
            .map_err(|err| StoreError::store("reading the items' position", err))?
            .state
            .last_sequence;
        let mut applied = self.applied.subscribe();
        let wait = async {
            loop {
                if self
                    .inner
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .seen
                    >= last
                {
                    return;
                }
                if applied.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        Ok(tokio::time::timeout(within, wait).await.is_ok())
    }

    /// Drops the heads of items that ended and were written before `cutoff`: the bucket ages
    /// records out without a watch event, so the view forgets them itself (an item changed
    /// after it was written may still be in the bucket: it then only leaves the listings).
    pub fn forget_before(&self, cutoff: OffsetDateTime) {
        self.inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .heads
            .retain(|_, head| head.waiting() || head.created_at >= cutoff);
    }

    /// Runs `f` over every head (under a read lock: keep it short).
    pub fn with<R>(&self, f: impl FnOnce(&HashMap<Uuid, Head>) -> R) -> R {
        f(&self
            .inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .heads)
    }
}
