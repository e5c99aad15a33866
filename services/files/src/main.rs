//! `files` binary: wiring only (see `switchboard_runtime::service::main`).

fn main() -> std::process::ExitCode {
    switchboard_runtime::service::main(
        "files",
        files::config::SECTION,
        |client, runtime, config: files::FilesConfig, shutdown| async move {
            files::run(&client, &runtime, config, shutdown).await
        },
    )
}
