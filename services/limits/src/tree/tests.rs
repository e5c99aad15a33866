use super::*;

fn agent(id: &str) -> AgentId {
    AgentId::parse(id).unwrap()
}

fn node(owner: &str, requester: &str, tokens: Option<u64>, cost: Option<u64>) -> Node {
    Node {
        p: None,
        o: agent(owner),
        r: agent(requester),
        t: tokens,
        c: cost,
        st: 0,
        sc: 0,
        ot: 0,
        oc: 0,
        kt: 0,
        kc: 0,
        x: false,
        d: None,
    }
}

fn id(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn cost(amount: u64) -> Amounts {
    Amounts {
        tokens: 0,
        cost: amount,
    }
}

/// A root of $1.00 (10^6 micro-units) owned by `a`, asked for by `user`.
fn dollar() -> Tree {
    Tree::new(id(1), node("a", "user", None, Some(1_000_000)), None)
}

#[test]
fn a_child_gets_at_most_what_its_parent_has_left_and_returns_the_rest() {
    let mut tree = dollar();
    let half = tree
        .reserve(
            id(2),
            id(1),
            &agent("a"),
            node("b", "a", None, Some(600_000)),
            0,
        )
        .unwrap();
    assert_eq!(half.cost, Some(600_000));
    // The parent has 400,000 left: a second child asking for all is cut to it.
    let rest = tree
        .reserve(id(3), id(1), &agent("a"), node("c", "a", None, None), 0)
        .unwrap();
    assert_eq!((rest.cost, rest.cut), (Some(400_000), false));
    let none = tree.reserve(id(4), id(1), &agent("a"), node("d", "a", None, None), 0);
    assert!(matches!(none, Err(Refusal::Exhausted(_))), "{none:?}");
    // `b` spends 100,000 and ends: 500,000 returns to `a`.
    tree.spend(id(2), &agent("b"), cost(100_000), 0).unwrap();
    assert!(tree.close(id(2)));
    assert_eq!(tree.view(id(1), 0).unwrap().left.cost, 500_000);
    // A node past its deadline returns its share even unclosed.
    tree.n.get_mut(&id(3)).unwrap().d = Some(10);
    assert_eq!(tree.view(id(1), 11).unwrap().left.cost, 900_000);
}

#[test]
fn only_the_owner_draws_or_spends_and_never_past_what_is_left() {
    let mut tree = dollar();
    let stranger = tree.reserve(
        id(2),
        id(1),
        &agent("mallory"),
        node("m", "mallory", None, None),
        0,
    );
    assert!(
        matches!(stranger, Err(Refusal::NotYours(_))),
        "{stranger:?}"
    );
    let spend = tree.spend(id(1), &agent("mallory"), cost(1), 0);
    assert!(matches!(spend, Err(Refusal::NotYours(_))), "{spend:?}");
    let absurd = tree.spend(id(1), &agent("a"), cost(BUDGET_AMOUNT_MAX + 1), 0);
    assert!(matches!(absurd, Err(Refusal::Bad(_))), "{absurd:?}");
    // Spend past what is left is charged to the last micro-unit, the rest recorded as over,
    // and it tells once.
    let charged = tree.spend(id(1), &agent("a"), cost(1_500_000), 0).unwrap();
    assert_eq!(charged.charged.cost, 1_000_000);
    assert_eq!(charged.over.cost, 500_000);
    assert!(charged.tell);
    assert!(tree.exhausted());
    assert!(!tree.spend(id(1), &agent("a"), cost(1), 0).unwrap().tell);
    assert_eq!(tree.spent_total().cost, 1_000_000);
}

#[test]
fn a_retry_finds_its_grant_and_another_use_of_the_id_is_refused() {
    let mut tree = dollar();
    let first = tree
        .reserve(id(2), id(1), &agent("a"), node("b", "a", None, Some(10)), 0)
        .unwrap();
    let again = tree
        .reserve(id(2), id(1), &agent("a"), node("b", "a", None, Some(99)), 0)
        .unwrap();
    assert!(again.again);
    assert_eq!(again.cost, first.cost);
    let other = tree.reserve(id(2), id(1), &agent("a"), node("z", "a", None, None), 0);
    assert!(matches!(other, Err(Refusal::Taken(_))), "{other:?}");
}

/// A tree of [`BUDGET_NODES_MAX`] nodes, all running: the root's children.
fn full_of_running_work() -> Tree {
    let mut tree = Tree::new(id(1), node("a", "user", Some(u64::MAX), None), None);
    for n in 2..=BUDGET_NODES_MAX as u128 {
        tree.reserve(id(n), id(1), &agent("a"), node("b", "a", Some(1), None), 0)
            .unwrap();
    }
    tree
}

#[test]
fn an_ended_parent_hands_down_nothing_and_the_tree_is_bounded() {
    let mut tree = dollar();
    tree.close(id(1));
    let late = tree.reserve(id(2), id(1), &agent("a"), node("b", "a", None, Some(1)), 0);
    assert!(matches!(late, Err(Refusal::Ended(_))), "{late:?}");
    let mut wide = full_of_running_work();
    let full = wide.reserve(
        id(9_999),
        id(1),
        &agent("a"),
        node("b", "a", Some(1), None),
        0,
    );
    assert_eq!(full, Err(Refusal::Full));
}

/// A full tree makes room from ended work: a hostile owner filling its tree with closed
/// sub-work blocks no one, what was spent stays counted, and running work is never removed.
#[test]
fn a_full_tree_folds_ended_work_into_its_parent() {
    let mut tree = dollar();
    // 511 children of the root, each spending 1,000 of a 1,500 share; all but one ended.
    tree.reserve(
        id(2),
        id(1),
        &agent("a"),
        node("b", "a", None, Some(900_000)),
        0,
    )
    .unwrap();
    for n in 3..=BUDGET_NODES_MAX as u128 {
        let owner = format!("w{n}");
        tree.reserve(
            id(n),
            id(2),
            &agent("b"),
            node(&owner, "b", None, Some(1_500)),
            0,
        )
        .unwrap();
        tree.spend(id(n), &agent(&owner), cost(1_000), 0).unwrap();
        if n != 3 {
            tree.close(id(n));
        }
    }
    assert_eq!(tree.n.len(), BUDGET_NODES_MAX);
    let spent = tree.spent_total();
    let left = tree.left(id(2), false, 0);
    let again = tree
        .reserve(
            id(9_999),
            id(2),
            &agent("b"),
            node("z", "b", None, Some(1)),
            0,
        )
        .unwrap();
    assert_eq!(again.cost, Some(1));
    // The ended children went; the running one and the new one stayed.
    assert_eq!(tree.n.len(), 4, "{:?}", tree.n.keys().collect::<Vec<_>>());
    assert!(tree.n.contains_key(&id(3)));
    assert_eq!(tree.spent_total(), spent);
    assert_eq!(tree.left(id(2), false, 0), left.map(|l| l - 1));
    // A retry of removed work is new work: it draws again from what is left.
    let retried = tree
        .reserve(
            id(4),
            id(2),
            &agent("b"),
            node("w4", "b", None, Some(10)),
            0,
        )
        .unwrap();
    assert!(!retried.again);
    // A tree whose every node runs stays full.
    let mut busy = full_of_running_work();
    let full = busy.reserve(
        id(9_999),
        id(1),
        &agent("a"),
        node("b", "a", Some(1), None),
        0,
    );
    assert_eq!(full, Err(Refusal::Full));
}

proptest::proptest! {
    /// Whatever agents reserve, spend and close, in whatever order, the tree never spends more
    /// than its root was granted, and no node more than it was granted.
    #[test]
    fn a_tree_never_spends_past_its_budget(ops in proptest::collection::vec((0u8..3, 0u128..12, 0u128..12, 0u64..400_000), 1..200)) {
        let mut tree = dollar();
        let owner = |n: u128| agent(&format!("w{n}"));
        tree.n.get_mut(&id(1)).unwrap().o = owner(1);
        for (op, work, parent, amount) in ops {
            let (work, parent) = (work + 1, parent + 1);
            match op {
                0 if work == 12 => { tree.prune(0); }
                0 => { let _ = tree.reserve(id(work), id(parent), &owner(parent), node(&format!("w{work}"), &format!("w{parent}"), None, Some(amount.max(1))), 0); }
                1 => { let _ = tree.spend(id(work), &owner(work), cost(amount), 0); }
                _ => { tree.close(id(work)); }
            }
            proptest::prop_assert!(tree.spent_total().cost <= 1_000_000);
            for n in tree.n.values() {
                proptest::prop_assert!(n.sc <= n.c.unwrap_or(u64::MAX));
            }
        }
    }
}

#[test]
fn a_child_ends_no_later_than_what_it_draws_on() {
    let mut tree = dollar();
    tree.n.get_mut(&id(1)).unwrap().d = Some(100);
    // No deadline of its own (a task drawing on a call): it ends with its parent.
    tree.reserve(id(2), id(1), &agent("a"), node("b", "a", None, Some(10)), 0)
        .unwrap();
    assert_eq!(tree.n[&id(2)].d, Some(100));
    let mut late = node("c", "a", None, Some(10));
    late.d = Some(500);
    tree.reserve(id(3), id(1), &agent("a"), late, 0).unwrap();
    assert_eq!(tree.n[&id(3)].d, Some(100));
    let spend = tree.spend(id(2), &agent("b"), cost(1), 101);
    assert!(matches!(spend, Err(Refusal::Ended(_))), "{spend:?}");
}
