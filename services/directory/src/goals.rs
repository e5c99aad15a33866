//! The goal rules: goal.open and goal.close.
//!
//! Each goal owns a cursor in `agent_cursors` (docs/protocol.md §4.4), created when the goal
//! opens, so messages sent before its runtime reads wait for it (buffer-on-demand); the
//! cursor names the goal's owner, which makes a goal id an address nobody else can read or
//! claim. Live goals are capped per agent, so one agent cannot fill the cluster. Goal ids of
//! the A2A gateway's context form (UUID version 8) only `a2a-` agents open, so a context goal
//! stays its client's even while it is closed.

use switchboard_proto::inbox::{CursorRecord, Overflow};
use switchboard_proto::registry::{GoalCloseReply, GoalOpenReply, GoalOpenRequest};
use switchboard_proto::subject::{self, RegistryEvent};
use switchboard_proto::{AgentId, GoalId, GoalRecord, timestamp};

use crate::error::DirectoryError;
use crate::registry::Registry;

/// How many opens the registry view may lag behind: within this many goals of the cap, an
/// open counts the agent's goals from the bucket instead of the view.
const VIEW_LAG_MARGIN: usize = 8;

impl Registry {
    /// goal.open: create the goal's cursor (claiming the goal id for the caller) and record the
    /// goal. Re-opening a goal the caller already owns is idempotent; a goal id another agent
    /// holds (a live goal record, or its cursor) is refused, and so is a goal id of the A2A
    /// gateway's context form ([`GoalId::is_a2a_context`]) unless the caller is an `a2a-` agent.
    pub async fn open_goal(
        &self,
        caller: &AgentId,
        request: GoalOpenRequest,
    ) -> Result<GoalOpenReply, DirectoryError> {
        if self.store.record(caller).await?.is_none() {
            return Err(DirectoryError::NotRegistered(caller.clone()));
        }
        // A named goal (issue 38): the same name always opens the same goal of this agent, so
        // a restarted agent resumes it. Ids of that form (UUID version 5) are opened by name
        // only, so no agent can open another's named goal first and hold it.
        let goal_id = match (&request.name, request.goal_id) {
            (Some(_), Some(_)) => {
                return Err(DirectoryError::BadGoalName(
                    "give `name` or `goal_id`, not both".to_owned(),
                ));
            }
            (Some(name), None) => {
                switchboard_proto::ids::check_goal_name(name)
                    .map_err(DirectoryError::BadGoalName)?;
                GoalId::named(caller, name)
            }
            (None, Some(goal_id)) if goal_id.is_named() => {
                return Err(DirectoryError::BadGoalName(format!(
                    "goal `{goal_id}` has the form of a named goal (UUID version 5): open it \
                     by its `name`"
                )));
            }
            (None, goal_id) => goal_id.unwrap_or_default(),
        };
        // The A2A gateway's context goals (UUID version 8) are its clients' alone: `lookup`
        // lists them, and one the gateway closed must not be taken by another agent.
        if goal_id.is_a2a_context()
            && !caller
                .as_str()
                .starts_with(switchboard_proto::A2A_CLIENT_PREFIX)
        {
            return Err(DirectoryError::ReservedGoal { goal: goal_id });
        }
        let holders = self.store.goal_holders(&goal_id).await?;
        if holders.iter().any(|holder| holder != caller) {
            return Err(DirectoryError::GoalOwnedElsewhere { goal: goal_id });
        }
        // A new goal is one more cursor and one more inbox subject: capped per agent, so one
        // agent cannot fill the cluster. Re-opening a goal one holds is not a new one.
        // The in-memory view counts first (no read): an agent well below the cap by its count
        // opens without a scan, however many goals it holds (a raised cap). Near the cap (the
        // view may lag a few opens behind) the goals are counted from the bucket.
        let near_cap = self.view.cached(caller.as_str()).is_none_or(|peer| {
            peer.goals.len().saturating_add(VIEW_LAG_MARGIN) >= self.max_goals_per_agent
        });
        if holders.is_empty() && near_cap {
            let live = self.store.count_goals(caller).await?;
            if live >= self.max_goals_per_agent {
                return Err(DirectoryError::TooManyGoals {
                    cap: self.max_goals_per_agent,
                });
            }
        }
        // A goal id the caller chose may have been used before (its inbox may hold messages
        // stored after an earlier close); one minted here is new.
        let overflow = request.overflow.unwrap_or_default();
        self.claim_cursor(caller, &goal_id, request.goal_id.is_some(), overflow)
            .await?;
        if holders.is_empty() {
            let record = GoalRecord {
                goal_id,
                agent_id: caller.clone(),
                kind: request.kind.unwrap_or_default(),
                opened_at: timestamp::now(),
            };
            self.store.put_goal(&record).await?;
            tracing::info!(agent_id = %caller, %goal_id, "goal opened");
            self.store
                .emit(RegistryEvent::GoalOpened, caller, Some(goal_id), None)
                .await;
        }
        Ok(GoalOpenReply {
            goal_id,
            subject: subject::inbox(&goal_id),
        })
    }

    /// Creates the goal's cursor for `caller`, or confirms the caller owns the one that exists.
    /// The create is the claim: of two agents racing for one goal id, one wins. A new cursor
    /// starts after whatever the goal's inbox already holds when the id was `chosen` by the
    /// caller (a reused id never hands out an earlier owner's messages), at 0 for a fresh one.
    async fn claim_cursor(
        &self,
        caller: &AgentId,
        goal_id: &GoalId,
        chosen: bool,
        overflow: Overflow,
    ) -> Result<(), DirectoryError> {
        let start = if chosen {
            self.store.last_inbox_sequence(goal_id).await?
        } else {
            0
        };
        let mut cursor = CursorRecord::new(caller.clone(), start);
        cursor.overflow = overflow;
        self.store.create_cursor(&cursor, goal_id).await
    }

    /// goal.close: forget the goal, purge its inbox and delete its cursor. A close that failed
    /// half-way can be retried: the caller's cursor still proves the goal is theirs.
    pub async fn close_goal(
        &self,
        caller: &AgentId,
        goal_id: GoalId,
    ) -> Result<GoalCloseReply, DirectoryError> {
        let recorded = self.store.goal_recorded(caller, &goal_id).await?;
        let owns_cursor = self
            .store
            .cursor(&goal_id)
            .await?
            .is_some_and(|(cursor, _)| cursor.agent_id == *caller);
        if !recorded && !owns_cursor {
            return Err(DirectoryError::UnknownGoal {
                agent: caller.clone(),
                goal: goal_id,
            });
        }
        // Forget the goal first so no new delivery targets it, then empty its inbox, then drop
        // the cursor.
        if recorded {
            self.store.forget_goal(caller, &goal_id).await?;
        }
        let purged = self.store.purge_inbox(&goal_id).await?;
        if owns_cursor {
            self.store.delete_cursor(caller, &goal_id).await?;
        }
        tracing::info!(agent_id = %caller, %goal_id, purged, "goal closed");
        self.store
            .emit(RegistryEvent::GoalClosed, caller, Some(goal_id), None)
            .await;
        Ok(GoalCloseReply { goal_id, purged })
    }
}
