//! `inbox-fanout` binary: wiring only (config → telemetry → connect → run → flush).

use std::process::ExitCode;

use inbox_fanout::{FanoutConfig, config::SECTION};
use switchboard_runtime::{RuntimeConfig, config, nats, shutdown, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let figment = config::figment();
    let (runtime, service) = match (
        RuntimeConfig::load(&figment),
        config::section::<FanoutConfig>(&figment, SECTION),
    ) {
        (Ok(runtime), Ok(service)) => (runtime, service),
        (Err(err), _) | (_, Err(err)) => {
            eprintln!("inbox-fanout: {err}");
            return ExitCode::from(64);
        }
    };
    let telemetry = match telemetry::init("inbox-fanout", &runtime.telemetry) {
        Ok(guard) => guard,
        Err(err) => {
            eprintln!("inbox-fanout: {err}");
            return ExitCode::from(64);
        }
    };
    let code = match serve(&runtime, service).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %err, "inbox-fanout failed");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown();
    code
}

async fn serve(runtime: &RuntimeConfig, service: FanoutConfig) -> anyhow::Result<()> {
    let client = nats::connect(&runtime.nats, "inbox-fanout").await?;
    inbox_fanout::run(&client, runtime, service, shutdown::on_signal()).await?;
    client.drain().await?;
    Ok(())
}
