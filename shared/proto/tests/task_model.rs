//! Property test: random operation sequences against a reference model of the task state
//! machine (docs/protocol.md §10), written independently as a table of legal moves.

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashMap;

use proptest::prelude::*;
use switchboard_proto::TaskState as S;
use switchboard_proto::task::{TaskOp as Op, TaskRole as R, apply};

/// The reference: every legal (state, op) → next state, with the roles that may do it.
fn model() -> HashMap<(S, Op), (S, &'static [R])> {
    const ASSIGNEE: &[R] = &[R::Assignee];
    const CANCELERS: &[R] = &[R::Requester, R::System];
    const SYSTEM: &[R] = &[R::System];
    let mut table = HashMap::new();
    table.insert((S::Submitted, Op::Accept), (S::Accepted, ASSIGNEE));
    table.insert((S::Submitted, Op::Reject), (S::Rejected, ASSIGNEE));
    table.insert((S::Accepted, Op::Start), (S::Working, ASSIGNEE));
    table.insert((S::InputRequired, Op::Start), (S::Working, ASSIGNEE));
    table.insert((S::Working, Op::Progress), (S::Working, ASSIGNEE));
    table.insert(
        (S::Working, Op::InputRequired),
        (S::InputRequired, ASSIGNEE),
    );
    table.insert((S::Working, Op::Complete), (S::Completed, ASSIGNEE));
    table.insert((S::Working, Op::Fail), (S::Failed, ASSIGNEE));
    for live in [S::Submitted, S::Accepted, S::Working, S::InputRequired] {
        table.insert((live, Op::Cancel), (S::Canceled, CANCELERS));
        table.insert((live, Op::Expire), (S::Failed, SYSTEM));
    }
    table
}

fn op() -> impl Strategy<Value = Op> {
    prop::sample::select(Op::ALL.to_vec())
}

fn role() -> impl Strategy<Value = R> {
    prop::sample::select(vec![R::Requester, R::Assignee, R::System])
}

/// 100,000 sequences by default; `SB_PROPTEST_CASES` overrides.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("SB_PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(100_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_sequences_match_the_model(steps in prop::collection::vec((op(), role()), 1..40)) {
        let table = model();
        let mut state = S::Submitted;
        for (op, role) in steps {
            let expected = table
                .get(&(state, op))
                .filter(|(_, roles)| roles.contains(&role))
                .map(|(next, _)| *next);
            let got = apply(state, op, role);
            match expected {
                Some(next) => prop_assert_eq!(got, Ok(next)),
                None => prop_assert!(
                    got.is_err(),
                    "{:?} by {:?} from {:?} must be refused",
                    op,
                    role,
                    state
                ),
            }
            if let Ok(next) = got {
                // Terminal states never change.
                prop_assert!(!state.is_terminal());
                state = next;
            }
        }
    }
}

#[test]
fn the_model_covers_every_legal_move_and_nothing_else() {
    // Exhaustive over the small space, both ways.
    let table = model();
    let states = [
        S::Submitted,
        S::Accepted,
        S::Working,
        S::InputRequired,
        S::Completed,
        S::Failed,
        S::Rejected,
        S::Canceled,
    ];
    let mut legal = 0;
    for state in states {
        for op in Op::ALL {
            for role in [R::Requester, R::Assignee, R::System] {
                let expected = table
                    .get(&(state, op))
                    .filter(|(_, roles)| roles.contains(&role))
                    .map(|(next, _)| *next);
                assert_eq!(
                    apply(state, op, role).ok(),
                    expected,
                    "{state:?} {op:?} {role:?}"
                );
                legal += usize::from(expected.is_some());
            }
        }
    }
    assert_eq!(legal, 8 + 4 * 2 + 4);
}
