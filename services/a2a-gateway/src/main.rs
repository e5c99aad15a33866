//! `a2a-gateway` binary: wiring only (see `switchboard_runtime::service::main`).

fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "a2a-gateway",
        a2a_gateway::config::SECTION,
        |client, runtime, config: a2a_gateway::GatewayConfig, shutdown| async move {
            a2a_gateway::run(&client, &runtime, config, shutdown).await
        },
    )
}
