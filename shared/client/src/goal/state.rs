//! What a goal's reader holds between calls: the messages fetched ahead, those in flight or
//! given back, and the acks settled, sent and confirmed (docs/protocol.md §7).

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use switchboard_proto::inbox::FetchedMessage;

/// What a goal's reader holds between calls.
#[derive(Debug, Default)]
pub(super) struct ReaderState {
    /// Messages fetched and not handed out yet, oldest first.
    pub(super) ahead: VecDeque<FetchedMessage>,
    /// Set when a handed-out message was given back: what is ahead is dropped and the next
    /// `recv` waits until the instant, if one was given, before it reads the given-back
    /// messages again (see [`ReaderState::read_after`]).
    pub(super) refetch: Option<Option<tokio::time::Instant>>,
    /// Sequences given back and not handled since: an ack never moves the cursor past one of
    /// them (acks are cumulative), so a later message acknowledged first cannot lose it.
    pub(super) given_back: BTreeSet<u64>,
    /// Sequences `recv` handed out that are not settled yet (being handled, perhaps several at
    /// once): a fetch from the cursor returns them again, and they are not handed out twice.
    pub(super) in_flight: BTreeSet<u64>,
    /// The highest sequence `recv` handed out: with messages in flight, the next fetch reads
    /// after it (`after`) instead of after the cursor.
    pub(super) handed: u64,
    /// The highest sequence acknowledged through a delivery.
    pub(super) acked: u64,
    /// The cumulative ack settled so far (what the cursor may move through), sent or not.
    pub(super) owed: u64,
    /// Where the service last said the cursor is (an ack's reply, a fetch's): what it has of
    /// the acks.
    pub(super) confirmed: u64,
    /// A lingering ack's send is scheduled ([`ACK_LINGER`]).
    pub(super) flush_scheduled: bool,
}

impl ReaderState {
    /// `seq` is handed out by `recv`.
    pub(super) fn handing(&mut self, seq: u64) {
        self.in_flight.insert(seq);
        self.handed = self.handed.max(seq);
    }

    /// `seq` comes back unhandled (given back, dropped, or its ack failed): the next `recv`
    /// fetches from the cursor and hands it out again.
    pub(super) fn give_back(&mut self, seq: u64, not_before: Option<tokio::time::Instant>) {
        self.in_flight.remove(&seq);
        self.ahead.clear();
        self.refetch = Some(not_before);
        self.given_back.insert(seq);
    }

    /// The goal's cursor is at `cursor`: messages given back at or below it are done (acked
    /// through, rejected, or moved to the dead letters by the service) and hold nothing up.
    pub(super) fn passed(&mut self, cursor: u64) {
        self.given_back.retain(|seq| *seq > cursor);
        self.ahead.retain(|fetched| fetched.seq > cursor);
    }

    /// Where the next fetch reads from (`after`; `None`: from the cursor). Messages given back
    /// and not handed out again come first: read from just before the oldest one past
    /// `fetched_through` — a read from the cursor returns only the first few of a reader's many
    /// held messages, and one given back further on would never come back, holding the cursor
    /// below it for good. Otherwise, with messages in flight, after the last one handed out.
    pub(super) fn read_after(&self, fetched_through: u64) -> Option<u64> {
        let next_given_back = self
            .given_back
            .range(fetched_through.saturating_add(1)..)
            .find(|seq| !self.in_flight.contains(seq));
        match next_given_back {
            Some(seq) => Some(seq.saturating_sub(1)),
            None if !self.in_flight.is_empty() => Some(self.handed),
            None => None,
        }
    }

    /// What an ack of `seq` may move the cursor through. Acks are cumulative (through N
    /// acknowledges everything up to N), so the cursor moves only through messages that are
    /// all settled: up to the newest acknowledged one, but never past a message still being
    /// handled or given back. An ack held back that way is committed by the ack that settles
    /// the last message before it.
    pub(super) fn ack_through(&mut self, seq: u64) -> u64 {
        self.given_back.remove(&seq);
        self.in_flight.remove(&seq);
        self.acked = self.acked.max(seq);
        let unsettled = self
            .in_flight
            .first()
            .into_iter()
            .chain(self.given_back.first())
            .min();
        match unsettled {
            Some(&oldest) => self.acked.min(oldest - 1),
            None => self.acked,
        }
    }
}

impl ReaderState {
    /// What a fetch carries as `ack_through`: every settled ack, also one an earlier fetch
    /// carried (acks are idempotent, and a fetch from a cursor the service has not written yet
    /// must still read past what was handled).
    pub(super) fn carry(&self) -> Option<u64> {
        (self.owed > 0).then_some(self.owed)
    }

    /// The service says the cursor is at `cursor`.
    pub(super) fn confirmed(&mut self, cursor: u64) {
        self.confirmed = self.confirmed.max(cursor);
    }
}

pub(super) type SharedState = Arc<Mutex<ReaderState>>;

pub(super) fn state(shared: &SharedState) -> std::sync::MutexGuard<'_, ReaderState> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::ReaderState;

    #[test]
    fn an_ack_never_passes_a_message_still_handled_or_given_back() {
        let mut state = ReaderState::default();
        for seq in [5, 7, 9] {
            state.handing(seq);
        }
        assert_eq!(state.ack_through(5), 5);
        // 9 acked while 7 is still being handled: the cursor stays before 7.
        assert_eq!(state.ack_through(9), 6);
        // 7 given back, then handled at last: everything through 9 is committed.
        state.give_back(7, None);
        assert_eq!(state.ack_through(7), 9);
        // One given back that the service moved past (dead-lettered) holds nothing up.
        state.handing(11);
        state.give_back(11, None);
        state.passed(11);
        state.handing(12);
        assert_eq!(state.ack_through(12), 12);
    }

    #[test]
    fn given_back_messages_are_read_from_where_they_are_however_many_are_held() {
        let mut state = ReaderState::default();
        for seq in 1..=40 {
            state.handing(seq);
        }
        state.give_back(6, None);
        state.give_back(31, None);
        // From just before the oldest given back, then from just before the next one past what
        // was fetched, then on after the last one handed out.
        assert_eq!(state.read_after(0), Some(5));
        assert_eq!(state.read_after(21), Some(30));
        assert_eq!(state.read_after(31), Some(40));
        // One handed out again is not read again; the other still is, by a later `recv`.
        state.handing(6);
        assert_eq!(state.read_after(0), Some(30));
        state.handing(31);
        assert_eq!(state.read_after(0), Some(40));
        // Nothing held and nothing given back: from the cursor.
        assert_eq!(ReaderState::default().read_after(0), None);
    }
}
