//! Cost budgets (docs/protocol.md §16): the work an agent serves may carry a budget, shown in
//! `metadata.budget` of the request or task message ([`budget_of`]). Report what you spend
//! against it with [`Agent::spend`]; sub-calls and subtasks made under the work draw from it.
//!
//! ```no_run
//! # async fn demo(agent: &switchboard_client::Agent, msg: &switchboard_client::proto::InboxMessage) -> Result<(), switchboard_client::ClientError> {
//! if let Some(budget) = switchboard_client::budget_of(msg) {
//!     let left = agent.spend(&budget, 1_200, 3_000).await?;
//!     println!("{} micro-units left", left.left.cost);
//! }
//! # Ok(()) }
//! ```

use switchboard_proto::InboxMessage;
use switchboard_proto::audit::AuditOp;
use switchboard_proto::budget::{
    BUDGET_METADATA_KEY, BudgetAsk, BudgetGrant, BudgetOp, BudgetQuery, BudgetView, CostQuery,
    CostReport, SpendRequest,
};

use crate::Agent;
use crate::error::ClientError;

/// The budget a received request or task carries (`metadata.budget`), if any.
pub fn budget_of(message: &InboxMessage) -> Option<BudgetGrant> {
    serde_json::from_value(message.metadata.get(BUDGET_METADATA_KEY)?.clone()).ok()
}

/// A `budget` for a call or task made while serving work with `grant`: it draws from that
/// work's budget, at most `cost`/`tokens` when given (none: all it has left).
pub fn draw_from(grant: &BudgetGrant, tokens: Option<u64>, cost: Option<u64>) -> BudgetAsk {
    BudgetAsk {
        tokens,
        cost,
        root: Some(grant.root),
        parent: Some(grant.work),
    }
}

impl Agent {
    /// Reports what this agent spent on work it owns (`tokens`, `cost` in micro-units); the
    /// reply is what the work has left. Not retried: a lost reply may have been charged
    /// (read [`Agent::budget`] to see).
    pub async fn spend(
        &self,
        grant: &BudgetGrant,
        tokens: u64,
        cost: u64,
    ) -> Result<BudgetView, ClientError> {
        let body = SpendRequest {
            root: grant.root,
            work: grant.work,
            tokens,
            cost,
        };
        crate::request(
            self.nats(),
            BudgetOp::Spend.subject(self.id()),
            &body,
            self.options().request_timeout,
        )
        .await
    }

    /// A budget node this agent owns or asked for, as it stands now.
    pub async fn budget(&self, grant: &BudgetGrant) -> Result<BudgetView, ClientError> {
        let body = BudgetQuery {
            root: grant.root,
            work: grant.work,
        };
        crate::request(
            self.nats(),
            BudgetOp::Get.subject(self.id()),
            &body,
            self.options().request_timeout,
        )
        .await
    }
}

/// `agent.audit.cost`: a budget tree's cost as the audit recorded it, or one agent's spend per
/// tree.
pub async fn audit_cost(
    nats: &async_nats::Client,
    query: &CostQuery,
) -> Result<CostReport, ClientError> {
    crate::request(
        nats,
        AuditOp::Cost.subject(),
        query,
        std::time::Duration::from_secs(10),
    )
    .await
}
