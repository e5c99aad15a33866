//! The A2A gateway against a real nats-server and the request services, driven over HTTP the
//! way an A2A client drives it: agent cards, bearer tokens, blocking and non-blocking
//! `SendMessage`, `GetTask`/`ListTasks`/`CancelTask`, a stream broken off and resumed on a
//! restarted gateway with no event lost, and a corpus of bad requests that get the spec's
//! codes and break nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because it holds one scenario per test of the A2A gateway; every
// integration file is its own test binary (a link of all six services), so a topic gets one
// file however many tests it has.

use std::time::Duration;

use serde_json::{Value, json};
use switchboard_tests::a2a::{A2a, OTHER_TOKEN, TOKEN, message, state};
use switchboard_tests::http::{self, SseStream};

#[tokio::test]
async fn cards_are_served_per_agent_and_tokens_decide_who_calls() {
    let a2a = A2a::start().await;
    let card = http::request(
        a2a.addr(),
        "GET",
        "/agents/echo/.well-known/agent-card.json",
        &[],
        b"",
    )
    .await;
    assert_eq!(card.status, 200);
    let json = card.json();
    assert_eq!(json["name"], "echo");
    let interface = &json["supportedInterfaces"][0];
    assert_eq!(
        interface["url"],
        format!("http://127.0.0.1:{}/agents/echo", a2a.port)
    );
    assert_eq!(interface["protocolBinding"], "JSONRPC");
    assert_eq!(interface["protocolVersion"], "1.0");
    assert_eq!(json["capabilities"]["streaming"], true);
    assert!(json["securitySchemes"]["bearer"].is_object(), "{json}");
    assert!(card.header("cache-control").unwrap().contains("max-age"));
    // When it last changed, as an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`).
    let modified = card.header("last-modified").unwrap_or_default();
    assert!(
        modified.ends_with(" GMT") && modified.len() == 29,
        "Last-Modified: {modified:?}"
    );
    let etag = card.header("etag").unwrap().to_owned();
    let again = http::request(
        a2a.addr(),
        "GET",
        "/agents/echo/.well-known/agent-card.json",
        &[("If-None-Match", &etag)],
        b"",
    )
    .await;
    assert_eq!(again.status, 304);
    for missing in [
        "/agents/nobody/.well-known/agent-card.json",
        "/agents/Not%20An%20Id/.well-known/agent-card.json",
        "/.well-known/agent-card.json",
    ] {
        let response = http::request(a2a.addr(), "GET", missing, &[], b"").await;
        assert_eq!(response.status, 404, "{missing}");
    }

    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}).to_string();
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Basic cGxhbm5lcg=="),
        Some("Bearer "),
    ] {
        let mut headers = vec![("Content-Type", "application/json"), ("A2A-Version", "1.0")];
        if let Some(auth) = auth {
            headers.push(("Authorization", auth));
        }
        let response = http::request(
            a2a.addr(),
            "POST",
            "/agents/echo",
            &headers,
            body.as_bytes(),
        )
        .await;
        assert_eq!(response.status, 401, "{auth:?}");
        assert_eq!(response.header("www-authenticate"), Some("Bearer"));
    }
}

#[tokio::test]
async fn send_get_list_and_cancel_go_through_the_task_service() {
    let a2a = A2a::start().await;
    // Blocking: answered when the task is done, its result as the artifact.
    let reply = a2a
        .rpc(
            "echo",
            "SendMessage",
            json!({"message": message("hi", Some("ctx-1"))}),
        )
        .await;
    let task = &reply["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{reply}");
    assert_eq!(task["contextId"], "ctx-1");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "echo: hi");
    assert_eq!(task["history"][0]["parts"][0]["text"], "hi");
    let first = task["id"].as_str().unwrap().to_owned();

    // Non-blocking: answered at once; GetTask sees it finish.
    let reply = a2a
        .rpc(
            "echo",
            "SendMessage",
            json!({"message": message("later", None), "configuration": {"returnImmediately": true}}),
        )
        .await;
    let task = &reply["result"]["task"];
    assert_ne!(state(task), "TASK_STATE_COMPLETED", "{reply}");
    let second = task["id"].as_str().unwrap().to_owned();
    switchboard_testkit::assert_eventually!(
        Duration::from_secs(10),
        async {
            let done = a2a.rpc("echo", "GetTask", json!({"id": second})).await;
            state(&done["result"]) == "TASK_STATE_COMPLETED"
        },
        "task {second} never completed"
    );
    // Completed is final: read it once more for its content.
    let done = a2a.rpc("echo", "GetTask", json!({"id": second})).await["result"].clone();
    assert_eq!(state(&done), "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(done["artifacts"][0]["parts"][0]["text"], "echo: later");

    // ListTasks: this client's tasks for this agent; contextId filters.
    let listed = a2a.rpc("echo", "ListTasks", json!({})).await["result"].clone();
    let ids: Vec<&str> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        [second.as_str(), first.as_str()],
        "newest first: {listed}"
    );
    assert_eq!(listed["totalSize"], 2);
    assert_eq!(listed["nextPageToken"], "");
    assert!(
        listed["tasks"][0].get("artifacts").is_none(),
        "artifacts only when asked"
    );
    let in_context = a2a
        .rpc("echo", "ListTasks", json!({"contextId": "ctx-1"}))
        .await["result"]
        .clone();
    assert_eq!(
        in_context["tasks"].as_array().unwrap().len(),
        1,
        "{in_context}"
    );
    // Proto field names as well as JSON names (ProtoJSON parsers accept both): a page of
    // one, by `page_size`, then the context by `context_id`, its page ending the list.
    let one = a2a.rpc("echo", "ListTasks", json!({"page_size": 1})).await["result"].clone();
    assert_eq!(one["tasks"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["tasks"][0]["id"], second.as_str(), "{one}");
    assert_ne!(one["nextPageToken"], "", "{one}");
    let by_proto_name = a2a
        .rpc(
            "echo",
            "ListTasks",
            json!({"context_id": "ctx-1", "page_size": 1}),
        )
        .await["result"]
        .clone();
    assert_eq!(
        by_proto_name["tasks"].as_array().unwrap().len(),
        1,
        "{by_proto_name}"
    );
    assert_eq!(
        by_proto_name["tasks"], in_context["tasks"],
        "{by_proto_name}"
    );
    // A context with no task here: nothing, and no page after it.
    let none = a2a
        .rpc(
            "echo",
            "ListTasks",
            json!({"contextId": "ctx-none", "pageSize": 1}),
        )
        .await["result"]
        .clone();
    assert_eq!(none["tasks"].as_array().map(Vec::len), Some(0), "{none}");
    assert_eq!(none["nextPageToken"], "", "{none}");

    // historyLength: how many of the latest history messages come back (0: none), in GetTask,
    // ListTasks and SendMessage alike; a negative one is refused.
    let full = a2a.rpc("echo", "GetTask", json!({"id": first})).await;
    assert_eq!(
        full["result"]["history"].as_array().map(Vec::len),
        Some(1),
        "{full}"
    );
    let none = a2a
        .rpc("echo", "GetTask", json!({"id": first, "historyLength": 0}))
        .await;
    assert!(none["result"].get("history").is_none(), "{none}");
    assert_eq!(
        a2a.rpc("echo", "GetTask", json!({"id": first, "history_length": 1}))
            .await["result"]["history"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let negative = a2a
        .rpc("echo", "GetTask", json!({"id": first, "historyLength": -1}))
        .await;
    assert_eq!(negative["error"]["code"], -32602, "{negative}");
    let listed_bare = a2a
        .rpc("echo", "ListTasks", json!({"historyLength": 0}))
        .await;
    assert!(
        listed_bare["result"]["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|task| task.get("history").is_none()),
        "{listed_bare}"
    );
    let sent_bare = a2a
        .rpc(
            "echo",
            "SendMessage",
            json!({"message": message("bare", None), "configuration": {"historyLength": 0}}),
        )
        .await;
    assert!(
        sent_bare["result"]["task"].get("history").is_none(),
        "{sent_bare}"
    );

    // A task is the agent's and the client's: not through another agent, not for another client.
    let elsewhere = a2a.rpc("sleeper", "GetTask", json!({"id": first})).await;
    assert_eq!(elsewhere["error"]["code"], -32001, "{elsewhere}");
    let stranger = a2a
        .rpc_as(OTHER_TOKEN, "echo", "GetTask", json!({"id": first}))
        .await;
    assert_eq!(stranger["error"]["code"], -32001, "{stranger}");
    let bogus = a2a
        .rpc("echo", "GetTask", json!({"id": "not-a-uuid"}))
        .await;
    assert_eq!(bogus["error"]["code"], -32001);

    // Cancel: a task the sleeper never took; a second cancel is refused with -32002.
    let waiting = a2a
        .rpc(
            "sleeper",
            "SendMessage",
            json!({"message": message("never", None), "configuration": {"returnImmediately": true}}),
        )
        .await;
    let waiting = waiting["result"]["task"]["id"].as_str().unwrap().to_owned();
    let canceled = a2a
        .rpc("sleeper", "CancelTask", json!({"id": waiting}))
        .await;
    assert_eq!(
        state(&canceled["result"]),
        "TASK_STATE_CANCELED",
        "{canceled}"
    );
    let again = a2a
        .rpc("sleeper", "CancelTask", json!({"id": waiting}))
        .await;
    assert_eq!(again["error"]["code"], -32002, "{again}");
    let ended = a2a.rpc("echo", "CancelTask", json!({"id": first})).await;
    assert_eq!(ended["error"]["code"], -32002, "{ended}");
}

#[tokio::test]
async fn one_context_is_one_goal_of_the_client() {
    let a2a = A2a::start().await;
    let nats = a2a.fabric.nats.client().await;
    let goal_of = |id: String| {
        let nats = nats.clone();
        async move {
            let reply = nats
                .request(
                    "agent.task.get.a2a-planner",
                    json!({"task_id": id}).to_string().into(),
                )
                .await
                .unwrap();
            let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
            reply["task"]["requester_goal"].as_str().unwrap().to_owned()
        }
    };
    let mut goals = Vec::new();
    for n in 0..10 {
        let reply = a2a
            .rpc(
                "echo",
                "SendMessage",
                json!({"message": message(&format!("turn {n}"), Some("ctx-a"))}),
            )
            .await;
        let task = &reply["result"]["task"];
        assert_eq!(state(task), "TASK_STATE_COMPLETED", "{reply}");
        goals.push(goal_of(task["id"].as_str().unwrap().to_owned()).await);
    }
    assert!(goals.iter().all(|goal| *goal == goals[0]), "{goals:?}");
    let other = a2a
        .rpc(
            "echo",
            "SendMessage",
            json!({"message": message("elsewhere", Some("ctx-b"))}),
        )
        .await;
    let other = goal_of(other["result"]["task"]["id"].as_str().unwrap().to_owned()).await;
    assert_ne!(other, goals[0], "another context is another goal");
    // The goals are the client's, and what piles up in them (task updates: the client follows
    // its tasks by their events) is acknowledged as it goes, far below the goal's cap.
    let peek = nats
        .request(
            "agent.inbox.fetch.a2a-planner",
            json!({"goal_id": goals[0], "max": 64, "peek": true})
                .to_string()
                .into(),
        )
        .await
        .unwrap();
    let peek: Value = serde_json::from_slice(&peek.payload).unwrap();
    let unread = peek["unread"].as_u64().unwrap();
    assert!(
        unread < 16,
        "ten tasks' updates were drained as they came: {peek}"
    );
}

/// Issue 37, item 3: `lookup` of a client's agent lists its context goals, and once the
/// gateway's LRU closed one (past 8 contexts) any agent could open that goal id and hold it,
/// so the context's later tasks had no goal. Context goal ids (UUID version 8) are reserved to
/// `a2a-` agents: the open is refused, and the context gets its goal back.
#[tokio::test]
async fn an_agent_cannot_take_a_context_goal_the_gateway_closed() {
    let a2a = A2a::start().await;
    let nats = a2a.fabric.nats.client().await;
    let goal_of = |id: String| {
        let nats = nats.clone();
        async move {
            let reply = nats
                .request(
                    "agent.task.get.a2a-planner",
                    json!({"task_id": id}).to_string().into(),
                )
                .await
                .unwrap();
            let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
            reply["task"]["requester_goal"].as_str().map(str::to_owned)
        }
    };
    let send = |context: String| {
        let a2a = &a2a;
        async move {
            let reply = a2a
                .rpc(
                    "echo",
                    "SendMessage",
                    json!({"message": message("hello", Some(context.as_str()))}),
                )
                .await;
            let task = &reply["result"]["task"];
            assert_eq!(state(task), "TASK_STATE_COMPLETED", "{reply}");
            task["id"].as_str().unwrap().to_owned()
        }
    };
    let held = goal_of(send("ctx-held".to_owned()).await)
        .await
        .expect("the context has a goal");
    // Eight more contexts: the gateway closes the least recently used goal, ctx-held's.
    for n in 0..8 {
        send(format!("ctx-{n}")).await;
    }
    let mallory = a2a.fabric.agent("mallory").await;
    let closed = switchboard_testkit::eventually(Duration::from_secs(10), || async {
        mallory
            .lookup("a2a-planner")
            .await
            .is_ok_and(|found| !found.live_goals.iter().any(|goal| goal.to_string() == held))
    })
    .await;
    assert!(closed, "the LRU closed the context's goal");
    let taken = mallory
        .open_goal_with(switchboard_proto::registry::GoalOpenRequest {
            goal_id: Some(switchboard_proto::GoalId::parse(&held).unwrap()),
            name: None,
            kind: None,
            overflow: None,
        })
        .await;
    assert_eq!(
        taken.err().and_then(|err| err.kind()),
        Some(switchboard_proto::ErrorKind::Conflict),
        "an agent opened a client's context goal"
    );
    // The context's next task has its goal again.
    let again = goal_of(send("ctx-held".to_owned()).await).await;
    assert_eq!(again.as_deref(), Some(held.as_str()));
}

/// Every item of a stream: (the client's last event id after it, the JSON-RPC result). A
/// result artifact has no id of its own: SSE keeps the one before.
async fn read_until_end(stream: &mut SseStream) -> Vec<(u64, Value)> {
    let mut items = Vec::new();
    let mut last = 0;
    while let Some(event) = stream.next(Duration::from_secs(20)).await {
        let reply: Value = serde_json::from_str(&event.data).unwrap();
        assert!(reply.get("error").is_none(), "{reply}");
        match event.id {
            Some(id) => last = id.parse().unwrap(),
            None => assert!(reply["result"]["artifactUpdate"].is_object(), "{reply}"),
        }
        items.push((last, reply["result"].clone()));
    }
    items
}

#[tokio::test]
async fn a_stream_broken_off_resumes_on_a_restarted_gateway_without_losing_an_event() {
    let mut a2a = A2a::start().await;
    let mut stream = a2a
        .stream(
            "SendStreamingMessage",
            json!({"message": message("slow", None)}),
            None,
        )
        .await;
    assert!(
        stream
            .headers
            .iter()
            .any(|(name, value)| name == "content-type" && value.starts_with("text/event-stream"))
    );
    // The task first.
    let first = stream.next(Duration::from_secs(10)).await.unwrap();
    let reply: Value = serde_json::from_str(&first.data).unwrap();
    let task_id = reply["result"]["task"]["id"].as_str().unwrap().to_owned();
    // Then at least one status update while the echo agent works.
    let update = stream.next(Duration::from_secs(10)).await.unwrap();
    let update_reply: Value = serde_json::from_str(&update.data).unwrap();
    assert!(
        update_reply["result"]["statusUpdate"].is_object(),
        "{update_reply}"
    );
    let seen: u64 = update.id.unwrap().parse().unwrap();
    assert_eq!(
        update_reply["result"]["statusUpdate"]["metadata"]["switchboardEventSeq"],
        seen
    );
    drop(stream);

    // The gateway goes away and comes back; the client resubscribes from what it saw.
    a2a.restart_gateway().await;
    let seen_text = seen.to_string();
    let mut resumed = a2a
        .stream("SubscribeToTask", json!({"id": task_id}), Some(&seen_text))
        .await;
    let items = read_until_end(&mut resumed).await;
    assert!(
        items[0].1["task"].is_object(),
        "the task comes first: {items:?}"
    );
    let events: Vec<&(u64, Value)> = items[1..].iter().collect();
    assert!(!events.is_empty());
    assert!(
        events.iter().all(|(seq, _)| *seq > seen),
        "nothing at or before {seen}"
    );
    let last = &events[events.len() - 1].1["statusUpdate"];
    assert_eq!(last["status"]["state"], "TASK_STATE_COMPLETED", "{items:?}");
    let artifact = events
        .iter()
        .find_map(|(_, item)| item.get("artifactUpdate"))
        .expect("the result comes as an artifact");
    assert_eq!(artifact["artifact"]["parts"][0]["text"], "echo: slow");

    // What the two connections saw together is every event the task has, once each: the
    // events are numbered 0 (the creation), 1, 2, … and the streams' ids are those numbers.
    let mut everything = a2a
        .stream("SubscribeToTask", json!({"id": task_id}), Some("0"))
        .await;
    let after_creation: Vec<u64> = read_until_end(&mut everything)
        .await
        .into_iter()
        .skip(1)
        .filter(|(_, item)| item.get("statusUpdate").is_some())
        .map(|(seq, _)| seq)
        .collect();
    let resumed: Vec<u64> = events
        .iter()
        .filter(|(_, item)| item.get("statusUpdate").is_some())
        .map(|(seq, _)| *seq)
        .collect();
    let expected: Vec<u64> = after_creation
        .iter()
        .copied()
        .filter(|seq| *seq > seen)
        .collect();
    assert_eq!(
        resumed, expected,
        "after {seen}; all after the creation: {after_creation:?}"
    );
    let numbers: Vec<u64> = (1..=after_creation.len() as u64).collect();
    assert_eq!(after_creation, numbers, "numbered without gaps");

    // A task that finishes before its stream is read still streams every event, from its
    // creation to its completion.
    let mut fast = a2a
        .stream(
            "SendStreamingMessage",
            json!({"message": message("fast", None)}),
            None,
        )
        .await;
    let items = read_until_end(&mut fast).await;
    // The task as it was created (event 0, SSE id 0), then each later event once, ids rising:
    // not the task as it is now followed by its creation again.
    assert_eq!(
        items[0].1["task"]["status"]["state"], "TASK_STATE_SUBMITTED",
        "{items:?}"
    );
    assert_eq!(items[0].0, 0);
    assert!(items[0].1["task"].get("artifacts").is_none(), "{items:?}");
    let ids: Vec<u64> = items
        .iter()
        .filter(|(_, item)| item.get("statusUpdate").is_some())
        .map(|(id, _)| *id)
        .collect();
    assert!(
        ids.first().is_some_and(|first| *first > 0) && ids.windows(2).all(|w| w[0] < w[1]),
        "each id once, rising: {ids:?}"
    );
    let states: Vec<&str> = items
        .iter()
        .filter_map(|(_, item)| item["statusUpdate"]["status"]["state"].as_str())
        .collect();
    assert_eq!(states.last(), Some(&"TASK_STATE_COMPLETED"), "{states:?}");
    assert!(states.contains(&"TASK_STATE_WORKING"), "{states:?}");

    // A new subscription to an ended task is refused (the task is read with GetTask).
    let ended = a2a
        .rpc("echo", "SubscribeToTask", json!({"id": task_id}))
        .await;
    assert_eq!(ended["error"]["code"], -32004, "{ended}");
}

/// One bad request: what it is, its headers and body, the HTTP status and JSON-RPC code due.
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, String, u16, i64);

#[tokio::test]
async fn bad_requests_get_the_spec_codes_and_break_nothing() {
    let a2a = A2a::start().await;
    let auth = format!("Bearer {TOKEN}");
    let json_headers = [
        ("Content-Type", "application/json"),
        ("A2A-Version", "1.0"),
        ("Authorization", auth.as_str()),
    ];
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{{"messageId":"m","role":"ROLE_USER","parts":[{{"text":"{}"}}]}}}}}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    // Issue 26: a body just under the limit of empty parts, refused by counting them.
    let flood = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{{"messageId":"m","role":"ROLE_USER","parts":[{}{{"text":""}}]}}}}}}"#,
        r#"{"text":""},"#.repeat(80_000)
    );
    let cases: Vec<Case> = vec![
        ("malformed JSON", json_headers.to_vec(), "{\"jsonrpc\":".into(), 200, -32700),
        ("80,001 empty parts", json_headers.to_vec(), flood, 200, -32602),
        ("not an object", json_headers.to_vec(), "[1,2]".into(), 200, -32600),
        ("wrong jsonrpc", json_headers.to_vec(), r#"{"jsonrpc":"1.0","id":1,"method":"GetTask"}"#.into(), 200, -32600),
        ("id of a bad type", json_headers.to_vec(), r#"{"jsonrpc":"2.0","id":[1],"method":"GetTask"}"#.into(), 200, -32600),
        ("no method", json_headers.to_vec(), r#"{"jsonrpc":"2.0","id":1}"#.into(), 200, -32600),
        ("unknown method", json_headers.to_vec(), r#"{"jsonrpc":"2.0","id":1,"method":"DeleteEverything","params":{}}"#.into(), 200, -32601),
        ("params of a bad type", json_headers.to_vec(), r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":42}}"#.into(), 200, -32602),
        ("message without parts", json_headers.to_vec(), r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[]}}}"#.into(), 200, -32602),
        ("page size out of range", json_headers.to_vec(), r#"{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"pageSize":100000}}"#.into(), 200, -32602),
        ("page token not ours", json_headers.to_vec(), r#"{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"pageToken":"../../etc"}}"#.into(), 200, -32602),
        ("push config for no task", json_headers.to_vec(), r#"{"jsonrpc":"2.0","id":1,"method":"CreateTaskPushNotificationConfig","params":{"taskId":"t","url":"http://x"}}"#.into(), 200, -32001),
        ("extended card", json_headers.to_vec(), r#"{"jsonrpc":"2.0","id":1,"method":"GetExtendedAgentCard","params":{}}"#.into(), 200, -32007),
        ("oversized body", json_headers.to_vec(), huge, 413, -32600),
        (
            "wrong content type",
            vec![("Content-Type", "text/plain"), ("A2A-Version", "1.0"), ("Authorization", auth.as_str())],
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}"#.into(),
            415,
            -32005,
        ),
        (
            "no version (0.3)",
            vec![("Content-Type", "application/json"), ("Authorization", auth.as_str())],
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}"#.into(),
            200,
            -32009,
        ),
        (
            "unsupported version",
            vec![("Content-Type", "application/json"), ("A2A-Version", "2.0"), ("Authorization", auth.as_str())],
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}"#.into(),
            200,
            -32009,
        ),
    ];
    for (what, headers, body, status, code) in &cases {
        let response =
            http::request(a2a.addr(), "POST", "/agents/echo", headers, body.as_bytes()).await;
        assert_eq!(
            response.status,
            *status,
            "{what}: {}",
            String::from_utf8_lossy(&response.body)
        );
        let reply = response.json();
        assert_eq!(reply["error"]["code"], *code, "{what}: {reply}");
        assert_eq!(reply["jsonrpc"], "2.0", "{what}");
        let info = reply["error"]["data"]
            .as_array()
            .and_then(|data| data.last())
            .cloned();
        assert_eq!(
            info.as_ref().map(|info| info["@type"].clone()),
            Some(json!("type.googleapis.com/google.rpc.ErrorInfo")),
            "{what}: {reply}"
        );
    }
    // The version may come as a query parameter instead of a header.
    let by_query = http::request(
        a2a.addr(),
        "POST",
        "/agents/echo?A2A-Version=1.0",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", auth.as_str()),
        ],
        br#"{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}}"#,
    )
    .await;
    assert!(by_query.json()["result"].is_object(), "{}", by_query.json());
    // An unknown agent path: 404.
    let unknown = http::request(
        a2a.addr(),
        "POST",
        "/agents/nobody",
        &json_headers,
        br#"{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}}"#,
    )
    .await;
    assert_eq!(unknown.status, 404);
    // The interface URL with a trailing slash (the A2A conformance kit posts there) is the
    // same endpoint; a path the gateway does not serve is a 404 that says what it serves.
    let slashed = http::request(
        a2a.addr(),
        "POST",
        "/agents/echo/",
        &json_headers,
        br#"{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}}"#,
    )
    .await;
    assert_eq!(slashed.status, 200);
    assert!(slashed.json()["result"].is_object(), "{}", slashed.json());
    for (method, path) in [
        ("GET", "/"),
        ("POST", "/agents"),
        ("GET", "/agents/echo/x/y"),
    ] {
        let nowhere = http::request(a2a.addr(), method, path, &json_headers, b"{}").await;
        assert_eq!(nowhere.status, 404, "{method} {path}");
        let said = nowhere.json();
        assert!(
            said["error"]["message"]
                .as_str()
                .is_some_and(|text| text.contains("/agents/<agent_id>")),
            "{method} {path}: {said}"
        );
    }
    // Still serving after all of it.
    let reply = a2a
        .rpc(
            "echo",
            "SendMessage",
            json!({"message": message("still here", None)}),
        )
        .await;
    assert_eq!(
        state(&reply["result"]["task"]),
        "TASK_STATE_COMPLETED",
        "{reply}"
    );
}

/// Issue 19: the official A2A Python SDK (`a2a-sdk`, pinned in tests/python/requirements.txt)
/// discovers the cards and drives every method through the gateway.
#[tokio::test]
async fn the_official_a2a_python_sdk_drives_the_gateway() {
    let a2a = A2a::start().await;
    let seen = a2a.run_sdk(&[]).await;
    assert_eq!(seen["blocking"], "TASK_STATE_COMPLETED");
    assert_eq!(seen["non_blocking"], "TASK_STATE_COMPLETED");
    assert_eq!(seen["canceled"], "TASK_STATE_CANCELED");
    assert_eq!(seen["no_token"], 401);
    assert_eq!(
        seen["stream"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_COMPLETED"
    );
}

/// The gateway's attack list (docs/a2a.md, "Errors"; docs/security.md): what one client may
/// not do to another, to the fabric, or to the gateway.
#[tokio::test]
async fn a_hostile_client_reaches_nothing_that_is_not_its_own() {
    let a2a = A2a::start().await;
    let mine = a2a
        .rpc(
            "sleeper",
            "SendMessage",
            json!({"message": message("mine", None), "configuration": {"returnImmediately": true}}),
        )
        .await;
    let mine = mine["result"]["task"]["id"].as_str().unwrap().to_owned();

    // Another client: no read, cancel, answer or stream of it.
    for (method, params) in [
        ("GetTask", json!({"id": mine})),
        ("CancelTask", json!({"id": mine})),
        ("SubscribeToTask", json!({"id": mine})),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "taskId": mine, "parts": [{"text": "hijack"}]}}),
        ),
    ] {
        let reply = a2a.rpc_as(OTHER_TOKEN, "sleeper", method, params).await;
        assert_eq!(reply["error"]["code"], -32001, "{method}: {reply}");
    }
    let still = a2a.rpc("sleeper", "GetTask", json!({"id": mine})).await;
    assert_eq!(state(&still["result"]), "TASK_STATE_SUBMITTED", "{still}");

    // A client agent is never an A2A agent: no card, no endpoint.
    let card = http::request(
        a2a.addr(),
        "GET",
        "/agents/a2a-other/.well-known/agent-card.json",
        &[],
        b"",
    )
    .await;
    assert_eq!(card.status, 404);
    let auth = format!("Bearer {TOKEN}");
    let headers = [
        ("Content-Type", "application/json"),
        ("A2A-Version", "1.0"),
        ("Authorization", auth.as_str()),
    ];
    let other = http::request(
        a2a.addr(),
        "POST",
        "/agents/a2a-other",
        &headers,
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message("hi", None)}})
            .to_string()
            .as_bytes(),
    )
    .await;
    assert_eq!(other.status, 404);
    // …and no fabric agent may message or task one.
    let mallory = a2a.fabric.agent("mallory").await;
    let refused = mallory.send_to_peer("a2a-planner", "psst").await.unwrap();
    assert!(refused.delivered_to.is_empty(), "{refused:?}");
    assert!(
        refused.unreachable_reasons[0].contains("does not accept messages"),
        "{refused:?}"
    );

    // Last-Event-ID must be a position of the task.
    for bad in ["-1", "abc", "18446744073709551615"] {
        let body =
            json!({"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": mine}});
        let mut with = headers.to_vec();
        with.push(("Last-Event-ID", bad));
        let response = http::request(
            a2a.addr(),
            "POST",
            "/agents/sleeper",
            &with,
            body.to_string().as_bytes(),
        )
        .await;
        assert_eq!(response.json()["error"]["code"], -32602, "{bad}");
    }

    // Bounded input, and errors that do not reflect it whole.
    let parts: Vec<Value> = (0..300).map(|n| json!({"data": n})).collect();
    let many = a2a
        .rpc(
            "sleeper",
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": parts}}),
        )
        .await;
    assert_eq!(many["error"]["code"], -32602, "{many}");
    let long_id = "x".repeat(100_000);
    let reflected = a2a.rpc("sleeper", "GetTask", json!({"id": long_id})).await;
    assert_eq!(reflected["error"]["code"], -32001);
    assert!(
        reflected["error"]["message"].as_str().unwrap().len() < 200,
        "{reflected}"
    );
    let long_context = a2a
        .rpc(
            "sleeper",
            "SendMessage",
            json!({"message": message("hi", Some(&"c".repeat(300)))}),
        )
        .await;
    assert_eq!(long_context["error"]["code"], -32602, "{long_context}");

    // Streams a client walks away from give their slots back: more subscriptions, opened and
    // dropped one after another, than a client may hold at once (32).
    for n in 0..40 {
        let mut stream = a2a
            .stream_to("sleeper", "SubscribeToTask", json!({"id": mine}), None)
            .await;
        let first = stream.next(Duration::from_secs(10)).await.unwrap();
        let reply: Value = serde_json::from_str(&first.data).unwrap();
        assert!(reply["result"]["task"].is_object(), "stream {n}: {reply}");
        drop(stream);
        // A real wait: the gateway notices the closed connection on its next write or read,
        // and how many slots a client holds is not observable from here.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Push notifications: every event of the task reaches the webhook, in a `StreamResponse`,
/// with its token, even though the webhook refuses its first two deliveries; the configs are
/// created, read, listed and deleted per task, and only by the task's client.
#[tokio::test]
async fn a_webhook_receives_every_event_of_its_task_despite_failures() {
    let a2a = A2a::start().await;
    let (url, received) = http::webhook_sink(2).await;
    let reply = a2a
        .rpc(
            "echo",
            "SendMessage",
            json!({
                "message": message("slow", None),
                "configuration": {
                    "returnImmediately": true,
                    "taskPushNotificationConfig": {"url": url, "token": "tok-1"},
                },
            }),
        )
        .await;
    let task_id = reply["result"]["task"]["id"].as_str().unwrap().to_owned();
    // Every event: created, accepted, started (working), the result, completed.
    let pushed_states = || -> Vec<String> {
        received
            .lock()
            .unwrap()
            .iter()
            .filter_map(|push| {
                push.body["statusUpdate"]["status"]["state"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    };
    switchboard_testkit::assert_eventually!(
        Duration::from_secs(20),
        async {
            pushed_states()
                .last()
                .is_some_and(|s| s == "TASK_STATE_COMPLETED")
        },
        "states pushed: {:?}",
        pushed_states()
    );
    let states = pushed_states();
    let got = received.lock().unwrap().clone();
    assert!(
        states.len() >= 4 && states.last().map(String::as_str) == Some("TASK_STATE_COMPLETED"),
        "states: {states:?}"
    );
    for state in ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"] {
        assert!(states.iter().any(|s| s == state), "{state} in {states:?}");
    }
    let artifact = got
        .iter()
        .find_map(|push| push.body.get("artifactUpdate"))
        .expect("the result is pushed");
    assert_eq!(artifact["artifact"]["parts"][0]["text"], "echo: slow");
    for push in &got {
        assert_eq!(
            push.body["statusUpdate"]["taskId"]
                .as_str()
                .or(push.body["artifactUpdate"]["taskId"].as_str()),
            Some(task_id.as_str())
        );
        let header = |name: &str| {
            push.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("x-a2a-notification-token"), Some("tok-1"));
        assert_eq!(header("content-type"), Some("application/a2a+json"));
    }

    // The config methods, on a task that stays open.
    let waiting = a2a
        .rpc(
            "sleeper",
            "SendMessage",
            json!({"message": message("wait", None), "configuration": {"returnImmediately": true}}),
        )
        .await;
    let waiting = waiting["result"]["task"]["id"].as_str().unwrap().to_owned();
    let created = a2a
        .rpc(
            "sleeper",
            "CreateTaskPushNotificationConfig",
            json!({"taskId": waiting, "id": "hook-1", "url": url,
                   "authentication": {"scheme": "Bearer", "credentials": "c"}}),
        )
        .await;
    assert_eq!(created["result"]["id"], "hook-1", "{created}");
    let got = a2a
        .rpc(
            "sleeper",
            "GetTaskPushNotificationConfig",
            json!({"taskId": waiting, "id": "hook-1"}),
        )
        .await;
    assert_eq!(got["result"]["url"], url.as_str());
    let listed = a2a
        .rpc(
            "sleeper",
            "ListTaskPushNotificationConfigs",
            json!({"taskId": waiting}),
        )
        .await;
    assert_eq!(
        listed["result"]["configs"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
    let stranger = a2a
        .rpc_as(
            OTHER_TOKEN,
            "sleeper",
            "ListTaskPushNotificationConfigs",
            json!({"taskId": waiting}),
        )
        .await;
    assert_eq!(stranger["error"]["code"], -32001, "{stranger}");
    let bad = a2a
        .rpc(
            "sleeper",
            "CreateTaskPushNotificationConfig",
            json!({"taskId": waiting, "url": "ftp://example.com/x"}),
        )
        .await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    let deleted = a2a
        .rpc(
            "sleeper",
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": waiting, "id": "hook-1"}),
        )
        .await;
    assert!(deleted.get("error").is_none(), "{deleted}");
    let listed = a2a
        .rpc(
            "sleeper",
            "ListTaskPushNotificationConfigs",
            json!({"taskId": waiting}),
        )
        .await;
    assert!(
        listed["result"]
            .get("configs")
            .is_none_or(|c| c.as_array().unwrap().is_empty()),
        "{listed}"
    );
}

/// The input-required round trip: the agent asks its requester a question, the client's next
/// message naming the task answers it (a message to the agent, in reply to the task), and the
/// agent resumes and completes; each `SendMessage` blocks until the task settles.
#[tokio::test]
async fn a_question_from_the_agent_is_answered_by_the_next_message() {
    let a2a = A2a::start().await;
    let worker = a2a.spawn_asker().await;

    let asked = a2a
        .rpc(
            "asker",
            "SendMessage",
            json!({"message": message("translate hello", None)}),
        )
        .await;
    let task = &asked["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_INPUT_REQUIRED", "{asked}");
    assert_eq!(
        task["status"]["message"]["parts"][0]["text"],
        "which language?"
    );
    let task_id = task["id"].as_str().unwrap().to_owned();
    // A subscriber from now gets the task as it is (asking), then only what comes after the
    // question: not the question again.
    let mut following = a2a
        .stream_to("asker", "SubscribeToTask", json!({"id": task_id}), None)
        .await;
    let first = following.next(Duration::from_secs(10)).await.unwrap();
    let first: Value = serde_json::from_str(&first.data).unwrap();
    assert_eq!(
        state(&first["result"]["task"]),
        "TASK_STATE_INPUT_REQUIRED",
        "{first}"
    );

    let answered = a2a
        .rpc(
            "asker",
            "SendMessage",
            json!({"message": {"messageId": "m-2", "role": "ROLE_USER", "taskId": task_id,
                               "parts": [{"text": "French"}]}}),
        )
        .await;
    let task = &answered["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{answered}");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "in French");
    worker.await.unwrap();
    let after: Vec<String> = read_until_end(&mut following)
        .await
        .into_iter()
        .filter_map(|(_, item)| {
            item["statusUpdate"]["status"]["state"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert!(
        !after
            .iter()
            .any(|state| state == "TASK_STATE_INPUT_REQUIRED")
            && after.last().map(String::as_str) == Some("TASK_STATE_COMPLETED"),
        "after the question: {after:?}"
    );

    // A message naming a task that asks nothing is refused (UnsupportedOperation).
    let again = a2a
        .rpc(
            "asker",
            "SendMessage",
            json!({"message": {"messageId": "m-3", "role": "ROLE_USER", "taskId": task_id,
                               "parts": [{"text": "more"}]}}),
        )
        .await;
    assert_eq!(again["error"]["code"], -32004, "{again}");
}

/// Issue 37: a question takes one answer. Forty answers at once to one `input_required`
/// question: one goes to the agent, thirty-nine are refused (UnsupportedOperation), and the
/// history holds the question and the one answer, no copies.
#[tokio::test]
async fn a_question_takes_one_answer_and_the_history_no_copies() {
    let a2a = A2a::start().await;
    let worker = a2a.spawn_asker().await;
    let asked = a2a
        .rpc(
            "asker",
            "SendMessage",
            json!({"message": message("translate hello", None),
                   "configuration": {"returnImmediately": false}}),
        )
        .await;
    let task_id = asked["result"]["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        state(&asked["result"]["task"]),
        "TASK_STATE_INPUT_REQUIRED",
        "{asked}"
    );
    let answers = (0..40).map(|n| {
        let a2a = &a2a;
        let task_id = task_id.clone();
        async move {
            a2a.rpc(
                "asker",
                "SendMessage",
                json!({"message": {"messageId": format!("answer-{n}"), "role": "ROLE_USER",
                                   "taskId": task_id, "parts": [{"text": "French"}]},
                       "configuration": {"returnImmediately": true}}),
            )
            .await
        }
    });
    let replies = futures::future::join_all(answers).await;
    let accepted = replies
        .iter()
        .filter(|reply| reply.get("result").is_some())
        .count();
    assert_eq!(accepted, 1, "one answer per question: {replies:?}");
    assert!(
        replies
            .iter()
            .filter(|reply| reply.get("error").is_some())
            .all(|reply| reply["error"]["code"] == -32004),
        "the others are refused: {replies:?}"
    );
    worker.await.unwrap();
    let task = a2a.rpc("asker", "GetTask", json!({"id": task_id})).await;
    let history = task["result"]["history"].as_array().unwrap();
    let texts: Vec<&str> = history
        .iter()
        .filter_map(|message| message["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(
        texts
            .iter()
            .filter(|text| **text == "which language?")
            .count(),
        1,
        "the question once: {texts:?}"
    );
    assert_eq!(
        texts.iter().filter(|text| **text == "French").count(),
        1,
        "the one answer: {texts:?}"
    );
}

/// Issue 19 through the official SDK as well: a stream it drops mid-task, resumed after the
/// gateway restarted (`Last-Event-ID` from the items' `switchboardEventSeq`), a webhook set
/// with the message, and the input-required round trip.
#[tokio::test]
async fn the_official_sdk_resumes_after_a_restart_sets_webhooks_and_answers_questions() {
    let mut a2a = A2a::start().await;
    let started = a2a.run_sdk(&["--phase", "stream-start"]).await;
    let task = started["task_id"].as_str().unwrap().to_owned();
    let seen = started["seen"].as_u64().unwrap().to_string();
    a2a.restart_gateway().await;
    let resumed = a2a
        .run_sdk(&[
            "--phase",
            "stream-resume",
            "--task",
            &task,
            "--after",
            &seen,
        ])
        .await;
    let states = resumed["states"].as_array().unwrap();
    assert_eq!(states.last().unwrap(), "TASK_STATE_COMPLETED", "{resumed}");

    let (url, received) = http::webhook_sink(0).await;
    let pushed = a2a.run_sdk(&["--phase", "push", "--webhook", &url]).await;
    let pushed_task = pushed["task_id"].as_str().unwrap().to_owned();
    switchboard_testkit::assert_eventually!(Duration::from_secs(15), async {
        received.lock().unwrap().iter().any(|push| {
            push.body["statusUpdate"]["taskId"] == pushed_task.as_str()
                && push.body["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        })
    });
    assert!(received.lock().unwrap().iter().all(|push| {
        push.headers
            .iter()
            .any(|(name, value)| name == "x-a2a-notification-token" && value == "sdk-tok")
    }));

    let worker = a2a.spawn_asker().await;
    let answered = a2a.run_sdk(&["--phase", "input"]).await;
    assert_eq!(answered["question"], "which language?");
    assert_eq!(answered["result"], "in French");
    worker.await.unwrap();
}

/// A webhook that takes the connection and the request and never answers.
async fn hanging_webhook() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&taken);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut sink = vec![0u8; 65_536];
                while stream.read(&mut sink).await.is_ok_and(|read| read > 0) {}
            });
        }
    });
    (url, taken)
}

/// `SendMessage` to `agent` as the client of `token`, returning at once, with a webhook at
/// `url` given with the message.
async fn send_with_webhook(a2a: &A2a, token: &str, agent: &str, text: &str, url: &str) -> Value {
    a2a.rpc_as(
        token,
        agent,
        "SendMessage",
        json!({
            "message": message(text, None),
            "configuration": {
                "returnImmediately": true,
                "taskPushNotificationConfig": {"url": url},
            },
        }),
    )
    .await
}

/// Issue 26, item 4: one client's hanging webhooks delay only its own pushes — another
/// client's push goes out at once — and a webhook given with a message whose task the task
/// service refuses is not kept.
#[tokio::test]
async fn a_clients_hanging_webhooks_do_not_delay_anothers_push() {
    let a2a = A2a::start().await;
    let (hanging, taken) = hanging_webhook().await;
    // "other" starts 16 tasks whose webhooks hang (the issue's 16, which filled the gateway's
    // shared 16 pushes in flight before): some 60 events to push, 4 of them posted at once
    // (its lane), the rest held or coming back later.
    for n in 0..16 {
        let reply =
            send_with_webhook(&a2a, OTHER_TOKEN, "echo", &format!("hang {n}"), &hanging).await;
        assert!(reply["result"]["task"].is_object(), "{reply}");
    }
    assert!(
        switchboard_testkit::eventually(Duration::from_secs(10), || async {
            taken.load(std::sync::atomic::Ordering::SeqCst) >= 4
        })
        .await,
        "only {} POSTs reached the hanging webhook",
        taken.load(std::sync::atomic::Ordering::SeqCst)
    );
    // planner's task and its webhook: the first event arrives promptly.
    let (url, received) = http::webhook_sink(0).await;
    let started = std::time::Instant::now();
    let reply = send_with_webhook(&a2a, TOKEN, "echo", "quick", &url).await;
    assert!(reply["result"]["task"].is_object(), "{reply}");
    assert!(
        switchboard_testkit::eventually(Duration::from_secs(10), || async {
            !received.lock().unwrap().is_empty()
        })
        .await
    );
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "planner's push waited {waited:?} behind other's hanging webhooks"
    );

    // A task the task service refuses (its agent has no live goal) leaves no webhook behind.
    let _idle = a2a.fabric.agent("idle").await;
    let js = async_nats::jetstream::new(a2a.fabric.nats.client().await);
    let bucket = js
        .get_key_value(switchboard_proto::A2A_PUSH_BUCKET)
        .await
        .unwrap();
    let count = || async {
        use futures::StreamExt;
        bucket.keys().await.unwrap().count().await
    };
    let before = count().await;
    for n in 0..5 {
        let reply = send_with_webhook(&a2a, TOKEN, "idle", &format!("refused {n}"), &url).await;
        assert!(reply["error"].is_object(), "refused: {reply}");
    }
    assert_eq!(count().await, before, "a refused task's webhook was kept");
}

/// Issue 26, item 7: connections that never finish their headers are closed after the
/// header-read timeout, and meanwhile the gateway serves everyone else.
#[tokio::test]
async fn connections_that_never_finish_their_headers_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a2a = A2a::start().await;
    let mut stalled = Vec::new();
    for _ in 0..150 {
        let mut stream = tokio::net::TcpStream::connect(a2a.addr()).await.unwrap();
        stream
            .write_all(b"POST /agents/echo HTTP/1.1\r\nHost: gateway\r\nContent-Ty")
            .await
            .unwrap();
        stalled.push(stream);
    }
    let card = http::request(
        a2a.addr(),
        "GET",
        "/agents/echo/.well-known/agent-card.json",
        &[],
        b"",
    )
    .await;
    assert_eq!(card.status, 200, "served while 150 connections stall");
    let limit = switchboard_runtime::http::HEADER_READ_TIMEOUT + Duration::from_secs(5);
    for mut stream in stalled {
        let mut byte = [0u8; 256];
        let closed = tokio::time::timeout(limit, async {
            // The server may answer 408 before closing: read to the end.
            loop {
                match stream.read(&mut byte).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "a stalled connection was still open after {limit:?}"
        );
    }
}

/// Creates a task for `echo` as the client of `token` in `context`, answered at once; its id.
async fn task_in_context(a2a: &A2a, token: &str, text: &str, context: &str) -> String {
    let reply = a2a
        .rpc_as(
            token,
            "echo",
            "SendMessage",
            json!({"message": message(text, Some(context)), "configuration": {"returnImmediately": true}}),
        )
        .await;
    reply["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {reply}"))
        .to_owned()
}

/// Runs one `ListTasks` as the client of `token` and returns its result with the `list`
/// requests the task service got meanwhile (read off the wire).
async fn list_counting(
    a2a: &A2a,
    wiretap: &async_nats::Client,
    lists: &mut async_nats::Subscriber,
    token: &str,
    params: Value,
) -> (Value, Vec<Value>) {
    use futures::StreamExt;
    let reply = a2a.rpc_as(token, "echo", "ListTasks", params).await;
    // Every request the gateway published before its answer is on the wiretap's connection
    // ahead of this round trip.
    switchboard_runtime::nats::sync(wiretap).await.unwrap();
    let mut seen = Vec::new();
    while let Ok(Some(request)) =
        tokio::time::timeout(Duration::from_millis(200), lists.next()).await
    {
        seen.push(serde_json::from_slice(&request.payload).unwrap());
    }
    let result = reply["result"].clone();
    assert!(result.is_object(), "{reply}");
    (result, seen)
}

/// Issue 37, hole 2: one `ListTasks` is one task-service `list`, with the client, the agent,
/// the context, the status, the page size and the page token pushed down, and the answer is
/// only the caller's tasks in that context. Before, a `contextId` made the gateway read up to
/// 16 pages (16 requests, each reading every task the agent was given by anyone and, with a
/// status, up to 1,000 records to count), and a context whose task sat behind 16 newer ones
/// came back empty.
#[tokio::test]
async fn list_tasks_costs_one_task_service_read() {
    let a2a = A2a::start().await;
    // The planner's oldest task is the only one in its context; 20 newer ones are in other
    // contexts, and the other client has tasks for the same agent in a context of that name.
    let needle = task_in_context(&a2a, TOKEN, "needle", "ctx-needle").await;
    let mut planners = vec![needle.clone()];
    for n in 0..20 {
        let (text, context) = (format!("hay {n}"), format!("ctx-hay-{n}"));
        planners.push(task_in_context(&a2a, TOKEN, &text, &context).await);
    }
    let mut others = Vec::new();
    for n in 0..5 {
        let text = format!("other {n}");
        others.push(task_in_context(&a2a, OTHER_TOKEN, &text, "ctx-needle").await);
    }
    let wiretap = a2a.fabric.nats.client().await;
    let mut lists = wiretap.subscribe("agent.task.list.>").await.unwrap();
    switchboard_runtime::nats::sync(&wiretap).await.unwrap();
    let ids = |result: &Value| -> Vec<String> {
        result["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|task| task["id"].as_str().unwrap().to_owned())
            .collect()
    };

    // One context, a page of one: the needle, found by one request that names the context.
    let (found, requests) = list_counting(
        &a2a,
        &wiretap,
        &mut lists,
        TOKEN,
        json!({"contextId": "ctx-needle", "pageSize": 1}),
    )
    .await;
    assert!(
        (1..=2).contains(&requests.len()),
        "{} task-service lists for one ListTasks: {requests:?}",
        requests.len()
    );
    assert_eq!(requests[0]["metadata"]["a2a_context_id"], "ctx-needle");
    assert_eq!(requests[0]["peer"], "echo");
    assert_eq!(requests[0]["limit"], 1);
    assert_eq!(ids(&found), vec![needle.clone()], "{found}");
    assert_eq!(found["nextPageToken"], "", "{found}");
    assert_eq!(found["totalSize"], 1, "{found}");

    // The other client's context of the same name: its own five, none of the planner's.
    let (theirs, requests) = list_counting(
        &a2a,
        &wiretap,
        &mut lists,
        OTHER_TOKEN,
        json!({"contextId": "ctx-needle"}),
    )
    .await;
    assert!((1..=2).contains(&requests.len()), "{requests:?}");
    let mut listed = ids(&theirs);
    listed.sort();
    others.sort();
    assert_eq!(listed, others, "{theirs}");

    // Paging the planner's 21 tasks five at a time: one request per page, every task once,
    // none of the other client's.
    let mut paged = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let mut params = json!({"pageSize": 5});
        if !token.is_empty() {
            params["pageToken"] = json!(token);
        }
        let (page, requests) = list_counting(&a2a, &wiretap, &mut lists, TOKEN, params).await;
        assert!((1..=2).contains(&requests.len()), "{requests:?}");
        assert_eq!(page["totalSize"], 21, "{page}");
        paged.extend(ids(&page));
        pages += 1;
        assert!(pages <= 10, "paging does not end: {page}");
        token = page["nextPageToken"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if token.is_empty() {
            break;
        }
    }
    paged.sort();
    planners.sort();
    assert_eq!(paged, planners);

    // A status filter is counted by the task service in the same one request.
    switchboard_testkit::assert_eventually!(
        Duration::from_secs(20),
        async {
            let done = a2a
                .rpc(
                    "echo",
                    "ListTasks",
                    json!({"status": "TASK_STATE_COMPLETED", "pageSize": 1}),
                )
                .await;
            done["result"]["totalSize"] == 21
        },
        "the planner's 21 tasks never all completed"
    );
    // Drain what the waiting loop sent.
    switchboard_runtime::nats::sync(&wiretap).await.unwrap();
    while let Ok(Some(_)) = tokio::time::timeout(
        Duration::from_millis(200),
        futures::StreamExt::next(&mut lists),
    )
    .await
    {}
    let (completed, requests) = list_counting(
        &a2a,
        &wiretap,
        &mut lists,
        TOKEN,
        json!({"status": "TASK_STATE_COMPLETED", "contextId": "ctx-needle"}),
    )
    .await;
    assert!((1..=2).contains(&requests.len()), "{requests:?}");
    assert_eq!(requests[0]["state"], "completed");
    assert_eq!(ids(&completed), vec![needle], "{completed}");
    assert_eq!(completed["totalSize"], 1, "{completed}");
}
