//! The `console` binary as deployed: refusing bad configuration with exit code 64 before it
//! connects anywhere. (It serving pages is `tests/console.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::ServiceBinary;

const CONSOLE: ServiceBinary = ServiceBinary::new(env!("CARGO_BIN_EXE_console"), "console");

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    CONSOLE
        .refuses_bad_settings(&[
            ("SWITCHBOARD_CONSOLE__SESSION_TTL_MS", "0"),
            (
                "SWITCHBOARD_CONSOLE__TRACE_URL_TEMPLATE",
                "javascript:alert(1)/{trace_id}",
            ),
            ("SWITCHBOARD_CONSOLE__BOOTSTRAP_TOKEN_SHA256", "not-hex"),
            ("SWITCHBOARD_CONSOLE__LISTEN", "nowhere"),
        ])
        .await;
}
