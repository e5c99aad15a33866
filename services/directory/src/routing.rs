//! Skill routing: `to: "skill:<name>"` in a send, a call or a task create is answered by the
//! services asking the directory (`_SB.registry.route.<agent_id>`, services only) for one
//! agent. It picks among the agents whose card lists the skill (a capability or a skill id)
//! and that the asker can reach: ACL both ways, a live goal, not offline, and for a task below
//! its `max_concurrent_tasks`. Below its cap before at it, then fewest active tasks, then
//! round-robin among the equally good, so work spreads and a loaded agent is passed over. The
//! load is the task service's count (`task_load`), never what an agent reports of itself.

use std::sync::atomic::Ordering;

use switchboard_proto::registry::{RouteReply, RouteRequest};
use switchboard_proto::{AgentId, AgentStatus, acl};

use crate::error::DirectoryError;
use crate::registry::{Registry, VIEW_CATCH_UP};

impl Registry {
    /// The agent a `skill:<name>` message, call or task from `caller` goes to.
    pub async fn route(
        &self,
        caller: &AgentId,
        request: &RouteRequest,
    ) -> Result<RouteReply, DirectoryError> {
        let skill = switchboard_proto::send::check_skill(&request.skill)
            .map_err(|err| DirectoryError::InvalidCard(err.error.message))?
            .to_owned();
        if !self.view.caught_up(VIEW_CATCH_UP).await? {
            tracing::warn!("registry view is behind; routing by skill from what it holds");
        }
        let picked = self.view.with(|view| {
            let me = view
                .record(caller.as_str())
                .map(|record| record.card.clone());
            let Some(me) = me else {
                return Err(DirectoryError::NotRegistered(caller.clone()));
            };
            let mut listing = 0;
            let mut at_cap = 0;
            // (busy, current tasks, id) of each agent that fits.
            let mut fits: Vec<(bool, u32, AgentId)> = Vec::new();
            for (record, _) in view.records_after(None) {
                let card = &record.card;
                // Listed on its card, granted by the operator where grants are kept, and not
                // a card that says its skills are not for routing (a remote the operator did
                // not open to it).
                if card.agent_id == *caller
                    || !card.routes_skill(&skill)
                    || !self.grants.allows(card.agent_id.as_str(), &skill)
                {
                    continue;
                }
                listing += 1;
                let reachable = record.status != AgentStatus::Offline
                    && view.has_goal(card.agent_id.as_str())
                    && acl::check(&me, card).is_ok();
                if !reachable {
                    continue;
                }
                // The task service's count, not the agent's own word (a heartbeat's
                // `current_tasks` or `busy`): an agent that says it is idle gets no more work.
                let load = record.task_load;
                let full = load >= card.max_concurrent_tasks;
                if request.task && full {
                    at_cap += 1;
                    continue;
                }
                fits.push((full, load, card.agent_id.clone()));
            }
            fits.sort();
            let Some((busy, load, _)) = fits.first().cloned() else {
                let why = match (listing, at_cap) {
                    (0, _) => String::new(),
                    (_, 0) => format!(": {listing} list it, none reachable from `{caller}`"),
                    _ => format!(": {listing} list it, {at_cap} at their task cap"),
                };
                return Err(DirectoryError::NoSkill {
                    skill: skill.clone(),
                    why,
                });
            };
            let best: Vec<AgentId> = fits
                .into_iter()
                .take_while(|(b, l, _)| *b == busy && *l == load)
                .map(|(_, _, id)| id)
                .collect();
            let turn = self.route_turn.fetch_add(1, Ordering::Relaxed);
            Ok(best[turn % best.len()].clone())
        })?;
        tracing::debug!(caller = %caller, skill, agent_id = %picked, "routed by skill");
        Ok(RouteReply { agent_id: picked })
    }
}
