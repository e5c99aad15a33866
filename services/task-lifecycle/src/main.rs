//! `task-lifecycle` binary: wiring only (see `switchboard_runtime::service::main`).

fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "task-lifecycle",
        task_lifecycle::config::SECTION,
        |client, runtime, config: task_lifecycle::TaskConfig, shutdown| async move {
            task_lifecycle::run(&client, &runtime, config, shutdown).await
        },
    )
}
