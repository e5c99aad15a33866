//! `audit` binary: wiring only (see `switchboard_runtime::service::main`).

fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "audit",
        audit::config::SECTION,
        |client, runtime, config: audit::AuditConfig, shutdown| async move {
            audit::yield_cpu(config.nice);
            audit::run(&client, &runtime, config, shutdown).await
        },
    )
}
