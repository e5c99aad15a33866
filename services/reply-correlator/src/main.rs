//! `reply-correlator` binary: wiring only (see `switchboard_runtime::service::main`).

fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "reply-correlator",
        reply_correlator::config::SECTION,
        |client, runtime, config: reply_correlator::CorrelatorConfig, shutdown| async move {
            reply_correlator::run(&client, &runtime, config, shutdown).await
        },
    )
}
