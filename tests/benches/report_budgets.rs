//! The report's budget rows (issue 41): a waiting call carrying a cost budget beside the same
//! call without one, on a fabric of their own (the services in process, a `limits` replica
//! keeping the budgets). A budgeted call opens its tree at the limits service beside its
//! request's delivery, and closes it after the answer, off the caller's path. Beside them, the
//! floor of that design: the same plain call with the least broker work a durable tree needs
//! done beside it (created in KV while the call runs, purged after its answer), with no
//! service in between.

use std::sync::Arc;
use std::time::Duration;

use switchboard_proto::budget::BudgetAsk;
use switchboard_proto::call::CallRequest;
use switchboard_tests::Fabric;
use switchboard_tests::bench::{compare_all, path};
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
    let floor = tree_floor(&fabric.url(), call(None)).await;
    // Measured side by side (A B C C B A blocks): one after the other, the machine's drift
    // between the runs moved the ratio more than the budget did (0.98× to 1.57×).
    let samples = compare_all(
        ops,
        8,
        &[
            path(call(None)),
            path(floor),
            path(call(Some(BudgetAsk {
                cost: Some(1_000_000),
                tokens: Some(100_000),
                ..Default::default()
            }))),
        ],
    )
    .await;
    let (plain, floor, budgeted) = (samples[0], samples[1], samples[2]);
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
    report.row(
        "budgets",
        "the same call beside a raw KV create of a tree, purged after the answer (the floor)",
        floor,
    );
    report.note_row(
        "budgets",
        "the floor p50 / the call without a budget p50",
        format!(
            "{:.2}× (the budgeted call: {:.2}× the floor)",
            floor.p50.as_secs_f64() / plain.p50.as_secs_f64(),
            budgeted.p50.as_secs_f64() / floor.p50.as_secs_f64()
        ),
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

/// Bytes of the floor's tree: about what the limits service stores for a new tree of one node
/// (its root, amounts granted and spent, owner, requester and deadline, as JSON).
const TREE_BYTES: usize = 320;

/// The floor of a budgeted call: `call` (a call without a budget) with a durable tree's
/// least broker work beside it, as raw NATS from a client of its own: a KV create of a new
/// `budget.<id>` in `agent_limits` while the call runs, and after the answer, off the path,
/// the purge of that key below its next revision (how the limits service removes a finished
/// tree). No reservation request, no events: the service's work is left out, so what the
/// floor adds to a plain call is what storing and removing a tree costs this machine.
async fn tree_floor<F, Fut>(
    url: &str,
    call: F,
) -> impl Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use futures::FutureExt;
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let kv = js
        .get_key_value(switchboard_proto::LIMITS_BUCKET)
        .await
        .unwrap();
    let value = bytes::Bytes::from(vec![b'x'; TREE_BYTES]);
    let call = Arc::new(call);
    move || {
        let (kv, value, call) = (kv.clone(), value.clone(), Arc::clone(&call));
        async move {
            let key = format!("budget.{}", switchboard_proto::new_id());
            let created = {
                let (kv, key) = (kv.clone(), key.clone());
                tokio::spawn(async move { kv.create(&key, value).await.unwrap() })
            };
            call().await;
            tokio::spawn(async move {
                let revision = created.await.unwrap();
                let subject = format!("{}{key}", kv.prefix);
                kv.stream
                    .purge()
                    .filter(subject)
                    .sequence(revision + 1)
                    .await
                    .unwrap();
            });
        }
        .boxed()
    }
}
