//! The A2A gateway's test fixture: the fabric, an `echo` agent working every task it gets
//! (`slow` takes 1.5 s), a `sleeper` agent that never takes its tasks, a gateway with two
//! clients, and JSON-RPC / SSE requests to it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use a2a_gateway::config::{ClientToken, GatewayConfig};
use serde_json::{Value, json};
use switchboard_client::TaskOutcome;
use switchboard_runtime::CancellationToken;
use switchboard_testkit::free_port;

use crate::http::{self, SseStream};
use crate::{Fabric, Handle, Replica, Service, runtime};

pub const TOKEN: &str = "planner-token";
pub const OTHER_TOKEN: &str = "other-token";

fn gateway_config(port: u16) -> GatewayConfig {
    GatewayConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        clients: vec![
            ClientToken {
                name: "planner".into(),
                sha256: a2a_gateway::serve::auth::sha256_hex(TOKEN.as_bytes()),
            },
            ClientToken {
                name: "other".into(),
                sha256: a2a_gateway::serve::auth::sha256_hex(OTHER_TOKEN.as_bytes()),
            },
        ],
        blocking_timeout_ms: 20_000,
        // The tests' webhooks listen on loopback.
        push_allow_private: true,
        ..Default::default()
    }
}

/// The fabric, an `echo` agent working every task it gets (`slow` takes 1.5 s), a `sleeper`
/// agent that never takes its tasks, and a gateway.
pub struct A2a {
    pub fabric: Fabric,
    pub port: u16,
    gateway: Option<Replica>,
    config: GatewayConfig,
    stop: CancellationToken,
}

impl A2a {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// As [`A2a::start`], with the gateway's settings changed by `settings` (lower limits).
    pub async fn start_with(settings: impl FnOnce(&mut GatewayConfig)) -> Self {
        let fabric = Fabric::start().await;
        let (echo, goal) = fabric.agent_with_goal("echo").await;
        let _sleeper = fabric.agent_with_goal("sleeper").await;
        let stop = CancellationToken::new();
        let serving = stop.clone();
        let echo = Arc::new(echo);
        tokio::spawn(async move {
            let _ = echo
                .serve_tasks(&goal, serving, None, |task| async move {
                    if task.message == "slow" {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                    }
                    Ok(TaskOutcome::text(format!("echo: {}", task.message)))
                })
                .await;
        });
        // The sleeper's agent stays registered, with a goal, and reads nothing.
        std::mem::forget(_sleeper);
        let port = free_port();
        let mut config = gateway_config(port);
        settings(&mut config);
        let mut a2a = Self {
            fabric,
            port,
            gateway: None,
            config,
            stop,
        };
        a2a.start_gateway().await;
        a2a
    }

    async fn start_gateway(&mut self) {
        let (replica, Handle::Listening(address)) = Service::Gateway(self.config.clone())
            .start_with_handle(&runtime(&self.fabric.url()))
            .await
        else {
            panic!("the gateway reports its address");
        };
        assert_eq!(address.port(), self.port);
        self.gateway = Some(replica);
    }

    pub async fn restart_gateway(&mut self) {
        if let Some(gateway) = self.gateway.take() {
            gateway.stop().await;
        }
        self.start_gateway().await;
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub async fn rpc_as(&self, token: &str, agent: &str, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
        let auth = format!("Bearer {token}");
        let response = http::request(
            self.addr(),
            "POST",
            &format!("/agents/{agent}"),
            &[
                ("Content-Type", "application/json"),
                ("A2A-Version", "1.0"),
                ("Authorization", &auth),
            ],
            body.to_string().as_bytes(),
        )
        .await;
        assert_eq!(
            response.status,
            200,
            "{}",
            String::from_utf8_lossy(&response.body)
        );
        let reply = response.json();
        assert_eq!(reply["jsonrpc"], "2.0");
        assert_eq!(reply["id"], 7);
        reply
    }

    pub async fn rpc(&self, agent: &str, method: &str, params: Value) -> Value {
        self.rpc_as(TOKEN, agent, method, params).await
    }

    /// A stream from the `echo` agent's endpoint.
    pub async fn stream(&self, method: &str, params: Value, last_event: Option<&str>) -> SseStream {
        self.stream_to("echo", method, params, last_event).await
    }

    /// A stream from `agent`'s endpoint (`Last-Event-ID` when given).
    pub async fn stream_to(
        &self,
        agent: &str,
        method: &str,
        params: Value,
        last_event: Option<&str>,
    ) -> SseStream {
        let body = json!({"jsonrpc": "2.0", "id": "s", "method": method, "params": params});
        let auth = format!("Bearer {TOKEN}");
        let mut headers = vec![
            ("Content-Type", "application/json"),
            ("A2A-Version", "1.0"),
            ("Authorization", auth.as_str()),
            ("Accept", "text/event-stream"),
        ];
        if let Some(seen) = last_event {
            headers.push(("Last-Event-ID", seen));
        }
        let stream = SseStream::open(
            self.addr(),
            &format!("/agents/{agent}"),
            &headers,
            body.to_string().as_bytes(),
        )
        .await;
        assert_eq!(stream.status, 200);
        stream
    }
}

impl A2a {
    /// An `asker` agent working one task: it accepts, starts, asks its requester "which
    /// language?", waits for the answer (a message in reply to the task), resumes and
    /// completes with `in <answer>`.
    pub async fn spawn_asker(&self) -> tokio::task::JoinHandle<()> {
        use switchboard_proto::MessageKind;
        use switchboard_proto::task::{TaskAction, TaskOp};

        let (asker, goal) = self.fabric.agent_with_goal("asker").await;
        let asker = Arc::new(asker);
        tokio::spawn(async move {
            let next = |kind: MessageKind| {
                let goal = &goal;
                async move {
                    loop {
                        let delivery = goal.recv(Duration::from_secs(20)).await.unwrap().unwrap();
                        let message = delivery.ack().await.unwrap();
                        if message.kind == kind {
                            return message;
                        }
                    }
                }
            };
            let task = next(MessageKind::Task).await;
            let task_id = task.task.as_ref().unwrap().id;
            asker
                .task_op(
                    TaskOp::Accept,
                    TaskAction {
                        task_id: Some(task_id),
                        from_goal_id: Some(goal.id()),
                        ..TaskAction::default()
                    },
                )
                .await
                .unwrap();
            asker.start_task(task_id).await.unwrap();
            asker
                .ask_requester(task_id, "which language?")
                .await
                .unwrap();
            let answer = next(MessageKind::Message).await;
            assert_eq!(
                answer.in_reply_to, task.id,
                "the answer replies to the task"
            );
            asker.start_task(task_id).await.unwrap();
            asker
                .complete_task(task_id, TaskOutcome::text(format!("in {}", answer.body)))
                .await
                .unwrap();
        })
    }

    /// Runs tests/python/a2a_client.py (the official A2A Python SDK) against this gateway with
    /// `args`; its one JSON line.
    pub async fn run_sdk(&self, args: &[&str]) -> Value {
        self.run_python("a2a_client.py", args).await
    }

    /// Runs `tests/python/<script>` against this gateway with `args`; its one JSON line.
    async fn run_python(&self, script: &str, args: &[&str]) -> Value {
        let script = switchboard_testkit::workspace_root()
            .join("tests/python")
            .join(script);
        let stdout = switchboard_testkit::stdout_of(
            tokio::process::Command::new(switchboard_testkit::python_bin())
                .arg(script)
                .args(["--base", &format!("http://127.0.0.1:{}", self.port)])
                .args(["--token", TOKEN])
                .args(args),
            Duration::from_secs(120),
            &format!("the a2a-sdk client {args:?}"),
        )
        .await;
        serde_json::from_str(stdout.trim()).unwrap()
    }
}

impl A2a {
    /// A `caller` agent that takes A2A messages as calls (its card's `a2a_messages: "call"`)
    /// and chooses per message:
    /// - `stream`: a streamed answer, `one `, `two `, then `three`;
    /// - `task …`: asks for a task (the data part `{"switchboard": "task"}`), then completes
    ///   it with `task: <message>` and the message's parts;
    /// - `task progress`: as `task …`, reporting progress with the part `chunk-1 ` first;
    /// - `ask twice`: asks for a task, asks its requester `first?` and `second?`, and completes
    ///   with `done: <answer 1>, <answer 2>`;
    /// - anything else: answers `answer: <text>` with the message's parts.
    pub async fn spawn_caller(&self) -> tokio::task::JoinHandle<()> {
        use a2a_gateway::serve::messages::{AS_CALLS, MESSAGES_KEY, TASK_MARKER, TASK_MARKER_KEY};
        use switchboard_proto::MessageKind;
        use switchboard_proto::task::{TaskAction, TaskOp};

        let mut card = crate::card("caller");
        card.metadata.insert(MESSAGES_KEY.into(), AS_CALLS.into());
        let caller = crate::agent_with(&self.fabric.url(), card, Duration::from_secs(3600)).await;
        let goal = caller.open_goal().await.unwrap();
        tokio::spawn(async move {
            let next = || async {
                let delivery = goal.recv(Duration::from_secs(3600)).await.unwrap().unwrap();
                delivery.ack().await.unwrap()
            };
            loop {
                let message = next().await;
                match message.kind {
                    MessageKind::Request => {
                        let call = message.correlation_id.unwrap();
                        if message.body == "stream" {
                            caller.reply_part(call, 1, "one ").await.unwrap();
                            caller.reply_part(call, 2, "two ").await.unwrap();
                            caller.reply(call, "three").await.unwrap();
                        } else if message.body.starts_with("task")
                            || message.body.starts_with("ask ")
                        {
                            let marker = switchboard_proto::Part::Data {
                                data: json!({ TASK_MARKER_KEY: TASK_MARKER }),
                            };
                            caller
                                .reply_with_parts(call, "a task", vec![marker])
                                .await
                                .unwrap();
                        } else {
                            let answer = format!("answer: {}", message.body);
                            caller
                                .reply_with_parts(call, &answer, message.parts)
                                .await
                                .unwrap();
                        }
                    }
                    MessageKind::Task => {
                        let task_id = message.task.as_ref().unwrap().id;
                        caller
                            .task_op(
                                TaskOp::Accept,
                                TaskAction {
                                    task_id: Some(task_id),
                                    from_goal_id: Some(goal.id()),
                                    ..TaskAction::default()
                                },
                            )
                            .await
                            .unwrap();
                        caller.start_task(task_id).await.unwrap();
                        if message.body == "task progress" {
                            let chunk = switchboard_proto::Part::Text {
                                text: "chunk-1 ".to_owned(),
                            };
                            let progress = TaskAction {
                                task_id: Some(task_id),
                                parts: vec![chunk],
                                ..TaskAction::default()
                            };
                            caller.task_op(TaskOp::Progress, progress).await.unwrap();
                        }
                        let questions: Vec<String> = match message.body.as_str() {
                            "ask twice" => vec!["first?".into(), "second?".into()],
                            body => body
                                .strip_prefix("ask ")
                                .and_then(|count| count.parse::<usize>().ok())
                                .map(|count| (1..=count).map(|n| format!("q{n}?")).collect())
                                .unwrap_or_default(),
                        };
                        let outcome = if !questions.is_empty() {
                            let mut answers = Vec::new();
                            for question in &questions {
                                caller.ask_requester(task_id, question).await.unwrap();
                                let answer = loop {
                                    let answer = next().await;
                                    if answer.kind == MessageKind::Message {
                                        break answer;
                                    }
                                };
                                answers.push(answer.body);
                                caller.start_task(task_id).await.unwrap();
                            }
                            TaskOutcome::text(format!("done: {}", answers.join(", ")))
                        } else {
                            TaskOutcome {
                                result: format!("task: {}", message.body),
                                parts: message.parts,
                                attachments: Vec::new(),
                            }
                        };
                        caller.complete_task(task_id, outcome).await.unwrap();
                    }
                    _ => {}
                }
            }
        })
    }

    /// Runs tests/python/a2a_conformance.py (the official A2A Python SDK) against the
    /// `caller` agent over `binding` (`JSONRPC` or `HTTP+JSON`); its one JSON line.
    pub async fn run_conformance(&self, binding: &str) -> Value {
        self.run_python("a2a_conformance.py", &["--binding", binding])
            .await
    }
}

impl Drop for A2a {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub fn message(text: &str, context: Option<&str>) -> Value {
    let mut message = json!({
        "messageId": uuid::Uuid::now_v7().to_string(),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    });
    if let Some(context) = context {
        message["contextId"] = json!(context);
    }
    message
}

pub fn state(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or("")
}

/// The official SDK's reference agent (tests/python/a2a_echo_server.py: echo, `slow`,
/// `ask: …`, `fail`, `trace`) on a port of its own; killed when dropped.
pub struct PythonAgent {
    child: tokio::process::Child,
    pub port: u16,
    tls: bool,
}

impl PythonAgent {
    /// Starts it on a free port and waits (at most 30 s) until it accepts connections.
    pub async fn start() -> Self {
        Self::start_on(free_port()).await
    }

    /// Starts it on `port` (again, after [`PythonAgent::stop`]).
    pub async fn start_on(port: u16) -> Self {
        Self::spawn(port, None).await
    }

    /// Starts it serving https with a CA of its own, written to `dir/ca.pem`.
    pub async fn start_tls(dir: &std::path::Path) -> Self {
        Self::spawn(free_port(), Some(dir)).await
    }

    async fn spawn(port: u16, tls: Option<&std::path::Path>) -> Self {
        let mut command = tokio::process::Command::new(switchboard_testkit::python_bin());
        command
            .arg(switchboard_testkit::workspace_root().join("tests/python/a2a_echo_server.py"))
            .args(["--port", &port.to_string()]);
        if let Some(dir) = tls {
            command.arg("--tls").arg(dir);
        }
        let child = command
            .kill_on_drop(true)
            .spawn()
            .expect("cannot start tests/python/a2a_echo_server.py");
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let ready = switchboard_testkit::eventually(Duration::from_secs(30), || async move {
            tokio::net::TcpStream::connect(address).await.is_ok()
        })
        .await;
        assert!(ready, "the a2a-sdk reference agent did not start on {port}");
        Self {
            child,
            port,
            tls: tls.is_some(),
        }
    }

    /// Its card's URL.
    pub fn card_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!(
            "{scheme}://127.0.0.1:{}/.well-known/agent-card.json",
            self.port
        )
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Kills it and waits for the exit.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
