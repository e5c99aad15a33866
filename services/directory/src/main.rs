//! `directory` binary: wiring only (config → telemetry → connect → run → flush).

use std::process::ExitCode;

use directory::{DirectoryConfig, config::SECTION};
use switchboard_runtime::{RuntimeConfig, config, nats, shutdown, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let figment = config::figment();
    let (runtime, service) = match (
        RuntimeConfig::load(&figment),
        config::section::<DirectoryConfig>(&figment, SECTION),
    ) {
        (Ok(runtime), Ok(service)) => (runtime, service),
        (Err(err), _) | (_, Err(err)) => {
            eprintln!("directory: {err}");
            return ExitCode::from(64);
        }
    };
    let telemetry = match telemetry::init("directory", &runtime.telemetry) {
        Ok(guard) => guard,
        Err(err) => {
            eprintln!("directory: {err}");
            return ExitCode::from(64);
        }
    };
    let code = match serve(&runtime, service).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %err, "directory failed");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown();
    code
}

async fn serve(runtime: &RuntimeConfig, service: DirectoryConfig) -> anyhow::Result<()> {
    let client = nats::connect(&runtime.nats, "directory").await?;
    directory::run(&client, runtime, service, shutdown::on_signal()).await?;
    client.drain().await?;
    Ok(())
}
