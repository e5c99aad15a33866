//! Who holds a full goal, remembered for a moment (docs/protocol.md §8, "The inbox cap").
//!
//! The fair choice in a full goal ([`crate::room`]) needs the senders of the goal's waiting
//! messages, which costs one batched read of up to a fetch's worth of bytes. A goal nobody
//! reads stays full, and every send into it needs a choice: reading the goal each time made a
//! burst of 16 KiB sends into unread goals time out. So a process remembers what it read of
//! each full goal — sequences and senders, no payloads — and keeps it current with what it
//! removes and stores there itself, reading the goal again after [`FRESH_FOR`] or
//! [`USES_MAX`] choices, when a removal finds its choice gone (another process was there),
//! or when it would remember more than [`GOALS_MAX`] goals (the oldest is forgotten).
//!
//! What another process stores meanwhile is missing until the next read, so within that
//! moment the counts lean on what this process saw; the choice still never takes a message
//! handed out to the reader (entries at or below the reader's hand-out are dropped on recall).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use switchboard_proto::AgentId;

/// How long what was read of a goal is used before it is read again.
pub const FRESH_FOR: Duration = Duration::from_secs(1);
/// How many choices one read serves at most.
pub const USES_MAX: u32 = 64;
/// How many goals a process remembers at once.
pub const GOALS_MAX: usize = 4_096;

/// One waiting message of a full goal: its stream sequence and sender (`None`: it does not
/// decode as an inbox message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Its stream sequence.
    pub seq: u64,
    /// Its `from_agent_id`.
    pub from: Option<AgentId>,
}

/// A full goal's waiting messages, oldest first, as far as one read got.
#[derive(Debug, Clone, Default)]
pub struct Holders {
    /// The messages read (and stored since by this process), oldest first.
    pub seen: Vec<Held>,
    /// How many more waited past them when the goal was read.
    pub beyond: u64,
}

#[derive(Debug)]
struct Remembered {
    holders: Holders,
    read_at: Instant,
    uses: u32,
}

static GOALS: LazyLock<Mutex<HashMap<String, Remembered>>> = LazyLock::new(Mutex::default);

fn goals() -> std::sync::MutexGuard<'static, HashMap<String, Remembered>> {
    GOALS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The fresh memory of a goal, its messages at or below `handed` dropped; forgotten (and
/// `None`) when stale, used up, or when every message it saw is gone while more wait past
/// it (what lies past a read is never chosen blind). Counts as one use.
fn fresh<'a>(
    goals: &'a mut HashMap<String, Remembered>,
    inbox_subject: &str,
    handed: u64,
) -> Option<&'a mut Remembered> {
    let remembered = goals.get_mut(inbox_subject)?;
    remembered.holders.seen.retain(|held| held.seq > handed);
    let spent = remembered.holders.seen.is_empty() && remembered.holders.beyond > 0;
    if remembered.read_at.elapsed() > FRESH_FOR || remembered.uses >= USES_MAX || spent {
        goals.remove(inbox_subject);
        return None;
    }
    let remembered = goals.get_mut(inbox_subject)?;
    remembered.uses += 1;
    Some(remembered)
}

/// What this process remembers of the goal `inbox_subject`, when it is fresh: without the
/// messages at or below `handed` (the reader has them). Counts as one use.
pub fn recall(inbox_subject: &str, handed: u64) -> Option<Holders> {
    let mut goals = goals();
    fresh(&mut goals, inbox_subject, handed).map(|remembered| remembered.holders.clone())
}

/// Recalls the goal `inbox_subject` as [`recall`] does and lets `choose` pick from it, in one
/// step under the lock: the message picked (`Some(seq)`) leaves what is remembered at once,
/// so publishers racing for room in one goal pick different messages. `None` when nothing
/// fresh is remembered; otherwise what `choose` returned.
pub fn choose_from<T>(
    inbox_subject: &str,
    handed: u64,
    choose: impl FnOnce(&Holders) -> (T, Option<u64>),
) -> Option<T> {
    let mut goals = goals();
    let remembered = fresh(&mut goals, inbox_subject, handed)?;
    let (chosen, seq) = choose(&remembered.holders);
    if let Some(seq) = seq {
        remembered.holders.seen.retain(|held| held.seq != seq);
    }
    Some(chosen)
}

/// Remembers `holders`, just read from the goal `inbox_subject`.
pub fn remember(inbox_subject: &str, holders: Holders) {
    let mut goals = goals();
    if goals.len() >= GOALS_MAX && !goals.contains_key(inbox_subject) {
        let oldest = goals
            .iter()
            .min_by_key(|(_, remembered)| remembered.read_at)
            .map(|(subject, _)| subject.clone());
        if let Some(oldest) = oldest {
            goals.remove(&oldest);
        }
    }
    goals.insert(
        inbox_subject.to_owned(),
        Remembered {
            holders,
            read_at: Instant::now(),
            uses: 0,
        },
    );
}

/// The message `seq` left the goal (this process removed it).
pub fn removed(inbox_subject: &str, seq: u64) {
    if let Some(remembered) = goals().get_mut(inbox_subject) {
        remembered.holders.seen.retain(|held| held.seq != seq);
    }
}

/// Whether this process remembers the goal's holders now (stored messages must then be
/// counted in, with [`stored`]).
pub fn remembers(inbox_subject: &str) -> bool {
    goals().contains_key(inbox_subject)
}

/// This process stored message `seq` from `from` in the goal: it holds one more.
pub fn stored(inbox_subject: &str, seq: u64, from: Option<AgentId>) {
    if let Some(remembered) = goals().get_mut(inbox_subject) {
        let holders = &mut remembered.holders;
        if holders.beyond > 0 {
            // Past what was read: counted with what lies beyond.
            holders.beyond += 1;
        } else if holders.seen.last().is_none_or(|last| last.seq < seq) {
            holders.seen.push(Held { seq, from });
        }
    }
}

/// What was remembered of the goal is wrong (a choice was gone): read it again next time.
pub fn forget(inbox_subject: &str) {
    goals().remove(inbox_subject);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(seq: u64, from: &str) -> Held {
        Held {
            seq,
            from: AgentId::parse(from).ok(),
        }
    }

    #[test]
    fn a_goal_is_remembered_kept_current_and_read_again_when_stale() {
        let subject = "agent.inbox.test-holders-1";
        assert!(recall(subject, 0).is_none(), "nothing read yet");
        remember(
            subject,
            Holders {
                seen: vec![held(1, "bob"), held(2, "mallory"), held(3, "mallory")],
                beyond: 0,
            },
        );
        // The reader took seq 1: it is not counted.
        let now = recall(subject, 1).unwrap();
        assert_eq!(now.seen, vec![held(2, "mallory"), held(3, "mallory")]);
        removed(subject, 2);
        stored(subject, 9, AgentId::parse("alice").ok());
        let now = recall(subject, 1).unwrap();
        assert_eq!(now.seen, vec![held(3, "mallory"), held(9, "alice")]);
        forget(subject);
        assert!(recall(subject, 0).is_none());
    }

    #[test]
    fn a_read_serves_a_bounded_number_of_choices() {
        let subject = "agent.inbox.test-holders-2";
        remember(subject, Holders::default());
        for _ in 0..USES_MAX {
            assert!(recall(subject, 0).is_some());
        }
        assert!(recall(subject, 0).is_none(), "read again after {USES_MAX}");
    }

    #[test]
    fn messages_past_the_read_are_counted_beyond() {
        let subject = "agent.inbox.test-holders-3";
        remember(
            subject,
            Holders {
                seen: vec![held(1, "bob")],
                beyond: 5,
            },
        );
        stored(subject, 10, AgentId::parse("alice").ok());
        let now = recall(subject, 0).unwrap();
        assert_eq!((now.seen.len(), now.beyond), (1, 6));
        // What it saw is gone, more waits past it: read again, never chosen blind.
        removed(subject, 1);
        assert!(recall(subject, 0).is_none());
    }
}
