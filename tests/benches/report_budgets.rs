//! The report's budget rows (issue 41): a waiting call carrying a cost budget beside the same
//! call without one, on a fabric of their own (the services in process, a `limits` replica
//! keeping the budgets). A budgeted call opens its tree at the limits service before its
//! request goes out, and closes it after the answer, off the caller's path.

use std::sync::Arc;
use std::time::Duration;

use switchboard_proto::budget::BudgetAsk;
use switchboard_proto::call::CallRequest;
use switchboard_tests::Fabric;
use switchboard_tests::bench::compare;
use switchboard_tests::services::start_limits;

use crate::Report;

/// The rows: the call without a budget, the call with one, and their ratio.
pub(crate) async fn budget_rows(report: &mut Report, ops: usize) {
    let fabric = Fabric::start().await;
    let limits = start_limits(&fabric.url()).await;
    let (_callee, serving) = fabric.answering("bench-budget-callee", |body| body).await;
    let caller = Arc::new(fabric.agent("bench-budget-caller").await);
    caller.open_goal().await.unwrap();
    let call = |budget: Option<BudgetAsk>| {
        let caller = Arc::clone(&caller);
        move || {
            let (caller, budget) = (Arc::clone(&caller), budget.clone());
            async move {
                caller
                    .call_with(CallRequest {
                        to: Some("bench-budget-callee".to_owned()),
                        message: Some("ping".to_owned()),
                        timeout_ms: Some(10_000),
                        budget,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
            }
        }
    };
    // Measured side by side (A B B A blocks): one after the other, the machine's drift
    // between the two runs moved the ratio more than the budget did (0.98× to 1.57×).
    let (plain, budgeted) = compare(
        ops,
        8,
        call(None),
        call(Some(BudgetAsk {
            cost: Some(1_000_000),
            tokens: Some(100_000),
            ..Default::default()
        })),
    )
    .await;
    report.row(
        "budgets",
        "waiting call, no budget (Rust client, services in process)",
        plain,
    );
    report.row(
        "budgets",
        "the same call carrying a new budget of $1.00",
        budgeted,
    );
    report.ratio(
        "budgets: call with a budget p50 / without p50",
        budgeted.p50.as_secs_f64() / plain.p50.as_secs_f64(),
        1.1,
        false,
    );
    serving.abort();
    limits.stop().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}
