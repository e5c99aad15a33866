//! What people do (docs/protocol.md §14, "People answer"): read their inbox, open an item,
//! answer. These run on `_SB.ops.people.*`, which only Switchboard's own users (the console,
//! the operator CLI) may publish on; they name the person acting, and every rule is checked
//! against that person here.

use std::collections::BTreeMap;

use switchboard_proto::AgentId;
use switchboard_proto::people::ops::{
    AnswerAck, AnswerRequest, InboxPage, InboxQuery, InboxState, PersonItemQuery, SenderShare,
};
use switchboard_proto::people::{
    Answer, Decision, INBOX_PAGE_MAX, ItemKind, ItemState, MAX_ANSWER_BYTES, Party,
    PeopleEventKind, PersonItem,
};
use switchboard_proto::timestamp;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::book::{Access, Book};
use crate::error::PeopleError;
use crate::service::{CAS_ROUNDS, People, text};
use crate::view::Head;

/// Whether `person` may see an item: it waits for them (or their role), or it did, or they
/// answered it.
fn concerns(
    book: &Book,
    person: &AgentId,
    head_to: &Party,
    addressee: &Party,
    by: Option<&Party>,
) -> bool {
    book.answers_for(person, addressee)
        || book.answers_for(person, head_to)
        || by.is_some_and(|by| *by == Party::Person(person.clone()))
}

/// Interleaves `items` (oldest first within each sender) one per sender in turn; in each
/// round the senders with fewest items waiting go first, so a sender with one question is
/// not pushed off the first page by a thousand agents with many each.
fn round_robin(mut items: Vec<(AgentId, OffsetDateTime, Uuid)>) -> Vec<Uuid> {
    items.sort_by_key(|item| (item.1, item.2));
    let mut by_sender: BTreeMap<AgentId, std::collections::VecDeque<(OffsetDateTime, Uuid)>> =
        BTreeMap::new();
    for (agent, at, id) in items {
        by_sender.entry(agent).or_default().push_back((at, id));
    }
    let mut queues: Vec<_> = by_sender.into_values().collect();
    // Fewest waiting first, then the sender whose oldest item is oldest.
    queues.sort_by_key(|queue| (queue.len(), queue.front().copied()));
    let mut out = Vec::new();
    loop {
        let mut took = false;
        for queue in &mut queues {
            if let Some((_, id)) = queue.pop_front() {
                out.push(id);
                took = true;
            }
        }
        if !took {
            return out;
        }
    }
}

impl People {
    fn person(&self, raw: &str) -> Result<(std::sync::Arc<Book>, AgentId), PeopleError> {
        let book = self.books.now();
        let id = book
            .person_named(raw)
            .map(|p| p.id.clone())
            .ok_or_else(|| PeopleError::UnknownPerson(raw.chars().take(80).collect()))?;
        Ok((book, id))
    }

    /// A page of a person's inbox: items interleaved across senders, those addressed to them
    /// before those addressed to their roles, with every sender's share.
    pub async fn inbox(&self, query: InboxQuery) -> Result<InboxPage, PeopleError> {
        let (book, person) = self.person(&query.person)?;
        let limit = query.limit.unwrap_or(50).clamp(1, INBOX_PAGE_MAX);
        let after = query.after.unwrap_or(0);
        self.fresh_view().await;
        let open = query.state == InboxState::Open;
        let (direct, via_role, shares) = self.view.with(|heads| {
            let mut direct = Vec::new();
            let mut via_role = Vec::new();
            // Per sender and `to`: the caps are counted that way.
            let mut shares: BTreeMap<(AgentId, Party), (usize, usize)> = BTreeMap::new();
            for (id, head) in heads {
                let Head {
                    from_agent,
                    addressee,
                    to,
                    ..
                } = head;
                if query.sender.as_ref().is_some_and(|s| s != from_agent) {
                    continue;
                }
                let here = if open {
                    head.waiting() && book.answers_for(&person, addressee)
                } else {
                    !head.waiting()
                        && concerns(&book, &person, to, addressee, head.answered_by.as_ref())
                };
                if !here {
                    continue;
                }
                if open {
                    let share = shares.entry((from_agent.clone(), to.clone())).or_default();
                    if head.kind == ItemKind::Note {
                        share.1 += 1;
                    } else {
                        share.0 += 1;
                    }
                }
                let entry = (from_agent.clone(), head.created_at, *id);
                if addressee.is_person() {
                    direct.push(entry);
                } else {
                    via_role.push(entry);
                }
            }
            (direct, via_role, shares)
        });
        let mut order = round_robin(direct);
        order.extend(round_robin(via_role));
        let total = order.len();
        let mut items = Vec::new();
        for id in order.into_iter().skip(after).take(limit) {
            if let Some(stored) = self.store.get(&id).await? {
                items.push(stored.item);
            }
        }
        let mut by_sender: BTreeMap<AgentId, SenderShare> = BTreeMap::new();
        for ((agent, _), (waiting, notes)) in shares {
            let share = by_sender.entry(agent.clone()).or_insert(SenderShare {
                agent,
                open: 0,
                at_cap: false,
            });
            share.open += waiting + notes;
            share.at_cap |= waiting >= self.config.max_open_per_sender
                || notes >= self.config.max_unread_notes_per_sender;
        }
        let mut senders: Vec<SenderShare> = by_sender.into_values().collect();
        senders.sort_by(|a, b| b.open.cmp(&a.open).then(a.agent.cmp(&b.agent)));
        let next = (after + limit < total).then_some(after + limit);
        Ok(InboxPage {
            items,
            senders,
            next,
        })
    }

    /// One item the person is, was or answers for the addressee of.
    pub async fn person_item(&self, query: PersonItemQuery) -> Result<PersonItem, PeopleError> {
        let (book, person) = self.person(&query.person)?;
        let item = self
            .store
            .get(&query.item_id)
            .await?
            .map(|stored| stored.item)
            .ok_or(PeopleError::NotFound(query.item_id))?;
        let escalated_from = item
            .escalated_at
            .is_some()
            .then_some(&item.to)
            .filter(|to| book.answers_for(&person, to));
        let seen = concerns(
            &book,
            &person,
            &item.to,
            &item.addressee,
            item.answer.as_ref().map(|a| &a.by),
        ) || escalated_from.is_some();
        if seen {
            Ok(item)
        } else {
            Err(PeopleError::NotFound(query.item_id))
        }
    }

    /// A person answers an ask, decides an approval or marks a note read. The first answer
    /// wins; the others are told who answered.
    pub async fn answer(&self, request: AnswerRequest) -> Result<AnswerAck, PeopleError> {
        let (book, person) = self.person(&request.person)?;
        if let Some(message) = &request.message {
            text("message", message, MAX_ANSWER_BYTES)?;
        }
        let id = request.item_id;
        let me = Party::Person(person.clone());
        for _ in 0..CAS_ROUNDS {
            let stored = self
                .store
                .get(&id)
                .await?
                .ok_or(PeopleError::NotFound(id))?;
            let item = &stored.item;
            if !book.answers_for(&person, &item.addressee) {
                if item.answer.as_ref().is_some_and(|a| a.by == me) {
                    return Err(self.ended(item));
                }
                return Err(PeopleError::NotAddressee(match item.escalated_at {
                    Some(at) if book.answers_for(&person, &item.to) => format!(
                        "item {id} was escalated to {} at {}; it is theirs to answer now",
                        item.addressee,
                        timestamp::format(at)
                    ),
                    _ => format!("item {id} is not addressed to {me}"),
                }));
            }
            // Ended first: the losing side of a role race is told who answered.
            let now = timestamp::now();
            if !item.state.is_waiting() {
                if item.kind == ItemKind::Note {
                    return Ok(AnswerAck {
                        item_id: id,
                        state: item.state,
                        delivered: false,
                    });
                }
                return Err(self.ended(item));
            }
            if item.deadline.is_some_and(|at| at <= now) {
                return Err(PeopleError::Expired {
                    item: id,
                    at: item.deadline.unwrap_or(now),
                });
            }
            let decision = match item.kind {
                ItemKind::Approval => {
                    let access = book
                        .person(&person)
                        .map(|p| p.access.clone())
                        .unwrap_or_default();
                    if !access.contains(&Access::Approver) {
                        return Err(PeopleError::NotAllowed(format!(
                            "{me} has no approver access"
                        )));
                    }
                    let Some(decision) = request.decision else {
                        return Err(PeopleError::BadRequest(
                            "an approval needs `decision`: approved or denied".to_owned(),
                        ));
                    };
                    let want = item.action_hash.clone().unwrap_or_default();
                    match &request.action_hash {
                        Some(shown) if *shown == want => {}
                        Some(shown) => {
                            return Err(PeopleError::ActionMismatch {
                                got: shown.chars().take(80).collect(),
                                want,
                            });
                        }
                        None => {
                            return Err(PeopleError::BadRequest(
                                "an approval needs `action_hash`: the hash of the action you were shown".to_owned(),
                            ));
                        }
                    }
                    Some(decision)
                }
                ItemKind::Ask => {
                    if request.decision.is_some() {
                        return Err(PeopleError::BadRequest(
                            "a question is answered with `message`, not `decision`".to_owned(),
                        ));
                    }
                    if request.message.is_none() {
                        return Err(PeopleError::Empty("message"));
                    }
                    None
                }
                ItemKind::Note => {
                    if request.decision.is_some() {
                        return Err(PeopleError::BadRequest(
                            "a note is marked read; it takes no `decision`".to_owned(),
                        ));
                    }
                    None
                }
            };
            let mut next = item.clone();
            next.state = match (item.kind, decision) {
                (ItemKind::Note, _) => ItemState::Read,
                (_, Some(Decision::Approved)) => ItemState::Approved,
                (_, Some(Decision::Denied)) => ItemState::Denied,
                _ => ItemState::Answered,
            };
            next.answer = Some(Answer {
                by: me.clone(),
                message: request.message.clone(),
                decision,
                at: now,
            });
            let Some(claimed) = self.store.replace(&stored, next).await? else {
                continue;
            };
            self.view.note(&claimed.item, claimed.revision);
            let event = match claimed.item.state {
                ItemState::Read => PeopleEventKind::Read,
                ItemState::Approved => PeopleEventKind::Approved,
                ItemState::Denied => PeopleEventKind::Denied,
                _ => PeopleEventKind::Answered,
            };
            let state = claimed.item.state;
            let item = claimed.item.clone();
            let delivered = Self::in_trace("people.answer", &item, async {
                self.emit(event, &item).await;
                if item.kind == ItemKind::Note {
                    return Ok(false);
                }
                self.deliver_answer(claimed).await
            })
            .await;
            let delivered = match delivered {
                Ok(delivered) => delivered,
                Err(err) => {
                    // Claimed: the sweep delivers it again shortly.
                    tracing::warn!(item_id = %id, error = %err, "answer claimed, delivery deferred to the sweep");
                    false
                }
            };
            return Ok(AnswerAck {
                item_id: id,
                state,
                delivered,
            });
        }
        Err(PeopleError::Contention(id))
    }

    /// The refusal for answering an item that ended.
    fn ended(&self, item: &PersonItem) -> PeopleError {
        match (&item.answer, item.state) {
            (Some(answer), _) => PeopleError::AlreadyAnswered {
                item: item.item_id,
                by: answer.by.clone(),
                at: answer.at,
            },
            (None, _) => PeopleError::Expired {
                item: item.item_id,
                at: item.deadline.unwrap_or(item.created_at),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_takes_one_per_sender_in_turn() {
        let t = timestamp::now();
        let later = |s: i64| t + time::Duration::seconds(s);
        let a = AgentId::parse("flood").unwrap();
        let b = AgentId::parse("honest").unwrap();
        let mut items: Vec<_> = (0..100)
            .map(|i| (a.clone(), later(i), Uuid::from_u128(i as u128)))
            .collect();
        items.push((b.clone(), later(500), Uuid::from_u128(1_000)));
        let order = round_robin(items);
        assert_eq!(order.len(), 101);
        assert_eq!(
            order[0],
            Uuid::from_u128(1_000),
            "the honest sender's one item comes first"
        );
        assert_eq!(order[1], Uuid::from_u128(0));
    }
}
