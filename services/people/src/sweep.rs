//! The escalation and expiry sweep (docs/protocol.md §14, "Escalation and expiry"): every
//! replica, on its own timer, walks the items past their escalation time or deadline, re-reads
//! each and changes it with compare-and-set, so across replicas exactly one escalates it once,
//! and exactly one expires it and tells the agent. It also delivers again an answer claimed
//! but not recorded delivered (a replica stopped in between): `Nats-Msg-Id` stores it once.

use switchboard_proto::people::{ItemKind, ItemState, PeopleEventKind};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::PeopleError;
use crate::service::People;
use crate::store::Stored;

/// An answer claimed this long ago and not delivered is delivered again by the sweep.
const REDELIVER_AFTER: time::Duration = time::Duration::seconds(10);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Due {
    Escalate,
    Expire,
    Redeliver,
}

impl People {
    /// One sweep; returns how many items it changed or delivered.
    pub async fn sweep(&self, now: OffsetDateTime) -> Result<usize, PeopleError> {
        // The bucket drops records past its max age without telling watchers.
        self.view.forget_before(now - self.keep);
        let due: Vec<(Uuid, Due)> = self.view.with(|heads| {
            heads
                .iter()
                .filter_map(|(id, head)| {
                    let past = |at: Option<OffsetDateTime>| at.is_some_and(|at| at <= now);
                    // An answer claimed and not delivered is delivered before anything else
                    // happens to its item (an approval past its deadline included): the
                    // agent gets its one ending.
                    if let Some(since) = head.undelivered_since {
                        return (now - since >= REDELIVER_AFTER).then_some((*id, Due::Redeliver));
                    }
                    let due = match head.state {
                        ItemState::Open | ItemState::Escalated | ItemState::Approved
                            if past(head.deadline) =>
                        {
                            Due::Expire
                        }
                        ItemState::Open if !head.escalated && past(head.escalate_at) => {
                            Due::Escalate
                        }
                        _ => return None,
                    };
                    Some((*id, due))
                })
                .collect()
        });
        let mut done = 0;
        for (id, due) in due {
            let Some(stored) = self.store.get(&id).await? else {
                continue;
            };
            let changed = Self::in_trace("people.sweep", &stored.item.clone(), async {
                match due {
                    Due::Escalate => self.escalate(stored, now).await,
                    Due::Expire => self.expire(stored, now).await,
                    Due::Redeliver => self.redeliver(stored, now).await,
                }
            })
            .await;
            match changed {
                Ok(true) => done += 1,
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(item_id = %id, error = %err, "sweep step failed; next sweep retries")
                }
            }
        }
        Ok(done)
    }

    async fn escalate(&self, stored: Stored, now: OffsetDateTime) -> Result<bool, PeopleError> {
        let item = &stored.item;
        let (Some(at), Some(whom)) = (item.escalate_at, item.escalate_to.clone()) else {
            return Ok(false);
        };
        if item.state != ItemState::Open || item.escalated_at.is_some() || at > now {
            return Ok(false);
        }
        let mut next = item.clone();
        next.state = ItemState::Escalated;
        next.addressee = whom;
        next.escalated_at = Some(now);
        let Some(written) = self.store.replace(&stored, next).await? else {
            return Ok(false);
        };
        self.view.note(&written.item, written.revision);
        tracing::info!(item_id = %written.item.item_id, to = %written.item.addressee, "item escalated");
        self.emit(PeopleEventKind::Escalated, &written.item).await;
        self.deliver_escalated(&written.item).await;
        Ok(true)
    }

    async fn expire(&self, stored: Stored, now: OffsetDateTime) -> Result<bool, PeopleError> {
        let item = &stored.item;
        let waiting = matches!(item.state, ItemState::Open | ItemState::Escalated);
        let unused = item.state == ItemState::Approved && item.delivered;
        if !(waiting || unused) || item.deadline.is_none_or(|at| at > now) {
            return Ok(false);
        }
        let mut next = item.clone();
        next.state = ItemState::Expired;
        // An approval expiring unused was decided and delivered already: nothing to tell.
        next.delivered = !waiting;
        let Some(written) = self.store.replace(&stored, next).await? else {
            return Ok(false);
        };
        self.view.note(&written.item, written.revision);
        self.emit(PeopleEventKind::Expired, &written.item).await;
        if waiting && written.item.kind != ItemKind::Note {
            self.deliver_timeout(written).await?;
        }
        Ok(true)
    }

    async fn redeliver(&self, stored: Stored, now: OffsetDateTime) -> Result<bool, PeopleError> {
        let item = &stored.item;
        if item.delivered || item.kind == ItemKind::Note || !Self::ends(item.state) {
            return Ok(false);
        }
        let since = item.answer.as_ref().map_or(item.created_at, |a| a.at);
        if now - since < REDELIVER_AFTER {
            return Ok(false);
        }
        tracing::info!(item_id = %item.item_id, "delivering a claimed answer again");
        if item.state == ItemState::Expired {
            self.deliver_timeout(stored).await?;
        } else {
            self.deliver_answer(stored).await?;
        }
        Ok(true)
    }
}
