//! A budget tree and the rules that change it (docs/protocol.md §16), pure: no I/O, the
//! clock passed in. One tree per root piece of work, stored whole as one value, so every rule
//! sees every node at once and a compare-and-set on the value serialises the writers.
//!
//! A node's **charge** on its parent, per unit: while it runs, everything it was granted;
//! once it ended (closed, or past its deadline), what it and its subtree spent. A node's
//! **left** is its grant less its own spend less its children's charges. So a child is
//! granted at most what its parent has left, and what it did not spend returns when it ends.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use switchboard_proto::budget::{Amounts, BUDGET_AMOUNT_MAX, BUDGET_NODES_MAX, BudgetView};
use switchboard_proto::{AgentId, GoalId};
use uuid::Uuid;

/// One piece of work. Short field names: the whole tree is one stored value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// The node it draws from (none for the root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p: Option<Uuid>,
    /// The owner: who does the work and reports its spend.
    pub o: AgentId,
    /// The requester: who made the work.
    pub r: AgentId,
    /// Granted tokens (none: unbounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t: Option<u64>,
    /// Granted cost (none: unbounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub c: Option<u64>,
    /// Spent: tokens, cost.
    #[serde(default)]
    pub st: u64,
    /// Spent cost.
    #[serde(default)]
    pub sc: u64,
    /// Reported beyond what was left: tokens.
    #[serde(default)]
    pub ot: u64,
    /// Reported beyond what was left: cost.
    #[serde(default)]
    pub oc: u64,
    /// Spent by ended children folded into this node to make room (see [`Tree::prune`]):
    /// tokens.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kt: u64,
    /// The same, cost.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kc: u64,
    /// Closed.
    #[serde(default)]
    pub x: bool,
    /// Deadline, ms since the epoch: past it the node counts as ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Node {
    fn ended(&self, now_ms: u64) -> bool {
        self.x || self.d.is_some_and(|d| d <= now_ms)
    }
}

/// A tree: its root and every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    /// The root node's id.
    pub root: Uuid,
    /// The root requester's goal: where its exhaustion notice goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub g: Option<GoalId>,
    /// The exhaustion was told.
    #[serde(default)]
    pub told: bool,
    /// Every node, by id.
    pub n: BTreeMap<Uuid, Node>,
    /// Each node's children, built on first use (so a rule walks the tree in O(n), not
    /// O(n²)); reset when a node is added.
    #[serde(skip)]
    kids: std::sync::OnceLock<BTreeMap<Uuid, Vec<Uuid>>>,
}

/// Why a rule refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No such node in the tree.
    Unknown(String),
    /// The caller may not do this to the node.
    NotYours(String),
    /// The node ended.
    Ended(String),
    /// Nothing is left to grant.
    Exhausted(String),
    /// The tree holds the most nodes allowed.
    Full,
    /// The same id names other work already.
    Taken(String),
    /// An amount out of range.
    Bad(String),
}

/// A grant (new or found again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// Tokens granted.
    pub tokens: Option<u64>,
    /// Cost granted.
    pub cost: Option<u64>,
    /// An amount was cut to what the parent had left.
    pub cut: bool,
    /// The node existed already (a retry): nothing changed.
    pub again: bool,
}

/// What a spend did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charged {
    /// Charged.
    pub charged: Amounts,
    /// Reported beyond what was left.
    pub over: Amounts,
    /// This spend exhausted the tree, and nobody was told before: tell now.
    pub tell: bool,
}

fn unit(node: &Node, tokens: bool) -> Option<u64> {
    if tokens { node.t } else { node.c }
}

/// What `node` and its folded children spent, in one unit.
fn spent(node: &Node, tokens: bool) -> u64 {
    if tokens {
        node.st.saturating_add(node.kt)
    } else {
        node.sc.saturating_add(node.kc)
    }
}

impl Tree {
    /// A new tree whose root is `work`.
    pub fn new(work: Uuid, root: Node, goal: Option<GoalId>) -> Self {
        Self {
            root: work,
            g: goal,
            told: false,
            n: BTreeMap::from([(work, root)]),
            kids: std::sync::OnceLock::new(),
        }
    }

    fn children(&self, of: Uuid) -> impl Iterator<Item = (&Uuid, &Node)> {
        let kids = self.kids.get_or_init(|| {
            let mut kids: BTreeMap<Uuid, Vec<Uuid>> = BTreeMap::new();
            for (id, node) in &self.n {
                if let Some(parent) = node.p {
                    kids.entry(parent).or_default().push(*id);
                }
            }
            kids
        });
        kids.get(&of)
            .into_iter()
            .flatten()
            .filter_map(|id| self.n.get_key_value(id))
    }

    /// What `id` weighs on its parent in one unit (see the module doc). The recursion is as
    /// deep as the tree, at most [`BUDGET_NODES_MAX`] nodes (calls made under tasks made under
    /// calls are bound by no depth limit of their own).
    fn charge(&self, id: Uuid, tokens: bool, now_ms: u64) -> u64 {
        let Some(node) = self.n.get(&id) else {
            return 0;
        };
        match (node.ended(now_ms), unit(node, tokens)) {
            (false, Some(granted)) => granted,
            _ => self
                .children(id)
                .fold(spent(node, tokens), |sum, (child, _)| {
                    sum.saturating_add(self.charge(*child, tokens, now_ms))
                }),
        }
    }

    fn held_by_children(&self, id: Uuid, tokens: bool, now_ms: u64) -> u64 {
        self.children(id).fold(0u64, |sum, (child, _)| {
            sum.saturating_add(self.charge(*child, tokens, now_ms))
        })
    }

    /// What `id` has left in one unit (`None`: unbounded).
    fn left(&self, id: Uuid, tokens: bool, now_ms: u64) -> Option<u64> {
        let node = self.n.get(&id)?;
        let granted = unit(node, tokens)?;
        Some(
            granted
                .saturating_sub(spent(node, tokens))
                .saturating_sub(self.held_by_children(id, tokens, now_ms)),
        )
    }

    /// Spent in the whole tree, per unit (folded children's spend included).
    pub fn spent_total(&self) -> Amounts {
        self.n.values().fold(Amounts::default(), |sum, n| Amounts {
            tokens: sum.tokens.saturating_add(spent(n, true)),
            cost: sum.cost.saturating_add(spent(n, false)),
        })
    }

    /// Makes room in a full tree: every ended piece of work with no children left (never the
    /// root) is removed and what it spent folded into its parent, until none is left. What
    /// the tree spent and what each node has left do not change; a retry of removed work is
    /// new work. `true` when it removed any.
    pub fn prune(&mut self, now_ms: u64) -> bool {
        let mut removed = false;
        loop {
            let parents: std::collections::BTreeSet<Uuid> =
                self.n.values().filter_map(|n| n.p).collect();
            let leaves: Vec<Uuid> = self
                .n
                .iter()
                .filter(|(id, n)| **id != self.root && n.ended(now_ms) && !parents.contains(id))
                .map(|(id, _)| *id)
                .collect();
            if leaves.is_empty() {
                break;
            }
            for id in leaves {
                let Some(leaf) = self.n.remove(&id) else {
                    continue;
                };
                if let Some(parent) = leaf.p.and_then(|p| self.n.get_mut(&p)) {
                    parent.kt = parent.kt.saturating_add(spent(&leaf, true));
                    parent.kc = parent.kc.saturating_add(spent(&leaf, false));
                }
            }
            removed = true;
        }
        if removed {
            self.kids = std::sync::OnceLock::new();
        }
        removed
    }

    /// The tree has spent its budget in a unit it bounds.
    pub fn exhausted(&self) -> bool {
        let Some(root) = self.n.get(&self.root) else {
            return false;
        };
        let spent = self.spent_total();
        root.t.is_some_and(|t| spent.tokens >= t) || root.c.is_some_and(|c| spent.cost >= c)
    }

    /// Reserves a child `work` of `parent` for `requester` (who must own `parent`), owned by
    /// `owner`, asking for `tokens`/`cost` (none: all the parent has left). A retry (the same
    /// work under the same parent for the same owner) gets its first grant again.
    pub fn reserve(
        &mut self,
        work: Uuid,
        parent: Uuid,
        requester: &AgentId,
        child: Node,
        now_ms: u64,
    ) -> Result<Granted, Refusal> {
        if let Some(found) = self.n.get(&work) {
            if found.p == Some(parent) && found.o == child.o && found.r == *requester {
                return Ok(Granted {
                    tokens: found.t,
                    cost: found.c,
                    cut: false,
                    again: true,
                });
            }
            return Err(Refusal::Taken(format!(
                "work {work} has a budget in this tree already"
            )));
        }
        let Some(from) = self.n.get(&parent) else {
            return Err(Refusal::Unknown(format!(
                "no work {parent} in budget tree {}",
                self.root
            )));
        };
        if from.o != *requester {
            return Err(Refusal::NotYours(format!(
                "work {parent} is `{}`'s; only its owner may draw on its budget",
                from.o
            )));
        }
        if from.ended(now_ms) {
            return Err(Refusal::Ended(format!(
                "work {parent} has ended; nothing more may draw on its budget"
            )));
        }
        // (A running parent is never pruned.)
        let parent_deadline = from.d;
        if self.n.len() >= BUDGET_NODES_MAX
            && !(self.prune(now_ms) && self.n.len() < BUDGET_NODES_MAX)
        {
            return Err(Refusal::Full);
        }
        let mut cut = false;
        let mut grant = [child.t, child.c];
        for (slot, tokens) in grant.iter_mut().zip([true, false]) {
            let Some(left) = self.left(parent, tokens, now_ms) else {
                continue;
            };
            let name = if tokens { "tokens" } else { "cost" };
            if left == 0 {
                return Err(Refusal::Exhausted(format!(
                    "work {parent} has no {name} left to hand down (budget tree {})",
                    self.root
                )));
            }
            let asked = slot.unwrap_or(left);
            cut |= asked > left;
            *slot = Some(asked.min(left));
        }
        let [t, c] = grant;
        // A child never outlives what it draws on: past its parent's deadline its share
        // returns too.
        let d = match (child.d, parent_deadline) {
            (Some(own), Some(theirs)) => Some(own.min(theirs)),
            (own, theirs) => own.or(theirs),
        };
        self.kids = std::sync::OnceLock::new();
        self.n.insert(
            work,
            Node {
                p: Some(parent),
                t,
                c,
                d,
                ..child
            },
        );
        Ok(Granted {
            tokens: t,
            cost: c,
            cut,
            again: false,
        })
    }

    /// Charges what `by` (the owner of `work`) spent, up to what `work` has left.
    pub fn spend(
        &mut self,
        work: Uuid,
        by: &AgentId,
        amounts: Amounts,
        now_ms: u64,
    ) -> Result<Charged, Refusal> {
        if amounts == Amounts::default() {
            return Err(Refusal::Bad(
                "a spend names `tokens` or `cost` above 0".to_owned(),
            ));
        }
        if amounts.tokens > BUDGET_AMOUNT_MAX || amounts.cost > BUDGET_AMOUNT_MAX {
            return Err(Refusal::Bad(format!(
                "a spend is at most {BUDGET_AMOUNT_MAX} of each unit"
            )));
        }
        let node = self.node_of(work, by)?;
        if node.ended(now_ms) {
            return Err(Refusal::Ended(format!(
                "work {work} has ended; report spend before it ends"
            )));
        }
        let mut charged = Amounts::default();
        let mut over = Amounts::default();
        for tokens in [true, false] {
            let asked = if tokens { amounts.tokens } else { amounts.cost };
            let take = match self.left(work, tokens, now_ms) {
                Some(left) => asked.min(left),
                None => asked,
            };
            let (c, o) = if tokens {
                (&mut charged.tokens, &mut over.tokens)
            } else {
                (&mut charged.cost, &mut over.cost)
            };
            *c = take;
            *o = asked - take;
        }
        let was = self.exhausted();
        if let Some(node) = self.n.get_mut(&work) {
            node.st = node.st.saturating_add(charged.tokens);
            node.sc = node.sc.saturating_add(charged.cost);
            node.ot = node.ot.saturating_add(over.tokens);
            node.oc = node.oc.saturating_add(over.cost);
        }
        let tell = !was && !self.told && self.exhausted();
        if tell {
            self.told = true;
        }
        Ok(Charged {
            charged,
            over,
            tell,
        })
    }

    fn node_of(&self, work: Uuid, by: &AgentId) -> Result<&Node, Refusal> {
        let node = self.n.get(&work).ok_or_else(|| {
            Refusal::Unknown(format!("no work {work} in budget tree {}", self.root))
        })?;
        if node.o != *by {
            return Err(Refusal::NotYours(format!(
                "work {work} is `{}`'s; only its owner reports its spend",
                node.o
            )));
        }
        Ok(node)
    }

    /// Ends `work`: what it did not spend returns to its parent. `true` when it changed.
    pub fn close(&mut self, work: Uuid) -> bool {
        match self.n.get_mut(&work) {
            Some(node) if !node.x => {
                node.x = true;
                true
            }
            _ => false,
        }
    }

    /// Every node has ended: the tree may be removed.
    pub fn finished(&self, now_ms: u64) -> bool {
        self.n.values().all(|n| n.ended(now_ms))
    }

    /// The owners of the nodes still running (told when the tree runs out).
    pub fn running_owners(&self, now_ms: u64) -> Vec<AgentId> {
        let mut owners: Vec<AgentId> = self
            .n
            .values()
            .filter(|n| !n.ended(now_ms))
            .map(|n| n.o.clone())
            .collect();
        owners.sort();
        owners.dedup();
        owners
    }

    /// `work` as its owner or requester sees it.
    pub fn view(&self, work: Uuid, now_ms: u64) -> Option<BudgetView> {
        let node = self.n.get(&work)?;
        let root = self.n.get(&self.root)?;
        let both = |f: &dyn Fn(bool) -> u64| Amounts {
            tokens: f(true),
            cost: f(false),
        };
        Some(BudgetView {
            root: self.root,
            work,
            owner: node.o.clone(),
            tokens: node.t,
            cost: node.c,
            spent: Amounts {
                tokens: node.st,
                cost: node.sc,
            },
            children: both(&|t| self.held_by_children(work, t, now_ms)),
            left: both(&|t| self.left(work, t, now_ms).unwrap_or(0)),
            over: Amounts {
                tokens: node.ot,
                cost: node.oc,
            },
            ended: node.ended(now_ms),
            exhausted: self.exhausted(),
            tree_budget: Amounts {
                tokens: root.t.unwrap_or(0),
                cost: root.c.unwrap_or(0),
            },
            tree_spent: self.spent_total(),
        })
    }
}

#[cfg(test)]
#[path = "tree/tests.rs"]
mod tests;
