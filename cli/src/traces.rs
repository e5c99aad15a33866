//! The CLI's own telemetry: each command one trace rooted at a `switchboard-cli` span.

/// `service.name` of what the CLI exports.
pub(crate) const CLI_SERVICE: &str = "switchboard-cli";

/// Telemetry for a CLI command: spans exported as `[telemetry]` in switchboard.toml or
/// `OTEL_EXPORTER_OTLP_ENDPOINT` say, logs only at `warn` (unless `RUST_LOG`), so a command's
/// output stays its own. `None` when it cannot start (the command runs without it).
pub(crate) fn cli_telemetry(
    name: &str,
    hosting: &[&str],
) -> Option<switchboard_runtime::telemetry::TelemetryGuard> {
    match switchboard_runtime::telemetry::init_hosting(name, hosting, &quiet_config()) {
        Ok(guard) => Some(guard),
        Err(err) => {
            eprintln!("switchboard: telemetry off: {err}");
            None
        }
    }
}

/// The `[telemetry]` settings (switchboard.toml, `SWITCHBOARD_TELEMETRY__*`, the `OTEL_*`
/// variables) for a process of the command line (a command, `switchboard mcp`): logs only at
/// `warn` unless `RUST_LOG` says otherwise (stdout and stderr are the command's), and no
/// `/metrics` listener of its own.
pub(crate) fn quiet_config() -> switchboard_runtime::config::TelemetryConfig {
    let mut config =
        switchboard_runtime::RuntimeConfig::load(&switchboard_runtime::config::figment())
            .map(|runtime| runtime.telemetry)
            .unwrap_or_default();
    config.log = "warn".to_owned();
    config.metrics_listen = None;
    config
}
