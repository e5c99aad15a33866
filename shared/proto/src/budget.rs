//! Cost budgets that flow down a conversation (docs/protocol.md §16). A call or a task may
//! carry a budget — tokens and/or cost, an integer number of micro-units of the one currency
//! the fabric is configured with. Work made while serving it (sub-calls, subtasks) draws from
//! it: a child's budget is reserved from what its parent has left when the child starts and
//! returned, less what the child spent, when it ends. The work's **owner** (the callee, the
//! assignee) reports what it spends; when the whole tree has spent its budget, new sub-work is
//! refused with `budget_exhausted` and the root's requester and every running owner are told
//! once.
//!
//! One budget **tree** per root piece of work; each piece of work in it (a call's
//! `correlation_id`, a task's `task_id`) is a **node**. An agent names a node by `{root,
//! work}`, both of which it reads from `metadata.budget` of the message that gave it the work
//! ([`BudgetGrant`]).
//!
//! Agent side: `agent.budget.<op>.<agent_id>` ([`BudgetOp`]). Services only:
//! `_SB.budget.reserve` and `_SB.budget.close` ([`ReserveRequest`], [`CloseRequest`]).

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::ids::{AgentId, GoalId};

/// Largest amount of tokens or cost any budget, spend or cap may name (10^15: a billion
/// units of the currency in micro-units).
pub const BUDGET_AMOUNT_MAX: u64 = 1_000_000_000_000_000;
/// Most pieces of work one budget tree holds (the whole tree is one stored record).
pub const BUDGET_NODES_MAX: usize = 512;
/// Prefix of the agent-facing budget endpoints: `agent.budget.<op>.<agent_id>`.
pub const BUDGET_PREFIX: &str = "agent.budget";
/// Prefix of budget events: `agent.budget.events.<event>.<root>` (published by the limits
/// service, stored in `AGENT_EVENTS`).
pub const BUDGET_EVENTS_PREFIX: &str = "agent.budget.events";
/// The key `metadata.budget` carries in a request or task message.
pub const BUDGET_METADATA_KEY: &str = "budget";

/// An agent-facing budget request: `agent.budget.<op>.<agent_id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetOp {
    /// Report what the caller spent on work it owns ([`SpendRequest`] → [`BudgetView`]).
    Spend,
    /// Read a node and its tree ([`BudgetQuery`] → [`BudgetView`]): its owner or requester.
    Get,
}

impl BudgetOp {
    /// Every op, for the endpoint table and the NATS exports.
    pub const ALL: [Self; 2] = [Self::Spend, Self::Get];

    /// The op's token after `agent.budget`.
    pub fn token(self) -> &'static str {
        match self {
            Self::Spend => "spend",
            Self::Get => "get",
        }
    }

    /// `agent.budget.<op>`.
    pub fn prefix(self) -> String {
        format!("{}.{}", BUDGET_PREFIX, self.token())
    }

    /// `agent.budget.<op>.<agent>`.
    pub fn subject(self, agent: &AgentId) -> String {
        format!("{}.{agent}", self.prefix())
    }
}

/// `_SB.budget.reserve`: the services' subject for opening a root budget or reserving a
/// child's from its parent.
pub const BUDGET_RESERVE_SUBJECT: &str = "_SB.budget.reserve";
/// `_SB.budget.close`: the services' subject for ending a node (its unspent share returns).
pub const BUDGET_CLOSE_SUBJECT: &str = "_SB.budget.close";

/// The budget a `CallRequest` or `CreateTask` asks for (`budget`). Without `root`/`parent`,
/// the work draws from the budget of the call or task it is made under
/// (`parent_correlation_id`, `parent_task_id`) when that one has a budget, else it opens a
/// new tree with these amounts. With them, it draws from that node (which the caller must
/// own): a call made while serving a task, a task made while serving a call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetAsk {
    /// Tokens: a new tree's total, or the most a child reserves (default: all its parent has
    /// left). 1–10^15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Cost in micro-units of the fabric's currency, like `tokens`. 1–10^15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// The tree to draw from (with `parent`): `metadata.budget.root` of the work being served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<Uuid>,
    /// The node to draw from (with `root`): `metadata.budget.work` of the work being served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
}

impl BudgetAsk {
    /// Checks the amounts and that `root` and `parent` come together.
    pub fn check(&self) -> Result<(), String> {
        for (name, amount) in [("tokens", self.tokens), ("cost", self.cost)] {
            if let Some(amount) = amount
                && !(1..=BUDGET_AMOUNT_MAX).contains(&amount)
            {
                return Err(format!(
                    "`budget.{name}` is {amount}; it must be 1..={BUDGET_AMOUNT_MAX}"
                ));
            }
        }
        if self.root.is_some() != self.parent.is_some() {
            return Err("`budget.root` and `budget.parent` come together".to_owned());
        }
        Ok(())
    }

    /// The node named to draw from, if any.
    pub fn from(&self) -> Option<(Uuid, Uuid)> {
        self.root.zip(self.parent)
    }
}

/// What a piece of work was granted: carried as `metadata.budget` in the request or task
/// message its owner receives, and returned to the services that asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BudgetGrant {
    /// The tree: the id of its root piece of work.
    pub root: Uuid,
    /// This piece of work (the call's `correlation_id`, the task's `task_id`).
    pub work: Uuid,
    /// Tokens granted; absent: no token bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Cost granted, in micro-units; absent: no cost bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// `true` when an amount was cut: to what the parent had left, or to the per-agent cap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
}

/// `_SB.budget.reserve` (services only): open a root (no `parent`) or reserve a child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReserveRequest {
    /// The tree (for a root: its own id, `work`).
    pub root: Uuid,
    /// The new piece of work.
    pub work: Uuid,
    /// The node it draws from; absent for a root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
    /// Who made the work (the caller, the requester): must own `parent`.
    pub requester: AgentId,
    /// The requester's goal (a root's exhaustion notice goes there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester_goal: Option<GoalId>,
    /// Who does the work (the callee, the assignee): the one who reports its spend.
    pub owner: AgentId,
    /// Tokens asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Cost asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// When the work ends at the latest (a call's or task's deadline): past it, its unspent
    /// share returns even if nobody closes it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    #[schemars(with = "Option<String>")]
    pub deadline: Option<OffsetDateTime>,
}

/// `_SB.budget.close` (services only): the work ended. Safe to repeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloseRequest {
    /// The tree.
    pub root: Uuid,
    /// The piece of work that ended.
    pub work: Uuid,
}

/// `agent.budget.spend.<me>`: what the caller spent on work it owns. Amounts are charged up
/// to what the work has left; the rest is recorded as `over_*`, never charged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpendRequest {
    /// The tree (`metadata.budget.root`).
    pub root: Uuid,
    /// The work (`metadata.budget.work`).
    pub work: Uuid,
    /// Tokens spent (0–10^15).
    #[serde(default)]
    pub tokens: u64,
    /// Cost spent, in micro-units (0–10^15).
    #[serde(default)]
    pub cost: u64,
}

/// `agent.budget.get.<me>`: a node, for its owner or its requester.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetQuery {
    /// The tree.
    pub root: Uuid,
    /// The work.
    pub work: Uuid,
}

/// Amounts in both units.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Amounts {
    /// Tokens.
    pub tokens: u64,
    /// Cost, in micro-units.
    pub cost: u64,
}

/// A node as its owner sees it: what it was granted, spent, holds for its children, and has
/// left; and its tree's totals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BudgetView {
    /// The tree.
    pub root: Uuid,
    /// The work.
    pub work: Uuid,
    /// Who does the work.
    pub owner: AgentId,
    /// Granted tokens; absent: unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Granted cost; absent: unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// Spent by this work itself.
    pub spent: Amounts,
    /// Held by its children still running, plus what its ended children spent.
    pub children: Amounts,
    /// Left to spend or hand down (for an unbounded unit: 0, ignore it).
    pub left: Amounts,
    /// Reported beyond what was left, and so not charged.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub over: Amounts,
    /// The work has ended (closed, or past its deadline).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended: bool,
    /// The whole tree has spent its budget.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exhausted: bool,
    /// The tree's budget (its root's grant).
    pub tree_budget: Amounts,
    /// Spent in the whole tree.
    pub tree_spent: Amounts,
}

fn is_zero(amounts: &Amounts) -> bool {
    *amounts == Amounts::default()
}

/// A budget event, `agent.budget.events.<event>.<root>` (stored in `AGENT_EVENTS`, recorded
/// by the audit as `budget.<event>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BudgetEvent {
    /// `opened`, `reserved`, `spent` or `exhausted` (`closed` in events stored before closing
    /// stopped publishing one: docs/protocol.md, migration item 138).
    pub event: String,
    /// The tree.
    pub root: Uuid,
    /// The work it concerns (for `exhausted`: the work whose spend exhausted the tree).
    pub work: Uuid,
    /// The work's parent node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
    /// The work's owner.
    pub agent_id: AgentId,
    /// Who made the work (`opened`, `reserved`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester: Option<AgentId>,
    /// `opened`/`reserved`: granted tokens; `spent`: tokens charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// `opened`/`reserved`: granted cost; `spent`: cost charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// `spent`: reported beyond what was left, not charged.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub over: Amounts,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "String")]
    pub at: OffsetDateTime,
}

impl BudgetEvent {
    /// `agent.budget.events.<event>.<root>`.
    pub fn subject(&self) -> String {
        format!("{}.{}.{}", BUDGET_EVENTS_PREFIX, self.event, self.root)
    }
}

/// `agent.audit.cost`: a tree's cost as the audit recorded it, or one agent's trees.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CostQuery {
    /// The tree (its root's id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<Uuid>,
    /// Instead: every tree this agent spent in (its newest 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

/// One piece of work in a cost tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CostNode {
    /// The work.
    pub work: Uuid,
    /// Its parent node; absent for the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
    /// Who did it.
    pub agent_id: String,
    /// What it was granted (0: unbounded or not recorded).
    pub granted: Amounts,
    /// What it spent itself.
    pub spent: Amounts,
    /// Reported beyond what it had left.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub over: Amounts,
}

/// One agent's spend in one tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentCost {
    /// The tree.
    pub root: Uuid,
    /// The agent.
    pub agent_id: String,
    /// What it spent there.
    pub spent: Amounts,
}

/// `agent.audit.cost`'s reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CostReport {
    /// The tree asked for: every node, parents before children.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<CostNode>,
    /// What each agent spent: in the tree asked for, or in each tree of the agent asked for.
    pub agents: Vec<AgentCost>,
    /// The total spent (the tree's, or the agent's over the trees listed).
    pub total: Amounts,
    /// The tree's budget (its root's grant), when a tree was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Amounts>,
    /// The tree ran out (an `exhausted` event was recorded).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exhausted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ask_checks_its_amounts_and_its_pair() {
        assert!(BudgetAsk::default().check().is_ok());
        let zero = BudgetAsk {
            cost: Some(0),
            ..Default::default()
        };
        assert!(zero.check().is_err());
        let huge = BudgetAsk {
            tokens: Some(BUDGET_AMOUNT_MAX + 1),
            ..Default::default()
        };
        assert!(huge.check().is_err());
        let half = BudgetAsk {
            root: Some(Uuid::nil()),
            ..Default::default()
        };
        assert!(half.check().is_err());
        let from: BudgetAsk = serde_json::from_str(&format!(
            r#"{{"root":"{0}","parent":"{0}","cost":5}}"#,
            Uuid::nil()
        ))
        .unwrap();
        assert_eq!(from.from(), Some((Uuid::nil(), Uuid::nil())));
        assert!(serde_json::from_str::<BudgetAsk>(r#"{"cost":-1}"#).is_err());
        assert!(serde_json::from_str::<BudgetAsk>(r#"{"dollars":1}"#).is_err());
    }
}
