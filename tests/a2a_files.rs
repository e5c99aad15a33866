//! Files through the A2A gateway (docs/a2a.md "Files", docs/protocol.md §17): an A2A client's
//! `raw` file part above `inline_file_bytes` reaches the agent as an attachment (a small one
//! stays inline), and the agent's result files come back as links of the gateway that only
//! work while signed, unchanged and readable by that client.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use switchboard_client::TaskOutcome;
use switchboard_proto::{MessageKind, Part};
use switchboard_tests::a2a::{A2a, message, state};
use switchboard_tests::files::data;
use switchboard_tests::http;

/// A `scribe` agent working each task it gets: it reads the task's files and inline parts,
/// and completes with one file, `SHOUT.txt` (the first file's bytes in upper case), its text
/// saying how many of each it was given. A task whose text says `revoke after` has the
/// result's reading revoked from every reader right after it completes.
async fn spawn_scribe(a2a: &A2a) -> tokio::task::JoinHandle<()> {
    let (scribe, goal) = a2a.fabric.agent_with_goal("scribe").await;
    let scribe = Arc::new(scribe);
    tokio::spawn(async move {
        loop {
            let Ok(Some(delivery)) = goal.recv(Duration::from_secs(30)).await else {
                return;
            };
            let message = delivery.ack().await.unwrap();
            if message.kind != MessageKind::Task {
                continue;
            }
            let task_id = message.task.as_ref().unwrap().id;
            scribe.accept_task(task_id).await.unwrap();
            scribe.start_task(task_id).await.unwrap();
            let inline = message
                .parts
                .iter()
                .filter(|part| matches!(part, Part::File { uri, .. } if uri.starts_with("data:")))
                .count();
            let mut shouted = Vec::new();
            if let Some(first) = message.attachments.first() {
                shouted = scribe.read_attachment(first).await.unwrap();
                shouted.make_ascii_uppercase();
            }
            let result = scribe
                .upload_bytes("SHOUT.txt", "text/plain", &shouted)
                .await
                .unwrap();
            let text = format!("files: {}, inline: {}", message.attachments.len(), inline);
            scribe
                .complete_task(
                    task_id,
                    TaskOutcome {
                        result: text,
                        attachments: vec![result.clone()],
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            if message.body.contains("revoke after") {
                scribe.file_revoke(result.file_ref, None).await.unwrap();
            }
        }
    })
}

async fn start() -> (A2a, switchboard_tests::Replica) {
    let a2a = A2a::start().await;
    let files = switchboard_tests::services::start_files_with(
        &a2a.fabric.url(),
        files::FilesConfig {
            max_file_bytes: 200 * 1024,
            ..Default::default()
        },
    )
    .await;
    (a2a, files)
}

fn with_file(text: &str, bytes: &[u8], name: &str, media_type: &str) -> Value {
    let mut sent = message(text, None);
    sent["parts"].as_array_mut().unwrap().push(json!({
        "raw": base64::engine::general_purpose::STANDARD.encode(bytes),
        "filename": name,
        "mediaType": media_type,
    }));
    sent
}

/// The link of the result artifact's file part.
fn result_link(task: &Value) -> String {
    let parts = task["artifacts"][0]["parts"].as_array().unwrap();
    let file = parts
        .iter()
        .find(|part| part.get("url").is_some())
        .unwrap_or_else(|| panic!("a file part in {task}"));
    assert_eq!(file["filename"], "SHOUT.txt");
    assert_eq!(file["mediaType"], "text/plain");
    file["url"].as_str().unwrap().to_owned()
}

async fn get(a2a: &A2a, url: &str) -> http::HttpResponse {
    let path = url
        .strip_prefix(&format!("http://127.0.0.1:{}", a2a.port))
        .unwrap_or_else(|| panic!("a link of this gateway: {url}"));
    http::request(a2a.addr(), "GET", path, &[], b"").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_part_becomes_an_attachment_and_the_result_a_link() {
    let (a2a, _files) = start().await;
    let _scribe = spawn_scribe(&a2a).await;
    // 40 KiB: above the 16 KiB inline limit, and far above what a message could hold.
    let mut text = data(40 * 1024);
    for byte in &mut text {
        *byte = b'a' + *byte % 26;
    }
    let reply = a2a
        .rpc(
            "scribe",
            "SendMessage",
            json!({"message": with_file("shout this", &text, "big.txt", "text/plain")}),
        )
        .await;
    let task = &reply["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{reply}");
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"],
        "files: 1, inline: 0"
    );
    // The request's file is in the history as a link too, the client's own.
    let history = task["history"][0]["parts"].as_array().unwrap();
    assert!(
        history
            .iter()
            .any(|part| part["filename"] == "big.txt" && part.get("url").is_some()),
        "{task}"
    );

    let link = result_link(task);
    let got = get(&a2a, &link).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, text.to_ascii_uppercase());
    assert_eq!(got.header("x-content-type-options"), Some("nosniff"));
    assert!(
        got.header("content-disposition")
            .is_some_and(|value| value.starts_with("attachment;")),
        "{:?}",
        got.headers
    );
    // GetTask hands out a fresh link to the same bytes.
    let id = task["id"].as_str().unwrap();
    let again = a2a.rpc("scribe", "GetTask", json!({"id": id})).await;
    assert_eq!(
        get(&a2a, &result_link(&again["result"])).await.body.len(),
        text.len()
    );

    // A link changed in any field, or not a link at all, is a 404.
    let token = link.rsplit('/').next().unwrap().to_owned();
    let fields: Vec<&str> = token.split('.').collect();
    let base = link.trim_end_matches(&token);
    for forged in [
        format!("{}.a2a-other.{}.{}", fields[0], fields[2], fields[3]),
        format!(
            "{}.{}.{}.{}",
            fields[0],
            fields[1],
            fields[2].parse::<u64>().unwrap() + 1,
            fields[3]
        ),
        format!("{}.{}.{}.{}A", fields[0], fields[1], fields[2], fields[3]),
        "..%2f..%2fetc%2fpasswd".to_owned(),
        "x".repeat(5000),
    ] {
        assert_eq!(
            get(&a2a, &format!("{base}{forged}")).await.status,
            404,
            "{forged}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_file_stays_inline_and_a_revoked_file_is_gone_from_its_link() {
    let (a2a, _files) = start().await;
    let _scribe = spawn_scribe(&a2a).await;
    let reply = a2a
        .rpc(
            "scribe",
            "SendMessage",
            json!({"message": with_file("revoke after", b"tiny", "t.txt", "text/plain")}),
        )
        .await;
    let task = &reply["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{reply}");
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"],
        "files: 0, inline: 1"
    );
    // The scribe took the requester's reading back: the link, good as it is, reads nothing.
    let link = result_link(task);
    switchboard_testkit::assert_eventually!(
        Duration::from_secs(5),
        async { get(&a2a, &link).await.status == 404 },
        "a revoked file is still served by its link"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_part_the_files_service_refuses_is_an_error_and_nothing_is_created() {
    let (a2a, _files) = start().await;
    let (_scribe, goal) = a2a.fabric.agent_with_goal("scribe").await;
    // 300 KiB: above this files service's 200 KiB bound.
    let reply = a2a
        .rpc(
            "scribe",
            "SendMessage",
            json!({"message": with_file("too big", &data(300 * 1024), "b.bin", "application/octet-stream")}),
        )
        .await;
    assert!(reply["error"].is_object(), "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("bytes"),
        "{reply}"
    );
    assert!(
        goal.recv(Duration::from_millis(500))
            .await
            .unwrap()
            .is_none(),
        "nothing reached the agent"
    );
    // More file parts than a message carries: refused before any upload.
    let mut many = message("many", None);
    for n in 0..17 {
        many["parts"].as_array_mut().unwrap().push(json!({
            "raw": base64::engine::general_purpose::STANDARD.encode(data(17 * 1024)),
            "filename": format!("f{n}.bin"),
        }));
    }
    let reply = a2a
        .rpc("scribe", "SendMessage", json!({"message": many}))
        .await;
    assert!(reply["error"].is_object(), "{reply}");
}
