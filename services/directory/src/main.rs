//! `directory` binary: wiring only (see `switchboard_runtime::service::main`).

fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "directory",
        directory::config::SECTION,
        |client, runtime, config: directory::DirectoryConfig, shutdown| async move {
            directory::run(&client, &runtime, config, shutdown).await
        },
    )
}
