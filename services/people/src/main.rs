//! `people` binary: wiring only (see `switchboard_runtime::service::main`).

fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "people",
        people::config::SECTION,
        |client, runtime, config: people::PeopleConfig, shutdown| async move {
            people::run(&client, &runtime, config, shutdown).await
        },
    )
}
