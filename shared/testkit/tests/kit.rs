//! Tests of the test kit against real nats-server processes.

use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage, stream};
use futures::StreamExt as _;
use switchboard_testkit::{NatsCluster, NatsServer, assert_eventually, eventually};

const WAIT: Duration = Duration::from_secs(10);

fn stream_config(name: &str, subjects: &str, replicas: usize) -> stream::Config {
    stream::Config {
        name: name.to_owned(),
        subjects: vec![subjects.to_owned()],
        num_replicas: replicas,
        ..Default::default()
    }
}

/// The payload of message `seq` of `stream`, if it can be read right now.
async fn read_message(js: &jetstream::Context, stream: &str, seq: u64) -> Option<String> {
    let stream = js.get_stream(stream).await.ok()?;
    let msg = stream.get_raw_message(seq).await.ok()?;
    Some(String::from_utf8_lossy(&msg.payload).into_owned())
}

#[tokio::test]
async fn publish_subscribe_round_trip() {
    let server = NatsServer::start().await;
    assert_eq!(server.url(), format!("nats://127.0.0.1:{}", server.port()));
    assert!(server.port() > 0);

    let client = server.client().await;
    let mut sub = client.subscribe("kit.greet").await.unwrap();
    client.flush().await.unwrap();
    client.publish("kit.greet", "hello".into()).await.unwrap();
    let msg = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("no message within the timeout")
        .expect("subscription ended");
    assert_eq!(msg.subject.as_str(), "kit.greet");
    assert_eq!(&msg.payload[..], b"hello");
}

#[tokio::test]
async fn jetstream_message_survives_restart_on_same_port() {
    let mut server = NatsServer::start().await;
    let port = server.port();
    let js = jetstream::new(server.client().await);
    js.create_stream(stream_config("KIT", "kit.>", 1))
        .await
        .unwrap();
    let ack = js
        .publish("kit.one", "persisted".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(ack.sequence, 1);
    let pid_before = server.pid().expect("running");

    server.restart().await;

    assert_eq!(server.port(), port, "restart must keep the port");
    assert_ne!(
        server.pid(),
        Some(pid_before),
        "restart must start a new process"
    );
    assert!(server.store_dir().join("jetstream").is_dir());
    let js = jetstream::new(server.client().await);
    let stream = js.get_stream("KIT").await.unwrap();
    let msg = stream.get_raw_message(1).await.unwrap();
    assert_eq!(msg.subject.as_str(), "kit.one");
    assert_eq!(&msg.payload[..], b"persisted");
}

#[tokio::test]
async fn stop_and_start_again_are_idempotent() {
    let mut server = NatsServer::start().await;
    let port = server.port();
    server.stop().await;
    server.stop().await;
    assert!(server.pid().is_none());
    assert!(async_nats::connect(server.url()).await.is_err());
    server.start_again().await;
    let pid = server.pid();
    server.start_again().await;
    assert_eq!(
        server.pid(),
        pid,
        "start_again on a running server is a no-op"
    );
    assert_eq!(server.port(), port);
    jetstream::new(server.client().await)
        .query_account()
        .await
        .unwrap();
}

#[tokio::test]
async fn drop_kills_the_process() {
    let server = NatsServer::start().await;
    let url = server.url();
    let pid = server.pid().expect("running");
    let store = server.store_dir().to_owned();
    // A connected client must not keep the server alive.
    let client = server.client().await;
    drop(server);

    #[cfg(target_os = "linux")]
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "nats-server pid {pid} still exists after drop"
    );
    let _ = pid;
    assert!(!store.exists(), "temp store dir not removed on drop");
    assert!(
        async_nats::connect(&url).await.is_err(),
        "connecting to {url} still works after drop"
    );
    drop(client);
}

#[tokio::test]
async fn many_servers_in_parallel() {
    let servers = futures::future::join_all((0..4).map(|_| NatsServer::start())).await;
    let mut ports: Vec<u16> = servers.iter().map(NatsServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len(), "ports must be distinct");
    for server in &servers {
        jetstream::new(server.client().await)
            .query_account()
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn cluster_of_three_survives_a_node_restart() {
    let mut cluster = NatsCluster::start(3).await;
    assert_eq!(cluster.len(), 3);
    assert!(!cluster.is_empty());
    assert_eq!(cluster.urls().len(), 3);
    assert_eq!(cluster.urls()[1], cluster.url(1));

    let js0 = jetstream::new(cluster.client(0).await);
    let js2 = jetstream::new(cluster.client(2).await);
    let info = switchboard_testkit::create_stream(&js0, stream_config("KITR3", "kitr3.>", 3))
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .clone();
    assert_eq!(info.config.num_replicas, 3);

    let ack = js2
        .send_publish(
            "kitr3.a",
            PublishMessage::build()
                .payload("first".into())
                .message_id("m1"),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(ack.sequence, 1);

    cluster.stop_node(1).await;

    // Node 1 may have led the stream: retry until a new leader takes the
    // publish. The message id makes retries idempotent.
    assert_eventually!(
        Duration::from_secs(20),
        async {
            match js2
                .send_publish(
                    "kitr3.b",
                    PublishMessage::build()
                        .payload("second".into())
                        .message_id("m2"),
                )
                .await
            {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            }
        },
        "publish via node 2 never succeeded with node 1 down"
    );
    assert_eventually!(
        Duration::from_secs(20),
        async {
            read_message(&js0, "KITR3", 1).await.as_deref() == Some("first")
                && read_message(&js0, "KITR3", 2).await.as_deref() == Some("second")
        },
        "could not read both messages through node 0"
    );
    let state = js0
        .get_stream("KITR3")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .clone();
    assert_eq!(state.messages, 2, "retries must not duplicate messages");

    cluster.start_node(1).await;
    let js1 = jetstream::new(cluster.client(1).await);
    js1.query_account().await.unwrap();
    assert_eventually!(
        Duration::from_secs(20),
        async { read_message(&js1, "KITR3", 2).await.as_deref() == Some("second") },
        "node 1 cannot read the stream after rejoining"
    );
}

#[tokio::test]
async fn eventually_polls_until_true() {
    let mut calls = 0;
    let ok = eventually(Duration::from_secs(5), || {
        calls += 1;
        let done = calls >= 3;
        async move { done }
    })
    .await;
    assert!(ok);
    assert_eq!(calls, 3);
}

#[tokio::test]
async fn eventually_gives_up_after_timeout() {
    let start = std::time::Instant::now();
    assert!(!eventually(Duration::from_millis(100), || async { false }).await);
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(100),
        "gave up too early: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "gave up too late: {elapsed:?}"
    );
}

#[tokio::test]
async fn eventually_bounds_a_hanging_condition() {
    let start = std::time::Instant::now();
    let ok = eventually(Duration::from_millis(100), || {
        futures::future::pending::<bool>()
    })
    .await;
    assert!(!ok);
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn assert_eventually_passes_when_condition_becomes_true() {
    let start = std::time::Instant::now();
    assert_eventually!(
        Duration::from_secs(5),
        async { start.elapsed() > Duration::from_millis(50) },
        "never became true"
    );
    assert_eventually!(Duration::from_secs(1), async { true });
}

#[tokio::test]
#[should_panic(expected = "assert_eventually failed after 100ms: answer was not 42")]
async fn assert_eventually_panics_with_message() {
    let answer = 41;
    assert_eventually!(
        Duration::from_millis(100),
        async { answer == 42 },
        "answer was not {}",
        42
    );
}

#[test]
fn nats_server_bin_is_found() {
    let bin = switchboard_testkit::nats_server_bin();
    assert!(bin.is_file(), "{} is not a file", bin.display());
}

#[tokio::test]
async fn a_service_process_that_exits_fails_its_start_with_the_exit_status() {
    // Not after the 30 s readiness wait: at once, saying it exited.
    let nats = NatsServer::start().await;
    let url = nats.url();
    let start = tokio::spawn(async move {
        switchboard_testkit::process::ServiceProcess::start("/bin/false", "none", &url, &[]).await
    });
    let failed = tokio::time::timeout(Duration::from_secs(10), start)
        .await
        .expect("the start did not fail at once")
        .expect_err("a process that exits is not a started service");
    let panic = failed.into_panic();
    let message = panic.downcast_ref::<String>().expect("a panic message");
    assert!(message.contains("exited"), "{message}");
}
