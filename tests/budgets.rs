//! Cost budgets (docs/protocol.md §16) against a real nats-server: a root task with a budget of
//! $1.00 whose tree keeps delegating four deep never spends past it, stops with
//! `budget_exhausted`, and tells its owner once; the audit's cost tree says so. A call's budget
//! flows to its sub-calls and returns what was not spent. A hostile agent cannot spend another
//! tree's budget, refund itself, draw past what its parent has left, or forge a budget.

// Longer than 600 lines because it holds one scenario per test of the budgets (the issue's
// $1.00 tree, a call's flow, the attacks, the command line), each on a fabric of its own; one
// binary links once.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use switchboard_client::proto::budget::{BudgetAsk, BudgetGrant, CostQuery};
use switchboard_client::proto::task::CreateTask;
use switchboard_client::{Agent, ClientError, audit_cost, budget_of, draw_from};
use switchboard_proto::budget::BudgetOp;
use switchboard_proto::call::CallRequest;
use switchboard_proto::{AgentId, ErrorKind, MessageKind, TaskState};
use switchboard_tests::Fabric;
use switchboard_tests::services::{
    fast_audit, fast_tasks, start_audit, start_limits, start_limits_with, switchboard_json,
};
use switchboard_tests::wire::raw;
use uuid::Uuid;

const DOLLAR: u64 = 1_000_000;

/// A task for `to` saying `message`, with a budget of `cost` micro-units.
fn budgeted(to: &str, message: &str, cost: u64) -> CreateTask {
    CreateTask {
        to: Some(to.to_owned()),
        message: Some(message.to_owned()),
        budget: Some(BudgetAsk {
            cost: Some(cost),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn kind(err: &ClientError) -> ErrorKind {
    match err {
        ClientError::Service(reply) => reply.kind(),
        other => panic!("not a service error: {other:?}"),
    }
}

/// One piece of a tree: spend seven cents, hand half of what is left to a child and the rest
/// to a second (four deep at most), wait for both, try one more child (refused once the tree
/// is spent), complete. A leaf spends until its budget has nothing left.
async fn work(
    agent: Arc<Agent>,
    task_id: Uuid,
    grant: BudgetGrant,
    next: Option<[String; 2]>,
    refused: Arc<AtomicUsize>,
) {
    agent.accept_task(task_id).await.unwrap();
    agent.start_task(task_id).await.unwrap();
    let view = agent.spend(&grant, 500, 70_000).await.unwrap();
    if let Some(next) = next {
        let mut children = Vec::new();
        for (share, to) in [Some(view.left.cost / 2), None].into_iter().zip(&next) {
            let spawned = agent
                .create_task(CreateTask {
                    to: Some(to.clone()),
                    message: Some("go on".to_owned()),
                    parent_task_id: Some(task_id),
                    budget: share.filter(|s| *s > 0).map(|cost| BudgetAsk {
                        cost: Some(cost),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await;
            match spawned {
                Ok(reply) => children.push(reply.task.task_id),
                Err(err) => {
                    assert_eq!(kind(&err), ErrorKind::BudgetExhausted, "{err}");
                    refused.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let spawned_ok = children.len();
        for child in children {
            loop {
                if agent.get_task(child).await.unwrap().state.is_terminal() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // The children spent everything they were given: nothing is left to hand down.
        let late = agent
            .create_task(CreateTask {
                to: Some(next[0].clone()),
                message: Some("one more".to_owned()),
                parent_task_id: Some(task_id),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(kind(&late), ErrorKind::BudgetExhausted, "{late}");
        refused.fetch_add(1, Ordering::SeqCst);
        // A spawn refused for its budget leaves no child behind.
        let linked = agent.get_task(task_id).await.unwrap().children.len();
        assert_eq!(linked, spawned_ok, "task {task_id}");
    } else {
        loop {
            let view = agent.spend(&grant, 500, 70_000).await.unwrap();
            if view.left.cost == 0 {
                break;
            }
        }
    }
    agent
        .complete_task(task_id, switchboard_client::TaskOutcome::text("done"))
        .await
        .unwrap();
}

/// Agent `level-<level>-<index>`, whose goal serves each task it is given with [`work`],
/// delegating to `level-<level + 1>-<2 index>` and `…-<2 index + 1>` (an agent takes at most 3
/// tasks at once).
async fn worker(
    fabric: &Fabric,
    level: usize,
    index: usize,
    refused: &Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let agent = Arc::new(fabric.agent(&format!("level-{level}-{index}")).await);
    let goal = agent.open_goal().await.unwrap();
    let next =
        (level < 4).then(|| [0, 1].map(|i| format!("level-{}-{}", level + 1, 2 * index + i)));
    let refused = Arc::clone(refused);
    tokio::spawn(async move {
        loop {
            let Some(delivery) =
                switchboard_tests::read_or_pause(&goal, Duration::from_secs(60)).await
            else {
                continue;
            };
            let message = delivery.ack().await.unwrap();
            if message.kind != MessageKind::Task {
                continue;
            }
            let grant = budget_of(&message).expect("every task of the tree carries its budget");
            let task_id = message.task.as_ref().unwrap().id;
            tokio::spawn(work(
                Arc::clone(&agent),
                task_id,
                grant,
                next.clone(),
                Arc::clone(&refused),
            ));
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dollar_tree_four_deep_stops_at_its_budget_and_tells_its_owner_once() {
    let fabric = Fabric::start_tasks_with(task_lifecycle::TaskConfig {
        depth_limit: 4,
        ..fast_tasks()
    })
    .await;
    let _limits = start_limits(&fabric.url()).await;
    let (_audit, _trail) = start_audit(&fabric.url(), fast_audit()).await;
    let refused = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for level in 1..=4 {
        for index in 0..(1 << (level - 1)) {
            workers.push(worker(&fabric, level, index, &refused).await);
        }
    }
    let (owner, owner_goal) = fabric.agent_with_goal("owner").await;
    let root = owner
        .create_task(budgeted(
            "level-1-0",
            "research, delegating as you see fit",
            DOLLAR,
        ))
        .await
        .unwrap()
        .task;
    let budget = root.budget.clone().expect("the root task has its budget");
    assert_eq!((budget.root, budget.cost), (root.task_id, Some(DOLLAR)));

    // The tree runs until the root completes.
    let mut notices = 0;
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(delivery) = owner_goal.recv(Duration::from_millis(200)).await.unwrap() {
                let message = delivery.ack().await.unwrap();
                if message.kind == MessageKind::Notify
                    && message.metadata.get("switchboard") == Some(&json!("budget_exhausted"))
                {
                    notices += 1;
                }
            }
            if owner.get_task(root.task_id).await.unwrap().state == TaskState::Completed {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the tree did not finish");
    // Anything still on its way to the owner.
    while let Some(delivery) = owner_goal.recv(Duration::from_millis(500)).await.unwrap() {
        let message = delivery.ack().await.unwrap();
        if message.metadata.get("switchboard") == Some(&json!("budget_exhausted")) {
            notices += 1;
        }
    }
    assert_eq!(notices, 1, "the root's owner is told once");
    assert!(
        refused.load(Ordering::SeqCst) >= 7,
        "each delegating node was refused at the end"
    );

    // The audit's cost tree: 15 pieces of work, exactly $1.00 spent, never more.
    let ops = fabric.nats.client().await;
    let query = CostQuery {
        root: Some(root.task_id),
        agent_id: None,
    };
    let mut report = audit_cost(&ops, &query).await.unwrap();
    for _ in 0..100 {
        if report.total.cost == DOLLAR && report.exhausted && report.nodes.len() == 15 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        report = audit_cost(&ops, &query).await.unwrap();
    }
    assert_eq!(report.total.cost, DOLLAR, "{report:?}");
    assert!(report.exhausted);
    assert_eq!(report.nodes.len(), 15, "{:?}", report.nodes);
    assert_eq!(report.budget.unwrap().cost, DOLLAR);
    let by_level: u64 = report.agents.iter().map(|a| a.spent.cost).sum();
    assert_eq!(by_level, DOLLAR);
    assert_eq!(report.agents.len(), 15);
    // One agent's view of its trees agrees with the tree's.
    let mine = audit_cost(
        &ops,
        &CostQuery {
            root: None,
            agent_id: Some("level-4-7".to_owned()),
        },
    )
    .await
    .unwrap();
    let leaf = report
        .agents
        .iter()
        .find(|a| a.agent_id == "level-4-7")
        .unwrap();
    assert_eq!((mine.total, mine.agents.len()), (leaf.spent, 1));
    assert!(leaf.spent.cost > 0);
    // An agent id with CR/LF in a cost query matches no agent (it is bound as a parameter,
    // never spliced into a query or a log line): an empty report.
    let reply = raw(
        &ops,
        &switchboard_proto::audit::AuditOp::Cost.subject(),
        json!({"agent_id": "worker\r\nforged: line"}).to_string(),
    )
    .await;
    assert_eq!(reply.body["agents"], json!([]), "{:?}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_calls_budget_flows_to_its_sub_calls_and_returns_what_was_not_spent() {
    let fabric = Fabric::start().await;
    let _limits = start_limits(&fabric.url()).await;
    let (caller, _caller_goal) = fabric.agent_with_goal("caller").await;
    let (planner, planner_goal) = fabric.agent_with_goal("planner").await;
    let (_helper, helper_goal) = fabric.agent_with_goal("helper").await;
    let planner = Arc::new(planner);
    let helper_sees = tokio::spawn(async move {
        let delivery = helper_goal
            .recv(Duration::from_secs(10))
            .await
            .unwrap()
            .unwrap();
        delivery.ack().await.unwrap()
    });
    let serve = {
        let planner = Arc::clone(&planner);
        tokio::spawn(async move {
            let delivery = planner_goal
                .recv(Duration::from_secs(10))
                .await
                .unwrap()
                .unwrap();
            let request = delivery.ack().await.unwrap();
            let grant = budget_of(&request).expect("the callee sees the call's budget");
            assert_eq!(grant.cost, Some(300_000));
            planner.spend(&grant, 0, 100_000).await.unwrap();
            // A parked sub-call while serving: it draws from the call's budget.
            let sub = planner
                .call_parked_with(CallRequest {
                    to: Some("helper".to_owned()),
                    message: Some("a hand?".to_owned()),
                    parent_correlation_id: request.correlation_id,
                    budget: Some(BudgetAsk {
                        cost: Some(50_000),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .unwrap();
            let view = planner.budget(&grant).await.unwrap();
            assert_eq!(
                (view.spent.cost, view.children.cost, view.left.cost),
                (100_000, 50_000, 150_000)
            );
            // More than is left is cut to it, and then nothing is left to hand down.
            let rest = planner
                .call_parked_with(CallRequest {
                    to: Some("helper".to_owned()),
                    message: Some("and the rest".to_owned()),
                    parent_correlation_id: request.correlation_id,
                    budget: Some(BudgetAsk {
                        cost: Some(DOLLAR),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await;
            assert!(rest.is_ok(), "{rest:?}");
            let none = planner
                .call_parked_with(CallRequest {
                    to: Some("helper".to_owned()),
                    message: Some("anything?".to_owned()),
                    parent_correlation_id: request.correlation_id,
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(kind(&none), ErrorKind::BudgetExhausted, "{none}");
            planner
                .reply(request.correlation_id.unwrap(), "planned")
                .await
                .unwrap();
            (grant, sub.correlation_id)
        })
    };
    let answer = caller
        .call_with(CallRequest {
            to: Some("planner".to_owned()),
            message: Some("plan it".to_owned()),
            timeout_ms: Some(10_000),
            budget: Some(BudgetAsk {
                cost: Some(300_000),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(answer.body, "planned");
    let (grant, sub) = serve.await.unwrap();
    let seen = helper_sees.await.unwrap();
    let sub_grant = budget_of(&seen).unwrap();
    assert_eq!(
        (sub_grant.root, sub_grant.work, sub_grant.cost),
        (grant.root, sub, Some(50_000))
    );
    // The caller may read the root it asked for; once answered, the call has ended.
    let mut view = caller.budget(&grant).await.unwrap();
    for _ in 0..50 {
        if view.ended {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        view = caller.budget(&grant).await.unwrap();
    }
    assert!(view.ended, "{view:?}");
    assert_eq!(view.tree_spent.cost, 100_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hostile_agent_cannot_spend_others_budgets_refund_itself_or_forge_one() {
    let fabric = Fabric::start().await;
    let _limits = start_limits(&fabric.url()).await;
    let (owner, _g) = fabric.agent_with_goal("owner").await;
    let (worker, worker_goal) = fabric.agent_with_goal("worker").await;
    let (mallory, mallory_goal) = fabric.agent_with_goal("mallory").await;
    let task = owner
        .create_task(CreateTask {
            budget: Some(BudgetAsk {
                cost: Some(DOLLAR),
                tokens: Some(10_000),
                ..Default::default()
            }),
            ..budgeted("worker", "work", DOLLAR)
        })
        .await
        .unwrap()
        .task;
    let delivery = worker_goal
        .recv(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let grant = budget_of(&delivery.ack().await.unwrap()).unwrap();

    // Spending or drawing on another's work.
    let theirs = mallory.spend(&grant, 0, 1).await.unwrap_err();
    assert_eq!(kind(&theirs), ErrorKind::NotAllowed, "{theirs}");
    let peek = mallory.budget(&grant).await.unwrap_err();
    assert_eq!(kind(&peek), ErrorKind::NotAllowed, "{peek}");
    let draw = mallory
        .call_parked_with(CallRequest {
            to: Some("worker".to_owned()),
            message: Some("on their dime".to_owned()),
            budget: Some(draw_from(&grant, None, Some(1))),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(kind(&draw), ErrorKind::NotAllowed, "{draw}");
    let made_up = mallory
        .spend(
            &BudgetGrant {
                root: Uuid::now_v7(),
                work: Uuid::now_v7(),
                tokens: None,
                cost: None,
                cut: false,
            },
            0,
            1,
        )
        .await
        .unwrap_err();
    assert_eq!(kind(&made_up), ErrorKind::NotFound, "{made_up}");

    // Negative, absurd and malformed amounts.
    let client = fabric.nats.client().await;
    let subject = switchboard_proto::budget::BudgetOp::Spend.subject(worker.id());
    for body in [
        json!({"root": grant.root, "work": grant.work, "cost": -1_000_000}),
        json!({"root": grant.root, "work": grant.work, "cost": 1e30}),
        json!({"root": grant.root, "work": grant.work, "tokens": "lots"}),
        json!({"root": grant.root, "work": grant.work, "cost": 1_000_000_000_000_001_u64}),
        json!({"root": grant.root, "work": grant.work, "refund": 5}),
        json!({"root": "x".repeat(1_000_000), "work": grant.work}),
    ] {
        let reply = raw(&client, &subject, body.to_string()).await;
        assert_eq!(
            reply.error_kind(),
            "bad_request",
            "{body:.200}: {:?}",
            reply.body
        );
    }
    for body in [
        json!({"to": "worker", "message": "x", "budget": {"cost": 0}}),
        json!({"to": "worker", "message": "x", "budget": {"cost": -5}}),
        json!({"to": "worker", "message": "x", "budget": {"root": grant.root}}),
    ] {
        let reply = raw(
            &client,
            &switchboard_proto::subject::call(mallory.id()),
            body.to_string(),
        )
        .await;
        assert_eq!(
            reply.error_kind(),
            "bad_request",
            "{body}: {:?}",
            reply.body
        );
    }
    // 2^63 and 2^64 (past i64 and u64) as raw JSON numbers: refused, not wrapped around.
    for amount in ["9223372036854775808", "18446744073709551616"] {
        let body = format!(
            r#"{{"root": "{}", "work": "{}", "cost": {amount}}}"#,
            grant.root, grant.work
        );
        let reply = raw(&client, &subject, body.clone()).await;
        assert_eq!(
            reply.error_kind(),
            "bad_request",
            "{body}: {:?}",
            reply.body
        );
    }
    // A spend of nothing is refused (it would rewrite the tree for nothing).
    let nothing = worker.spend(&grant, 0, 0).await.unwrap_err();
    assert_eq!(kind(&nothing), ErrorKind::BadRequest, "{nothing}");
    // A sub-call refused after its share was reserved gives it back at once, not at its
    // deadline: a flood of them cannot hold the budget.
    for _ in 0..20 {
        let refused = worker
            .call_parked_with(CallRequest {
                to: Some("nobody-here".to_owned()),
                message: Some("anyone?".to_owned()),
                timeout_ms: Some(300_000),
                // Small shares, so the twenty fit even before any comes back.
                budget: Some(draw_from(&grant, Some(100), Some(10_000))),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(kind(&refused), ErrorKind::Unreachable, "{refused}");
    }
    let returned = switchboard_testkit::eventually(Duration::from_secs(10), || async {
        let view = worker.budget(&grant).await.unwrap();
        view.children.cost == 0 && view.children.tokens == 0
    })
    .await;
    assert!(returned, "{:?}", worker.budget(&grant).await.unwrap());
    // An absurd real spend is charged to what is left, never past it.
    let view = worker.spend(&grant, 0, u64::MAX / 2).await;
    assert_eq!(kind(&view.unwrap_err()), ErrorKind::BadRequest);
    let view = worker.spend(&grant, 20_000, 5 * DOLLAR).await.unwrap();
    assert_eq!(
        (view.spent.cost, view.over.cost, view.left.cost),
        (DOLLAR, 4 * DOLLAR, 0)
    );
    assert_eq!((view.spent.tokens, view.over.tokens), (10_000, 10_000));
    assert!(view.exhausted);

    // A budget written into a message's metadata by its sender is not a budget.
    let mut forged = serde_json::Map::new();
    forged.insert(
        "budget".to_owned(),
        json!({"root": grant.root, "work": grant.work, "cost": DOLLAR}),
    );
    mallory
        .call_parked_with(CallRequest {
            to: Some("worker".to_owned()),
            message: Some("spend this".to_owned()),
            metadata: forged,
            ..Default::default()
        })
        .await
        .unwrap();
    // (The worker was also told the tree ran out: a notice before the request.)
    let request = loop {
        let delivery = worker_goal
            .recv(Duration::from_secs(10))
            .await
            .unwrap()
            .unwrap();
        let message = delivery.ack().await.unwrap();
        if message.kind == MessageKind::Request {
            break message;
        }
        assert_eq!(
            message.metadata.get("switchboard"),
            Some(&json!("budget_exhausted"))
        );
    };
    assert!(budget_of(&request).is_none(), "{:?}", request.metadata);
    let _ = mallory_goal;
    assert_eq!(
        owner
            .get_task(task.task_id)
            .await
            .unwrap()
            .budget
            .unwrap()
            .cost,
        Some(DOLLAR)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_reads_a_budget_reports_spend_and_reads_the_cost_tree_on_the_command_line() {
    let fabric = Fabric::start().await;
    let _limits = start_limits(&fabric.url()).await;
    let (_audit, _trail) = start_audit(&fabric.url(), fast_audit()).await;
    let (owner, _g) = fabric.agent_with_goal("cli-owner").await;
    let (_worker, worker_goal) = fabric.agent_with_goal("cli-worker").await;
    let task = owner
        .create_task(budgeted("cli-worker", "work", DOLLAR))
        .await
        .unwrap()
        .task;
    let delivery = worker_goal
        .recv(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let grant = budget_of(&delivery.ack().await.unwrap()).unwrap();
    let (root, work) = (grant.root.to_string(), grant.work.to_string());
    let url = fabric.url();
    let base = [
        "--root",
        root.as_str(),
        "--work",
        work.as_str(),
        "--as",
        "cli-worker",
    ];
    let shown = switchboard_json(&url, &[&["budget", "show"][..], &base[..]].concat()).await;
    assert_eq!(shown["cost"], DOLLAR, "{shown}");
    let spent = switchboard_json(
        &url,
        &[
            &["budget", "spend"][..],
            &base[..],
            &["--cost", "250000", "--tokens", "900"][..],
        ]
        .concat(),
    )
    .await;
    assert_eq!(spent["left"]["cost"], 750_000, "{spent}");
    assert_eq!(spent["spent"]["tokens"], 900, "{spent}");
    let root_id = task.task_id.to_string();
    let mut cost = switchboard_json(&url, &["audit", "cost", "--root", &root_id]).await;
    for _ in 0..50 {
        if cost["total"]["cost"] == 250_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        cost = switchboard_json(&url, &["audit", "cost", "--root", &root_id]).await;
    }
    assert_eq!(cost["total"]["cost"], 250_000, "{cost}");
    assert_eq!(cost["agents"][0]["agent_id"], "cli-worker", "{cost}");
    let mine = switchboard_json(&url, &["audit", "cost", "--agent", "cli-worker"]).await;
    assert_eq!(mine["total"]["cost"], 250_000, "{mine}");
}

/// A tree whose work ends by its deadline alone (its service never closed it: the caller's
/// correlator died, a task was abandoned) is removed by a replica's sweep
/// (`[limits] budget_sweep_ms`), not left in `agent_limits` for good; a tree with running work
/// stays.
#[tokio::test]
async fn a_tree_whose_work_ends_by_its_deadline_alone_is_swept_away() {
    let fabric = Fabric::start().await;
    let _limits = start_limits_with(
        &fabric.url(),
        limits::LimitsConfig {
            budget_sweep_ms: 200,
            ..limits::LimitsConfig::default()
        },
    )
    .await;
    let client = fabric.nats.client().await;
    let bucket = limits_bucket(&client).await;
    let open = |deadline: Option<time::OffsetDateTime>| {
        let root = Uuid::now_v7();
        let mut body = json!({"root": root, "work": root, "requester": "alice", "owner": "bob",
                              "cost": 1_000_000});
        if let Some(at) = deadline {
            body["deadline"] = json!(
                at.format(&time::format_description::well_known::Rfc3339)
                    .unwrap()
            );
        }
        (root, body.to_string())
    };
    let (ending, body) = open(Some(
        time::OffsetDateTime::now_utc() + Duration::from_secs(1),
    ));
    let reply = raw(
        &client,
        switchboard_proto::budget::BUDGET_RESERVE_SUBJECT,
        body,
    )
    .await;
    assert_eq!(reply.body["cost"], 1_000_000, "{:?}", reply.body);
    let (running, body) = open(None);
    raw(
        &client,
        switchboard_proto::budget::BUDGET_RESERVE_SUBJECT,
        body,
    )
    .await;
    let stored = |root: Uuid| {
        let bucket = bucket.clone();
        async move {
            bucket
                .get(format!("budget.{root}"))
                .await
                .unwrap()
                .is_some()
        }
    };
    assert!(stored(ending).await && stored(running).await);
    let swept = switchboard_testkit::eventually(Duration::from_secs(10), || async {
        !stored(ending).await
    })
    .await;
    assert!(swept, "the tree past its deadline is still stored");
    assert!(stored(running).await, "a tree with running work was swept");
    // Nothing of it is left for listings to read: not even a delete marker.
    let left = left_of(&bucket, ending).await;
    assert!(
        left.is_none(),
        "a marker of the removed tree stays: {left:?}"
    );
}

/// A hostile owner fills its tree with 511 short sub-tasks, each closed at once, through the
/// services' own `_SB.budget.reserve|close`: the full tree makes room from ended work, so new
/// work is still granted (without the pruning it is refused; that spend stays counted is the
/// unit tests' in `services/limits/src/tree/tests.rs`).
#[tokio::test]
async fn a_tree_filled_with_ended_work_still_grants_new_work() {
    use switchboard_proto::budget::{
        BUDGET_CLOSE_SUBJECT, BUDGET_NODES_MAX, BUDGET_RESERVE_SUBJECT,
    };
    let fabric = Fabric::start().await;
    let _limits = start_limits(&fabric.url()).await;
    let client = fabric.nats.client().await;
    let root = Uuid::now_v7();
    let reserve = |work: Uuid, parent: Option<Uuid>| {
        let mut body = json!({"root": root, "work": work, "requester": "alice", "owner": "bob",
                              "cost": DOLLAR});
        if let Some(parent) = parent {
            body = json!({"root": root, "work": work, "parent": parent, "requester": "bob",
                          "owner": "filler", "cost": 1});
        }
        body.to_string()
    };
    let opened = raw(&client, BUDGET_RESERVE_SUBJECT, reserve(root, None)).await;
    assert_eq!(opened.body["cost"], DOLLAR, "{:?}", opened.body);
    for _ in 1..BUDGET_NODES_MAX {
        let work = Uuid::now_v7();
        let child = raw(&client, BUDGET_RESERVE_SUBJECT, reserve(work, Some(root))).await;
        assert_eq!(child.body["cost"], 1, "{:?}", child.body);
        let closed = raw(
            &client,
            BUDGET_CLOSE_SUBJECT,
            json!({"root": root, "work": work}).to_string(),
        )
        .await;
        assert!(closed.body.get("error").is_none(), "{:?}", closed.body);
    }
    // The tree holds 512 nodes now; one more piece of work is granted all the same.
    let more = raw(
        &client,
        BUDGET_RESERVE_SUBJECT,
        reserve(Uuid::now_v7(), Some(root)),
    )
    .await;
    assert_eq!(more.body["cost"], 1, "{:?}", more.body);
}

/// A tree whose work all closed is removed at once by one purge, with nothing left for
/// listings to read, across two replicas (opened, spent on and closed through either); the
/// same root opened again afterwards is a new tree and stays.
#[tokio::test]
async fn a_closed_tree_is_removed_and_a_tree_opened_again_stays() {
    let fabric = Fabric::start().await;
    let _one = start_limits(&fabric.url()).await;
    let _two = start_limits(&fabric.url()).await;
    let client = fabric.nats.client().await;
    let bucket = limits_bucket(&client).await;
    let reserve = |root: Uuid| {
        json!({"root": root, "work": root, "requester": "alice", "owner": "bob",
               "cost": 1_000_000})
        .to_string()
    };
    let close = |root: Uuid| json!({"root": root, "work": root}).to_string();
    // What bob, the owner, reads of the tree's root.
    let bobs_view = |client: &async_nats::Client, root: Uuid| {
        let (client, subject) = (
            client.clone(),
            BudgetOp::Get.subject(&AgentId::parse("bob").unwrap()),
        );
        async move {
            let query = json!({"root": root, "work": root}).to_string();
            raw(&client, &subject, query).await
        }
    };
    for round in 0..12 {
        let root = Uuid::now_v7();
        let opened = raw(
            &client,
            switchboard_proto::budget::BUDGET_RESERVE_SUBJECT,
            reserve(root),
        )
        .await;
        assert_eq!(opened.body["cost"], 1_000_000, "{:?}", opened.body);
        let spent = raw(
            &client,
            "agent.budget.spend.bob",
            json!({"root": root, "work": root, "cost": 1_000 + round}).to_string(),
        )
        .await;
        assert!(spent.body.get("error").is_none(), "{:?}", spent.body);
        let view = bobs_view(&client, root).await;
        assert_eq!(
            view.body["tree_spent"]["cost"],
            1_000 + round,
            "{:?}",
            view.body
        );
        let closed = raw(
            &client,
            switchboard_proto::budget::BUDGET_CLOSE_SUBJECT,
            close(root),
        )
        .await;
        assert_eq!(closed.body["closed"], true, "{:?}", closed.body);
        let left = left_of(&bucket, root).await;
        assert!(
            left.is_none(),
            "round {round}: the closed tree stays: {left:?}"
        );
        // The same root opened again is a new tree: nothing of the old one's spend, and its
        // own close removes it too.
        raw(
            &client,
            switchboard_proto::budget::BUDGET_RESERVE_SUBJECT,
            reserve(root),
        )
        .await;
        let view = bobs_view(&client, root).await;
        assert_eq!(
            view.body["tree_spent"]["cost"], 0,
            "round {round}: {:?}",
            view.body
        );
        raw(
            &client,
            switchboard_proto::budget::BUDGET_CLOSE_SUBJECT,
            close(root),
        )
        .await;
        let left = left_of(&bucket, root).await;
        assert!(
            left.is_none(),
            "round {round}: the reopened tree stays: {left:?}"
        );
    }
}

/// The `agent_limits` bucket, where the limits service keeps budget trees.
async fn limits_bucket(client: &async_nats::Client) -> async_nats::jetstream::kv::Store {
    async_nats::jetstream::new(client.clone())
        .get_key_value(switchboard_proto::names::LIMITS_BUCKET)
        .await
        .unwrap()
}

/// Whatever the bucket still stores for the tree of `root` (a value or a delete marker).
async fn left_of(
    bucket: &async_nats::jetstream::kv::Store,
    root: Uuid,
) -> Option<async_nats::jetstream::message::StreamMessage> {
    bucket
        .stream
        .get_last_raw_message_by_subject(&format!("$KV.agent_limits.budget.{root}"))
        .await
        .ok()
}
