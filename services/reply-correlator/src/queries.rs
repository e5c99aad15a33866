//! What an agent asks about its calls: `agent.calls.pending.<agent_id>` lists the calls it has
//! open, as caller and as callee (docs/protocol.md §9).

use switchboard_proto::call::{CallState, PendingCall, PendingCalls};
use switchboard_proto::{AgentId, timestamp};

use crate::Correlator;
use crate::error::CorrelatorError;
use crate::store::CallEntry;

impl Correlator {
    /// The caller's open outgoing and incoming calls.
    pub async fn pending(&self, agent: &AgentId) -> Result<PendingCalls, CorrelatorError> {
        let now = timestamp::now();
        let open = |calls: Vec<CallEntry>| -> Vec<PendingCall> {
            let mut open: Vec<PendingCall> = calls
                .into_iter()
                .map(|s| s.call.summary())
                .filter(|c| c.state == CallState::Open && c.deadline > now)
                .collect();
            open.sort_by_key(|c| c.created_at);
            open
        };
        // With the waiting calls this replica holds that are not indexed yet (a young one is
        // in no index; another replica's young waiting calls are not listed here).
        let (mut outgoing, mut incoming) = (
            self.store.outgoing(agent).await?,
            self.store.incoming(agent).await?,
        );
        for held in self.held_calls(agent) {
            let listed = |calls: &[CallEntry]| {
                calls
                    .iter()
                    .any(|c| c.call.correlation_id == held.call.correlation_id)
            };
            if held.call.caller == *agent && !listed(&outgoing) {
                outgoing.push(held.clone());
            }
            if held.call.callee == *agent && !listed(&incoming) {
                incoming.push(held);
            }
        }
        Ok(PendingCalls {
            outgoing: open(outgoing),
            incoming: open(incoming),
        })
    }
}
