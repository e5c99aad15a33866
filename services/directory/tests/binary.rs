//! The `directory` binary as deployed: configured by environment, serving, stopping cleanly on
//! SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::{NatsCluster, NatsServer, ServiceBinary};

const DIRECTORY: ServiceBinary = ServiceBinary::new(env!("CARGO_BIN_EXE_directory"), "directory");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let body = DIRECTORY
        .answer_then_stop(
            &[("SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT_MS", "5000")],
            "agent.registry.register.bin-agent",
            "{}",
        )
        .await;
    assert_eq!(body["agent_id"], "bin-agent");
}

/// Runs `directory health` against `url` with the given id file; (exit code, output).
async fn health(url: &str, id_file: &std::path::Path) -> (Option<i32>, String) {
    let output = tokio::process::Command::new(DIRECTORY.bin())
        .arg("health")
        .env("SWITCHBOARD_NATS__URLS", format!("[{url}]"))
        .env("SWITCHBOARD_HEALTH_ID_FILE", id_file)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

#[tokio::test]
async fn the_health_command_checks_this_very_instance() {
    let nats = NatsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let id_file = dir.path().join("directory.id");
    let (code, text) = health(&nats.url(), &id_file).await;
    assert_eq!(code, Some(1), "nothing started yet: {text}");
    assert!(text.contains("not started"), "{text}");
    let service = DIRECTORY
        .start_on(
            &nats.url(),
            &[("SWITCHBOARD_HEALTH_ID_FILE", id_file.to_str().unwrap())],
        )
        .await;
    let (code, text) = health(&nats.url(), &id_file).await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("healthy"), "{text}");
    // A stopped instance is unhealthy (even while another replica would answer PING).
    let _other = DIRECTORY.start_on(&nats.url(), &[]).await;
    // (`terminate` would wait for nobody to answer PING; the other replica does.)
    let status = service.signal("TERM").await;
    assert!(status.success());
    let (code, text) = health(&nats.url(), &id_file).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("$SRV.PING.directory."), "{text}");
    let (code, text) = health("nats://127.0.0.1:1", &id_file).await;
    assert_eq!(code, Some(1), "{text}");
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    DIRECTORY
        .refuses_bad_settings(&[
            ("SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT", "5"),
            ("SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT_MS", "soon"),
        ])
        .await;
}

/// `jetstream.replicas` is checked against what the server can place at start-up: more than 1
/// on a single server, or more than the cluster's servers, exits 64 naming the setting. (The
/// cluster tests run R3 on three nodes.)
#[tokio::test]
async fn replicas_beyond_the_cluster_size_exit_64_naming_the_setting() {
    let single = NatsServer::start().await;
    let (code, stderr) = DIRECTORY
        .run_to_exit(&single.url(), &[("SWITCHBOARD_JETSTREAM__REPLICAS", "3")])
        .await;
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("jetstream.replicas is 3")
            && stderr.contains("not part of a JetStream cluster"),
        "{stderr}"
    );
    assert!(
        stderr.lines().next().unwrap().starts_with("directory: "),
        "{stderr}"
    );

    let cluster = NatsCluster::start(3).await;
    let (code, stderr) = DIRECTORY
        .run_to_exit(&cluster.url(0), &[("SWITCHBOARD_JETSTREAM__REPLICAS", "5")])
        .await;
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("jetstream.replicas is 5") && stderr.contains("cannot place 5"),
        "{stderr}"
    );
    // Nothing was created with the wrong replica count.
    let js = async_nats::jetstream::new(cluster.client(0).await);
    assert!(js.get_stream("AGENT_INBOX").await.is_err());

    // The right count starts and serves.
    let service = DIRECTORY
        .start_on(&cluster.url(1), &[("SWITCHBOARD_JETSTREAM__REPLICAS", "3")])
        .await;
    let mut inbox = js.get_stream("AGENT_INBOX").await.unwrap();
    let info = inbox.info().await.unwrap();
    assert_eq!(info.config.num_replicas, 3);
    assert_eq!(info.cluster.as_ref().unwrap().replicas.len(), 2);
    assert!(service.terminate().await.success());
}

/// SIGTERM while the service is still retrying its first connection (no server yet, as under
/// compose or Kubernetes) stops it cleanly instead of leaving it retrying.
#[tokio::test]
async fn sigterm_while_the_first_connect_is_retried_exits_cleanly() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new(DIRECTORY.bin())
        .env_remove("SWITCHBOARD_CONFIG")
        .env(
            "SWITCHBOARD_NATS__URLS",
            format!("[nats://127.0.0.1:{port}]"),
        )
        .env("SWITCHBOARD_NATS__RETRY_ON_INITIAL_CONNECT", "true")
        .env("SWITCHBOARD_SHUTDOWN_GRACE_MS", "1000")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // A real wait: it must still be retrying, not exited, after a while.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(child.try_wait().unwrap().is_none(), "it keeps retrying");
    let pid = child.id().unwrap().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait())
        .await
        .expect("still retrying 10 s after SIGTERM")
        .unwrap();
    assert!(status.success(), "clean exit, got {status:?}");
}

/// Issue 26, items 9 and 10: a service started before NATS listens waits for it, saying so,
/// for `nats.wait_for_server_ms`, then exits 1; its log lines have no colour codes when stderr
/// is not a terminal, and are one JSON object each with `log_format = "json"`.
#[tokio::test]
async fn a_missing_nats_is_waited_for_then_reported_in_plain_or_json_lines() {
    let nowhere = format!("nats://127.0.0.1:{}", switchboard_testkit::free_port());
    let started = std::time::Instant::now();
    let (code, text) = DIRECTORY
        .run_to_exit(
            &nowhere,
            &[("SWITCHBOARD_NATS__WAIT_FOR_SERVER_MS", "1500")],
        )
        .await;
    assert_eq!(code, Some(1), "{text}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(1500));
    assert!(text.contains("nats not reachable yet"), "{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a pipe: {text:?}");

    let (code, text) = DIRECTORY
        .run_to_exit(
            &nowhere,
            &[
                ("SWITCHBOARD_NATS__WAIT_FOR_SERVER_MS", "600"),
                ("SWITCHBOARD_TELEMETRY__LOG_FORMAT", "json"),
            ],
        )
        .await;
    assert_eq!(code, Some(1), "{text}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: {line}")))
        .collect();
    assert!(
        lines.iter().any(|line| line["fields"]["message"]
            == "nats not reachable yet; trying again"
            && line["level"] == "WARN"),
        "{text}"
    );
}
