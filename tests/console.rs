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

/// One HTTP reply: status, headers, JSON body (`Null` when none).
struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

/// Sends a request the way a browser would (JSON body, the session cookie when given).
async fn http(
    world: &World,
    method: &str,
    path: &str,
    session: Option<&Session>,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Reply {
    switchboard_runtime::nats::install_crypto_provider();
    let client = reqwest::Client::new();
    let url = format!("{}{path}", world.url);
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

async fn sign_in(world: &World, token: &str) -> (Reply, Option<Session>) {
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
