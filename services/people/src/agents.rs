//! What agents do (docs/protocol.md §14, "Agents"): note, ask, request and use approvals,
//! read their own items, list people.
//!
//! Every request runs its checks in one order: the texts (and an approval's action), the
//! caller's registration, the parties and times, the caller's goal, that someone can answer
//! (an approver for approvals), the access rules for `to` and `escalate_to`, a retry by id
//! (joined when it asks the same: sender, kind, `to`, text, goal, action and `escalate_to`),
//! the caps, then the record is created.

use switchboard_proto::approval::{ApprovalRequest, ApprovalUse, ApprovalUsed};
use switchboard_proto::people::{
    AskRequest, ItemKind, ItemState, MAX_PEOPLE_TEXT_BYTES, NoteReport, NoteRequest, Parked, Party,
    PendingItems, PeopleEventKind, PeopleList, PersonItem,
};
use switchboard_proto::{AgentCard, AgentId, GoalId, new_id, timestamp};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::PeopleError;
use crate::service::{CAS_ROUNDS, People, party, text};

/// What an ask or an approval request asks for, checked.
struct Wait {
    to: Party,
    from_goal: GoalId,
    deadline: OffsetDateTime,
    escalate: Option<(OffsetDateTime, Party)>,
}

impl People {
    /// The caller's card: it must be registered.
    async fn sender(&self, caller: &AgentId) -> Result<AgentCard, PeopleError> {
        self.door
            .view()
            .card(caller)
            .await?
            .ok_or_else(|| PeopleError::NotRegistered(caller.clone()))
    }

    /// Whether `card` may address `party`, and someone can answer it.
    fn reach(&self, card: &AgentCard, party: &Party, approval: bool) -> Result<(), PeopleError> {
        let book = self.books.now();
        if !book.exists(party) {
            return Err(PeopleError::Unreachable(match party {
                Party::Person(_) => format!("there is no {party}"),
                Party::Role(_) => format!("there is no {party} with members"),
            }));
        }
        if approval && !book.can_approve(party) {
            return Err(PeopleError::Unreachable(format!(
                "{party} cannot approve (no approver access)"
            )));
        }
        book.check(card, party).map_err(PeopleError::AclDenied)
    }

    /// Checks the sender's caps against the view.
    async fn caps(&self, caller: &AgentId, to: &Party, note: bool) -> Result<(), PeopleError> {
        self.fresh_view().await;
        let (with_party, notes_with_party, all) = self.view.with(|heads| {
            let mut counts = (0, 0, 0);
            for head in heads
                .values()
                .filter(|h| h.from_agent == *caller && h.waiting())
            {
                let same = head.to == *to;
                if head.kind == ItemKind::Note {
                    counts.1 += usize::from(same);
                } else {
                    counts.0 += usize::from(same);
                    counts.2 += 1;
                }
            }
            counts
        });
        if note {
            if notes_with_party >= self.config.max_unread_notes_per_sender {
                return Err(PeopleError::SenderAtCap {
                    agent: caller.clone(),
                    to: to.clone(),
                    count: notes_with_party,
                    what: "unread notes",
                });
            }
            return Ok(());
        }
        if with_party >= self.config.max_open_per_sender {
            return Err(PeopleError::SenderAtCap {
                agent: caller.clone(),
                to: to.clone(),
                count: with_party,
                what: "asks and approvals",
            });
        }
        if all >= self.config.max_open_per_agent {
            return Err(PeopleError::TooManyWaiting {
                agent: caller.clone(),
                cap: self.config.max_open_per_agent,
            });
        }
        Ok(())
    }

    /// Note a person: recorded unread; nothing waits.
    pub async fn note(
        &self,
        caller: &AgentId,
        request: NoteRequest,
    ) -> Result<NoteReport, PeopleError> {
        text("message", &request.message, MAX_PEOPLE_TEXT_BYTES)?;
        let card = self.sender(caller).await?;
        let to = party(&request.to)?;
        self.reach(&card, &to, false)?;
        let item = PersonItem {
            metadata: request.metadata,
            ..self.item(
                caller,
                ItemKind::Note,
                to.clone(),
                request.message,
                request.note_id,
            )
        };
        let _turn = self.turn(caller).lock().await;
        if let Some(existing) = self.store.get(&item.item_id).await? {
            self.join(&existing.item, &item)?;
            return Ok(NoteReport {
                item_id: item.item_id,
                to,
            });
        }
        self.caps(caller, &to, true).await?;
        match self.store.create(&item).await? {
            Some(stored) => {
                self.view.note(&stored.item, stored.revision);
                self.emit(PeopleEventKind::Noted, &stored.item).await;
            }
            None => {
                let existing = self
                    .store
                    .get(&item.item_id)
                    .await?
                    .ok_or(PeopleError::IdTaken(item.item_id))?;
                self.join(&existing.item, &item)?;
            }
        }
        Ok(NoteReport {
            item_id: item.item_id,
            to,
        })
    }

    /// A fresh item from `caller`.
    fn item(
        &self,
        caller: &AgentId,
        kind: ItemKind,
        to: Party,
        message: String,
        id: Option<Uuid>,
    ) -> PersonItem {
        PersonItem {
            item_id: id.unwrap_or_else(new_id),
            kind,
            from_agent: caller.clone(),
            from_goal: None,
            addressee: to.clone(),
            to,
            message,
            action: None,
            action_hash: None,
            state: if kind == ItemKind::Note {
                ItemState::Unread
            } else {
                ItemState::Open
            },
            created_at: timestamp::now(),
            deadline: None,
            escalate_at: None,
            escalate_to: None,
            escalated_at: None,
            answer: None,
            delivered: false,
            request_id: new_id(),
            used_at: None,
            use_id: None,
            metadata: serde_json::Map::new(),
            traceparent: switchboard_request::trace::current_traceparent(),
        }
    }

    /// The shared checks of an ask and an approval request.
    #[allow(clippy::too_many_arguments)]
    async fn wait_for(
        &self,
        caller: &AgentId,
        card: &AgentCard,
        to: &str,
        from_goal: GoalId,
        wait_ms: u64,
        escalate_after_ms: Option<u64>,
        escalate_to: Option<&str>,
        approval: bool,
    ) -> Result<Wait, PeopleError> {
        let to = party(to)?;
        if wait_ms == 0 || wait_ms > self.config.max_wait_ms {
            return Err(PeopleError::BadRequest(format!(
                "the wait must be 1..={} ms",
                self.config.max_wait_ms
            )));
        }
        let escalate = match (escalate_after_ms, escalate_to) {
            (None, None) => None,
            (Some(after), Some(whom)) => {
                let whom = party(whom)?;
                if after == 0 || after >= wait_ms {
                    return Err(PeopleError::BadRequest(
                        "`escalate_after_ms` must be above 0 and shorter than the wait".to_owned(),
                    ));
                }
                if whom == to {
                    return Err(PeopleError::BadRequest(
                        "`escalate_to` must differ from `to`".to_owned(),
                    ));
                }
                Some((after, whom))
            }
            _ => {
                return Err(PeopleError::BadRequest(
                    "`escalate_after_ms` and `escalate_to` go together".to_owned(),
                ));
            }
        };
        if !self.door.view().owns_goal(caller, &from_goal).await? {
            return Err(PeopleError::NotYourGoal {
                goal: from_goal,
                caller: caller.clone(),
            });
        }
        self.reach(card, &to, approval)?;
        if let Some((_, whom)) = &escalate {
            // An agent cannot escalate into someone it may not reach.
            self.reach(card, whom, approval)?;
        }
        let now = timestamp::now();
        let ms = |ms: u64| time::Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX));
        Ok(Wait {
            to,
            from_goal,
            deadline: now + ms(wait_ms),
            escalate: escalate.map(|(after, whom)| (now + ms(after), whom)),
        })
    }

    /// Records a parked item, or joins the one a retry names.
    async fn park(&self, caller: &AgentId, item: PersonItem) -> Result<Parked, PeopleError> {
        let _turn = self.turn(caller).lock().await;
        let parked = |item: &PersonItem, joined: bool| Parked {
            item_id: item.item_id,
            to: item.to.clone(),
            action_hash: item.action_hash.clone(),
            deadline: item.deadline.unwrap_or(item.created_at),
            escalate_at: item.escalate_at,
            joined,
        };
        if let Some(existing) = self.store.get(&item.item_id).await? {
            return self
                .join(&existing.item, &item)
                .map(|()| parked(&existing.item, true));
        }
        self.caps(caller, &item.to, false).await?;
        match self.store.create(&item).await? {
            Some(stored) => {
                self.view.note(&stored.item, stored.revision);
                let event = if item.kind == ItemKind::Approval {
                    PeopleEventKind::ApprovalRequested
                } else {
                    PeopleEventKind::Asked
                };
                self.emit(event, &stored.item).await;
                Ok(parked(&stored.item, false))
            }
            None => {
                let existing = self
                    .store
                    .get(&item.item_id)
                    .await?
                    .ok_or(PeopleError::IdTaken(item.item_id))?;
                self.join(&existing.item, &item)
                    .map(|()| parked(&existing.item, true))
            }
        }
    }

    /// A retry joins the item its id names only when it asks the same thing.
    fn join(&self, existing: &PersonItem, retry: &PersonItem) -> Result<(), PeopleError> {
        let same = existing.from_agent == retry.from_agent
            && existing.kind == retry.kind
            && existing.to == retry.to
            && existing.message == retry.message
            && existing.from_goal == retry.from_goal
            && existing.action_hash == retry.action_hash
            && existing.escalate_to == retry.escalate_to;
        if same {
            Ok(())
        } else {
            Err(PeopleError::IdTaken(existing.item_id))
        }
    }

    /// Ask a person or a role; the answer comes to the goal's inbox.
    pub async fn ask(&self, caller: &AgentId, request: AskRequest) -> Result<Parked, PeopleError> {
        text("message", &request.message, MAX_PEOPLE_TEXT_BYTES)?;
        let card = self.sender(caller).await?;
        let wait = self
            .wait_for(
                caller,
                &card,
                &request.to,
                request.from_goal_id,
                request
                    .timeout_ms
                    .unwrap_or(self.config.ask_timeout_default_ms),
                request.escalate_after_ms,
                request.escalate_to.as_deref(),
                false,
            )
            .await?;
        let item = PersonItem {
            from_goal: Some(wait.from_goal),
            deadline: Some(wait.deadline),
            escalate_at: wait.escalate.as_ref().map(|(at, _)| *at),
            escalate_to: wait.escalate.map(|(_, whom)| whom),
            metadata: request.metadata,
            ..self.item(
                caller,
                ItemKind::Ask,
                wait.to,
                request.message,
                request.ask_id,
            )
        };
        self.park(caller, item).await
    }

    /// Request an approval of one exact action.
    pub async fn request_approval(
        &self,
        caller: &AgentId,
        request: ApprovalRequest,
    ) -> Result<Parked, PeopleError> {
        text("reason", &request.reason, MAX_PEOPLE_TEXT_BYTES)?;
        let hash = request
            .action
            .hash()
            .map_err(|err| PeopleError::BadRequest(err.to_string()))?;
        let card = self.sender(caller).await?;
        let wait = self
            .wait_for(
                caller,
                &card,
                &request.to,
                request.from_goal_id,
                request.expires_in_ms,
                request.escalate_after_ms,
                request.escalate_to.as_deref(),
                true,
            )
            .await?;
        let item = PersonItem {
            from_goal: Some(wait.from_goal),
            deadline: Some(wait.deadline),
            escalate_at: wait.escalate.as_ref().map(|(at, _)| *at),
            escalate_to: wait.escalate.map(|(_, whom)| whom),
            action: Some(request.action),
            action_hash: Some(hash),
            ..self.item(
                caller,
                ItemKind::Approval,
                wait.to,
                request.reason,
                request.approval_id,
            )
        };
        self.park(caller, item).await
    }

    /// Check an approval for this exact action and spend it: single use.
    pub async fn use_approval(
        &self,
        caller: &AgentId,
        request: ApprovalUse,
    ) -> Result<ApprovalUsed, PeopleError> {
        let hash = request
            .action
            .hash()
            .map_err(|err| PeopleError::BadRequest(err.to_string()))?;
        let id = request.approval_id;
        for _ in 0..CAS_ROUNDS {
            let stored = self
                .store
                .get(&id)
                .await?
                .filter(|s| s.item.from_agent == *caller && s.item.kind == ItemKind::Approval)
                .ok_or(PeopleError::NotFound(id))?;
            let item = &stored.item;
            let want = item.action_hash.clone().unwrap_or_default();
            if hash != want {
                return Err(PeopleError::ActionMismatch { got: hash, want });
            }
            let used = |item: &PersonItem, duplicate: bool| {
                let answer = item.answer.clone();
                ApprovalUsed {
                    approval_id: id,
                    action_hash: want.clone(),
                    decided_by: answer
                        .as_ref()
                        .map_or_else(|| item.to.clone(), |a| a.by.clone()),
                    decided_at: answer.as_ref().map_or(item.created_at, |a| a.at),
                    note: answer.and_then(|a| a.message),
                    used_at: item.used_at.unwrap_or(item.created_at),
                    duplicate,
                }
            };
            let now = timestamp::now();
            match item.state {
                ItemState::Open | ItemState::Escalated => {
                    return Err(PeopleError::ApprovalPending(id));
                }
                ItemState::Denied => {
                    let answer = item.answer.clone();
                    return Err(PeopleError::ApprovalDenied {
                        item: id,
                        by: answer
                            .as_ref()
                            .map_or_else(|| item.to.clone(), |a| a.by.clone()),
                        note: answer.and_then(|a| a.message),
                    });
                }
                ItemState::Used => {
                    if request.use_id.is_some() && item.use_id == request.use_id {
                        return Ok(used(item, true));
                    }
                    return Err(PeopleError::ApprovalUsed {
                        item: id,
                        at: item.used_at.unwrap_or(now),
                    });
                }
                ItemState::Approved if item.deadline.is_none_or(|at| at > now) => {}
                _ => {
                    return Err(PeopleError::Expired {
                        item: id,
                        at: item.deadline.unwrap_or(now),
                    });
                }
            }
            let mut next = item.clone();
            next.state = ItemState::Used;
            next.used_at = Some(now);
            next.use_id = request.use_id;
            if let Some(written) = self.store.replace(&stored, next).await? {
                self.view.note(&written.item, written.revision);
                self.emit(PeopleEventKind::Used, &written.item).await;
                return Ok(used(&written.item, false));
            }
        }
        Err(PeopleError::Contention(id))
    }

    /// One of the caller's own items (another's is `not_found`: no oracle).
    pub async fn get(&self, caller: &AgentId, id: Uuid) -> Result<PersonItem, PeopleError> {
        self.store
            .get(&id)
            .await?
            .map(|stored| stored.item)
            .filter(|item| item.from_agent == *caller)
            .ok_or(PeopleError::NotFound(id))
    }

    /// The caller's asks and approvals waiting for a person, and approvals not used yet.
    pub async fn pending(&self, caller: &AgentId) -> Result<PendingItems, PeopleError> {
        self.fresh_view().await;
        let mut ids: Vec<(OffsetDateTime, Uuid)> = self.view.with(|heads| {
            heads
                .iter()
                .filter(|(_, h)| {
                    h.from_agent == *caller
                        && h.kind != ItemKind::Note
                        && matches!(
                            h.state,
                            ItemState::Open | ItemState::Escalated | ItemState::Approved
                        )
                })
                .map(|(id, h)| (h.created_at, *id))
                .collect()
        });
        ids.sort();
        let mut items = Vec::with_capacity(ids.len());
        for (_, id) in ids {
            if let Some(stored) = self.store.get(&id).await? {
                items.push(stored.item);
            }
        }
        Ok(PendingItems { items })
    }

    /// Everyone configured, with whether the caller may reach them.
    pub async fn list(&self, caller: &AgentId) -> Result<PeopleList, PeopleError> {
        let card = self.sender(caller).await?;
        Ok(self.books.now().listing(&card))
    }
}
