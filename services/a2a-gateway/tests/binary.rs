//! The `a2a-gateway` binary as deployed: configured by environment, serving HTTP and its
//! micro service, refusing a caller without a token, stopping cleanly on SIGTERM, refusing bad
//! configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::ServiceBinary;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GATEWAY: ServiceBinary = ServiceBinary::new(env!("CARGO_BIN_EXE_a2a-gateway"), "a2a-gateway");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let listen = format!("127.0.0.1:{}", switchboard_testkit::free_port());
    let service = GATEWAY
        .start(&[("SWITCHBOARD_A2A_GATEWAY__LISTEN", listen.as_str())])
        .await;
    // No token and anonymous callers off by default: the JSON-RPC endpoint answers 401.
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"t"}}"#;
    let request = format!(
        "POST /agents/someone HTTP/1.1\r\nHost: {listen}\r\nContent-Type: application/json\r\n\
         A2A-Version: 1.0\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(&listen).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    service.stops_cleanly().await;
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    GATEWAY
        .refuses_bad_settings(&[
            ("SWITCHBOARD_A2A_GATEWAY__LISTEN", "nowhere"),
            ("SWITCHBOARD_A2A_GATEWAY__BLOCKING_TIMEOUT_MS", "0"),
            ("SWITCHBOARD_A2A_GATEWAY__MAX_BODY_BYTES", "10"),
            ("SWITCHBOARD_A2A_GATEWAY__PUBLIC_URL", "ftp://x"),
            ("SWITCHBOARD_A2A_GATEWAY__INLINE_FILE_BYTES", "70000"),
            ("SWITCHBOARD_A2A_GATEWAY__FILE_LINK_TTL_SECS", "1"),
        ])
        .await;
}
