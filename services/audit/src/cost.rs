//! `agent.audit.cost` (docs/protocol.md §16): a budget tree's cost as the trail recorded it —
//! every piece of work, what it was granted and spent, and what each agent spent — or one
//! agent's spend per tree. Folded from the tree's `budget.*` records, which carry the tree's
//! root id as their correlation id.

use std::collections::BTreeMap;

use switchboard_proto::audit::AuditEntry;
use switchboard_proto::budget::{AgentCost, Amounts, BudgetEvent, CostNode, CostReport};
use uuid::Uuid;

/// Most trees an agent's report lists (its newest).
pub const AGENT_TREES_MAX: usize = 100;
/// Most `budget.spent` records an agent's report reads.
pub const AGENT_SPENDS_MAX: usize = 10_000;

fn add(sum: &mut Amounts, tokens: u64, cost: u64) {
    sum.tokens = sum.tokens.saturating_add(tokens);
    sum.cost = sum.cost.saturating_add(cost);
}

fn event(entry: &AuditEntry) -> Option<BudgetEvent> {
    serde_json::from_value(entry.record.payload.clone()).ok()
}

/// A tree's report from its records, in trail order.
pub fn tree(root: Uuid, entries: &[AuditEntry]) -> CostReport {
    let mut nodes: Vec<CostNode> = Vec::new();
    let mut at: BTreeMap<Uuid, usize> = BTreeMap::new();
    let mut report = CostReport::default();
    let mut granted = std::collections::BTreeSet::new();
    for event in entries.iter().filter_map(event).filter(|e| e.root == root) {
        let slot = *at.entry(event.work).or_insert_with(|| {
            nodes.push(CostNode {
                work: event.work,
                parent: event.parent,
                agent_id: event.agent_id.to_string(),
                granted: Amounts::default(),
                spent: Amounts::default(),
                over: Amounts::default(),
            });
            nodes.len() - 1
        });
        let node = &mut nodes[slot];
        match event.event.as_str() {
            // The first grant counts: a root id opened again later (a reused task id) does
            // not rewrite what the tree was given.
            "opened" | "reserved" if !granted.contains(&event.work) => {
                granted.insert(event.work);
                node.granted = Amounts {
                    tokens: event.tokens.unwrap_or(0),
                    cost: event.cost.unwrap_or(0),
                };
                node.parent = event.parent;
                if event.event == "opened" {
                    report.budget = Some(node.granted);
                }
            }
            "spent" => {
                add(
                    &mut node.spent,
                    event.tokens.unwrap_or(0),
                    event.cost.unwrap_or(0),
                );
                add(&mut node.over, event.over.tokens, event.over.cost);
            }
            "exhausted" => report.exhausted = true,
            _ => {}
        }
    }
    let mut agents: BTreeMap<String, Amounts> = BTreeMap::new();
    for node in &nodes {
        add(&mut report.total, node.spent.tokens, node.spent.cost);
        let sum = agents.entry(node.agent_id.clone()).or_default();
        add(sum, node.spent.tokens, node.spent.cost);
    }
    report.agents = agents
        .into_iter()
        .map(|(agent_id, spent)| AgentCost {
            root,
            agent_id,
            spent,
        })
        .collect();
    report.nodes = nodes;
    report
}

/// One agent's spend per tree from its `budget.spent` records (newest first): its newest
/// [`AGENT_TREES_MAX`] trees.
pub fn agent(agent_id: &str, entries: &[AuditEntry]) -> CostReport {
    let mut order: Vec<Uuid> = Vec::new();
    let mut trees: BTreeMap<Uuid, Amounts> = BTreeMap::new();
    for event in entries.iter().filter_map(event) {
        if !trees.contains_key(&event.root) {
            if order.len() == AGENT_TREES_MAX {
                continue;
            }
            order.push(event.root);
        }
        let sum = trees.entry(event.root).or_default();
        add(sum, event.tokens.unwrap_or(0), event.cost.unwrap_or(0));
    }
    let mut report = CostReport::default();
    for root in order {
        let spent = trees.get(&root).copied().unwrap_or_default();
        add(&mut report.total, spent.tokens, spent.cost);
        report.agents.push(AgentCost {
            root,
            agent_id: agent_id.to_owned(),
            spent,
        });
    }
    report
}
