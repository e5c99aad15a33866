//! A2A conformance (issue 28): what the official conformance kit checks, kept in CI with the
//! official `a2a-sdk` and raw HTTP against a real gateway and nats-server. A Message answer,
//! chunked artifacts, history with `historyLength`, raw parts and both bindings through the
//! SDK; proto field names, the trailing slash and camelCase metadata over raw JSON-RPC; the
//! REST binding's errors and attacks. (The kit itself runs with `scripts/a2a-tck`.)

use std::time::Duration;

use serde_json::{Value, json};
use switchboard_tests::a2a::{A2a, OTHER_TOKEN, TOKEN, message};
use switchboard_tests::http::{self, HttpResponse, SseStream};

#[tokio::test]
async fn an_agent_answers_with_messages_or_tasks_over_both_bindings_with_the_sdk() {
    let a2a = A2a::start().await;
    let _caller = a2a.spawn_caller().await;
    for binding in ["JSONRPC", "HTTP+JSON"] {
        let seen = a2a.run_conformance(binding).await;
        assert_eq!(seen["message"], "answer: hi", "{binding}");
        assert_eq!(seen["raw"], json!([0, 1, 116, 99, 107, 255]), "{binding}");
        assert_eq!(seen["task"], "task: task please", "{binding}");
        assert_eq!(
            seen["history"],
            json!(["ask twice", "first?", "one", "second?", "two"]),
            "{binding}"
        );
        assert_eq!(seen["history_2"], json!(["second?", "two"]), "{binding}");
        assert_eq!(seen["listed"], 1, "{binding}");
    }
}

#[tokio::test]
async fn progress_parts_stream_as_artifacts_and_the_marker_is_the_agents_alone() {
    let a2a = A2a::start().await;
    let _caller = a2a.spawn_caller().await;
    let mut stream = a2a
        .stream_to(
            "caller",
            "SendStreamingMessage",
            json!({"message": message("task progress", None)}),
            None,
        )
        .await;
    let mut items = Vec::new();
    while let Some(event) = stream.next(Duration::from_secs(10)).await {
        let item: Value = serde_json::from_str(&event.data).unwrap();
        items.push(item["result"].clone());
    }
    let progress = items
        .iter()
        .position(|item| {
            item["artifactUpdate"]["artifact"]["artifactId"]
                .as_str()
                .is_some_and(|id| id.starts_with("progress-"))
        })
        .expect("the progress parts as an artifact");
    assert_eq!(
        items[progress]["artifactUpdate"]["artifact"]["parts"][0]["text"],
        "chunk-1 "
    );
    // Before the progress status it belongs to, and long before the end.
    assert_eq!(
        items[progress + 1]["statusUpdate"]["metadata"]["switchboardOp"],
        "progress"
    );
    let last = items.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );

    // A client may not send the agent's marker: the agent (which echoes parts) would answer
    // with it and make the message a task behind its back.
    let mut forged = message("hi", None);
    forged["parts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"data": {"switchboard": "task"}}));
    let refused = a2a
        .rpc("caller", "SendMessage", json!({"message": forged}))
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
}

/// A REST request to the gateway with the client's token (and `extra` headers).
async fn rest(
    a2a: &A2a,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    rest_as(a2a, TOKEN, method, path, extra, body).await
}

async fn rest_as(
    a2a: &A2a,
    token: &str,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    let auth = format!("Bearer {token}");
    // `extra` replaces a header of the same name.
    let mut headers: Vec<(&str, &str)> = [
        ("Content-Type", "application/json"),
        ("A2A-Version", "1.0"),
        ("Authorization", auth.as_str()),
    ]
    .into_iter()
    .filter(|(name, _)| {
        !extra
            .iter()
            .any(|(other, _)| other.eq_ignore_ascii_case(name))
    })
    .collect();
    headers.extend_from_slice(extra);
    http::request(a2a.addr(), method, path, &headers, body).await
}

/// The AIP-193 error of a REST answer: status, `error.code`, `error.status`, the reason.
fn rest_error(response: &HttpResponse) -> (u16, Value, Value, Value) {
    let body = response.json();
    assert_eq!(body["error"]["code"], response.status, "{body}");
    assert_eq!(body["error"]["details"][0]["domain"], "a2a-protocol.org");
    (
        response.status,
        body["error"]["code"].clone(),
        body["error"]["status"].clone(),
        body["error"]["details"][0]["reason"].clone(),
    )
}

#[tokio::test]
async fn proto_names_the_trailing_slash_and_camel_case_keys_over_json_rpc() {
    let a2a = A2a::start().await;
    // The interface URL with a trailing slash is the same endpoint.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("hi", Some("ctx-proto"))}});
    let sent = http::request(
        a2a.addr(),
        "POST",
        "/agents/echo/",
        &[
            ("Content-Type", "application/json"),
            ("A2A-Version", "1.0"),
            ("Authorization", &format!("Bearer {TOKEN}")),
        ],
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(sent.status, 200);
    let task = sent.json()["result"]["task"].clone();
    let id = task["id"].as_str().unwrap().to_owned();
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    // No snake_case key anywhere in the answer, metadata included.
    let mut keys = Vec::new();
    collect_keys(&task, &mut keys);
    let snake: Vec<_> = keys.iter().filter(|key| key.contains('_')).collect();
    assert!(snake.is_empty(), "snake_case keys: {snake:?}");
    assert_eq!(task["metadata"]["switchboardState"], "completed");

    // Proto field names are read as their JSON names.
    let got = a2a
        .rpc("echo", "GetTask", json!({"id": id, "history_length": 0}))
        .await;
    assert!(got["result"].get("history").is_none(), "{got}");
    let listed = a2a
        .rpc(
            "echo",
            "ListTasks",
            json!({"context_id": "ctx-proto", "page_size": 1, "include_artifacts": true}),
        )
        .await;
    let tasks = listed["result"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{listed}");
    assert_eq!(tasks[0]["id"], id.as_str());
    assert!(tasks[0]["artifacts"].is_array(), "includeArtifacts read");
    let webhook = a2a
        .rpc(
            "echo",
            "CreateTaskPushNotificationConfig",
            json!({"task_id": id, "id": "hook", "url": "http://127.0.0.1:9/hook"}),
        )
        .await;
    assert_eq!(webhook["result"]["taskId"], id.as_str(), "{webhook}");

    // A follow-up naming another context, and one to a task that ended.
    let mut other = message("more", Some("ctx-other"));
    other["taskId"] = json!(id);
    let mismatch = a2a
        .rpc("echo", "SendMessage", json!({"message": other}))
        .await;
    assert_eq!(mismatch["error"]["code"], -32602, "{mismatch}");
    let mut late = message("more", None);
    late["taskId"] = json!(id);
    let ended = a2a
        .rpc("echo", "SendMessage", json!({"message": late}))
        .await;
    assert_eq!(ended["error"]["code"], -32004, "{ended}");
}

fn collect_keys(value: &Value, keys: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            for (key, inner) in object {
                keys.push(key.clone());
                collect_keys(inner, keys);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_keys(item, keys)),
        _ => {}
    }
}

#[tokio::test]
async fn the_rest_binding_serves_every_method_and_refuses_what_it_must() {
    let a2a = A2a::start().await;
    let send = json!({"message": message("hi", Some("ctx-rest"))}).to_string();
    let sent = rest(
        &a2a,
        "POST",
        "/agents/echo/message:send",
        &[],
        send.as_bytes(),
    )
    .await;
    assert_eq!(sent.status, 200, "{}", String::from_utf8_lossy(&sent.body));
    let task = sent.json()["task"].clone();
    let id = task["id"].as_str().unwrap().to_owned();
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");

    let got = rest(
        &a2a,
        "GET",
        &format!("/agents/echo/tasks/{id}?historyLength=0"),
        &[],
        b"",
    )
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["id"], id.as_str());
    assert!(got.json().get("history").is_none());
    let listed = rest(
        &a2a,
        "GET",
        "/agents/echo/tasks?contextId=ctx-rest&pageSize=5",
        &[],
        b"",
    )
    .await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json()["tasks"][0]["id"], id.as_str());

    // A stream over REST: bare StreamResponses, the task first, completed last.
    let auth = format!("Bearer {TOKEN}");
    let stream_body = json!({"message": message("slow", None)}).to_string();
    let mut stream = SseStream::open(
        a2a.addr(),
        "/agents/echo/message:stream",
        &[
            ("Content-Type", "application/json"),
            ("A2A-Version", "1.0"),
            ("Authorization", &auth),
        ],
        stream_body.as_bytes(),
    )
    .await;
    assert_eq!(stream.status, 200);
    let first = stream.next(Duration::from_secs(10)).await.unwrap();
    let first: Value = serde_json::from_str(&first.data).unwrap();
    assert!(first["task"]["id"].is_string(), "{first}");
    let mut last = first;
    while let Some(event) = stream.next(Duration::from_secs(10)).await {
        last = serde_json::from_str(&event.data).unwrap();
    }
    assert_eq!(
        last["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );

    // Push configs: created on the path's task (a body naming another is overruled), read,
    // listed, deleted twice.
    let hook = json!({"id": "hook", "url": "http://127.0.0.1:9/h", "taskId": "not-this"});
    let path = format!("/agents/echo/tasks/{id}/pushNotificationConfigs");
    let created = rest(&a2a, "POST", &path, &[], hook.to_string().as_bytes()).await;
    assert_eq!(
        created.status,
        200,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert_eq!(created.json()["taskId"], id.as_str());
    assert_eq!(
        rest(&a2a, "GET", &format!("{path}/hook"), &[], b"")
            .await
            .status,
        200
    );
    assert_eq!(rest(&a2a, "GET", &path, &[], b"").await.status, 200);
    for _ in 0..2 {
        let deleted = rest(&a2a, "DELETE", &format!("{path}/hook"), &[], b"").await;
        assert_eq!(deleted.status, 200);
        assert_eq!(deleted.json(), json!({}));
    }
    let gone = rest(&a2a, "GET", &format!("{path}/hook"), &[], b"").await;
    assert_eq!(rest_error(&gone).0, 404);

    // Errors: the HTTP status of the A2A error, an AIP-193 body with the ErrorInfo.
    let missing = rest(
        &a2a,
        "GET",
        "/agents/echo/tasks/01900000-0000-7000-8000-000000000000",
        &[],
        b"",
    )
    .await;
    assert_eq!(
        rest_error(&missing),
        (404, json!(404), json!("NOT_FOUND"), json!("TASK_NOT_FOUND"))
    );
    let ended = rest(
        &a2a,
        "POST",
        &format!("/agents/echo/tasks/{id}:cancel"),
        &[],
        b"",
    )
    .await;
    assert_eq!(rest_error(&ended).3, "TASK_NOT_CANCELABLE");
    assert_eq!(ended.status, 409);
    let subscribed = rest(
        &a2a,
        "POST",
        &format!("/agents/echo/tasks/{id}:subscribe"),
        &[],
        b"",
    )
    .await;
    assert_eq!(rest_error(&subscribed).3, "UNSUPPORTED_OPERATION");
    let card = rest(&a2a, "GET", "/agents/echo/extendedAgentCard", &[], b"").await;
    assert_eq!(rest_error(&card).3, "EXTENDED_AGENT_CARD_NOT_CONFIGURED");
}

/// The REST binding's attack list: what the JSON-RPC binding refuses, refused the same way.
#[tokio::test]
async fn a_hostile_rest_client_reaches_nothing_that_is_not_its_own() {
    let a2a = A2a::start().await;
    let send = json!({"message": message("mine", None)}).to_string();
    let sent = rest(
        &a2a,
        "POST",
        "/agents/echo/message:send",
        &[],
        send.as_bytes(),
    )
    .await;
    let id = sent.json()["task"]["id"].as_str().unwrap().to_owned();

    // No token, a wrong one: 401 before anything is read.
    let anonymous = http::request(
        a2a.addr(),
        "GET",
        &format!("/agents/echo/tasks/{id}"),
        &[("A2A-Version", "1.0")],
        b"",
    )
    .await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    let wrong = rest_as(
        &a2a,
        "nope",
        "GET",
        &format!("/agents/echo/tasks/{id}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(wrong.status, 401);

    // Another client's task does not exist for it: read, cancel, subscribe, push config.
    for (method, path) in [
        ("GET", format!("/agents/echo/tasks/{id}")),
        ("POST", format!("/agents/echo/tasks/{id}:cancel")),
        ("POST", format!("/agents/echo/tasks/{id}:subscribe")),
        (
            "GET",
            format!("/agents/echo/tasks/{id}/pushNotificationConfigs"),
        ),
    ] {
        let stolen = rest_as(&a2a, OTHER_TOKEN, method, &path, &[], b"").await;
        assert_eq!(rest_error(&stolen).3, "TASK_NOT_FOUND", "{method} {path}");
    }
    let hook = json!({"id": "h", "url": "http://127.0.0.1:9/h"}).to_string();
    let planted = rest_as(
        &a2a,
        OTHER_TOKEN,
        "POST",
        &format!("/agents/echo/tasks/{id}/pushNotificationConfigs"),
        &[],
        hook.as_bytes(),
    )
    .await;
    assert_eq!(rest_error(&planted).0, 404);

    // Paths that are not a task id, an agent, or a method.
    for (method, path) in [
        ("GET", "/agents/echo/tasks/..%2F..%2Fetc"),
        ("GET", "/agents/echo/tasks/%00"),
        ("POST", "/agents/echo/tasks/x:delete"),
        ("GET", "/agents/a2a-planner/tasks"),
        ("GET", "/agents/no.such.agent/tasks"),
    ] {
        let refused = rest(&a2a, method, path, &[], b"").await;
        assert_eq!(refused.status, 404, "{method} {path}");
        assert!(refused.json()["error"].is_object(), "{method} {path}");
    }

    // A wrong version, content type, body shape, size, and params.
    let version = rest(
        &a2a,
        "POST",
        "/agents/echo/message:send",
        &[("A2A-Version", "99.0")],
        send.as_bytes(),
    )
    .await;
    assert_eq!(rest_error(&version).3, "VERSION_NOT_SUPPORTED");
    assert_eq!(version.status, 400);
    let text = http::request(
        a2a.addr(),
        "POST",
        "/agents/echo/message:send",
        &[
            ("Content-Type", "text/plain"),
            ("A2A-Version", "1.0"),
            ("Authorization", &format!("Bearer {TOKEN}")),
        ],
        b"{'message': 'python repr'}",
    )
    .await;
    assert_eq!(rest_error(&text).0, 415);
    for body in [&b"{"[..], b"[]", b"{}", b"{\"message\": {\"parts\": 7}}"] {
        let bad = rest(&a2a, "POST", "/agents/echo/message:send", &[], body).await;
        assert_eq!(bad.status, 400, "{}", String::from_utf8_lossy(body));
    }
    let huge = vec![b' '; 2 * 1024 * 1024];
    let too_big = rest(&a2a, "POST", "/agents/echo/message:send", &[], &huge).await;
    assert_eq!(too_big.status, 413);
    for query in [
        "pageSize=100000",
        "pageSize=9223372036854775808",
        "historyLength=-1",
        "pageSize=%0D%0AX-Injected:%201",
    ] {
        let page = rest(
            &a2a,
            "GET",
            &format!("/agents/echo/tasks?{query}"),
            &[],
            b"",
        )
        .await;
        assert_eq!(rest_error(&page).3, "INVALID_PARAMS", "{query}");
    }

    // And the gateway still serves.
    let again = rest(
        &a2a,
        "POST",
        "/agents/echo/message:send",
        &[],
        send.as_bytes(),
    )
    .await;
    assert_eq!(again.status, 200);
}

/// The limits a message carried as a call runs into: an agent that takes calls but never
/// answers (the blocking wait ends with the fabric's `timeout`, as -32603 over JSON-RPC), and
/// a client whose every stream slot is held (a blocking call takes one too: 429 over REST,
/// at once, not after the wait).
#[tokio::test]
async fn a_silent_call_taker_times_out_and_a_client_at_its_slot_cap_gets_429() {
    use a2a_gateway::serve::messages::{AS_CALLS, MESSAGES_KEY};
    let a2a = A2a::start_with(|config| {
        config.blocking_timeout_ms = 1_000;
        config.max_streams_per_client = 1;
    })
    .await;
    let mut card = switchboard_tests::card("silent");
    card.metadata.insert(MESSAGES_KEY.into(), AS_CALLS.into());
    let silent =
        switchboard_tests::agent_with(&a2a.fabric.url(), card, Duration::from_secs(3600)).await;
    let _goal = silent.open_goal().await.unwrap();

    let started = std::time::Instant::now();
    let waited = a2a
        .rpc(
            "silent",
            "SendMessage",
            json!({"message": message("anyone?", None)}),
        )
        .await;
    assert_eq!(waited["error"]["code"], -32603, "{waited}");
    let info = &waited["error"]["data"][0];
    assert_eq!(info["metadata"]["switchboardKind"], "timeout", "{waited}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "the wait is blocking_timeout_ms: {took:?}"
    );

    // One stream held (the sleeper never takes its task) fills the client's one slot.
    let _held = a2a
        .stream_to(
            "sleeper",
            "SendStreamingMessage",
            json!({"message": message("hold", None)}),
            None,
        )
        .await;
    let started = std::time::Instant::now();
    let body = json!({"message": message("anyone?", None)}).to_string();
    let refused = rest(
        &a2a,
        "POST",
        "/agents/silent/message:send",
        &[],
        body.as_bytes(),
    )
    .await;
    let (status, _, grpc_status, _) = rest_error(&refused);
    assert_eq!(status, 429, "{}", refused.json());
    assert_eq!(grpc_status, "RESOURCE_EXHAUSTED");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "refused at once"
    );
}

/// `Task.history` of a task that asks more questions than `a2a_history` keeps (each question
/// and its answer are two of its 32): the request that made the task stays first, then the
/// latest 32 follow-ups; the oldest question and answer go.
#[tokio::test]
async fn a_tasks_history_keeps_its_request_and_the_latest_32_follow_ups() {
    let a2a = A2a::start().await;
    let _caller = a2a.spawn_caller().await;
    let asked = a2a
        .rpc(
            "caller",
            "SendMessage",
            json!({"message": message("ask 17", None)}),
        )
        .await;
    let mut task = asked["result"]["task"].clone();
    let id = task["id"].as_str().unwrap().to_owned();
    for n in 1..=17 {
        assert_eq!(
            task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "question {n}: {task}"
        );
        let mut answer = message(&format!("a{n}"), None);
        answer["taskId"] = json!(id);
        let sent = a2a
            .rpc("caller", "SendMessage", json!({"message": answer}))
            .await;
        task = sent["result"]["task"].clone();
    }
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let got = a2a.rpc("caller", "GetTask", json!({"id": id})).await;
    let history = got["result"]["history"].as_array().unwrap();
    let texts: Vec<&str> = history
        .iter()
        .map(|item| item["parts"][0]["text"].as_str().unwrap_or(""))
        .collect();
    // 17 questions and answers are 34 follow-ups: the first two went.
    assert_eq!(history.len(), 1 + 32, "{texts:?}");
    assert_eq!(texts[0], "ask 17", "{texts:?}");
    assert_eq!(texts[1], "q2?", "{texts:?}");
    assert_eq!(texts.last().copied(), Some("a17"), "{texts:?}");
    assert!(
        !texts.contains(&"q1?") && !texts.contains(&"a1"),
        "{texts:?}"
    );
}
