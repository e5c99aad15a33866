//! `inbox-fanout` binary: wiring only (see `switchboard_runtime::service::main`).

fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "inbox-fanout",
        inbox_fanout::config::SECTION,
        |client, runtime, config: inbox_fanout::FanoutConfig, shutdown| async move {
            inbox_fanout::run(&client, &runtime, config, shutdown).await
        },
    )
}
