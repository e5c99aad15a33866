//! `nats::connect` against real servers: plain, user/password, wrong credentials, bad config.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_runtime::config::{NatsConfig, Secret};
use switchboard_runtime::nats::{ConnectError, connect};
use switchboard_testkit::NatsServer;

fn config(url: &str) -> NatsConfig {
    NatsConfig {
        urls: vec![url.to_owned()],
        ..NatsConfig::default()
    }
}

#[tokio::test]
async fn connects_named_and_with_credentials() {
    let open = NatsServer::start().await;
    let client = connect(&config(&open.url()), "svc-open").await.unwrap();
    client.flush().await.unwrap();
    assert_eq!(
        client.server_info().port,
        open.port(),
        "connected to the configured server"
    );

    let locked = NatsServer::start_with_user("svc", "s3cret").await;
    let mut with_user = config(&locked.url());
    with_user.user = Some("svc".into());
    with_user.password = Some(Secret::new("s3cret"));
    let client = connect(&with_user, "svc-auth").await.unwrap();
    let reply_inbox = client.new_inbox();
    let mut sub = client.subscribe(reply_inbox.clone()).await.unwrap();
    client.publish(reply_inbox, "hi".into()).await.unwrap();
    let got = futures::StreamExt::next(&mut sub).await.unwrap();
    assert_eq!(got.payload, "hi");

    let mut wrong = with_user.clone();
    wrong.password = Some(Secret::new("nope"));
    assert!(matches!(
        connect(&wrong, "svc-wrong").await,
        Err(ConnectError::Connect { .. })
    ));
    let mut none = config(&locked.url());
    none.connect_timeout_ms = 1_000;
    assert!(connect(&none, "svc-none").await.is_err());
}

#[tokio::test]
async fn refuses_incomplete_configuration() {
    let mut half = config("nats://127.0.0.1:1");
    half.user = Some("svc".into());
    assert!(matches!(
        connect(&half, "x").await,
        Err(ConnectError::HalfCredentials)
    ));
    let mut empty = config("nats://127.0.0.1:1");
    empty.urls.clear();
    assert!(matches!(
        connect(&empty, "x").await,
        Err(ConnectError::NoUrls)
    ));
    let mut creds = config("nats://127.0.0.1:1");
    creds.creds_file = Some("/nonexistent/agent.creds".into());
    let err = connect(&creds, "x").await.unwrap_err();
    assert!(matches!(err, ConnectError::CredsFile { .. }), "{err}");
}
