//! `console` binary: wiring only (see `switchboard_runtime::service::main`).

fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "console",
        console::config::SECTION,
        |client, runtime, config: console::ConsoleConfig, shutdown| async move {
            console::run(&client, &runtime, config, shutdown).await
        },
    )
}
