// Longer than 600 lines because the browser run is one story with its harness steps beside
// it, and the HTTP attack list reads best in one place.

//! The console (docs/console.md) against a real fabric: over HTTP (the headers, the session
//! cookie, CSRF, the host check, who may do what) and in a real headless Chromium
//! (`tests/console/browser.mjs`: sign in, the live map, a conversation, dead letters, answering
//! a question and deciding an approval as a person, escalation), with agent-written attack
//! text everywhere the page shows it. The browser run saves the screenshots of
//! docs/console.md.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use serde_json::{Value, json};
use switchboard_client::{Agent, PersonAnswer};
use switchboard_proto::MessageKind;
use switchboard_proto::people::PeopleOp;
use switchboard_tests::services::{Handle, Replica, Service, fast_audit, fast_people, runtime};
use switchboard_tests::{Fabric, agent_with, card};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const ALICE_TOKEN: &str = "alice-token-0123456789abcdef";
const BOB_TOKEN: &str = "bob-token-0123456789abcdef";

fn people_file() -> String {
    let hash = |t: &str| console::store::sha256_hex(t);
    format!(
        r#"
[[person]]
id = "admin"
name = "Local administrator"
access = ["viewer", "operator", "approver"]

[[person]]
id = "alice"
name = "Alice"
roles = ["oncall"]
access = ["viewer", "approver"]
tokens = ["sha256:{}"]

[[person]]
id = "bob"
name = "Bob"
access = ["viewer"]
tokens = ["sha256:{}"]

[[person]]
id = "carol"
name = "Carol"
access = ["viewer", "approver"]
"#,
        hash(ALICE_TOKEN),
        hash(BOB_TOKEN)
    )
}

/// A fabric with audit, people and the console, and the console's address.
struct World {
    fabric: Fabric,
    _replicas: Vec<Replica>,
    console: Option<Replica>,
    _dir: tempfile::TempDir,
    url: String,
    admin_token: String,
}

impl World {
    async fn start() -> Self {
        let fabric = Fabric::start().await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("people.toml");
        std::fs::write(&file, people_file()).unwrap();
        let settings = runtime(&fabric.url());
        let audit = Service::Audit(fast_audit()).start(&settings).await;
        let people = Service::People(fast_people(&file)).start(&settings).await;
        let (admin_token, hash) = console::one_time_token();
        let config = console::ConsoleConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            people_file: Some(file),
            bootstrap_token_sha256: Some(hash),
            trace_url_template: Some("http://localhost:16686/trace/{trace_id}".to_owned()),
            ..Default::default()
        };
        let (console, handle) = Service::Console(config).start_with_handle(&settings).await;
        let Handle::Listening(address) = handle else {
            panic!("the console listens");
        };
        Self {
            fabric,
            _replicas: vec![audit, people],
            console: Some(console),
            _dir: dir,
            url: format!("http://{address}"),
            admin_token,
        }
    }
}

/// Where a console listens, and its one-time administrator token.
trait Site {
    fn base(&self) -> &str;
    fn admin_token(&self) -> &str;
}

impl Site for World {
    fn base(&self) -> &str {
        &self.url
    }
    fn admin_token(&self) -> &str {
        &self.admin_token
    }
}

/// A console on a keyed server ([`World`] runs an open one).
struct Keyed {
    url: String,
    admin_token: String,
}

impl Site for Keyed {
    fn base(&self) -> &str {
        &self.url
    }
    fn admin_token(&self) -> &str {
        &self.admin_token
    }
}

/// One HTTP reply: status, headers, JSON body (`Null` when none).
struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

/// Sends a request the way a browser would (JSON body, the session cookie when given).
async fn http(
    world: &impl Site,
    method: &str,
    path: &str,
    session: Option<&Session>,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Reply {
    switchboard_runtime::nats::install_crypto_provider();
    let client = reqwest::Client::new();
    let url = format!("{}{path}", world.base());
    let mut request = match method {
        "GET" => client.get(url),
        _ => client.post(url),
    };
    if let Some(session) = session {
        request = request.header("cookie", format!("sb_session={}", session.cookie));
    }
    let mut typed = false;
    for (name, value) in headers {
        typed |= name.eq_ignore_ascii_case("content-type");
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        if !typed {
            request = request.header("content-type", "application/json");
        }
        request = request.body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    Reply {
        status,
        headers,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
    }
}

/// A signed-in person: the cookie value and the CSRF token.
struct Session {
    cookie: String,
    csrf: String,
}

async fn sign_in(world: &impl Site, token: &str) -> (Reply, Option<Session>) {
    let reply = http(
        world,
        "POST",
        "/api/login",
        None,
        &[],
        Some(&json!({"token": token}).to_string()),
    )
    .await;
    let session = reply
        .headers
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("sb_session="))
        .and_then(|v| v.split(';').next())
        .map(|cookie| Session {
            cookie: cookie.to_owned(),
            csrf: reply.body["csrf"].as_str().unwrap_or_default().to_owned(),
        });
    (reply, session)
}

#[tokio::test]
async fn every_response_is_hardened_and_every_write_needs_the_session_and_its_csrf_token() {
    let world = World::start().await;
    // Headers and the page's own files.
    let page = http(&world, "GET", "/", None, &[], None).await;
    assert_eq!(page.status, 200);
    let csp = page.headers["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(page.headers["x-frame-options"], "DENY");
    assert_eq!(page.headers["x-content-type-options"], "nosniff");
    // Signed out: nothing.
    let nobody = http(&world, "GET", "/api/me", None, &[], None).await;
    assert_eq!(nobody.body["person"], Value::Null);
    for path in ["/api/map", "/api/inbox", "/api/dlq", "/api/events"] {
        let reply = http(&world, "GET", path, None, &[], None).await;
        assert_eq!(reply.status, 401, "{path}");
    }
    // Another Host (DNS rebinding to loopback) is refused.
    let rebound = http(
        &world,
        "GET",
        "/api/me",
        None,
        &[("host", "evil.example")],
        None,
    )
    .await;
    assert_eq!(rebound.status, 421);
    // The one-time token works once; its cookie is HttpOnly and SameSite=Strict.
    let (login, admin) = sign_in(&world, &world.admin_token).await;
    let cookie = login.headers["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(admin.is_some());
    let (again, none) = sign_in(&world, &world.admin_token).await;
    assert_eq!(again.status, 401);
    assert!(none.is_none());
    let (wrong, _) = sign_in(&world, "not-a-token").await;
    assert_eq!(wrong.status, 401);

    // CSRF: a write without the token, with a form body, or from another site is refused.
    let (_, bob) = sign_in(&world, BOB_TOKEN).await;
    let bob = bob.unwrap();
    let item = uuid::Uuid::now_v7();
    let answer = format!("/api/items/{item}/answer");
    let no_token = http(&world, "POST", &answer, Some(&bob), &[], Some("{}")).await;
    assert_eq!(no_token.status, 403);
    assert_eq!(no_token.body["error"]["kind"], "csrf");
    let form = http(
        &world,
        "POST",
        &answer,
        Some(&bob),
        &[
            ("x-csrf-token", &bob.csrf),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
        Some("message=x"),
    )
    .await;
    assert_eq!(form.status, 403);
    let cross = http(
        &world,
        "POST",
        &answer,
        Some(&bob),
        &[
            ("x-csrf-token", &bob.csrf),
            ("sec-fetch-site", "cross-site"),
        ],
        Some("{}"),
    )
    .await;
    assert_eq!(cross.status, 403);
    // A viewer may not redrive dead letters.
    let redrive = http(
        &world,
        "POST",
        "/api/dlq/1/redrive",
        Some(&bob),
        &[("x-csrf-token", &bob.csrf)],
        Some("{}"),
    )
    .await;
    assert_eq!(redrive.status, 403);
    assert_eq!(redrive.body["error"]["kind"], "not_allowed");

    // An operator discards a dead letter for good; a viewer may not.
    let (sender, _) = world.fabric.agent_with_goal("dlq-sender").await;
    let (_, reader_goal) = world.fabric.agent_with_goal("dlq-reader").await;
    sender.send_to_peer("dlq-reader", "poison").await.unwrap();
    let delivery = reader_goal
        .recv(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    delivery.reject("unreadable").await.unwrap();
    let admin = admin.unwrap();
    let letters = http(&world, "GET", "/api/dlq", Some(&admin), &[], None).await;
    let seq = letters.body["letters"][0]["seq"].as_u64().unwrap();
    let path = format!("/api/dlq/{seq}/discard");
    let viewer = http(
        &world,
        "POST",
        &path,
        Some(&bob),
        &[("x-csrf-token", &bob.csrf)],
        Some("{}"),
    )
    .await;
    assert_eq!(viewer.status, 403);
    let discarded = http(
        &world,
        "POST",
        &path,
        Some(&admin),
        &[("x-csrf-token", &admin.csrf)],
        Some("{}"),
    )
    .await;
    assert_eq!(discarded.body["discarded"], true, "{}", discarded.body);
    let letters = http(&world, "GET", "/api/dlq", Some(&admin), &[], None).await;
    assert!(letters.body["letters"].as_array().unwrap().is_empty());

    // A person cannot answer another person's question: bob tries alice's.
    let (agent, goal) = world.fabric.agent_with_goal("deployer").await;
    let parked = agent
        .ask_person(&goal, "person:alice", "for alice only", None)
        .await
        .unwrap();
    let path = format!("/api/items/{}/answer", parked.item_id);
    let stolen = http(
        &world,
        "POST",
        &path,
        Some(&bob),
        &[("x-csrf-token", &bob.csrf)],
        Some(r#"{"message": "bob here"}"#),
    )
    .await;
    assert_eq!(stolen.status, 403);
    assert_eq!(stolen.body["error"]["kind"], "not_addressee");
    // Nor does a person named in the body count: the session's does (the field is refused).
    let named = http(
        &world,
        "POST",
        &path,
        Some(&bob),
        &[("x-csrf-token", &bob.csrf)],
        Some(r#"{"message": "x", "person": "alice"}"#),
    )
    .await;
    assert!((400..500).contains(&named.status), "{}", named.status);
    let peek = http(
        &world,
        "GET",
        &format!("/api/items/{}", parked.item_id),
        Some(&bob),
        &[],
        None,
    )
    .await;
    assert_eq!(peek.status, 404);
    // A body past the limit is refused before it is read whole.
    let huge = format!(r#"{{"message": "{}"}}"#, "x".repeat(300 * 1024));
    let (_, alice) = sign_in(&world, ALICE_TOKEN).await;
    let alice = alice.unwrap();
    let big = http(
        &world,
        "POST",
        &path,
        Some(&alice),
        &[("x-csrf-token", &alice.csrf)],
        Some(&huge),
    )
    .await;
    assert_eq!(big.status, 413);
    // Alice answers; a sign-out ends her session.
    let ok = http(
        &world,
        "POST",
        &path,
        Some(&alice),
        &[("x-csrf-token", &alice.csrf)],
        Some(r#"{"message": "yes"}"#),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let out = http(
        &world,
        "POST",
        "/api/logout",
        Some(&alice),
        &[("x-csrf-token", &alice.csrf)],
        Some("{}"),
    )
    .await;
    assert_eq!(out.status, 204);
    let after = http(&world, "GET", "/api/inbox", Some(&alice), &[], None).await;
    assert_eq!(after.status, 401);

    // A page left open does not hold the console up when it stops: its live stream ends.
    let (_, bob_again) = sign_in(&world, BOB_TOKEN).await;
    let mut stream = reqwest::Client::new()
        .get(format!("{}/api/events", world.url))
        .header(
            "cookie",
            format!("sb_session={}", bob_again.unwrap().cookie),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let hello = stream.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&hello).contains("hello"));
    let mut world = world;
    // `stop` fails the test if the console takes longer than 10 s.
    world.console.take().unwrap().stop().await;
}

/// Signs in with the one-time administrator link's token.
async fn admin(world: &impl Site) -> Session {
    let (reply, session) = sign_in(world, world.admin_token()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    session.unwrap()
}

async fn post(world: &impl Site, path: &str, session: &Session, body: &str) -> Reply {
    http(
        world,
        "POST",
        path,
        Some(session),
        &[("x-csrf-token", &session.csrf)],
        Some(body),
    )
    .await
}

#[tokio::test]
async fn operators_cancel_task_trees_and_talk_to_agents_and_viewers_cannot() {
    let world = World::start().await;
    let url = world.fabric.url();
    let deployer = agent_with(&url, card("deployer"), Duration::from_secs(3600)).await;
    let deployer_goal = deployer.open_goal().await.unwrap();
    let (worker, worker_goal) = world.fabric.agent_with_goal("worker").await;
    let root = deployer
        .create_task(switchboard_proto::task::CreateTask {
            to: Some("worker".to_owned()),
            message: Some("ship <b>42</b>".to_owned()),
            from_goal_id: Some(deployer_goal.id()),
            ..Default::default()
        })
        .await
        .unwrap()
        .task
        .task_id;
    worker.accept_task(root).await.unwrap();
    let child = worker
        .spawn_subtask(root, "self", "migrate")
        .await
        .unwrap()
        .task
        .task_id;
    let admin = admin(&world).await;
    let (_, bob) = sign_in(&world, BOB_TOKEN).await;
    let bob = bob.unwrap();

    // A viewer reads tasks and trees.
    let listed = http(
        &world,
        "GET",
        "/api/tasks?agent=deployer",
        Some(&bob),
        &[],
        None,
    )
    .await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.body["tasks"][0]["task_id"], json!(root));
    let tree_path = format!("/api/tasks/{child}/tree");
    let tree = http(&world, "GET", &tree_path, Some(&bob), &[], None).await;
    assert_eq!(tree.status, 200, "{}", tree.body);
    assert_eq!(tree.body["root"], json!(root));
    assert_eq!(tree.body["tasks"].as_array().unwrap().len(), 2);
    // ...but neither cancels nor talks.
    let cancel_path = format!("/api/tasks/{root}/cancel");
    let refused = post(&world, &cancel_path, &bob, "{}").await;
    assert_eq!(refused.status, 403);
    assert_eq!(refused.body["error"]["kind"], "not_allowed");
    let talk = json!({"to": "worker", "mode": "send", "message": "hi"}).to_string();
    assert_eq!(post(&world, "/api/talk", &bob, &talk).await.status, 403);
    let heard = http(&world, "GET", "/api/talk", Some(&bob), &[], None).await;
    assert_eq!(heard.status, 403);

    // Bad input: a clear error each, nothing sent.
    for (path, status) in [
        ("/api/tasks?agent=..%2Fx", 400),
        ("/api/tasks?agent=", 400),
        ("/api/tasks?agent=deployer&state=lost", 400),
        (
            &format!("/api/tasks/{}/tree", uuid::Uuid::now_v7()) as &str,
            404,
        ),
        ("/api/tasks/not-a-uuid/tree", 400),
    ] {
        let reply = http(&world, "GET", path, Some(&admin), &[], None).await;
        assert_eq!(reply.status, status, "{path}: {}", reply.body);
    }
    let no_csrf = http(&world, "POST", &cancel_path, Some(&admin), &[], Some("{}")).await;
    assert_eq!(no_csrf.status, 403);
    assert_eq!(no_csrf.body["error"]["kind"], "csrf");
    let unknown = post(
        &world,
        &format!("/api/tasks/{}/cancel", uuid::Uuid::now_v7()),
        &admin,
        "{}",
    )
    .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        post(&world, &cancel_path, &admin, r#"{"reason": 7}"#)
            .await
            .status,
        400
    );
    let oversized = "x".repeat(switchboard_proto::MAX_BODY_BYTES + 1);
    for (body, status, kind) in [
        (
            json!({"to": "", "mode": "send", "message": "hi"}),
            400,
            "bad_request",
        ),
        (
            json!({"to": "worker", "mode": "shout", "message": "hi"}),
            400,
            "bad_request",
        ),
        (
            json!({"to": "worker", "mode": "send", "message": "  "}),
            400,
            "bad_request",
        ),
        (
            json!({"to": "worker", "mode": "send", "message": oversized}),
            413,
            "body_too_large",
        ),
        (
            json!({"to": "nobody", "mode": "call", "message": "hi"}),
            0,
            "unreachable",
        ),
        (
            json!({"to": "../../etc", "mode": "send", "message": "hi"}),
            0,
            "",
        ),
        (
            json!({"to": "worker", "mode": "send", "message": "hi", "as": "deployer"}),
            400,
            "bad_request",
        ),
    ] {
        let reply = post(&world, "/api/talk", &admin, &body.to_string()).await;
        assert!(
            (400..500).contains(&reply.status),
            "{body}: {}",
            reply.status
        );
        if status != 0 {
            assert_eq!(reply.status, status, "{body}: {}", reply.body);
        }
        if !kind.is_empty() {
            assert_eq!(reply.body["error"]["kind"], kind, "{body}: {}", reply.body);
        }
    }

    // The operator talks: the agent gets it from the person's own agent, never another's.
    let said = post(&world, "/api/talk", &admin, &talk).await;
    assert_eq!(said.status, 200, "{}", said.body);
    assert_eq!(said.body["as"], "people-admin");
    let got = switchboard_tests::wire::next(&worker_goal).await;
    // The task message came first; read on to the person's message.
    let got = if got.kind == MessageKind::Task {
        switchboard_tests::wire::next(&worker_goal).await
    } else {
        got
    };
    let got = if got.body == "hi" {
        got
    } else {
        switchboard_tests::wire::next(&worker_goal).await
    };
    assert_eq!(got.body, "hi");
    assert_eq!(got.from_agent_id.as_str(), "people-admin");
    // An agent that takes messages from named peers only is out of the person's reach.
    let mut closed = card("closed");
    closed.allow_from = vec!["deployer".to_owned()];
    let closed = agent_with(&url, closed, Duration::from_secs(3600)).await;
    let _closed_goal = closed.open_goal().await.unwrap();
    let denied = post(
        &world,
        "/api/talk",
        &admin,
        &json!({"to": "closed", "mode": "send", "message": "hi"}).to_string(),
    )
    .await;
    assert_eq!(denied.status, 404, "{}", denied.body);
    assert_eq!(denied.body["error"]["kind"], "unreachable");
    assert!(
        denied.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not accept messages from `people-admin`"),
        "{}",
        denied.body
    );
    // What the person sent is in their conversation.
    let heard = http(&world, "GET", "/api/talk", Some(&admin), &[], None).await;
    assert_eq!(heard.status, 200, "{}", heard.body);
    assert!(
        heard.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["outgoing"] == json!(true) && m["body"] == "hi")
    );

    // The operator cancels the tree; a second cancel changes nothing.
    let done = post(
        &world,
        &cancel_path,
        &admin,
        r#"{"reason": "release frozen"}"#,
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(done.body["task"]["state"], "canceled");
    assert_eq!(done.body["descendants"][0]["task_id"], json!(child));
    assert_eq!(done.body["descendants"][0]["state"], "canceled");
    let again = post(&world, &cancel_path, &admin, "{}").await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body["duplicate"], true);
    // Over NATS the cancel names a person, never an agent or nothing.
    for person in ["admin", "role:oncall", "", "person:../x"] {
        let refused: Result<Value, _> = switchboard_request::request::request_json(
            deployer.nats(),
            &switchboard_proto::task::ops::TaskOpsOp::Cancel.subject(),
            &json!({"task_id": root, "person": person}),
            Duration::from_secs(10),
        )
        .await;
        let Err(switchboard_request::request::RequestFailure::Service(reply)) = refused else {
            panic!("{person}: {refused:?}");
        };
        assert_eq!(reply.kind(), switchboard_proto::ErrorKind::BadRequest);
    }
}

#[test]
fn the_page_never_turns_text_into_markup() {
    let js = include_str!("../services/console/assets/app.js");
    for banned in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        "setAttribute(\"on",
        "srcdoc",
    ] {
        assert!(!js.contains(banned), "app.js uses {banned}");
    }
    let html = include_str!("../services/console/assets/index.html");
    assert!(
        !html.contains("<script>") && !html.contains(" on"),
        "inline script in index.html"
    );
    assert!(
        !html.contains("http"),
        "index.html loads something from elsewhere"
    );
}

/// What the harness does for the browser script, step by step.
struct Harness {
    world: World,
    deployer: Agent,
    deployer_goal: switchboard_client::Goal,
    newcomer: Option<Agent>,
    reader: Option<(Agent, switchboard_client::Goal)>,
    ask: Option<uuid::Uuid>,
    approval: Option<(uuid::Uuid, Value)>,
    /// The worker and its goal, and the tree's root and child.
    tree: Option<(Agent, switchboard_client::Goal, uuid::Uuid, uuid::Uuid)>,
    helpdesk: Option<tokio::task::JoinHandle<()>>,
}

const HOSTILE_DESCRIPTION: &str = "<img src=x onerror=\"window.pwned=true;alert(1)\">deploys";
const HOSTILE_BODY: &str = "<script>window.pwned=true</script> see javascript:alert(1)";
const HOSTILE_ARGUMENT: &str = "javascript:alert(document.cookie)";

fn action() -> Value {
    json!({"tool": "deploy", "arguments": {"version": "42",
        "note": "</style><style>*{display:none}</style>", "link": HOSTILE_ARGUMENT}})
}

impl Harness {
    async fn step(&mut self, what: &str, arg: &str) -> String {
        match what {
            "online" => {
                let agent = agent_with(
                    &self.world.fabric.url(),
                    card(arg),
                    Duration::from_secs(3600),
                )
                .await;
                self.newcomer = Some(agent);
                String::new()
            }
            "offline" => {
                self.newcomer.take().unwrap().deregister().await.unwrap();
                String::new()
            }
            "conversation" => {
                let (echo, task) = self
                    .world
                    .fabric
                    .answering("echo", |body| format!("echo: {body}"))
                    .await;
                let answer = self
                    .deployer
                    .call("echo", HOSTILE_BODY, Duration::from_secs(10))
                    .await
                    .unwrap();
                // The audit has recorded the call and its answer.
                tokio::time::sleep(Duration::from_millis(1500)).await;
                task.abort();
                drop(echo);
                answer.correlation_id.to_string()
            }
            "dead-letter" => {
                let reader = self.world.fabric.agent_with_goal("reader").await;
                self.deployer
                    .send_to_peer("reader", "poison")
                    .await
                    .unwrap();
                let delivery = reader
                    .1
                    .recv(Duration::from_secs(10))
                    .await
                    .unwrap()
                    .unwrap();
                delivery.reject("cannot parse <b>this</b>").await.unwrap();
                let letters = switchboard_client::dlq_list(self.deployer.nats(), 10)
                    .await
                    .unwrap();
                self.reader = Some(reader);
                letters.last().unwrap().seq.to_string()
            }
            "redriven" => {
                let (_, goal) = self.reader.as_ref().unwrap();
                let back = switchboard_tests::wire::next(goal).await;
                assert_eq!(back.body, "poison");
                String::new()
            }
            "ask" => {
                let parked = self
                    .deployer
                    .ask_person(
                        &self.deployer_goal,
                        "person:alice",
                        "<svg onload=alert(1)> roll back 42?\u{202e}gnp.exe",
                        None,
                    )
                    .await
                    .unwrap();
                self.ask = Some(parked.item_id);
                parked.item_id.to_string()
            }
            "answered" => {
                let message = switchboard_tests::wire::next(&self.deployer_goal).await;
                let Some(PersonAnswer::Answered(answer)) =
                    PersonAnswer::of(&message, self.ask.unwrap())
                else {
                    panic!("the agent got no answer: {message:?}");
                };
                assert_eq!(answer.body, "yes, roll back");
                assert_eq!(answer.from_person.as_deref(), Some("person:alice"));
                String::new()
            }
            "approval" => {
                let reply: Value = switchboard_request::request::request_json(
                    self.deployer.nats(),
                    &PeopleOp::ApprovalRequest.subject(self.deployer.id()),
                    &json!({"action": action(), "reason": "release <b>42</b>", "to": "person:alice",
                        "from_goal_id": self.deployer_goal.id(), "expires_in_ms": 60_000}),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
                let id = uuid::Uuid::parse_str(reply["item_id"].as_str().unwrap()).unwrap();
                self.approval = Some((id, action()));
                id.to_string()
            }
            "approved" => {
                let (id, action) = self.approval.clone().unwrap();
                let message = switchboard_tests::wire::next(&self.deployer_goal).await;
                assert!(PersonAnswer::of(&message, id).unwrap().approved());
                let mut changed = action.clone();
                changed["arguments"]["version"] = json!("43");
                let refused = self
                    .deployer
                    .use_approval(id, serde_json::from_value(changed).unwrap())
                    .await
                    .unwrap_err();
                assert_eq!(
                    refused.kind(),
                    Some(switchboard_proto::ErrorKind::ActionMismatch)
                );
                let used = self
                    .deployer
                    .use_approval(id, serde_json::from_value(action).unwrap())
                    .await
                    .unwrap();
                assert_eq!(used.decided_by.to_string(), "person:alice");
                String::new()
            }
            "escalating" => {
                let parked = self
                    .deployer
                    .ask_person_with(switchboard_proto::people::AskRequest {
                        to: "person:alice".to_owned(),
                        message: "anyone?".to_owned(),
                        from_goal_id: self.deployer_goal.id(),
                        timeout_ms: Some(60_000),
                        escalate_after_ms: Some(3_000),
                        escalate_to: Some("person:carol".to_owned()),
                        ask_id: None,
                        metadata: serde_json::Map::new(),
                    })
                    .await
                    .unwrap();
                parked.item_id.to_string()
            }
            "tree" => {
                // deployer → worker (accepted), worker → worker (a subtask): a tree of two.
                let (worker, worker_goal) = self.world.fabric.agent_with_goal("worker").await;
                let root = self
                    .deployer
                    .create_task(switchboard_proto::task::CreateTask {
                        to: Some("worker".to_owned()),
                        message: Some("ship release <b>42</b>".to_owned()),
                        from_goal_id: Some(self.deployer_goal.id()),
                        deadline_in_ms: Some(600_000),
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .task
                    .task_id;
                worker.accept_task(root).await.unwrap();
                worker.start_task(root).await.unwrap();
                let child = worker
                    .spawn_subtask(root, "self", "run the migrations")
                    .await
                    .unwrap()
                    .task
                    .task_id;
                self.tree = Some((worker, worker_goal, root, child));
                root.to_string()
            }
            "canceled" => {
                let (worker, _, root, child) = self.tree.as_ref().unwrap();
                // The root names the person; its subtask, the root it ended with.
                for (id, named) in [(root, "person:admin".to_owned()), (child, root.to_string())] {
                    let task = worker.get_task(*id).await.unwrap();
                    assert_eq!(task.state, switchboard_proto::TaskState::Canceled);
                    assert!(
                        task.reason.as_deref().unwrap_or("").contains(&named),
                        "{:?}",
                        task.reason
                    );
                }
                // The requester is told who canceled its task.
                loop {
                    let update = switchboard_tests::wire::next(&self.deployer_goal).await;
                    if update.kind == MessageKind::TaskUpdate && update.body.contains("canceled") {
                        assert!(update.body.contains("person:admin"), "{}", update.body);
                        break;
                    }
                }
                String::new()
            }
            "helpdesk" => {
                let (_agent, task) = self
                    .world
                    .fabric
                    .answering("helpdesk", |body| format!("on it: {body}"))
                    .await;
                self.helpdesk = Some(task);
                String::new()
            }
            other => panic!("the browser asked for {other}"),
        }
    }
}

#[tokio::test]
async fn a_person_signs_in_watches_the_fabric_and_answers_agents_in_a_real_browser() {
    let world = World::start().await;
    let mut deployer_card = card("deployer");
    deployer_card.description = HOSTILE_DESCRIPTION.to_owned();
    let deployer = agent_with(
        &world.fabric.url(),
        deployer_card,
        Duration::from_secs(3600),
    )
    .await;
    let deployer_goal = deployer.open_goal().await.unwrap();
    let root = switchboard_testkit::workspace_root();
    let screenshots = root.join("docs/images");
    let mut child = tokio::process::Command::new("node")
        .current_dir(root.join("tests/console"))
        .arg("browser.mjs")
        .env("CONSOLE_URL", &world.url)
        .env("ADMIN_TOKEN", &world.admin_token)
        .env("ALICE_TOKEN", ALICE_TOKEN)
        .env("SCREENSHOTS", &screenshots)
        .env("HOSTILE_DESCRIPTION", HOSTILE_DESCRIPTION)
        .env("HOSTILE_BODY", HOSTILE_BODY)
        .env("HOSTILE_ARGUMENT", HOSTILE_ARGUMENT)
        .env(
            "HOSTILE_QUESTION",
            "<svg onload=alert(1)> roll back 42?\u{27e6}U+202E\u{27e7}gnp.exe",
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs (make test installs tests/console)");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut harness = Harness {
        world,
        deployer,
        deployer_goal,
        newcomer: None,
        reader: None,
        ask: None,
        approval: None,
        tree: None,
        helpdesk: None,
    };
    let run = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("need ") {
                let (what, arg) = rest.split_once(' ').unwrap_or((rest, ""));
                let value = harness.step(what, arg).await;
                stdin
                    .write_all(format!("ok {value}\n").as_bytes())
                    .await
                    .unwrap();
            } else if line == "done" {
                return Ok(());
            } else if let Some(why) = line.strip_prefix("failed ") {
                return Err(why.to_owned());
            }
        }
        Err("the browser script ended without a verdict".to_owned())
    };
    let verdict = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the browser run finished within 180 s");
    if let Err(why) = verdict {
        panic!("the browser run failed: {why}");
    }
    drop(stdin);
    let exited = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the browser script exits")
        .unwrap();
    assert!(exited.success());
    // The agents' own view of what happened stays consistent: nothing more arrived.
    let stray = harness
        .deployer_goal
        .recv(Duration::from_millis(300))
        .await
        .unwrap()
        .map(|d| d.message.kind);
    assert!(
        stray.is_none() || stray == Some(MessageKind::Notify),
        "{stray:?}"
    );
}

/// The console under the generated accounts (`switchboard nats-config --people`): it signs in
/// as `console.nk` with only its own permissions, every view works, the person talks as their
/// own agent, and what the console may not do is refused by the server.
#[tokio::test]
async fn the_console_works_with_its_own_nats_identity_and_nothing_more() {
    use switchboard::permissions::{self, AgentEntry, AgentsFile};
    use switchboard_runtime::config::Secret;
    use switchboard_runtime::nats::read_seed;
    use switchboard_testkit::{Login, NatsServer};

    let dir = tempfile::tempdir().unwrap();
    let agents = AgentsFile {
        agents: ["deployer", "worker"]
            .into_iter()
            .map(|id| AgentEntry {
                id: id.to_owned(),
                audit: false,
                skills: Vec::new(),
            })
            .collect(),
    };
    let talkers = [switchboard_proto::AgentId::parse("admin").unwrap()];
    permissions::generate_with(&agents, &talkers, dir.path()).unwrap();
    let seed = |file: &str| read_seed(&dir.path().join(file)).unwrap();
    let services_seed = seed(permissions::SERVICES_SEED_FILE);
    let auth = std::fs::read_to_string(dir.path().join(permissions::AUTH_FILE)).unwrap();
    let nats = NatsServer::start_with_config(&auth, Login::Nkey(services_seed.clone())).await;
    let mut services = runtime(&nats.url());
    services.nats.nkey_seed = Some(Secret::new(services_seed));
    let mut replicas = Vec::new();
    let directory = directory::DirectoryConfig {
        skill_grants_file: Some(dir.path().join(permissions::SKILL_GRANTS_FILE)),
        ..Default::default()
    };
    let file = dir.path().join("people.toml");
    std::fs::write(&file, people_file()).unwrap();
    for service in [
        Service::Directory(directory),
        Service::Fanout(Default::default()),
        Service::Correlator(Default::default()),
        Service::Tasks(switchboard_tests::fast_tasks()),
        Service::Audit(fast_audit()),
        Service::People(fast_people(&file)),
    ] {
        replicas.push(service.start(&services).await);
    }
    // The console with its own key and reply prefix.
    let mut own = runtime(&nats.url());
    own.nats.nkey_seed = Some(Secret::new(seed(permissions::CONSOLE_SEED_FILE)));
    own.nats.inbox_prefix = Some(switchboard_proto::CONSOLE_INBOX_PREFIX.to_owned());
    let (admin_token, hash) = console::one_time_token();
    let config = console::ConsoleConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        people_file: Some(file),
        bootstrap_token_sha256: Some(hash),
        ..Default::default()
    };
    let (console, handle) = Service::Console(config).start_with_handle(&own).await;
    let Handle::Listening(address) = handle else {
        panic!("the console listens");
    };
    // Agents with their own keys.
    let keyed = |id: &str| {
        let seed = seed(&format!("agents/{id}.nk"));
        let url = nats.url();
        let id = id.to_owned();
        async move {
            let nats = switchboard_client::agent_connect_options(
                &switchboard_proto::AgentId::parse(&id).unwrap(),
            )
            .nkey(seed)
            .connect(url)
            .await
            .unwrap();
            let options = switchboard_client::AgentOptions {
                heartbeat_interval: Duration::from_secs(3600),
                ..Default::default()
            };
            Agent::connect_with(nats, card(&id), options).await.unwrap()
        }
    };
    let deployer = keyed("deployer").await;
    let deployer_goal = deployer.open_goal().await.unwrap();
    let worker = keyed("worker").await;
    let worker_goal = worker.open_goal().await.unwrap();
    let root = deployer
        .create_task(switchboard_proto::task::CreateTask {
            to: Some("worker".to_owned()),
            message: Some("ship".to_owned()),
            from_goal_id: Some(deployer_goal.id()),
            ..Default::default()
        })
        .await
        .unwrap()
        .task
        .task_id;
    let _ = switchboard_tests::wire::next(&worker_goal).await;

    let world = Keyed {
        url: format!("http://{address}"),
        admin_token,
    };
    let admin = admin(&world).await;
    // Every view reads through the console's own user.
    let map = http(&world, "GET", "/api/map", Some(&admin), &[], None).await;
    assert_eq!(map.status, 200, "{}", map.body);
    assert!(
        map.body["agents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["id"] == "deployer"),
        "{}",
        map.body
    );
    for path in [
        "/api/tasks?agent=deployer".to_owned(),
        format!("/api/tasks/{root}/tree"),
        "/api/dlq".to_owned(),
        format!("/api/thread?id={root}"),
        "/api/inbox".to_owned(),
    ] {
        let reply = http(&world, "GET", &path, Some(&admin), &[], None).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    }
    // The operator talks as their own agent; the answer comes back through the console.
    let said = post(
        &world,
        "/api/talk",
        &admin,
        &json!({"to": "worker", "mode": "send", "message": "from a person"}).to_string(),
    )
    .await;
    assert_eq!(said.status, 200, "{}", said.body);
    let got = switchboard_tests::wire::next(&worker_goal).await;
    assert_eq!(got.body, "from a person");
    assert_eq!(got.from_agent_id.as_str(), "people-admin");
    let heard = http(&world, "GET", "/api/talk", Some(&admin), &[], None).await;
    assert_eq!(heard.status, 200, "{}", heard.body);
    let done = post(&world, &format!("/api/tasks/{root}/cancel"), &admin, "{}").await;
    assert_eq!(done.status, 200, "{}", done.body);

    // What the console's user may not do, the server refuses.
    let (tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let raw = async_nats::ConnectOptions::new()
        .nkey(seed(permissions::CONSOLE_SEED_FILE))
        .custom_inbox_prefix(switchboard_proto::CONSOLE_INBOX_PREFIX)
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let async_nats::Event::ServerError(err) = event {
                    let _ = tx.send(err.to_string());
                }
            }
        })
        .connect(nats.url())
        .await
        .unwrap();
    for subject in [
        "_SB.audit.records",
        "agent.send.deployer",
        "agent.registry.register.deployer",
        "$JS.API.STREAM.DELETE.AGENT_INBOX",
        "$JS.API.STREAM.PURGE.AGENT_AUDIT",
    ] {
        raw.publish(subject, "{}".into()).await.unwrap();
        raw.flush().await.unwrap();
        violation(&mut errors, &format!("Publish to \"{subject}\"")).await;
    }
    let _sneak = raw.subscribe("_INBOX.>").await.unwrap();
    raw.flush().await.unwrap();
    violation(&mut errors, "Subscription to \"_INBOX.>\"").await;
    console.stop().await;
    drop(replicas);
}

/// Waits for the server to report a permission violation containing `wanted`.
async fn violation(errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>, wanted: &str) {
    let found = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(error) = errors.recv().await {
            if error.contains("Permissions Violation") && error.contains(wanted) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "no permission violation: {wanted}");
}
