//! Files by reference on tasks (docs/protocol.md §17): a task's input files, a progress note's
//! and its result's (the task's artifacts) reach the other party, who may read them, also with
//! no live goal; an outsider may not, and a file the caller may not pass on changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use switchboard_client::TaskOutcome;
use switchboard_proto::task::{CreateTask, TaskAction, TaskOp};
use switchboard_proto::{ErrorKind, TaskState};
use switchboard_tests::files::{attachments_of, fabric_with_files, kind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_carries_files_both_ways_and_only_to_its_parties() {
    let (fabric, _files) = fabric_with_files(Default::default()).await;
    let (requester, requester_goal) = fabric.agent_with_goal("requester").await;
    let (worker, worker_goal) = fabric.agent_with_goal("worker").await;
    let outsider = fabric.agent("outsider").await;
    let brief = requester
        .upload_bytes("brief.md", "text/markdown", b"# summarise this")
        .await
        .unwrap();
    let secret = outsider
        .upload_bytes("secret.txt", "text/plain", b"not yours")
        .await
        .unwrap();

    // Another agent's file on a create: refused before anything is stored or delivered.
    let stolen = requester
        .create_task(CreateTask {
            to: Some("worker".into()),
            message: Some("use this".into()),
            attachments: vec![secret.clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(kind(&stolen), ErrorKind::NotFound, "{stolen}");
    // A lie about the file's size: bad_request.
    let mut lying = brief.clone();
    lying.size += 1;
    let lie = requester
        .create_task(CreateTask {
            to: Some("worker".into()),
            message: Some("use this".into()),
            attachments: vec![lying],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(kind(&lie), ErrorKind::BadRequest, "{lie}");
    assert!(
        worker_goal
            .recv(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none(),
        "a refused task delivers nothing"
    );

    let created = requester
        .create_task(CreateTask {
            to: Some("worker".into()),
            message: Some("summarise the brief".into()),
            attachments: vec![brief.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let task_id = created.task.task_id;
    assert_eq!(created.task.attachments, vec![brief.clone()]);
    // The kind: task message carries the brief; the worker reads it.
    assert_eq!(attachments_of(&worker_goal).await, vec![brief.clone()]);
    assert_eq!(
        worker.read_attachment(&brief).await.unwrap(),
        b"# summarise this"
    );
    assert_eq!(
        kind(&outsider.read_attachment(&brief).await.unwrap_err()),
        ErrorKind::NotFound
    );

    worker.accept_task(task_id).await.unwrap();
    worker.start_task(task_id).await.unwrap();
    let _ = attachments_of(&requester_goal).await; // accepted
    let _ = attachments_of(&requester_goal).await; // working

    // A progress note with a draft, then the result with the summary: the requester's goal
    // gets each, and the record keeps the result's files as the task's artifacts.
    let draft = worker
        .upload_bytes("draft.md", "text/markdown", b"draft")
        .await
        .unwrap();
    worker
        .task_op(
            TaskOp::Progress,
            TaskAction {
                task_id: Some(task_id),
                message: Some("a first draft".into()),
                attachments: vec![draft.clone()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(attachments_of(&requester_goal).await, vec![draft.clone()]);
    assert_eq!(requester.read_attachment(&draft).await.unwrap(), b"draft");

    // The worker may not complete with a file that is not its to pass on; nothing moves.
    let refused = worker
        .complete_task(
            task_id,
            TaskOutcome {
                result: "done".into(),
                attachments: vec![secret.clone()],
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(kind(&refused), ErrorKind::NotFound, "{refused}");
    assert_eq!(
        requester.get_task(task_id).await.unwrap().state,
        TaskState::Working
    );

    let summary = worker
        .upload_bytes("summary.md", "text/markdown", b"short")
        .await
        .unwrap();
    let done = worker
        .complete_task(
            task_id,
            TaskOutcome {
                result: "summarised".into(),
                attachments: vec![summary.clone(), brief.clone()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        done.task.result_attachments,
        vec![summary.clone(), brief.clone()]
    );
    assert_eq!(
        attachments_of(&requester_goal).await,
        vec![summary.clone(), brief.clone()]
    );
    assert_eq!(requester.read_attachment(&summary).await.unwrap(), b"short");
    let record = requester.get_task(task_id).await.unwrap();
    assert_eq!(record.result_attachments, vec![summary.clone(), brief]);
    assert_eq!(
        kind(&outsider.read_attachment(&summary).await.unwrap_err()),
        ErrorKind::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requester_without_a_live_goal_still_reads_its_tasks_artifacts() {
    let (fabric, _files) = fabric_with_files(Default::default()).await;
    // A requester that only polls its tasks (as the A2A gateway's clients do): its goal
    // closes after the create, so the result's update has nowhere to go.
    let (requester, requester_goal) = fabric.agent_with_goal("poller").await;
    let (worker, worker_goal) = fabric.agent_with_goal("worker").await;
    let task_id = requester
        .give_task("worker", "make a chart")
        .await
        .unwrap()
        .task
        .task_id;
    let _ = attachments_of(&worker_goal).await;
    requester_goal.close().await.unwrap();
    worker.accept_task(task_id).await.unwrap();
    worker.start_task(task_id).await.unwrap();
    let chart = worker
        .upload_bytes("chart.svg", "image/svg+xml", b"<svg/>")
        .await
        .unwrap();
    worker
        .complete_task(
            task_id,
            TaskOutcome {
                result: "here".into(),
                attachments: vec![chart.clone()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let record = requester.get_task(task_id).await.unwrap();
    assert_eq!(record.state, TaskState::Completed);
    assert_eq!(record.result_attachments, vec![chart.clone()]);
    assert_eq!(requester.read_attachment(&chart).await.unwrap(), b"<svg/>");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_or_malformed_attachments_on_a_task_are_bad_requests() {
    let (fabric, _files) = fabric_with_files(Default::default()).await;
    let requester = fabric.agent("requester").await;
    let (_worker, _goal) = fabric.agent_with_goal("worker").await;
    let file = requester
        .upload_bytes("a.txt", "text/plain", b"a")
        .await
        .unwrap();
    let too_many = requester
        .create_task(CreateTask {
            to: Some("worker".into()),
            message: Some("x".into()),
            attachments: vec![file.clone(); 17],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(kind(&too_many), ErrorKind::BadRequest, "{too_many}");
    let mut climbing = file.clone();
    climbing.name = "../../etc/passwd".into();
    let climb = requester
        .create_task(CreateTask {
            to: Some("worker".into()),
            message: Some("x".into()),
            attachments: vec![climbing],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(kind(&climb), ErrorKind::BadRequest, "{climb}");
}
