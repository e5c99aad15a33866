//! The endpoint table: the agent-facing `agent.limits.<op>.<agent>` and the operator's
//! `_SB.ops.limits.<op>`. The micro scaffold decodes each request; the rules are in
//! [`crate::service`].

use std::sync::Arc;

use switchboard_proto::ErrorReply;
use switchboard_proto::budget::{
    BUDGET_CLOSE_SUBJECT, BUDGET_RESERVE_SUBJECT, BudgetOp, BudgetQuery, CloseRequest,
    ReserveRequest, SpendRequest,
};
use switchboard_proto::limits::{
    AcquireRequest, LimitQuery, LimitSpec, LimitsOp, LimitsOpsOp, ReleaseRequest, RenewRequest,
};
use switchboard_runtime::micro::{AgentRequest, Endpoint};

use crate::budget::Budgets;
use crate::service::Limits;

/// Every endpoint of the budgets: the agent-facing `agent.budget.<op>.<agent>` and the
/// services' `_SB.budget.reserve|close`.
pub(crate) fn budget_endpoints(budgets: &Arc<Budgets>) -> Vec<Endpoint> {
    macro_rules! agent {
        ($op:expr, $name:literal, $body:ty, |$me:ident, $req:ident| $call:expr) => {{
            let held = Arc::clone(budgets);
            Endpoint::agent($name, $op.prefix(), move |$req: AgentRequest<$body>| {
                let $me = Arc::clone(&held);
                async move { $call.await.map_err(ErrorReply::from) }
            })
        }};
    }
    macro_rules! services {
        ($subject:expr, $name:literal, $body:ty, |$me:ident, $req:ident| $call:expr) => {{
            let held = Arc::clone(budgets);
            Endpoint::json($name, $subject.to_owned(), move |$req: $body| {
                let $me = Arc::clone(&held);
                async move { $call.await.map_err(ErrorReply::from) }
            })
        }};
    }
    vec![
        agent!(BudgetOp::Spend, "budget_spend", SpendRequest, |me, req| me
            .spend(&req.caller, req.body)),
        agent!(BudgetOp::Get, "budget_get", BudgetQuery, |me, req| me
            .get(&req.caller, req.body)),
        services!(
            BUDGET_RESERVE_SUBJECT,
            "budget_reserve",
            ReserveRequest,
            |me, req| me.reserve(req)
        ),
        services!(
            BUDGET_CLOSE_SUBJECT,
            "budget_close",
            CloseRequest,
            |me, req| me.close(req)
        ),
    ]
}

/// Every endpoint of the limits.
pub(crate) fn endpoints(limits: &Arc<Limits>) -> Vec<Endpoint> {
    macro_rules! agent {
        ($op:expr, $name:literal, $body:ty, |$me:ident, $req:ident| $call:expr) => {{
            let held = Arc::clone(limits);
            Endpoint::agent($name, $op.prefix(), move |$req: AgentRequest<$body>| {
                let $me = Arc::clone(&held);
                async move { $call.await.map_err(ErrorReply::from) }
            })
        }};
    }
    macro_rules! ops {
        ($op:expr, $name:literal, $body:ty, |$me:ident, $req:ident| $call:expr) => {{
            let held = Arc::clone(limits);
            Endpoint::json($name, $op.subject(), move |$req: $body| {
                let $me = Arc::clone(&held);
                async move { $call.await.map_err(ErrorReply::from) }
            })
        }};
    }
    vec![
        agent!(LimitsOp::Acquire, "acquire", AcquireRequest, |me, req| me
            .acquire(&req.caller, req.body)),
        agent!(LimitsOp::Release, "release", ReleaseRequest, |me, req| me
            .release(&req.caller, req.body)),
        agent!(LimitsOp::Renew, "renew", RenewRequest, |me, req| me
            .renew(&req.caller, req.body)),
        agent!(LimitsOp::Get, "get", LimitQuery, |me, req| me
            .get(&req.caller, req.body)),
        ops!(LimitsOpsOp::Set, "ops_set", LimitSpec, |me, req| me
            .set(req)),
        ops!(LimitsOpsOp::Delete, "ops_delete", LimitQuery, |me, req| me
            .delete(req)),
        {
            let held = Arc::clone(limits);
            Endpoint::json(
                "keeper_forward",
                limits.keeper_subject(),
                move |req: crate::keeper::Forward| {
                    let me = Arc::clone(&held);
                    async move { me.forwarded(req).await.map_err(ErrorReply::from) }
                },
            )
        },
        ops!(
            LimitsOpsOp::List,
            "ops_list",
            serde::de::IgnoredAny,
            |me, _req| me.list()
        ),
    ]
}
