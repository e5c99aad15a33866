//! Files by reference on calls (docs/protocol.md §17): a call's request and its answer carry
//! files each way, waiting or parked, and only the call's parties may read them.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use switchboard_proto::ErrorKind;
use switchboard_tests::files::{attachments_of, fabric_with_files, kind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_carries_a_file_each_way_and_only_to_its_parties() {
    let (fabric, _files) = fabric_with_files(Default::default()).await;
    let (caller, caller_goal) = fabric.agent_with_goal("caller").await;
    let (callee, callee_goal) = fabric.agent_with_goal("callee").await;
    let outsider = fabric.agent("outsider").await;
    let question = caller
        .upload_bytes("question.csv", "text/csv", b"a,b\n1,2\n")
        .await
        .unwrap();
    let answer = callee
        .upload_bytes("answer.json", "application/json", br#"{"sum": 3}"#)
        .await
        .unwrap();
    let secret = outsider
        .upload_bytes("secret.txt", "text/plain", b"not yours")
        .await
        .unwrap();

    // A waiting call: the request carries the question, the answer the result.
    let serving = {
        let callee = std::sync::Arc::new(callee);
        let (answer, secret) = (answer.clone(), secret.clone());
        tokio::spawn(async move {
            for round in 0..2 {
                let delivery = callee_goal
                    .recv(Duration::from_secs(10))
                    .await
                    .unwrap()
                    .expect("a request");
                let request = delivery.ack().await.unwrap();
                let id = request.correlation_id.unwrap();
                assert_eq!(request.attachments.len(), 1);
                assert_eq!(
                    callee
                        .read_attachment(&request.attachments[0])
                        .await
                        .unwrap(),
                    b"a,b\n1,2\n"
                );
                if round == 0 {
                    // Another agent's file may not ride on an answer.
                    let err = callee
                        .reply_with_attachments(id, "stolen", vec![secret.clone()])
                        .await
                        .unwrap_err();
                    assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");
                }
                callee
                    .reply_with_attachments(id, "the sum", vec![answer.clone()])
                    .await
                    .unwrap();
            }
        })
    };
    let asked = switchboard_proto::call::CallRequest {
        to: Some("callee".into()),
        message: Some("add these".into()),
        timeout_ms: Some(10_000),
        attachments: vec![question.clone()],
        ..Default::default()
    };
    let answered = caller.call_with(asked.clone()).await.unwrap();
    assert_eq!(answered.attachments, vec![answer.clone()]);
    assert_eq!(
        caller
            .read_attachment(&answered.attachments[0])
            .await
            .unwrap(),
        br#"{"sum": 3}"#
    );
    // A parked call: the answer lands in the caller's inbox, the file with it.
    caller.call_parked_with(asked).await.unwrap();
    let response = attachments_of(&caller_goal).await;
    assert_eq!(response, vec![answer.clone()]);
    serving.await.unwrap();
    // The outsider was never a party: it reads neither.
    for file in [&question, &answer] {
        let err = outsider.read_attachment(file).await.unwrap_err();
        assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_part_carries_files_the_caller_reads_as_they_come() {
    use futures::StreamExt;
    use switchboard_client::CallEvent;
    use switchboard_proto::call::{CallRequest, ReplyRequest};

    let (fabric, _files) = fabric_with_files(Default::default()).await;
    let caller = fabric.agent("caller").await;
    let (callee, callee_goal) = fabric.agent_with_goal("callee").await;
    let outsider = fabric.agent("outsider").await;
    let page = callee
        .upload_bytes("page-1.txt", "text/plain", b"first page")
        .await
        .unwrap();
    let secret = outsider
        .upload_bytes("secret.txt", "text/plain", b"not yours")
        .await
        .unwrap();
    let serving = tokio::spawn(async move {
        let delivery = callee_goal
            .recv(Duration::from_secs(10))
            .await
            .unwrap()
            .expect("a request");
        let id = delivery.ack().await.unwrap().correlation_id.unwrap();
        let part = |attachments, error: Option<switchboard_proto::call::ReplyError>| ReplyRequest {
            correlation_id: Some(id),
            message: error.is_none().then(|| "page one; ".to_owned()),
            partial: error.is_none(),
            part: error.is_none().then_some(1),
            attachments,
            error,
            ..Default::default()
        };
        // Another agent's file on a part: refused, and no part is taken.
        let stolen = callee
            .reply_with(part(vec![secret], None))
            .await
            .unwrap_err();
        assert_eq!(kind(&stolen), ErrorKind::NotFound, "{stolen}");
        // Files on a failure: bad_request.
        let failing = part(
            vec![page.clone()],
            Some(switchboard_proto::call::ReplyError {
                kind: "handler_error".into(),
                message: "no".into(),
            }),
        );
        let refused = callee.reply_with(failing).await.unwrap_err();
        assert_eq!(kind(&refused), ErrorKind::BadRequest, "{refused}");
        let taken = callee
            .reply_with(part(vec![page.clone()], None))
            .await
            .unwrap();
        assert_eq!(taken.part, Some(1));
        callee.reply(id, "done").await.unwrap();
        page
    });
    let mut events = Box::pin(
        caller
            .call_streamed(CallRequest {
                to: Some("callee".into()),
                message: Some("read me the book".into()),
                timeout_ms: Some(10_000),
                ..Default::default()
            })
            .await
            .unwrap(),
    );
    let Some(Ok(CallEvent::Part(first))) = events.next().await else {
        panic!("a part first");
    };
    assert_eq!(first.part, 1);
    assert_eq!(first.attachments.len(), 1);
    assert_eq!(
        caller.read_attachment(&first.attachments[0]).await.unwrap(),
        b"first page"
    );
    let Some(Ok(CallEvent::Answer(answer))) = events.next().await else {
        panic!("then the answer");
    };
    assert_eq!(answer.body, "page one; done");
    assert!(answer.attachments.is_empty(), "a part's files stay with it");
    let page = serving.await.unwrap();
    assert_eq!(
        kind(&outsider.read_attachment(&page).await.unwrap_err()),
        ErrorKind::NotFound
    );
}
