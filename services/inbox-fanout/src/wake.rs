//! Held fetches: how many one agent may hold ([`HELD_FETCHES_PER_AGENT`]), and waking them. `AGENT_INBOX`
//! republishes every stored message (headers and payload) to `_SB.inbox.stored.<goal_id>`,
//! every inbox-fanout replica subscribes to all of them (core NATS, no queue group), and a
//! notice wakes the fetches this replica holds for that goal,
//! handing them the message itself: a fetch that knows nothing else is unread answers with it
//! without reading the stream again. Whichever replica a fetch landed on, it is answered
//! within milliseconds of the store.
//!
//! A waiter subscribes *before* its fetch reads the inbox, so a message stored between the read
//! and the wait still wakes it. A notice can be lost (a reconnect), so a held fetch also reads
//! again every [`SAFETY_REREAD`] on its own.
//!
//! The hub also remembers the newest sequence each goal's notices named since its connection
//! last (re)connected ([`WakeHub::register`] returns it): a held fetch whose cursor is already
//! there has nothing unread and waits without reading the stream first. A reconnect forgets
//! them all (notices may have been missed meanwhile); so does growing past [`LATEST_KEPT`].
//!
//! It keeps the message of each goal's newest notice for [`LATELY`] too (up to
//! [`LATELY_BYTES`] in all): a held fetch that comes just after a store, the next call's
//! request stored before its callee's next fetch arrived, hands out that message without
//! reading the stream back. On a cluster that read may go to a replica that has not applied
//! the message yet, and the fetch then waits for its re-reads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::Subscriber;
use bytes::Bytes;
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

/// Goals whose newest stored sequence the hub remembers, at most (about 40 bytes each); past
/// it, it forgets them all and learns again from the next notices.
pub const LATEST_KEPT: usize = 250_000;

/// How long the message of a goal's newest notice serves a fetch that registers after it.
pub const LATELY: Duration = Duration::from_secs(1);

/// The most bytes of messages the hub keeps for [`LATELY`] (past it, it forgets them all).
pub const LATELY_BYTES: usize = 8 * 1024 * 1024;

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

/// What the hub knows, under one lock: a fetch registers and reads what was stored in one step,
/// so every notice comes either before (and is known) or after (and wakes it).
#[derive(Debug, Default)]
struct Hub {
    waiting: HashMap<GoalId, watch::Sender<Latest>>,
    /// The newest sequence a notice named per goal, since the connection count `epoch`.
    newest: HashMap<GoalId, u64>,
    /// The message of each goal's newest notice, and when it came.
    lately: HashMap<GoalId, (std::time::Instant, Arc<Notice>)>,
    /// The bytes `lately` holds (each message's payload and headers, copied out of the
    /// connection's read buffer, and [`LATELY_ENTRY_BYTES`] more for the entry).
    lately_bytes: usize,
    /// When each kept message came, oldest first: entries older than [`LATELY`] are dropped as
    /// new ones come, so the hub holds about a second of notices, not every goal's newest.
    lately_order: VecDeque<(std::time::Instant, GoalId, u64)>,
    epoch: u64,
}

impl Hub {
    fn forget_lately(&mut self) {
        self.lately.clear();
        self.lately_order.clear();
        self.lately_bytes = 0;
    }

    /// Drops `goal`'s kept message (all of it, if `seq` is `None`; else only if it is `seq`).
    fn drop_lately(&mut self, goal: &GoalId, seq: Option<u64>) {
        if let Some((_, kept)) = self.lately.get(goal)
            && seq.is_none_or(|seq| kept.message.seq == seq)
        {
            self.lately_bytes -= lately_size(kept);
            self.lately.remove(goal);
        }
    }

    /// Keeps `notice` as its goal's newest message (the one before it goes), copied out of the
    /// read buffer it arrived in (a slice of it would hold the whole buffer), and drops what
    /// came more than [`LATELY`] ago.
    fn keep_lately(&mut self, goal: GoalId, notice: &Notice) {
        let at = std::time::Instant::now();
        while let Some(&(came, old_goal, old_seq)) = self.lately_order.front() {
            if at.duration_since(came) < LATELY {
                break;
            }
            self.lately_order.pop_front();
            self.drop_lately(&old_goal, Some(old_seq));
        }
        let kept = Arc::new(Notice {
            message: StoredMessage {
                seq: notice.message.seq,
                headers: notice.message.headers.clone(),
                payload: Bytes::copy_from_slice(&notice.message.payload),
            },
            last_on_goal: notice.last_on_goal,
        });
        let size = lately_size(&kept);
        if self.lately_bytes + size > LATELY_BYTES || self.lately.len() >= LATEST_KEPT {
            self.forget_lately();
        }
        self.drop_lately(&goal, None);
        self.lately.insert(goal, (at, kept));
        self.lately_order.push_back((at, goal, notice.message.seq));
        self.lately_bytes += size;
    }
}

/// Bookkeeping per kept message, beyond its payload and headers.
const LATELY_ENTRY_BYTES: usize = 128;

/// What a kept message counts against [`LATELY_BYTES`].
fn lately_size(notice: &Notice) -> usize {
    let headers: usize = notice
        .message
        .headers
        .iter()
        .map(|(name, values)| {
            AsRef::<str>::as_ref(name).len()
                + values.iter().map(|v| v.as_str().len()).sum::<usize>()
        })
        .sum();
    notice.message.payload.len() + headers + LATELY_ENTRY_BYTES
}

type Waiting = Arc<Mutex<Hub>>;

/// The goals this replica holds fetches for, each with a channel carrying the latest message
/// stored for it, and the newest sequence stored per goal (see the module docs).
#[derive(Debug, Clone)]
pub struct WakeHub {
    waiting: Waiting,
    /// The connection's statistics: its `connects` count tells a reconnect.
    stats: Arc<async_nats::Statistics>,
}

/// A held fetch's registration; dropping it forgets the goal when no other fetch waits on it.
#[derive(Debug)]
pub struct Waiter {
    goal: GoalId,
    /// `None` only while dropping (it is dropped under the hub's lock, so the count the hub
    /// reads is exact when two waiters of one goal go at once).
    receiver: Option<watch::Receiver<Latest>>,
    waiting: Waiting,
    /// The goal's newest stored message when it registered, stored within [`LATELY`].
    lately: Latest,
}

impl Waiter {
    /// The message of the goal's newest notice, if it came within [`LATELY`] before this
    /// waiter registered and is the newest the hub knows on the goal (once).
    pub fn stored_lately(&mut self) -> Latest {
        self.lately.take()
    }

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
        let mut hub = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        self.receiver = None;
        if hub
            .waiting
            .get(&self.goal)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            hub.waiting.remove(&self.goal);
        }
    }
}

impl WakeHub {
    /// A hub for the notices of the connection whose statistics these are.
    pub fn new(stats: Arc<async_nats::Statistics>) -> Self {
        Self {
            waiting: Waiting::default(),
            stats,
        }
    }

    fn connects(&self) -> u64 {
        self.stats
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Registers a fetch about to wait on `goal`, with the newest sequence stored on it that
    /// this hub knows of (`None`: unknown — no notice since the connection last connected).
    pub fn register(&self, goal: GoalId) -> (Waiter, Option<u64>) {
        let connects = self.connects();
        let mut hub = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let receiver = hub
            .waiting
            .entry(goal)
            .or_insert_with(|| watch::channel(None).0)
            .subscribe();
        let newest = (hub.epoch == connects)
            .then(|| hub.newest.get(&goal).copied())
            .flatten();
        let lately = hub
            .lately
            .get(&goal)
            .filter(|(at, notice)| at.elapsed() < LATELY && newest == Some(notice.message.seq))
            .map(|(_, notice)| Arc::clone(notice));
        let waiter = Waiter {
            goal,
            receiver: Some(receiver),
            waiting: Arc::clone(&self.waiting),
            lately,
        };
        (waiter, newest)
    }

    /// How many goals have a fetch held here (for tests and diagnostics).
    pub fn goals_waiting(&self) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waiting
            .len()
    }

    /// Records the sequence a notice named and wakes the fetches held for its goal.
    fn notice(&self, subject: &str, seq: Option<u64>, notice: Latest) {
        let Some(goal) = subject
            .strip_prefix(INBOX_STORED_PREFIX)
            .and_then(|rest| rest.strip_prefix('.'))
            .and_then(|id| GoalId::parse(id).ok())
        else {
            return;
        };
        let connects = self.connects();
        let mut hub = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if hub.epoch != connects || hub.newest.len() >= LATEST_KEPT {
            hub.newest.clear();
            hub.forget_lately();
            hub.epoch = connects;
        }
        match seq {
            Some(seq) => {
                let newest = hub.newest.entry(goal).or_default();
                *newest = (*newest).max(seq);
                let newest = *newest;
                match &notice {
                    // An older notice arriving late leaves the newest message kept.
                    _ if seq < newest => {}
                    Some(carried) if carried.message.seq == seq => hub.keep_lately(goal, carried),
                    _ => hub.drop_lately(&goal, None),
                }
            }
            // A notice without its sequence: what is newest on the goal is unknown again.
            None => {
                hub.newest.remove(&goal);
                hub.drop_lately(&goal, None);
            }
        }
        if let Some(sender) = hub.waiting.get(&goal) {
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
                // What the notices said is no longer kept up: forget it, for good.
                let mut hub = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
                hub.newest.clear();
                hub.forget_lately();
                hub.epoch = u64::MAX;
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
            let seq = number(HEADER_SEQUENCE);
            let carried = match (seq, number(HEADER_LAST_SEQUENCE)) {
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
            self.notice(notice.subject.as_str(), seq, carried);
        }
    }
}

/// The most fetches one agent may hold open at once on one replica (two per goal at the
/// default goal cap): past it a fetch is answered at once, as if `wait_ms` were 0, so an agent
/// cannot pile up held requests (each is a task and a wake registration for up to 30 s).
pub const HELD_FETCHES_PER_AGENT: usize = 32;

#[cfg(test)]
fn hub() -> WakeHub {
    WakeHub::new(Arc::new(async_nats::Statistics::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carried(seq: u64, last_on_goal: u64, bytes: usize) -> Latest {
        Some(Arc::new(Notice {
            message: StoredMessage {
                seq,
                headers: async_nats::HeaderMap::new(),
                payload: bytes::Bytes::from(vec![b'x'; bytes]),
            },
            last_on_goal,
        }))
    }

    #[test]
    fn the_newest_message_serves_a_fetch_that_comes_just_after_it_only() {
        let hub = hub();
        let (goal, other) = (GoalId::default(), GoalId::default());
        let subject = |goal: GoalId| format!("{INBOX_STORED_PREFIX}.{goal}");
        hub.notice(&subject(goal), Some(7), carried(7, 3, 10));
        let (mut waiter, newest) = hub.register(goal);
        assert_eq!(newest, Some(7));
        assert_eq!(waiter.stored_lately().map(|n| n.message.seq), Some(7));
        assert!(waiter.stored_lately().is_none(), "handed to one pass only");
        assert!(hub.register(other).0.stored_lately().is_none());
        // An older notice arriving late does not replace the newest; one without its message
        // forgets the message (what is newest is no longer what the hub holds).
        hub.notice(&subject(goal), Some(5), carried(5, 3, 10));
        assert_eq!(
            hub.register(goal).0.stored_lately().map(|n| n.message.seq),
            Some(7)
        );
        hub.notice(&subject(goal), Some(8), None);
        assert!(hub.register(goal).0.stored_lately().is_none());
        // Bounded in bytes: past the bound it forgets them all, then keeps the next ones.
        hub.notice(&subject(goal), Some(9), carried(9, 8, LATELY_BYTES / 2 + 1));
        hub.notice(
            &subject(other),
            Some(2),
            carried(2, 0, LATELY_BYTES / 2 + 1),
        );
        assert!(hub.register(goal).0.stored_lately().is_none());
        assert_eq!(
            hub.register(other).0.stored_lately().map(|n| n.message.seq),
            Some(2)
        );
        assert_eq!(
            hub.waiting.lock().unwrap().lately_bytes,
            LATELY_BYTES / 2 + 1 + LATELY_ENTRY_BYTES
        );
        // What came more than LATELY ago goes as new notices come: about a second of them is
        // kept, not every goal's newest.
        std::thread::sleep(LATELY + Duration::from_millis(20));
        let third = GoalId::default();
        hub.notice(&subject(third), Some(3), carried(3, 0, 10));
        {
            let hub = hub.waiting.lock().unwrap();
            assert_eq!(hub.lately.len(), 1);
            assert_eq!(hub.lately_bytes, 10 + LATELY_ENTRY_BYTES);
            assert_eq!(hub.lately_order.len(), 1);
        }
        // A reconnect forgets them (notices may have been missed).
        hub.stats
            .connects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        hub.notice(&subject(goal), Some(10), carried(10, 9, 10));
        assert!(hub.register(other).0.stored_lately().is_none());
    }

    #[test]
    fn the_newest_sequence_is_known_until_a_reconnect() {
        let hub = hub();
        let goal = GoalId::default();
        let subject = format!("{INBOX_STORED_PREFIX}.{goal}");
        hub.notice(&subject, Some(9), None);
        hub.notice(&subject, Some(4), None);
        assert_eq!(hub.register(goal).1, Some(9));
        assert_eq!(hub.register(GoalId::default()).1, None);
        hub.stats
            .connects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            hub.register(goal).1,
            None,
            "a reconnect may have lost notices"
        );
        hub.notice(&subject, Some(12), None);
        assert_eq!(hub.register(goal).1, Some(12));
        hub.notice(&subject, None, None);
        assert_eq!(hub.register(goal).1, None);
    }

    #[tokio::test]
    async fn a_notice_wakes_the_waiters_of_its_goal_only_and_forgotten_goals_cost_nothing() {
        let hub = hub();
        let goal = GoalId::default();
        let other = GoalId::default();
        let (mut first, _) = hub.register(goal);
        let (mut second, _) = hub.register(goal);
        let (mut elsewhere, _) = hub.register(other);
        assert_eq!(hub.goals_waiting(), 2);
        hub.notice(&format!("{INBOX_STORED_PREFIX}.{goal}"), Some(7), None);
        hub.notice(&format!("{INBOX_STORED_PREFIX}.not-a-goal"), Some(8), None);
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
        let hub = hub();
        let goal = GoalId::default();
        let (mut waiter, newest) = hub.register(goal);
        assert_eq!(newest, None);
        hub.notice(&format!("{INBOX_STORED_PREFIX}.{goal}"), Some(3), None);
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
        let hub = hub();
        for _ in 0..200 {
            let goal = GoalId::default();
            let waiters: Vec<Waiter> = (0..8).map(|_| hub.register(goal).0).collect();
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
