//! The `switchboard` command; everything it does is in the library (`lib.rs`, the commands in
//! `cmd/`).

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    switchboard::run().await
}
