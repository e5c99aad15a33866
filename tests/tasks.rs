//! task-lifecycle end to end against a real nats-server: every legal transition and a table of
//! illegal ones, acceptance rules (ACL, concurrency cap, deadline), deadline expiry across
//! replicas and restarts, callback routing, subtasks (spawn, self, caps, results to the
//! parent's goal), the cancel cascade, racing replicas, bad input, listings, the client's
//! worker loop, and random op sequences against a reference model.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because it holds one scenario per test of the task service; every
// integration file is its own test binary (a link of all five services), so a topic gets one file
// however many tests it has.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use switchboard_client::{Agent, ClientError, Goal, TaskOutcome};
use switchboard_proto::task::{
    CreateTask, ListRole, ListTasks, TaskAction, TaskEvent, TaskOp, TaskRecord, TaskRequestOp,
};
use switchboard_proto::{
    AgentId, AgentStatus, ErrorKind, InboxMessage, MessageKind, Part, TaskState,
};
use switchboard_testkit::assert_eventually;
use switchboard_tests::{
    Fabric, agent_with, assert_no_more, card, next, raw, start_tasks, start_tasks_in_process,
    stored_json,
};
use uuid::Uuid;

/// The next `task_update` about `task` (other messages are skipped), which must be in `state`.
async fn update_of(goal: &Goal, task: Uuid, state: TaskState) -> InboxMessage {
    loop {
        let message = next(goal).await;
        if message.kind == MessageKind::TaskUpdate
            && message.task.as_ref().map(|t| t.id) == Some(task)
        {
            assert_eq!(message.task.as_ref().unwrap().state, state, "{message:?}");
            return message;
        }
    }
}

/// The next message, which must be a `task_update` in `state`.
async fn update(goal: &Goal, state: TaskState) -> InboxMessage {
    let message = next(goal).await;
    assert_eq!(message.kind, MessageKind::TaskUpdate, "{message:?}");
    assert_eq!(message.task.as_ref().unwrap().state, state, "{message:?}");
    message
}

fn kind<T: std::fmt::Debug>(result: Result<T, ClientError>) -> ErrorKind {
    result.unwrap_err().kind().expect("a service error reply")
}

async fn events(fabric: &Fabric, task: Uuid) -> Vec<TaskEvent> {
    stored_json(
        &fabric.nats.client().await,
        &format!("agent.task.events.{task}"),
    )
    .await
}

/// A requester and an assignee, each with one goal.
struct Pair {
    boss: Agent,
    boss_goal: Goal,
    worker: Agent,
    worker_goal: Goal,
}

async fn pair(fabric: &Fabric) -> Pair {
    let (boss, boss_goal) = fabric.agent_with_goal("boss").await;
    // Room for every task a test leaves active.
    let mut worker_card = card("worker");
    worker_card.max_concurrent_tasks = 100;
    let worker = agent_with(&fabric.url(), worker_card, Duration::from_secs(3600)).await;
    let worker_goal = worker.open_goal().await.unwrap();
    Pair {
        boss,
        boss_goal,
        worker,
        worker_goal,
    }
}

impl Pair {
    /// boss gives worker a task; the worker's goal receives it.
    async fn task(&self, what: &str) -> Uuid {
        let reply = self.boss.give_task("worker", what).await.unwrap();
        let message = next(&self.worker_goal).await;
        assert_eq!(message.kind, MessageKind::Task);
        assert_eq!(message.task.as_ref().unwrap().id, reply.task.task_id);
        reply.task.task_id
    }

    /// A task driven to `state` by legal moves (updates on the boss goal consumed).
    async fn task_in(&self, state: TaskState) -> Uuid {
        let id = self.task("reach a state").await;
        let path: &[TaskOp] = match state {
            TaskState::Submitted => &[],
            TaskState::Accepted => &[TaskOp::Accept],
            TaskState::Working => &[TaskOp::Accept, TaskOp::Start],
            TaskState::InputRequired => &[TaskOp::Accept, TaskOp::Start, TaskOp::InputRequired],
            TaskState::Completed => &[TaskOp::Accept, TaskOp::Start, TaskOp::Complete],
            TaskState::Failed => &[TaskOp::Accept, TaskOp::Start, TaskOp::Fail],
            TaskState::Rejected => &[TaskOp::Reject],
            TaskState::Canceled => &[TaskOp::Cancel],
        };
        for op in path {
            let agent = if *op == TaskOp::Cancel {
                &self.boss
            } else {
                &self.worker
            };
            agent.task_op(*op, action(id, "because")).await.unwrap();
            next(&self.boss_goal).await;
        }
        if state == TaskState::Canceled {
            next(&self.worker_goal).await; // the assignee's notice
        }
        id
    }
}

fn action(id: Uuid, text: &str) -> TaskAction {
    TaskAction {
        task_id: Some(id),
        message: Some(text.to_owned()),
        ..TaskAction::default()
    }
}

#[tokio::test]
async fn every_legal_transition_reaches_the_requester_with_the_callback() {
    let fabric = Fabric::start().await;
    let p = pair(&fabric).await;
    let callback: switchboard_proto::Callback = serde_json::from_value(
        serde_json::json!({"session_id": "feishu:user_123", "channel": "feishu"}),
    )
    .unwrap();
    let created = p
        .boss
        .create_task(CreateTask {
            to: Some("worker".into()),
            message: Some("summarise the report".into()),
            parts: vec![Part::Text {
                text: "report.pdf".into(),
            }],
            callback: Some(callback.clone()),
            deadline_in_ms: Some(60_000),
            ..CreateTask::default()
        })
        .await
        .unwrap();
    let id = created.task.task_id;
    assert_eq!(created.task.state, TaskState::Submitted);
    assert_eq!(created.delivered_to, vec![p.worker_goal.id()]);
    assert_eq!(created.task.requester_goal, Some(p.boss_goal.id()));

    let handed = next(&p.worker_goal).await;
    assert_eq!(handed.kind, MessageKind::Task);
    assert_eq!(handed.from_agent_id, "boss");
    assert_eq!(handed.body, "summarise the report");
    assert_eq!(handed.callback, Some(callback.clone()));
    assert_eq!(handed.id, Some(created.task.message_id));
    assert!(handed.task.as_ref().unwrap().deadline.is_some());

    let steps = [
        (TaskOp::Accept, TaskState::Accepted),
        (TaskOp::Start, TaskState::Working),
        (TaskOp::Progress, TaskState::Working),
        (TaskOp::InputRequired, TaskState::InputRequired),
        (TaskOp::Start, TaskState::Working),
        (TaskOp::Complete, TaskState::Completed),
    ];
    for (op, state) in steps {
        let reply = p
            .worker
            .task_op(op, action(id, &format!("{} text", op.as_str())))
            .await
            .unwrap();
        assert_eq!(reply.task.state, state);
        let message = update(&p.boss_goal, state).await;
        assert_eq!(
            message.callback,
            Some(callback.clone()),
            "callback unchanged"
        );
        assert_eq!(message.in_reply_to, Some(created.task.message_id));
        assert_eq!(message.from_agent_id, "worker");
        assert_eq!(message.metadata["task_op"], op.as_str());
        if matches!(
            op,
            TaskOp::Progress | TaskOp::InputRequired | TaskOp::Complete
        ) {
            assert!(
                message.body.contains(&format!("{} text", op.as_str())),
                "{}",
                message.body
            );
        }
    }
    let done = p.boss.get_task(id).await.unwrap();
    assert_eq!(done.result.as_deref(), Some("complete text"));
    assert_eq!(done.assignee_goal, Some(p.worker_goal.id()));
    assert_eq!(done.transitions, 6);
    assert_eq!(done.history.len(), 6);

    // One event per transition plus the creation, in order, each with a stable id.
    let events = events(&fabric, id).await;
    let path: Vec<_> = events.iter().map(|e| (e.op, e.to)).collect();
    assert_eq!(path[0], (None, TaskState::Submitted));
    assert_eq!(
        path[1..]
            .iter()
            .map(|(op, to)| (op.unwrap(), *to))
            .collect::<Vec<_>>(),
        steps.to_vec()
    );
    let ids: Vec<_> = events.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids, (0..7).map(|n| format!("{id}:{n}")).collect::<Vec<_>>());

    // The other endings: reject, fail, and cancel from every live state (the assignee is told).
    let rejected = p.task("no thanks").await;
    p.worker
        .reject_task(rejected, "not my field")
        .await
        .unwrap();
    let message = update(&p.boss_goal, TaskState::Rejected).await;
    assert!(message.body.contains("not my field"));
    let failed = p.task_in(TaskState::Working).await;
    p.worker
        .fail_task(failed, "source unavailable")
        .await
        .unwrap();
    update(&p.boss_goal, TaskState::Failed).await;
    assert_eq!(
        p.boss.get_task(failed).await.unwrap().reason.as_deref(),
        Some("source unavailable")
    );
    for state in [
        TaskState::Submitted,
        TaskState::Accepted,
        TaskState::Working,
        TaskState::InputRequired,
    ] {
        let id = p.task_in(state).await;
        let reply = p.boss.cancel_task(id, Some("plans changed")).await.unwrap();
        assert_eq!(reply.task.state, TaskState::Canceled);
        update(&p.boss_goal, TaskState::Canceled).await;
        let notice = update(&p.worker_goal, TaskState::Canceled).await;
        assert_eq!(notice.from_agent_id, "boss");
        assert!(notice.body.contains("plans changed"), "{}", notice.body);
    }
    assert_no_more(&p.boss_goal).await;
    assert_no_more(&p.worker_goal).await;
}

#[tokio::test]
async fn illegal_transitions_are_refused_with_their_kind_and_change_nothing() {
    use ErrorKind::{IllegalTransition as Illegal, NotAllowed, TaskTerminal as Terminal};
    use TaskOp::*;
    use TaskState as S;
    #[derive(Clone, Copy, Debug)]
    enum Who {
        Boss,
        Worker,
        Stranger,
    }
    let fabric = Fabric::start().await;
    let p = pair(&fabric).await;
    let stranger = fabric.agent("stranger").await;
    let table: &[(S, TaskOp, Who, ErrorKind)] = &[
        (S::Submitted, Start, Who::Worker, Illegal),
        (S::Submitted, Progress, Who::Worker, Illegal),
        (S::Submitted, InputRequired, Who::Worker, Illegal),
        (S::Submitted, Complete, Who::Worker, Illegal),
        (S::Submitted, Fail, Who::Worker, Illegal),
        (S::Submitted, Accept, Who::Boss, NotAllowed),
        (S::Submitted, Cancel, Who::Worker, NotAllowed),
        (S::Submitted, Accept, Who::Stranger, NotAllowed),
        (S::Submitted, Cancel, Who::Stranger, NotAllowed),
        (S::Accepted, Reject, Who::Worker, Illegal),
        (S::Accepted, Complete, Who::Worker, Illegal),
        (S::Accepted, Progress, Who::Worker, Illegal),
        (S::Accepted, InputRequired, Who::Worker, Illegal),
        (S::Accepted, Start, Who::Boss, NotAllowed),
        (S::Working, Accept, Who::Worker, Illegal),
        (S::Working, Reject, Who::Worker, Illegal),
        (S::Working, Complete, Who::Boss, NotAllowed),
        (S::InputRequired, Complete, Who::Worker, Illegal),
        (S::InputRequired, Progress, Who::Worker, Illegal),
        (S::InputRequired, Fail, Who::Worker, Illegal),
        (S::InputRequired, Accept, Who::Worker, Illegal),
        (S::Completed, Cancel, Who::Boss, Terminal),
        (S::Completed, Start, Who::Worker, Terminal),
        (S::Completed, Fail, Who::Worker, Terminal),
        (S::Failed, Start, Who::Worker, Terminal),
        (S::Failed, Complete, Who::Worker, Terminal),
        (S::Rejected, Accept, Who::Worker, Terminal),
        (S::Rejected, Cancel, Who::Boss, Terminal),
        (S::Canceled, Accept, Who::Worker, Terminal),
        (S::Canceled, Start, Who::Worker, Terminal),
    ];
    let mut tasks: HashMap<S, Uuid> = HashMap::new();
    for (state, op, who, expected) in table {
        let id = match tasks.get(state) {
            Some(id) => *id,
            None => {
                let id = p.task_in(*state).await;
                tasks.insert(*state, id);
                id
            }
        };
        let before = p.boss.get_task(id).await.unwrap();
        let agent = match who {
            Who::Boss => &p.boss,
            Who::Worker => &p.worker,
            Who::Stranger => &stranger,
        };
        let got = kind(agent.task_op(*op, action(id, "try")).await);
        assert_eq!(got, *expected, "{op:?} by {who:?} on a {state:?} task");
        let after = p.boss.get_task(id).await.unwrap();
        assert_eq!(after, before, "a refused {op:?} changed the task");
    }
    assert_no_more(&p.boss_goal).await;
    assert_no_more(&p.worker_goal).await;

    // A retried request is answered as a duplicate: no second transition, event or message.
    let id = p.task("twice").await;
    let first = p.worker.accept_task(id).await.unwrap();
    assert!(!first.duplicate);
    let again = p.worker.accept_task(id).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.task.transitions, 1);
    update(&p.boss_goal, S::Accepted).await;
    assert_no_more(&p.boss_goal).await;
    assert_eq!(events(&fabric, id).await.len(), 2);
}

#[tokio::test]
async fn a_retried_create_is_one_task_and_one_message() {
    let fabric = Fabric::start().await;
    let p = pair(&fabric).await;
    let request = CreateTask {
        to: Some("worker".into()),
        message: Some("once".into()),
        task_id: Some(switchboard_proto::new_id()),
        ..CreateTask::default()
    };
    let first = p.boss.create_task(request.clone()).await.unwrap();
    let again = p.boss.create_task(request.clone()).await.unwrap();
    assert!(!first.duplicate);
    assert!(again.duplicate);
    assert_eq!(again.task.task_id, first.task.task_id);
    assert_eq!(next(&p.worker_goal).await.kind, MessageKind::Task);
    assert_no_more(&p.worker_goal).await;
    assert_eq!(events(&fabric, first.task.task_id).await.len(), 1);
    // The same id for a different task is a conflict, also for another agent, who gains no
    // view of the task through it.
    let other = CreateTask {
        message: Some("something else".into()),
        ..request.clone()
    };
    assert_eq!(kind(p.boss.create_task(other).await), ErrorKind::Conflict);
    let (intruder, _ig) = fabric.agent_with_goal("intruder").await;
    let stolen = CreateTask {
        to: Some("boss".into()),
        ..request
    };
    assert_eq!(
        kind(intruder.create_task(stolen).await),
        ErrorKind::Conflict
    );
    let seen = intruder.list_tasks(&ListTasks::default()).await.unwrap();
    assert!(seen.tasks.is_empty(), "{:?}", seen.tasks);
}

#[tokio::test]
async fn the_concurrency_cap_counts_active_tasks_and_the_directory_follows() {
    let fabric = Fabric::start().await;
    let (boss, _boss_goal) = fabric.agent_with_goal("boss").await;
    let mut worker_card = card("worker");
    worker_card.max_concurrent_tasks = 2;
    let worker = agent_with(&fabric.url(), worker_card, Duration::from_secs(3600)).await;
    let _goal = worker.open_goal().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(
            boss.give_task("worker", &format!("job {n}"))
                .await
                .unwrap()
                .task
                .task_id,
        );
    }
    worker.accept_task(ids[0]).await.unwrap();
    worker.accept_task(ids[1]).await.unwrap();
    assert_eq!(
        kind(worker.accept_task(ids[2]).await),
        ErrorKind::AtCapacity
    );
    assert_eq!(
        boss.get_task(ids[2]).await.unwrap().state,
        TaskState::Submitted,
        "a refused accept leaves the task submitted"
    );
    let looked = boss.lookup("worker").await.unwrap();
    assert_eq!(looked.status, AgentStatus::Busy, "busy at the cap");
    let mut current = looked.current_tasks.clone();
    current.sort();
    let mut expected = vec![ids[0].to_string(), ids[1].to_string()];
    expected.sort();
    assert_eq!(current, expected);

    // input_required still counts; ending one frees a place.
    worker.start_task(ids[0]).await.unwrap();
    worker.ask_requester(ids[0], "which format?").await.unwrap();
    assert_eq!(
        kind(worker.accept_task(ids[2]).await),
        ErrorKind::AtCapacity
    );
    worker.start_task(ids[0]).await.unwrap();
    worker
        .complete_task(ids[0], TaskOutcome::text("done"))
        .await
        .unwrap();
    assert_eq!(
        boss.lookup("worker").await.unwrap().status,
        AgentStatus::Idle
    );
    worker.accept_task(ids[2]).await.unwrap();
    boss.cancel_task(ids[1], None).await.unwrap();
    boss.cancel_task(ids[2], None).await.unwrap();
    let looked = boss.lookup("worker").await.unwrap();
    assert_eq!(looked.status, AgentStatus::Idle);
    assert!(
        looked.current_tasks.is_empty(),
        "{:?}",
        looked.current_tasks
    );

    // Concurrent accepts never exceed the cap.
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(
            boss.give_task("worker", &format!("rush {n}"))
                .await
                .unwrap()
                .task
                .task_id,
        );
    }
    let worker = Arc::new(worker);
    let accepts = ids.iter().map(|id| {
        let worker = Arc::clone(&worker);
        let id = *id;
        tokio::spawn(async move { worker.accept_task(id).await })
    });
    let results = futures::future::join_all(accepts).await;
    let accepted = results
        .iter()
        .filter(|r| r.as_ref().unwrap().is_ok())
        .count();
    assert_eq!(accepted, 2, "{results:?}");
    for result in results {
        if let Err(err) = result.unwrap() {
            assert_eq!(err.kind(), Some(ErrorKind::AtCapacity));
        }
    }
}

#[tokio::test]
async fn acceptance_needs_allow_from_and_a_deadline_ahead() {
    let fabric = Fabric::start_tasks_with(switchboard_tests::slow_task_sweep()).await;
    let (boss, _g) = fabric.agent_with_goal("boss").await;
    let mut guarded = card("worker");
    guarded.allow_from = vec!["boss".into()];
    let worker = agent_with(&fabric.url(), guarded.clone(), Duration::from_secs(3600)).await;
    let _wg = worker.open_goal().await.unwrap();
    let (stranger, _sg) = fabric.agent_with_goal("stranger").await;

    assert_eq!(
        kind(stranger.give_task("worker", "hi").await),
        ErrorKind::AclDenied
    );
    let id = boss
        .give_task("worker", "allowed")
        .await
        .unwrap()
        .task
        .task_id;
    // The card changes before the task is accepted: the rule is checked again.
    guarded.allow_from = vec!["someone-else".into()];
    let nats = async_nats::connect(fabric.url()).await.unwrap();
    raw(
        &nats,
        "agent.registry.register.worker",
        serde_json::to_vec(&guarded).unwrap(),
    )
    .await;
    assert_eq!(kind(worker.accept_task(id).await), ErrorKind::AclDenied);

    // A deadline in the past is refused at create; one that passes before accept fails the
    // task at the accept (the sweep here is slow, so the accept sees it first).
    let past = switchboard_proto::timestamp::now() - time::Duration::seconds(1);
    let refused = boss
        .create_task(CreateTask {
            to: Some("stranger".into()),
            message: Some("late".into()),
            deadline: Some(past),
            ..CreateTask::default()
        })
        .await;
    assert_eq!(kind(refused), ErrorKind::Expired);
    let id = boss
        .create_task(CreateTask {
            to: Some("stranger".into()),
            message: Some("quick".into()),
            deadline_in_ms: Some(200),
            ..CreateTask::default()
        })
        .await
        .unwrap()
        .task
        .task_id;
    // A real wait: past the task's 200 ms deadline.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(kind(stranger.accept_task(id).await), ErrorKind::Expired);
    let task = boss.get_task(id).await.unwrap();
    assert_eq!(task.state, TaskState::Failed);
    assert_eq!(task.reason.as_deref(), Some("deadline_expired"));
}

#[tokio::test]
async fn deadlines_fail_tasks_exactly_once_across_replicas_and_restarts() {
    let mut fabric = Fabric::start().await;
    let second = start_tasks(&fabric.url(), switchboard_tests::fast_tasks()).await;
    let p = pair(&fabric).await;
    let mut ids = Vec::new();
    for n in 0..6 {
        let id = p
            .boss
            .create_task(CreateTask {
                to: Some("worker".into()),
                message: Some(format!("short {n}")),
                deadline_in_ms: Some(400),
                ..CreateTask::default()
            })
            .await
            .unwrap()
            .task
            .task_id;
        next(&p.worker_goal).await;
        if n % 2 == 0 {
            p.worker.accept_task(id).await.unwrap();
            update(&p.boss_goal, TaskState::Accepted).await;
        }
        ids.push(id);
    }
    for id in &ids {
        assert_eventually!(
            Duration::from_secs(5),
            async {
                p.boss
                    .get_task(*id)
                    .await
                    .is_ok_and(|t| t.state == TaskState::Failed)
            },
            "task {id} did not expire"
        );
    }
    for id in &ids {
        let task = p.boss.get_task(*id).await.unwrap();
        assert_eq!(task.reason.as_deref(), Some("deadline_expired"));
        let expiries = events(&fabric, *id)
            .await
            .into_iter()
            .filter(|e| e.op == Some(TaskOp::Expire))
            .count();
        assert_eq!(expiries, 1, "task {id} expired {expiries} times");
    }
    // One update per task to the requester, one notice per task to the assignee.
    for _ in &ids {
        let message = update(&p.boss_goal, TaskState::Failed).await;
        assert_eq!(message.metadata["task_reason"], "deadline_expired");
        let notice = update(&p.worker_goal, TaskState::Failed).await;
        assert!(notice.body.contains("deadline_expired"));
    }
    assert_no_more(&p.boss_goal).await;
    assert_no_more(&p.worker_goal).await;
    // The worker's load was released as the accepted ones failed.
    assert!(
        p.boss
            .lookup("worker")
            .await
            .unwrap()
            .current_tasks
            .is_empty()
    );

    // Restart: with no task service running the deadline passes; the next one expires it.
    let id = p
        .boss
        .create_task(CreateTask {
            to: Some("worker".into()),
            message: Some("over the restart".into()),
            deadline_in_ms: Some(300),
            ..CreateTask::default()
        })
        .await
        .unwrap()
        .task
        .task_id;
    next(&p.worker_goal).await;
    second.stop().await;
    fabric.stop_tasks().await;
    // A real wait: the 300 ms deadline passes while no task service runs.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let _restarted = start_tasks(&fabric.url(), switchboard_tests::fast_tasks()).await;
    assert_eventually!(
        Duration::from_secs(5),
        async {
            p.boss
                .get_task(id)
                .await
                .is_ok_and(|t| t.state == TaskState::Failed)
        },
        "task {id} did not expire after the restart"
    );
    update(&p.boss_goal, TaskState::Failed).await;
    assert_eq!(
        events(&fabric, id)
            .await
            .iter()
            .filter(|e| e.op == Some(TaskOp::Expire))
            .count(),
        1
    );
}

#[tokio::test]
async fn subtasks_return_their_results_to_the_parent_goal() {
    let fabric = Fabric::start().await;
    let p = pair(&fabric).await;
    let (helper, helper_goal) = fabric.agent_with_goal("helper").await;
    let parent = p.task_in(TaskState::Working).await;

    // Only the parent's assignee spawns; the child goes to the named agent.
    assert_eq!(
        kind(p.boss.spawn_subtask(parent, "helper", "dig").await),
        ErrorKind::NotAllowed
    );
    let child = p
        .worker
        .spawn_subtask(parent, "helper", "find three sources")
        .await
        .unwrap()
        .task;
    assert_eq!(child.parent, Some(parent));
    assert_eq!(child.depth, 2);
    assert_eq!(child.requester_goal, Some(p.worker_goal.id()));
    let handed = next(&helper_goal).await;
    assert_eq!(handed.kind, MessageKind::Task);
    assert_eq!(handed.task.as_ref().unwrap().parent, Some(parent));

    helper.accept_task(child.task_id).await.unwrap();
    helper.start_task(child.task_id).await.unwrap();
    helper
        .complete_task(
            child.task_id,
            TaskOutcome {
                result: "three sources".into(),
                parts: vec![Part::Data {
                    data: serde_json::json!({"sources": ["a", "b", "c"]}),
                }],
                attachments: Vec::new(),
            },
        )
        .await
        .unwrap();
    update(&p.worker_goal, TaskState::Accepted).await;
    update(&p.worker_goal, TaskState::Working).await;
    let result = update(&p.worker_goal, TaskState::Completed).await;
    assert!(result.body.contains("three sources"));
    assert_eq!(result.task.as_ref().unwrap().parent, Some(parent));
    assert_eq!(
        result.parts,
        vec![Part::Data {
            data: serde_json::json!({"sources": ["a", "b", "c"]})
        }]
    );

    // `self`: any live goal of the caller's own agent takes it; the result comes back to
    // the goal that spawned it.
    let other_goal = p.worker.open_goal().await.unwrap();
    let own = p
        .worker
        .create_task(CreateTask {
            to: Some("self".into()),
            message: Some("check my own draft".into()),
            parent_task_id: Some(parent),
            from_goal_id: Some(p.worker_goal.id()),
            ..CreateTask::default()
        })
        .await
        .unwrap();
    assert_eq!(own.task.assignee, "worker");
    assert_eq!(own.delivered_to.len(), 2, "every live goal of the agent");
    let taken = next(&other_goal).await;
    assert_eq!(taken.kind, MessageKind::Task);
    assert_eq!(taken.task.as_ref().unwrap().id, own.task.task_id);
    p.worker
        .task_op(
            TaskOp::Accept,
            TaskAction {
                task_id: Some(own.task.task_id),
                from_goal_id: Some(other_goal.id()),
                ..TaskAction::default()
            },
        )
        .await
        .unwrap();
    // The first goal to accept has it: another goal of the same agent is refused.
    let second = p
        .worker
        .task_op(
            TaskOp::Accept,
            TaskAction {
                task_id: Some(own.task.task_id),
                from_goal_id: Some(p.worker_goal.id()),
                ..TaskAction::default()
            },
        )
        .await;
    assert_eq!(kind(second), ErrorKind::IllegalTransition);
    p.worker.start_task(own.task.task_id).await.unwrap();
    p.worker
        .complete_task(own.task.task_id, TaskOutcome::text("draft is fine"))
        .await
        .unwrap();
    // The spawning goal got the task itself (every live goal does), then the updates.
    let mut seen = Vec::new();
    while seen.last().map(|(_, state)| *state) != Some(TaskState::Completed) {
        let message = next(&p.worker_goal).await;
        if message.task.as_ref().map(|t| t.id) == Some(own.task.task_id) {
            seen.push((message.kind, message.task.unwrap().state));
        }
    }
    assert_eq!(
        seen,
        vec![
            (MessageKind::Task, TaskState::Submitted),
            (MessageKind::TaskUpdate, TaskState::Accepted),
            (MessageKind::TaskUpdate, TaskState::Working),
            (MessageKind::TaskUpdate, TaskState::Completed),
        ]
    );

    // subagent_status: the parent's children and their states.
    let children = p.worker.subtasks(parent).await.unwrap();
    let states: Vec<_> = children.iter().map(|c| (c.task_id, c.state)).collect();
    assert_eq!(
        states,
        vec![
            (child.task_id, TaskState::Completed),
            (own.task.task_id, TaskState::Completed)
        ]
    );
    // The root requester sees the children too (a party of an ancestor).
    assert_eq!(p.boss.subtasks(parent).await.unwrap().len(), 2);
    assert_eq!(
        kind(helper.subtasks(parent).await),
        ErrorKind::NotAllowed,
        "a child's assignee is not a party of the parent"
    );
}

#[tokio::test]
async fn lifetime_children_and_kept_history_are_bounded() {
    let fabric = Fabric::start_tasks_with(task_lifecycle::TaskConfig {
        max_open_children: 2,
        max_children: 3,
        ..switchboard_tests::fast_tasks()
    })
    .await;
    let p = pair(&fabric).await;
    let (helper, _hg) = fabric.agent_with_goal("helper").await;
    let root = p.task_in(TaskState::Working).await;
    // Children that ended free an open place, but not a lifetime one.
    for n in 0..3 {
        let child = p
            .worker
            .spawn_subtask(root, "helper", &format!("child {n}"))
            .await
            .unwrap()
            .task;
        helper.reject_task(child.task_id, "no").await.unwrap();
    }
    let refused = p.worker.spawn_subtask(root, "helper", "fourth").await;
    let err = refused.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::TooManyChildren));
    assert!(err.to_string().contains("has spawned 3"), "{err}");

    // The record keeps the latest transitions; the count goes on.
    for n in 0..40 {
        p.worker
            .task_progress(root, &format!("step {n}"), Vec::new())
            .await
            .unwrap();
    }
    let task = p.boss.get_task(root).await.unwrap();
    assert_eq!(
        task.transitions, 42,
        "accept, start and 40 progress reports"
    );
    assert_eq!(task.history.len(), switchboard_proto::task::HISTORY_KEPT);
    assert_eq!(
        task.history.last().unwrap().note.as_deref(),
        Some("step 39")
    );
}

#[tokio::test]
async fn depth_and_open_children_are_capped() {
    let fabric = Fabric::start().await;
    let p = pair(&fabric).await;
    let (helper, _hg) = fabric.agent_with_goal("helper").await;
    let root = p.task_in(TaskState::Working).await;
    let level2 = p
        .worker
        .spawn_subtask(root, "helper", "level 2")
        .await
        .unwrap()
        .task;
    helper.accept_task(level2.task_id).await.unwrap();
    let level3 = helper
        .spawn_subtask(level2.task_id, "worker", "level 3")
        .await
        .unwrap()
        .task;
    assert_eq!(level3.depth, 3);
    p.worker.accept_task(level3.task_id).await.unwrap();
    let too_deep = p
        .worker
        .spawn_subtask(level3.task_id, "helper", "level 4")
        .await;
    assert_eq!(kind(too_deep), ErrorKind::DepthExceeded);

    // Eight open children at once (level2 is one of them), the ninth refused.
    let mut children = vec![level2.task_id];
    for n in 0..7 {
        children.push(
            p.worker
                .spawn_subtask(root, "helper", &format!("part {n}"))
                .await
                .unwrap()
                .task
                .task_id,
        );
    }
    assert_eq!(
        kind(p.worker.spawn_subtask(root, "helper", "one too many").await),
        ErrorKind::TooManyChildren
    );
    // One ends: a place is free again.
    helper.reject_task(children[7], "busy").await.unwrap();
    p.worker
        .spawn_subtask(root, "helper", "ninth")
        .await
        .unwrap();
    assert_eq!(
        kind(p.worker.spawn_subtask(root, "helper", "tenth").await),
        ErrorKind::TooManyChildren
    );
    // Spawning under an ended task is refused.
    p.worker_goal.drain().await.unwrap();
    let ended = p.task_in(TaskState::Completed).await;
    assert_eq!(
        kind(p.worker.spawn_subtask(ended, "helper", "late").await),
        ErrorKind::TaskTerminal
    );
}

#[tokio::test]
async fn a_subtask_never_outlives_its_parents_deadline() {
    let fabric = Fabric::start().await;
    let p = pair(&fabric).await;
    let (_b, _b_goal) = fabric.agent_with_goal("agent-b").await;
    let parent = p
        .boss
        .create_task(CreateTask {
            to: Some("worker".into()),
            message: Some("within 2 s".into()),
            deadline_in_ms: Some(2_000),
            ..CreateTask::default()
        })
        .await
        .unwrap()
        .task;
    next(&p.worker_goal).await;
    p.worker.accept_task(parent.task_id).await.unwrap();
    // A subtask asking for an hour gets the parent's deadline, and the reply says so.
    let child = p
        .worker
        .create_task(CreateTask {
            to: Some("agent-b".into()),
            message: Some("take your time".into()),
            parent_task_id: Some(parent.task_id),
            deadline_in_ms: Some(3_600_000),
            ..CreateTask::default()
        })
        .await
        .unwrap();
    assert!(child.deadline_clamped);
    assert_eq!(child.task.deadline, parent.deadline);
    // One asking for less keeps its own; one asking for none gets the parent's.
    let sooner = p
        .worker
        .create_task(CreateTask {
            to: Some("agent-b".into()),
            message: Some("quick".into()),
            parent_task_id: Some(parent.task_id),
            deadline_in_ms: Some(500),
            ..CreateTask::default()
        })
        .await
        .unwrap();
    assert!(!sooner.deadline_clamped);
    let unbounded = p
        .worker
        .spawn_subtask(parent.task_id, "agent-b", "no deadline asked")
        .await
        .unwrap();
    assert!(unbounded.deadline_clamped);
    assert_eq!(unbounded.task.deadline, parent.deadline);
    // Once the parent has run out, no subtask is taken.
    // A real wait: past the parent's deadline.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let late = p
        .worker
        .spawn_subtask(parent.task_id, "agent-b", "too late")
        .await;
    assert_eq!(kind(late), ErrorKind::Expired);
}

#[tokio::test]
async fn ending_a_parent_cancels_every_open_descendant_and_tells_each_assignee() {
    let fabric = Fabric::start().await;
    let p = pair(&fabric).await;
    let (b, b_goal) = fabric.agent_with_goal("agent-b").await;
    let (c, c_goal) = fabric.agent_with_goal("agent-c").await;
    let root = p.task_in(TaskState::Working).await;
    let level2 = p
        .worker
        .spawn_subtask(root, "agent-b", "level 2")
        .await
        .unwrap()
        .task;
    next(&b_goal).await;
    b.accept_task(level2.task_id).await.unwrap();
    b.start_task(level2.task_id).await.unwrap();
    let level3 = b
        .spawn_subtask(level2.task_id, "agent-c", "level 3")
        .await
        .unwrap()
        .task;
    next(&c_goal).await;
    c.accept_task(level3.task_id).await.unwrap();
    let finished = b
        .spawn_subtask(level2.task_id, "agent-c", "already done")
        .await
        .unwrap()
        .task;
    next(&c_goal).await;
    c.reject_task(finished.task_id, "nope").await.unwrap();

    let canceled = p
        .boss
        .cancel_task(root, Some("no longer needed"))
        .await
        .unwrap();
    // The cancel reports the tree: every descendant, parents first, as the end left it.
    let tree: Vec<(Uuid, Uuid, TaskState)> = canceled
        .descendants
        .iter()
        .map(|d| (d.task_id, d.parent, d.state))
        .collect();
    assert_eq!(tree.len(), 3, "{tree:?}");
    assert_eq!(tree[0], (level2.task_id, root, TaskState::Canceled));
    let mut rest = tree[1..].to_vec();
    rest.sort_by_key(|(id, _, _)| *id);
    let mut expected = vec![
        (level3.task_id, level2.task_id, TaskState::Canceled),
        (finished.task_id, level2.task_id, TaskState::Rejected),
    ];
    expected.sort_by_key(|(id, _, _)| *id);
    assert_eq!(rest, expected);
    for (agent, id) in [(&p.boss, level2.task_id), (&p.boss, level3.task_id)] {
        let task = agent.get_task(id).await.unwrap();
        assert_eq!(task.state, TaskState::Canceled, "{id}");
        assert!(
            task.reason.as_deref().unwrap().starts_with("parent task"),
            "{:?}",
            task.reason
        );
    }
    assert_eq!(
        p.boss.get_task(finished.task_id).await.unwrap().state,
        TaskState::Rejected,
        "ended children stay as they were"
    );
    // Each assignee is told, and each requester gets the update.
    let told_b = update_of(&b_goal, level2.task_id, TaskState::Canceled).await;
    assert_eq!(told_b.from_agent_id, "worker", "from the requester");
    let told_c = update_of(&c_goal, level3.task_id, TaskState::Canceled).await;
    assert!(told_c.body.contains("parent task"), "{}", told_c.body);
    // agent-b, the requester of level 3, also gets its update.
    update_of(&b_goal, level3.task_id, TaskState::Canceled).await;
    for event in [level2.task_id, level3.task_id] {
        let cancels: Vec<_> = events(&fabric, event)
            .await
            .into_iter()
            .filter(|e| e.op == Some(TaskOp::Cancel))
            .collect();
        assert_eq!(cancels.len(), 1);
        assert_eq!(cancels[0].by, None, "the service canceled it");
    }

    // Completing a parent with an open child cancels the child too.
    p.worker_goal.drain().await.unwrap();
    let root = p.task_in(TaskState::Working).await;
    let open = p
        .worker
        .spawn_subtask(root, "agent-b", "still open")
        .await
        .unwrap()
        .task;
    p.worker
        .complete_task(root, TaskOutcome::text("done anyway"))
        .await
        .unwrap();
    assert_eq!(
        p.boss.get_task(open.task_id).await.unwrap().state,
        TaskState::Canceled
    );
}

#[tokio::test]
async fn two_replicas_racing_on_one_transition_make_it_once() {
    let fabric = Fabric::start().await;
    let (_r1, one) = start_tasks_in_process(&fabric.url(), switchboard_tests::fast_tasks()).await;
    let (_r2, two) = start_tasks_in_process(&fabric.url(), switchboard_tests::fast_tasks()).await;
    let p = pair(&fabric).await;
    let worker = p.worker.id().clone();
    let boss = p.boss.id().clone();
    for _ in 0..10 {
        let id = p
            .boss
            .give_task("worker", "race")
            .await
            .unwrap()
            .task
            .task_id;
        let (a, b) = tokio::join!(
            one.act(&worker, TaskOp::Accept, action(id, "")),
            two.act(&worker, TaskOp::Accept, action(id, ""))
        );
        let winners = [&a, &b]
            .iter()
            .filter(|r| r.as_ref().is_ok_and(|r| !r.duplicate))
            .count();
        assert_eq!(winners, 1, "{a:?} / {b:?}");
        assert!(
            a.is_ok() && b.is_ok(),
            "the loser sees a duplicate: {a:?} / {b:?}"
        );
        one.act(&worker, TaskOp::Start, action(id, ""))
            .await
            .unwrap();
        // Different actors racing to end it: one wins, the other is told it ended.
        let (done, canceled) = tokio::join!(
            one.act(&worker, TaskOp::Complete, action(id, "result")),
            two.act(&boss, TaskOp::Cancel, action(id, "stop"))
        );
        assert!(done.is_ok() != canceled.is_ok(), "{done:?} / {canceled:?}");
        let loser = done.err().or(canceled.err()).unwrap();
        assert_eq!(loser.kind(), ErrorKind::TaskTerminal);
        let events = events(&fabric, id).await;
        let ops: Vec<_> = events.iter().filter_map(|e| e.op).collect();
        assert_eq!(ops.len(), 3, "accept, start and one ending: {ops:?}");
    }

    // The concurrency cap holds across replicas: accepts of different tasks for one assignee,
    // split over both replicas at once, decided one at a time on its active set.
    let mut capped = card("capped");
    capped.max_concurrent_tasks = 2;
    let capped_agent = agent_with(&fabric.url(), capped, Duration::from_secs(3600)).await;
    let _capped_goal = capped_agent.open_goal().await.unwrap();
    let capped_id = capped_agent.id().clone();
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(
            p.boss
                .give_task("capped", &format!("rush {n}"))
                .await
                .unwrap()
                .task
                .task_id,
        );
    }
    let accepts = ids.iter().enumerate().map(|(n, id)| {
        let replica = if n % 2 == 0 { &one } else { &two };
        replica.act(&capped_id, TaskOp::Accept, action(*id, ""))
    });
    let results = futures::future::join_all(accepts).await;
    let accepted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(accepted, 2, "{results:?}");
    for result in results {
        if let Err(err) = result {
            assert_eq!(err.kind(), ErrorKind::AtCapacity);
        }
    }
}

#[tokio::test]
async fn bad_input_gets_a_typed_error() {
    let fabric = Fabric::start().await;
    let p = pair(&fabric).await;
    let parent = p.task_in(TaskState::Working).await;
    let other_goal = fabric.agent_with_goal("other").await.1;
    let nats = async_nats::connect(fabric.url()).await.unwrap();
    let body_limit = "x".repeat(switchboard_proto::MAX_BODY_BYTES + 1);
    let cases: Vec<(&str, String, &str)> = vec![
        ("agent.task.create.boss", "not json".into(), "bad_request"),
        (
            "agent.task.create.boss",
            r#"{"to":"worker","message":"x","bogus":1}"#.into(),
            "bad_request",
        ),
        (
            "agent.task.create.boss",
            r#"{"message":"x"}"#.into(),
            "missing_to",
        ),
        (
            "agent.task.create.boss",
            r#"{"to":"boss","message":"x"}"#.into(),
            "self_send",
        ),
        (
            "agent.task.create.boss",
            r#"{"to":"worker","message":"  "}"#.into(),
            "empty_message",
        ),
        (
            "agent.task.create.boss",
            serde_json::json!({"to":"worker","message": body_limit}).to_string(),
            "body_too_large",
        ),
        (
            "agent.task.create.boss",
            r#"{"to":"ghost","message":"x"}"#.into(),
            "unreachable",
        ),
        (
            "agent.task.create.boss",
            r#"{"to":"bad id","message":"x"}"#.into(),
            "unreachable",
        ),
        (
            "agent.task.create.boss",
            r#"{"to":"*","message":"x"}"#.into(),
            "bad_request",
        ),
        (
            "agent.task.create.nobody",
            r#"{"to":"worker","message":"x"}"#.into(),
            "not_registered",
        ),
        (
            "agent.task.create.boss",
            r#"{"to":"worker","message":"x","deadline_in_ms":5,"deadline":"2030-01-01T00:00:00Z"}"#
                .into(),
            "bad_request",
        ),
        (
            "agent.task.create.boss",
            r#"{"to":"worker","message":"x","deadline":"yesterday"}"#.into(),
            "bad_request",
        ),
        (
            "agent.task.create.boss",
            format!(r#"{{"to":"worker","message":"x","parent_task_id":"{parent}"}}"#),
            "bad_request",
        ),
        (
            "agent.task.create.boss",
            format!(
                r#"{{"to":"worker","message":"x","from_goal_id":"{}"}}"#,
                other_goal.id()
            ),
            "invalid_goal_id",
        ),
        (
            "agent.task.spawn.worker",
            r#"{"to":"boss","message":"x"}"#.into(),
            "bad_request",
        ),
        (
            "agent.task.spawn.worker",
            format!(
                r#"{{"to":"boss","message":"x","parent_task_id":"{}"}}"#,
                Uuid::nil()
            ),
            "not_found",
        ),
        ("agent.task.accept.worker", "{}".into(), "bad_request"),
        (
            "agent.task.accept.worker",
            r#"{"task_id":"not-a-uuid"}"#.into(),
            "bad_request",
        ),
        (
            "agent.task.accept.worker",
            format!(r#"{{"task_id":"{}"}}"#, Uuid::nil()),
            "not_found",
        ),
        (
            "agent.task.reject.worker",
            format!(r#"{{"task_id":"{parent}"}}"#),
            "bad_request",
        ),
        (
            "agent.task.fail.worker",
            format!(r#"{{"task_id":"{parent}","reason":" "}}"#),
            "bad_request",
        ),
        (
            "agent.task.input_required.worker",
            format!(r#"{{"task_id":"{parent}"}}"#),
            "bad_request",
        ),
        (
            "agent.task.progress.worker",
            format!(r#"{{"task_id":"{parent}"}}"#),
            "bad_request",
        ),
        (
            "agent.task.progress.worker",
            format!(r#"{{"task_id":"{parent}","note":"a","reason":"b"}}"#),
            "bad_request",
        ),
        (
            "agent.task.accept.a.b",
            format!(r#"{{"task_id":"{parent}"}}"#),
            "invalid_agent_id",
        ),
        (
            "agent.task.get.stranger",
            format!(r#"{{"task_id":"{parent}"}}"#),
            "not_allowed",
        ),
        (
            "agent.task.list.boss",
            r#"{"limit":0}"#.into(),
            "bad_request",
        ),
        (
            "agent.task.list.boss",
            r#"{"limit":100000}"#.into(),
            "bad_request",
        ),
        (
            "agent.task.list.boss",
            r#"{"role":"boss"}"#.into(),
            "bad_request",
        ),
        (
            "agent.task.list.boss",
            r#"{"state":"sleeping"}"#.into(),
            "bad_request",
        ),
    ];
    for (subject, body, expected) in cases {
        let reply = raw(&nats, subject, body.clone()).await;
        assert_eq!(reply.error_kind(), expected, "{subject} {body:.120}");
    }
    // Nothing was created by any of them, and the service still serves.
    let listing = p.boss.list_tasks(&ListTasks::default()).await.unwrap();
    assert_eq!(listing.tasks.len(), 1);
    p.worker
        .task_progress(parent, "still fine", Vec::new())
        .await
        .unwrap();
}

#[tokio::test]
async fn listings_filter_by_role_state_and_peer_and_page_both_ways() {
    let fabric = Fabric::start().await;
    let p = pair(&fabric).await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(
            p.boss
                .give_task("worker", &format!("item {n}"))
                .await
                .unwrap()
                .task
                .task_id,
        );
    }
    let back = p
        .worker
        .give_task("boss", "the other way")
        .await
        .unwrap()
        .task
        .task_id;
    p.worker.accept_task(ids[1]).await.unwrap();
    p.worker.accept_task(ids[3]).await.unwrap();

    let list = |role, state, limit, cursor| ListTasks {
        role,
        state,
        parent: None,
        limit,
        cursor,
        ..ListTasks::default()
    };
    let ids_of = |tasks: &[TaskRecord]| tasks.iter().map(|t| t.task_id).collect::<Vec<_>>();
    let accepted = p
        .worker
        .list_tasks(&list(
            ListRole::Assignee,
            Some(TaskState::Accepted),
            None,
            None,
        ))
        .await
        .unwrap();
    assert_eq!(ids_of(&accepted.tasks), vec![ids[1], ids[3]]);
    let asked = p
        .boss
        .list_tasks(&list(ListRole::Requester, None, None, None))
        .await
        .unwrap();
    assert_eq!(ids_of(&asked.tasks), ids);
    let both = p
        .boss
        .list_tasks(&list(ListRole::Any, None, None, None))
        .await
        .unwrap();
    assert_eq!(both.tasks.len(), 6);
    assert_eq!(both.tasks.last().unwrap().task_id, back, "oldest first");

    let mut pages = Vec::new();
    let mut cursor = None;
    loop {
        let page = p
            .boss
            .list_tasks(&list(ListRole::Requester, None, Some(2), cursor))
            .await
            .unwrap();
        pages.push(ids_of(&page.tasks));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(
        pages,
        vec![ids[0..2].to_vec(), ids[2..4].to_vec(), ids[4..5].to_vec()]
    );
    // Newest first pages backwards; the total counts every page.
    let mut newest = Vec::new();
    let mut cursor = None;
    loop {
        let page = p
            .boss
            .list_tasks(&ListTasks {
                newest_first: true,
                ..list(ListRole::Requester, None, Some(2), cursor)
            })
            .await
            .unwrap();
        assert_eq!(page.total, Some(5), "every page tells the total");
        newest.extend(ids_of(&page.tasks));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(newest, ids.iter().rev().copied().collect::<Vec<_>>());
    let accepted_total = p
        .worker
        .list_tasks(&list(
            ListRole::Assignee,
            Some(TaskState::Accepted),
            Some(1),
            None,
        ))
        .await
        .unwrap();
    assert_eq!(accepted_total.tasks.len(), 1);
    assert_eq!(
        accepted_total.total,
        Some(2),
        "a state filter is counted record by record"
    );

    // One peer's tasks: a third agent's task for the worker is not the boss's.
    let third = fabric.agent("third").await;
    let _goal = third.open_goal().await.unwrap();
    let from_third = third
        .give_task("worker", "mine")
        .await
        .unwrap()
        .task
        .task_id;
    let with_boss = p
        .worker
        .list_tasks(&ListTasks {
            peer: Some(AgentId::parse("boss").unwrap()),
            ..list(ListRole::Any, None, None, None)
        })
        .await
        .unwrap();
    let mut expected = ids.clone();
    expected.push(back);
    assert_eq!(ids_of(&with_boss.tasks), expected);
    assert_eq!(with_boss.total, Some(6));
    let with_third = p
        .worker
        .list_tasks(&ListTasks {
            peer: Some(AgentId::parse("third").unwrap()),
            ..list(ListRole::Assignee, None, None, None)
        })
        .await
        .unwrap();
    assert_eq!(ids_of(&with_third.tasks), vec![from_third]);

    let stranger = fabric.agent("stranger").await;
    assert!(
        stranger
            .list_tasks(&ListTasks::default())
            .await
            .unwrap()
            .tasks
            .is_empty()
    );
    assert_eq!(kind(stranger.get_task(ids[0]).await), ErrorKind::NotAllowed);
}

#[tokio::test]
async fn the_worker_loop_accepts_works_and_completes_or_fails() {
    let fabric = Fabric::start().await;
    let (boss, boss_goal) = fabric.agent_with_goal("boss").await;
    let (worker, goal) = fabric.agent_with_goal("worker").await;
    let stop = tokio_util::sync::CancellationToken::new();
    let (others, mut other_rx) = tokio::sync::mpsc::unbounded_channel();
    let worker = Arc::new(worker);
    let looping = {
        let worker = Arc::clone(&worker);
        let stop = stop.clone();
        tokio::spawn(async move {
            worker
                .serve_tasks(&goal, stop, Some(others), |task| async move {
                    if task.message.contains("impossible") {
                        Err("cannot be done".to_owned())
                    } else {
                        Ok(TaskOutcome::text(format!("did: {}", task.message)))
                    }
                })
                .await
        })
    };
    let ok = boss
        .give_task("worker", "write a haiku")
        .await
        .unwrap()
        .task
        .task_id;
    update(&boss_goal, TaskState::Accepted).await;
    update(&boss_goal, TaskState::Working).await;
    let done = update(&boss_goal, TaskState::Completed).await;
    assert!(done.body.contains("did: write a haiku"));
    assert_eq!(
        boss.get_task(ok).await.unwrap().result.as_deref(),
        Some("did: write a haiku")
    );
    boss.give_task("worker", "something impossible")
        .await
        .unwrap();
    update(&boss_goal, TaskState::Accepted).await;
    update(&boss_goal, TaskState::Working).await;
    let failed = update(&boss_goal, TaskState::Failed).await;
    assert!(failed.body.contains("cannot be done"));
    boss.send_to_peer("worker", "just a chat").await.unwrap();
    let chat = tokio::time::timeout(Duration::from_secs(10), other_rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(chat.body, "just a chat");
    stop.cancel();
    looping.await.unwrap().unwrap();
}

/// The reference model for the property test: legal moves by role, written as a table
/// independent of `switchboard_proto::task::apply`.
fn model_next(state: TaskState, op: TaskOp, as_assignee: bool) -> Result<TaskState, ErrorKind> {
    use TaskState as S;
    let by_assignee = !matches!(op, TaskOp::Cancel);
    if by_assignee != as_assignee {
        return Err(ErrorKind::NotAllowed);
    }
    if matches!(state, S::Completed | S::Failed | S::Rejected | S::Canceled) {
        return Err(ErrorKind::TaskTerminal);
    }
    match (state, op) {
        (S::Submitted, TaskOp::Accept) => Ok(S::Accepted),
        (S::Submitted, TaskOp::Reject) => Ok(S::Rejected),
        (S::Accepted, TaskOp::Start) | (S::InputRequired, TaskOp::Start) => Ok(S::Working),
        (S::Working, TaskOp::Progress) => Ok(S::Working),
        (S::Working, TaskOp::InputRequired) => Ok(S::InputRequired),
        (S::Working, TaskOp::Complete) => Ok(S::Completed),
        (S::Working, TaskOp::Fail) => Ok(S::Failed),
        (_, TaskOp::Cancel) => Ok(S::Canceled),
        _ => Err(ErrorKind::IllegalTransition),
    }
}

const OPS: [TaskOp; 8] = [
    TaskOp::Accept,
    TaskOp::Reject,
    TaskOp::Start,
    TaskOp::Progress,
    TaskOp::InputRequired,
    TaskOp::Complete,
    TaskOp::Fail,
    TaskOp::Cancel,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_op_sequences_against_the_service_match_the_model() {
    let fabric = Fabric::start().await;
    let boss = fabric.agent("boss").await;
    let worker = fabric.agent("worker").await;
    let stranger = fabric.agent("stranger").await;
    let _goal = worker.open_goal().await.unwrap();
    let _boss_goal = boss.open_goal().await.unwrap();
    let handle = tokio::runtime::Handle::current();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 40,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let steps = prop::collection::vec((prop::sample::select(OPS.to_vec()), 0..3u8), 1..14);
    runner
        .run(&steps, |steps| {
            tokio::task::block_in_place(|| {
                handle.block_on(async {
                    let id = boss
                        .give_task("worker", "model")
                        .await
                        .unwrap()
                        .task
                        .task_id;
                    let mut state = TaskState::Submitted;
                    let mut last: Option<(TaskOp, u8)> = None;
                    let mut transitions = 0;
                    for (op, who) in steps {
                        let agent = [&boss, &worker, &stranger][usize::from(who)];
                        let got = agent.task_op(op, action(id, "because")).await;
                        let repeat = who != 2 && op != TaskOp::Progress && last == Some((op, who));
                        let expected = if who == 2 {
                            Err(ErrorKind::NotAllowed)
                        } else if repeat {
                            Ok(state) // a retried request: answered as a duplicate
                        } else {
                            model_next(state, op, who == 1)
                        };
                        match (&got, expected) {
                            (Ok(reply), Ok(next)) => {
                                prop_assert_eq!(reply.task.state, next);
                                prop_assert_eq!(reply.duplicate, repeat);
                                if !repeat {
                                    transitions += 1;
                                    last = Some((op, who));
                                }
                                state = next;
                            }
                            (Err(err), Err(kind)) => prop_assert_eq!(err.kind(), Some(kind)),
                            (got, expected) => prop_assert!(
                                false,
                                "{:?} by {} from {:?}: got {:?}, model {:?}",
                                op,
                                who,
                                state,
                                got.as_ref().map(|r| r.task.state),
                                expected
                            ),
                        }
                    }
                    let task = boss.get_task(id).await.unwrap();
                    prop_assert_eq!(task.state, state);
                    prop_assert_eq!(task.transitions, transitions);
                    if !state.is_terminal() {
                        boss.cancel_task(id, None).await.unwrap();
                    }
                    Ok(())
                })
            })
        })
        .unwrap();
}

#[tokio::test]
async fn task_requests_are_micro_endpoints() {
    let fabric = Fabric::start().await;
    let nats = async_nats::connect(fabric.url()).await.unwrap();
    let info = raw(&nats, "$SRV.INFO.task-lifecycle", "").await;
    let subjects: Vec<String> = info.body["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["subject"].as_str().unwrap().to_owned())
        .collect();
    for op in TaskRequestOp::ALL {
        assert!(
            subjects.contains(&format!("{}.>", op.prefix())),
            "{} missing from {subjects:?}",
            op.token()
        );
    }
}

/// Issue 37, hole 2: a `list` reads at most `LIST_READ_MAX` records per request, whatever its
/// filter matches. Over more candidates than that, a `metadata` filter that matches only the
/// oldest task answers an empty page with a cursor (not a scan of every task), and the next
/// page finds it; over fewer, the filter is counted and paged exactly. `peer` lists one pair's
/// tasks only, and a `metadata` filter of too many keys is refused.
#[tokio::test]
async fn a_listing_reads_a_bounded_number_of_records_and_filters_by_metadata() {
    use futures::StreamExt;
    use switchboard_proto::task::{LIST_METADATA_MAX, LIST_READ_MAX};

    let fabric = Fabric::start().await;
    let p = pair(&fabric).await;
    let topic = |value: &str| {
        let mut metadata = serde_json::Map::new();
        metadata.insert("topic".to_owned(), serde_json::json!(value));
        metadata
    };
    let create = |to: &'static str, text: String, value: &'static str| {
        p.boss.create_task(CreateTask {
            to: Some(to.to_owned()),
            message: Some(text),
            metadata: topic(value),
            ..CreateTask::default()
        })
    };
    // The needle first (the oldest id), then more hay than one listing reads.
    let needle = create("worker", "needle".to_owned(), "needle")
        .await
        .unwrap()
        .task
        .task_id;
    let hay = LIST_READ_MAX + 20;
    let made: Vec<_> = futures::stream::iter(0..hay)
        .map(|n| create("worker", format!("hay {n}"), "hay"))
        .buffer_unordered(16)
        .collect()
        .await;
    let failed: Vec<_> = made.iter().filter_map(|made| made.as_ref().err()).collect();
    assert!(failed.is_empty(), "creates failed: {failed:?}");

    // Newest first, the needle is the last candidate: the first page spends its reads on hay.
    let needles = |cursor| ListTasks {
        role: ListRole::Requester,
        peer: Some(AgentId::parse("worker").unwrap()),
        limit: Some(1),
        cursor,
        newest_first: true,
        metadata: topic("needle"),
        ..ListTasks::default()
    };
    let first = p.boss.list_tasks(&needles(None)).await.unwrap();
    assert!(first.tasks.is_empty(), "{} tasks", first.tasks.len());
    assert!(
        first.next_cursor.is_some(),
        "a page cut short by the read budget says where to read on"
    );
    assert_eq!(first.total, None, "too many candidates to count");
    let second = p
        .boss
        .list_tasks(&needles(first.next_cursor))
        .await
        .unwrap();
    let found: Vec<Uuid> = second.tasks.iter().map(|t| t.task_id).collect();
    assert_eq!(found, vec![needle]);
    assert_eq!(second.next_cursor, None, "the end of the list");

    // Few candidates: the filter is counted and paged exactly (another pair of agents).
    let (_third, _third_goal) = fabric.agent_with_goal("third").await;
    let mut ours = Vec::new();
    for (n, value) in ["a", "b", "a"].into_iter().enumerate() {
        ours.push(
            create("third", format!("for third {n}"), value)
                .await
                .unwrap()
                .task
                .task_id,
        );
    }
    let topic_a = |cursor| ListTasks {
        role: ListRole::Requester,
        peer: Some(AgentId::parse("third").unwrap()),
        limit: Some(1),
        cursor,
        metadata: topic("a"),
        ..ListTasks::default()
    };
    let page = p.boss.list_tasks(&topic_a(None)).await.unwrap();
    assert_eq!(page.total, Some(2), "counted record by record");
    assert_eq!(
        page.tasks.iter().map(|t| t.task_id).collect::<Vec<_>>(),
        vec![ours[0]]
    );
    let last = p.boss.list_tasks(&topic_a(page.next_cursor)).await.unwrap();
    assert_eq!(
        last.tasks.iter().map(|t| t.task_id).collect::<Vec<_>>(),
        vec![ours[2]]
    );
    assert_eq!(last.next_cursor, None);
    // The pair's own entries: the third agent's tasks are none of the worker's.
    let with_third = p
        .boss
        .list_tasks(&ListTasks {
            role: ListRole::Requester,
            peer: Some(AgentId::parse("third").unwrap()),
            ..ListTasks::default()
        })
        .await
        .unwrap();
    assert_eq!(with_third.total, Some(3));
    assert_eq!(
        with_third
            .tasks
            .iter()
            .map(|t| t.task_id)
            .collect::<Vec<_>>(),
        ours
    );

    // A filter of too many keys is refused before anything is read.
    let mut wide = serde_json::Map::new();
    for n in 0..=LIST_METADATA_MAX {
        wide.insert(format!("k{n}"), serde_json::json!(n));
    }
    assert_eq!(
        kind(
            p.boss
                .list_tasks(&ListTasks {
                    metadata: wide,
                    ..ListTasks::default()
                })
                .await
        ),
        ErrorKind::BadRequest
    );
}
