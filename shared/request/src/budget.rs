//! What the services that make work (the correlator's calls, task-lifecycle's tasks) ask of
//! the budgets (docs/protocol.md §16): reserve a node when work starts, close it when it ends.
//! Both are idempotent at the limits service, so both are retried while nobody answers.

use std::time::Duration;

use async_nats::Client;
use switchboard_proto::budget::{
    BUDGET_CLOSE_SUBJECT, BUDGET_RESERVE_SUBJECT, BudgetAsk, BudgetGrant, CloseRequest,
    ReserveRequest,
};
use switchboard_proto::{AgentId, ErrorKind, ErrorReply, GoalId};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::request::{RequestFailure, request_json_retrying};

/// How long one reserve or close may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Where new work's budget comes from: the node it draws on (`root`, `parent`), or a new tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    /// The tree; for a new tree, the work's own id.
    pub root: Uuid,
    /// The node drawn on; none: a new tree.
    pub parent: Option<Uuid>,
}

/// Which budget work gets: the node its `ask` names; else its parent's (`inherited`, the tree
/// and node of the call or task it is made under, when that has a budget); else a new tree
/// when it asks for amounts, or the configured `default`; else none.
pub fn draw(
    work: Uuid,
    ask: Option<&BudgetAsk>,
    inherited: Option<(Uuid, Uuid)>,
    default: Option<BudgetAsk>,
) -> Option<(Draw, BudgetAsk)> {
    let ask = ask.cloned();
    if let Some((root, parent)) = ask.as_ref().and_then(BudgetAsk::from).or(inherited) {
        return Some((
            Draw {
                root,
                parent: Some(parent),
            },
            ask.unwrap_or_default(),
        ));
    }
    let ask = ask
        .filter(|a| a.tokens.is_some() || a.cost.is_some())
        .or(default)?;
    Some((
        Draw {
            root: work,
            parent: None,
        },
        ask,
    ))
}

/// Reserves `work`'s budget: the grant, or the service's error (`budget_exhausted`,
/// `not_allowed`, …); `unavailable` when no limits service answers.
pub async fn reserve(
    client: &Client,
    (draw, ask): (Draw, BudgetAsk),
    work: Uuid,
    (requester, requester_goal): (&AgentId, Option<GoalId>),
    owner: &AgentId,
    deadline: Option<OffsetDateTime>,
) -> Result<BudgetGrant, ErrorReply> {
    let request = ReserveRequest {
        root: draw.root,
        work,
        parent: draw.parent,
        requester: requester.clone(),
        requester_goal,
        owner: owner.clone(),
        tokens: ask.tokens,
        cost: ask.cost,
        deadline,
    };
    request_json_retrying(client, BUDGET_RESERVE_SUBJECT, &request, TIMEOUT, 2)
        .await
        .map_err(|failure| match failure {
            RequestFailure::Service(reply) => reply,
            other => ErrorReply::new(
                ErrorKind::Unavailable,
                format!("the budget could not be reserved: {other}"),
            ),
        })
}

/// Closes `work` in the background (its unspent share returns to its parent); a failure is
/// logged: the node ends by its deadline anyway, if it has one.
pub fn close(client: &Client, grant: &BudgetGrant) {
    let client = client.clone();
    let request = CloseRequest {
        root: grant.root,
        work: grant.work,
    };
    tokio::spawn(async move {
        // A tree busy with other writers answers `conflict`: a close is worth waiting for.
        let mut pause = Duration::from_millis(50);
        for attempt in 0..5 {
            let closed: Result<serde_json::Value, _> =
                request_json_retrying(&client, BUDGET_CLOSE_SUBJECT, &request, TIMEOUT, 5).await;
            match closed {
                Ok(_) => return,
                Err(RequestFailure::Service(reply))
                    if attempt < 4
                        && matches!(reply.kind(), ErrorKind::Conflict | ErrorKind::Unavailable) =>
                {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(err) => {
                    tracing::warn!(root = %request.root, work = %request.work, error = %err, "budget not closed");
                    return;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_draws_on_what_it_names_then_its_parent_then_a_new_tree_then_the_default() {
        let (work, root, parent) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let named = BudgetAsk {
            root: Some(root),
            parent: Some(parent),
            cost: Some(5),
            ..Default::default()
        };
        let (d, ask) = draw(work, Some(&named), None, None).unwrap();
        assert_eq!((d.root, d.parent, ask.cost), (root, Some(parent), Some(5)));
        let (d, _) = draw(work, None, Some((root, parent)), None).unwrap();
        assert_eq!(d.parent, Some(parent));
        let fresh = BudgetAsk {
            cost: Some(7),
            ..Default::default()
        };
        let (d, ask) = draw(work, Some(&fresh), None, None).unwrap();
        assert_eq!((d.root, d.parent, ask.cost), (work, None, Some(7)));
        assert!(draw(work, None, None, None).is_none());
        let default = BudgetAsk {
            tokens: Some(9),
            ..Default::default()
        };
        let (d, ask) = draw(work, None, None, Some(default)).unwrap();
        assert_eq!((d.root, ask.tokens), (work, Some(9)));
    }
}
