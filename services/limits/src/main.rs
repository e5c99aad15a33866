//! `limits` binary: wiring only (see `switchboard_runtime::service::main`).

fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "limits",
        limits::config::SECTION,
        |client, runtime, config: limits::LimitsConfig, shutdown| async move {
            limits::run(&client, &runtime, config, shutdown).await
        },
    )
}
