//! Waking held fetches: `AGENT_INBOX` republishes every stored message (headers and payload)
//! to `_SB.inbox.stored.<goal_id>`, every inbox-fanout replica subscribes to all of them (core
//! NATS, no queue group), and a notice wakes the fetches this replica holds for that goal,
//! handing them the message itself: a fetch that knows nothing else is unread answers with it
//! without reading the stream again. Whichever replica a fetch landed on, it is answered
//! within milliseconds of the store.
//!
//! A waiter subscribes *before* its fetch reads the inbox, so a message stored between the read
//! and the wait still wakes it. A notice can be lost (a reconnect), so a held fetch also reads
//! again every [`SAFETY_REREAD`] on its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::Subscriber;
use futures::StreamExt;
use switchboard_proto::GoalId;
use switchboard_proto::subject::INBOX_STORED_PREFIX;
use switchboard_proto::{HEADER_LAST_SEQUENCE, HEADER_SEQUENCE};

use crate::store::{StoredMessage, published_headers};
use switchboard_runtime::CancellationToken;
use tokio::sync::watch;

/// How often a held fetch reads again without a notice (a notice lost to a reconnect delays a
/// fetch by at most this).
pub const SAFETY_REREAD: Duration = Duration::from_secs(5);

/// A message as its store notice carried it.
#[derive(Debug)]
pub struct Notice {
    /// The message, with the headers it was published with.
    pub message: StoredMessage,
    /// The sequence of the goal's message stored before it (0: none): when a fetch had nothing
    /// unread after `n` and this is at most `n`, the message is all that is unread.
    pub last_on_goal: u64,
}

type Latest = Option<Arc<Notice>>;
type Waiting = Arc<Mutex<HashMap<GoalId, watch::Sender<Latest>>>>;

/// The goals this replica holds fetches for, each with a channel carrying the latest message
/// stored for it.
#[derive(Debug, Clone, Default)]
pub struct WakeHub {
    waiting: Waiting,
}

/// A held fetch's registration; dropping it forgets the goal when no other fetch waits on it.
#[derive(Debug)]
pub struct Waiter {
    goal: GoalId,
    /// `None` only while dropping (it is dropped under the hub's lock, so the count the hub
    /// reads is exact when two waiters of one goal go at once).
    receiver: Option<watch::Receiver<Latest>>,
    waiting: Waiting,
}

impl Waiter {
    /// Resolves when a message for the goal is stored after this waiter registered (or since
    /// the last call), with the latest such message (`None` when its notice did not carry one
    /// whole).
    pub async fn stored(&mut self) -> Latest {
        let Some(receiver) = self.receiver.as_mut() else {
            return std::future::pending().await;
        };
        if receiver.changed().await.is_err() {
            // The sender is gone only if the hub forgot the goal, which it does not while a
            // waiter exists; never resolve rather than spin.
            std::future::pending::<()>().await;
        }
        receiver.borrow_and_update().clone()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        self.receiver = None;
        if waiting
            .get(&self.goal)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            waiting.remove(&self.goal);
        }
    }
}

impl WakeHub {
    /// Registers a fetch about to wait on `goal`.
    pub fn register(&self, goal: GoalId) -> Waiter {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let receiver = waiting
            .entry(goal)
            .or_insert_with(|| watch::channel(None).0)
            .subscribe();
        Waiter {
            goal,
            receiver: Some(receiver),
            waiting: Arc::clone(&self.waiting),
        }
    }

    /// How many goals have a fetch held here (for tests and diagnostics).
    pub fn goals_waiting(&self) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Wakes the fetches held for the goal named by a notice's subject.
    fn notice(&self, subject: &str, notice: Latest) {
        let Some(goal) = subject
            .strip_prefix(INBOX_STORED_PREFIX)
            .and_then(|rest| rest.strip_prefix('.'))
            .and_then(|id| GoalId::parse(id).ok())
        else {
            return;
        };
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = waiting.get(&goal) {
            sender.send_replace(notice);
        }
    }

    /// Feeds notices from `notices` (a subscription to `_SB.inbox.stored.*`) until `stop`.
    pub async fn run(self, mut notices: Subscriber, stop: CancellationToken) {
        loop {
            let notice = tokio::select! {
                notice = notices.next() => notice,
                () = stop.cancelled() => return,
            };
            let Some(notice) = notice else {
                tracing::warn!(
                    "the stored-message notices ended; held fetches now wait for their re-read"
                );
                return;
            };
            let number = |name: &str| {
                notice
                    .headers
                    .as_ref()
                    .and_then(|headers| headers.get(name))
                    .and_then(|value| value.as_str().parse::<u64>().ok())
            };
            // A notice without its sequences (a server that does not send them) only wakes.
            let carried = match (number(HEADER_SEQUENCE), number(HEADER_LAST_SEQUENCE)) {
                (Some(seq), Some(last_on_goal)) if !notice.payload.is_empty() => {
                    Some(Arc::new(Notice {
                        message: StoredMessage {
                            seq,
                            headers: published_headers(&notice.headers.clone().unwrap_or_default()),
                            payload: notice.payload.clone(),
                        },
                        last_on_goal,
                    }))
                }
                _ => None,
            };
            self.notice(notice.subject.as_str(), carried);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_notice_wakes_the_waiters_of_its_goal_only_and_forgotten_goals_cost_nothing() {
        let hub = WakeHub::default();
        let goal = GoalId::default();
        let other = GoalId::default();
        let mut first = hub.register(goal);
        let mut second = hub.register(goal);
        let mut elsewhere = hub.register(other);
        assert_eq!(hub.goals_waiting(), 2);
        hub.notice(&format!("{INBOX_STORED_PREFIX}.{goal}"), None);
        hub.notice(&format!("{INBOX_STORED_PREFIX}.not-a-goal"), None);
        first.stored().await;
        second.stored().await;
        let idle = tokio::time::timeout(Duration::from_millis(20), elsewhere.stored()).await;
        assert!(idle.is_err(), "a notice for another goal woke this one");
        drop(first);
        assert_eq!(hub.goals_waiting(), 2, "one waiter of the goal is left");
        drop(second);
        drop(elsewhere);
        assert_eq!(hub.goals_waiting(), 0);
    }

    #[tokio::test]
    async fn a_notice_between_registering_and_waiting_is_not_lost() {
        let hub = WakeHub::default();
        let goal = GoalId::default();
        let mut waiter = hub.register(goal);
        hub.notice(&format!("{INBOX_STORED_PREFIX}.{goal}"), None);
        tokio::time::timeout(Duration::from_millis(100), waiter.stored())
            .await
            .unwrap();
    }
}

#[cfg(test)]
mod race_tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_of_one_goal_dropping_at_once_leave_nothing_behind() {
        let hub = WakeHub::default();
        for _ in 0..200 {
            let goal = GoalId::default();
            let waiters: Vec<Waiter> = (0..8).map(|_| hub.register(goal)).collect();
            let drops: Vec<_> = waiters
                .into_iter()
                .map(|waiter| tokio::spawn(async move { drop(waiter) }))
                .collect();
            for dropped in drops {
                dropped.await.unwrap();
            }
        }
        assert_eq!(hub.goals_waiting(), 0);
    }
}
