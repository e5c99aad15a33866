//! `audit` binary: wiring only (see `switchboard_runtime::service::main`).

#[tokio::main]
async fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "audit",
        audit::config::SECTION,
        |client, runtime, config: audit::AuditConfig, shutdown| async move {
            audit::run(&client, &runtime, config, shutdown).await
        },
    )
    .await
}
