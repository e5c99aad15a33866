//! `switchboard up`: the embedded default.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use a2a_gateway::GatewayConfig;
use audit::AuditConfig;
use clap::Args;
use directory::DirectoryConfig;
use inbox_fanout::FanoutConfig;
use people::PeopleConfig;
use reply_correlator::CorrelatorConfig;
use switchboard_runtime::{RuntimeConfig, config, nats, shutdown, telemetry};
use task_lifecycle::TaskConfig;

use crate::embedded::EmbeddedNats;

/// Run every service in this process (and a local nats-server unless --nats-url is given).
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  switchboard up\n  switchboard up --port 4333 --data-dir /tmp/sb\n  switchboard up --nats-url nats://10.0.0.5:4222"
)]
pub struct UpArgs {
    // Not `super::args::Connection`: without the flag `up` starts its own server, and
    // `NATS_URL` is not read.
    /// Use this NATS (with JetStream) instead of starting a local nats-server; a
    /// comma-separated list is a cluster's servers (`nats://a:4222,nats://b:4222`), failed
    /// over between. Without it, `nats.urls` from switchboard.toml / SWITCHBOARD_NATS__URLS is
    /// not consulted: the embedded server is the default.
    #[arg(long, value_name = "URL")]
    nats_url: Option<String>,
    /// Port of the embedded nats-server.
    #[arg(long, default_value_t = 4222)]
    port: u16,
    /// JetStream data folder of the embedded nats-server.
    #[arg(long, default_value = ".data/nats")]
    data_dir: PathBuf,
    /// Run the embedded nats-server with the accounts `switchboard nats-config --out DIR`
    /// wrote (agents isolated, NKeys); the services sign in with `DIR/services.nk`. Without
    /// it the embedded server is open, for a laptop.
    #[arg(long, value_name = "DIR", conflicts_with = "nats_url")]
    auth: Option<PathBuf>,
    /// Where the A2A gateway listens (default `[a2a_gateway] listen`, 127.0.0.1:9999); port 0
    /// picks a free one, which the banner shows.
    #[arg(long, value_name = "ADDR")]
    a2a_listen: Option<std::net::SocketAddr>,
    /// Where to serve Prometheus metrics of every service (`GET /metrics`); default
    /// `[telemetry] metrics_listen`, else 127.0.0.1:9464. Port 0 picks a free one, which the
    /// banner shows; `off` serves none.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Where to serve the console (default `[console] listen`, 127.0.0.1:8090); port 0 picks a
    /// free one, which the banner shows with a one-time sign-in link; `off` serves none. An
    /// address already taken (a second `up`) leaves the system running without it.
    #[arg(long, value_name = "ADDR")]
    console_listen: Option<String>,
}

/// Where `up` serves `/metrics` when neither the flag nor the config says.
const METRICS_LISTEN: &str = "127.0.0.1:9464";

/// Runs `up` until SIGINT/SIGTERM.
pub async fn run(args: UpArgs) -> ExitCode {
    let figment = config::figment();
    let loaded = RuntimeConfig::load(&figment).and_then(|runtime| {
        Ok(Services {
            directory: config::section_for(&figment, directory::config::SECTION, &runtime)?,
            fanout: config::section_for(&figment, inbox_fanout::config::SECTION, &runtime)?,
            correlator: config::section_for(&figment, reply_correlator::config::SECTION, &runtime)?,
            tasks: config::section_for(&figment, task_lifecycle::config::SECTION, &runtime)?,
            audit: config::section_for(&figment, audit::config::SECTION, &runtime)?,
            gateway: config::section_for(&figment, a2a_gateway::config::SECTION, &runtime)?,
            people: config::section_for(&figment, people::config::SECTION, &runtime)?,
            limits: config::section_for(&figment, limits::config::SECTION, &runtime)?,
            files: config::section_for(&figment, files::config::SECTION, &runtime)?,
            console: config::section_for(&figment, console::config::SECTION, &runtime)?,
            runtime,
        })
    });
    let mut services = match loaded {
        Ok(services) => services,
        Err(err) => {
            eprintln!("switchboard: {err}");
            return ExitCode::from(64);
        }
    };
    match args.metrics_listen.as_deref() {
        Some("off") => services.runtime.telemetry.metrics_listen = None,
        Some(listen) => services.runtime.telemetry.metrics_listen = Some(listen.to_owned()),
        None if services.runtime.telemetry.metrics_listen.is_none() => {
            services.runtime.telemetry.metrics_listen = Some(METRICS_LISTEN.to_owned());
        }
        None => {}
    }
    let telemetry =
        match telemetry::init_hosting("switchboard", &super::SERVICES, &services.runtime.telemetry)
        {
            Ok(guard) => guard,
            Err(err) => {
                eprintln!("switchboard: {err}");
                return ExitCode::from(64);
            }
        };
    let code = match serve(args, &mut services, telemetry.exporting_to()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.is::<BadConfig>() => {
            eprintln!("switchboard: {err:#}");
            ExitCode::from(64)
        }
        Err(err) => {
            eprintln!("switchboard: {err:#}");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown();
    code
}

/// The OTLP protocol in use, as the banner names it.
fn protocol_of(runtime: &RuntimeConfig) -> String {
    telemetry::export::status()
        .protocol
        .or_else(|| {
            runtime
                .telemetry
                .otlp_protocol
                .map(|p| p.as_str().to_owned())
        })
        .unwrap_or_else(|| "http/protobuf".to_owned())
}

/// A setting the NATS server or cluster cannot honour (exit 64, like a bad config file).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadConfig(String);

/// Every service's configuration.
struct Services {
    runtime: RuntimeConfig,
    directory: DirectoryConfig,
    fanout: FanoutConfig,
    correlator: CorrelatorConfig,
    tasks: TaskConfig,
    audit: AuditConfig,
    gateway: GatewayConfig,
    people: PeopleConfig,
    limits: limits::LimitsConfig,
    files: files::FilesConfig,
    console: console::ConsoleConfig,
}

/// What `up` writes as the people file when the data folder has none: the local administrator
/// (docs/protocol.md §14, "Who people are").
const DEFAULT_PEOPLE: &str = "\
# People who answer agents' notes, questions and approvals (docs/protocol.md section 14).
# Edit freely: a change applies within seconds, without a restart.
[[person]]
id = \"admin\"
name = \"Local administrator\"
roles = [\"admin\"]
access = [\"viewer\", \"operator\", \"approver\"]
";

/// The people file `up` uses: the configured one, else `<data-dir>/people.toml`, written with
/// the local administrator when missing.
fn people_file(
    configured: Option<&std::path::Path>,
    data_dir: &std::path::Path,
) -> anyhow::Result<PathBuf> {
    if let Some(path) = configured {
        return Ok(path.to_owned());
    }
    let path = data_dir.join("people.toml");
    if !path.exists() {
        std::fs::create_dir_all(data_dir)?;
        std::fs::write(&path, DEFAULT_PEOPLE)?;
    }
    Ok(path)
}

async fn serve(args: UpArgs, services: &mut Services, otlp: Option<&str>) -> anyhow::Result<()> {
    let runtime = &mut services.runtime;
    let embedded = match &args.nats_url {
        Some(url) => {
            runtime.nats.urls = switchboard_client::server_list(url);
            None
        }
        None => {
            // Under the generated accounts the operator's skill grants decide who is routed
            // `skill:` work (unless the config names another grants file).
            if let Some(auth) = &args.auth {
                let grants = auth.join(crate::permissions::SKILL_GRANTS_FILE);
                if grants.is_file() && services.directory.skill_grants_file.is_none() {
                    services.directory.skill_grants_file = Some(grants);
                }
            }
            let server =
                EmbeddedNats::start(args.port, &args.data_dir, args.auth.as_deref()).await?;
            runtime.nats.urls = vec![server.url().to_owned()];
            if let Some(seed) = server.services_seed() {
                runtime.nats.nkey_seed = Some(switchboard_runtime::config::Secret::new(seed));
            }
            Some(server)
        }
    };
    let url = runtime.nats.urls.join(",");
    let client = nats::connect(&runtime.nats, "switchboard-up").await?;
    let js = async_nats::jetstream::new(client.clone());
    switchboard_runtime::resources::check_replicas(&js, &runtime.jetstream)
        .await
        .map_err(|err| {
            if err.misconfigured {
                anyhow::Error::new(BadConfig(err.to_string()))
            } else {
                err.into()
            }
        })?;
    let shutdown = shutdown::on_signal();
    let metrics = match &runtime.telemetry.metrics_listen {
        Some(listen) => {
            match telemetry::metrics::serve(listen, shutdown.clone()).await {
                Ok(bound) => format!("http://{bound}/metrics"),
                // Another process has the port (a second `up`): the system runs without it.
                Err(err) => {
                    tracing::warn!(%listen, error = %err, "cannot serve /metrics");
                    format!("not served ({listen}: {err})")
                }
            }
        }
        None => "not served (--metrics-listen ADDR)".to_owned(),
    };
    let traces = match otlp {
        None => "not exported (set OTEL_EXPORTER_OTLP_ENDPOINT)".to_owned(),
        Some(endpoint) => {
            let endpoint = endpoint.to_owned();
            let probed = tokio::task::spawn_blocking({
                let endpoint = endpoint.clone();
                move || {
                    let probed = telemetry::export::probe(&endpoint, Duration::from_secs(1));
                    telemetry::export::record_probe(&probed);
                    probed
                }
            })
            .await
            .unwrap_or_else(|err| Err(err.to_string()));
            match probed {
                Ok(()) => format!("exported to {endpoint} (OTLP {})", protocol_of(runtime)),
                Err(why) => {
                    tracing::warn!(%endpoint, error = %why, "the OTLP endpoint does not answer; traces and metrics are dropped until it does");
                    format!("NOT EXPORTED: {endpoint} does not answer ({why})")
                }
            }
        }
    };

    let directory = directory::start(&client, runtime, services.directory.clone()).await?;
    let fanout = inbox_fanout::start(&client, runtime, services.fanout.clone()).await?;
    let correlator = reply_correlator::start(&client, runtime, services.correlator.clone()).await?;
    let task_service = task_lifecycle::start(&client, runtime, services.tasks.clone()).await?;
    let audit_service = audit::start(&client, runtime, services.audit.clone()).await?;
    let mut gateway_config = services.gateway.clone();
    if let Some(listen) = args.a2a_listen {
        gateway_config.listen = listen;
    }
    let gateway = a2a_gateway::start(&client, runtime, gateway_config).await?;
    let mut people_config = services.people.clone();
    if embedded.is_some() {
        people_config.file = Some(people_file(people_config.file.as_deref(), &args.data_dir)?);
    }
    let people_file_shown = people_config.file.as_ref().map_or_else(
        || "none ([people] file)".to_owned(),
        |path| path.display().to_string(),
    );
    let console_address = match args.console_listen.as_deref() {
        Some("off") => None,
        Some(listen) => Some(
            listen
                .parse::<std::net::SocketAddr>()
                .map_err(|err| BadConfig(format!("--console-listen {listen}: {err}")))?,
        ),
        None => Some(services.console.listen),
    };
    let console_file = people_config.file.clone();
    let people_service = people::start(&client, runtime, people_config).await?;
    let limits_service = limits::start(&client, runtime, services.limits.clone()).await?;
    let files_service = files::start(&client, runtime, services.files.clone()).await?;
    // The console: a one-time sign-in link for the local administrator, shown once below.
    let (console_service, console_line) = match console_address {
        None => (None, "not served (--console-listen ADDR)".to_owned()),
        Some(listen) => {
            let (token, hash) = console::one_time_token();
            let config = console::ConsoleConfig {
                listen,
                people_file: services.console.people_file.clone().or(console_file),
                bootstrap_token_sha256: Some(hash),
                ..services.console.clone()
            };
            match console::start(&client, runtime, config).await {
                Ok(running) => {
                    let line = match running.local_addr() {
                        Ok(bound) => format!(
                            "http://{bound}/#login={token} (sign in once as the local administrator)"
                        ),
                        Err(err) => format!("not served ({err})"),
                    };
                    (Some(running), line)
                }
                Err(err) => {
                    tracing::warn!(%listen, error = %err, "cannot serve the console");
                    (None, format!("not served ({listen}: {err})"))
                }
            }
        }
    };
    let a2a_url = gateway.gateway().config().base_url();
    let tasks = vec![
        tokio::spawn(directory.run(shutdown.clone())),
        tokio::spawn(fanout.run(shutdown.clone())),
        tokio::spawn(correlator.run(shutdown.clone())),
        tokio::spawn(task_service.run(shutdown.clone())),
        tokio::spawn(audit_service.run(shutdown.clone())),
        tokio::spawn(gateway.run(shutdown.clone())),
        tokio::spawn(people_service.run(shutdown.clone())),
        tokio::spawn(limits_service.run(shutdown.clone())),
        tokio::spawn(files_service.run(shutdown.clone())),
    ];
    let mut tasks = tasks;
    if let Some(console_service) = console_service {
        tasks.push(tokio::spawn(console_service.run(shutdown.clone())));
    }

    match &embedded {
        Some(server) => println!(
            "Switchboard is up.\n  NATS:      {url} (embedded nats-server {}, JetStream data in {}, log {})\n  access:    {}",
            server.bin().display(),
            server.data_dir().display(),
            server.log_file().display(),
            match &args.auth {
                Some(dir) => format!(
                    "accounts from {} (each agent signs in with agents/<agent_id>.nk)",
                    dir.display()
                ),
                None => "open (any client; use --auth DIR for the isolated accounts)".to_owned(),
            }
        ),
        None => println!("Switchboard is up.\n  NATS:      {url}"),
    }
    println!(
        "  services:  directory, inbox-fanout, reply-correlator, task-lifecycle, audit, a2a-gateway, people, limits, files, console\n  console:   {console_line}\n  people:    {people_file_shown} (who answers agents' questions and approvals: switchboard people --help)\n  A2A:       {a2a_url}/agents/<agent_id> (A2A v1.0, JSON-RPC and HTTP+JSON; card at …/.well-known/agent-card.json)\n  traces:    {traces}\n  metrics:   {metrics}\n\nAn agent in any language connects to {url} and sends\n  agent.registry.register.<agent_id>   (its card, JSON)\n  agent.registry.goal.open.<agent_id>  (then agent.inbox.fetch.<agent_id> / agent.inbox.ack.<agent_id>)\n  agent.send.<agent_id>                ({{\"to\": \"peer\", \"message\": \"…\"}})\n  agent.call.<agent_id> / agent.reply.<agent_id>   (calls that wait for an answer)\n  agent.task.<op>.<agent_id>           (tasks: create, accept, start, complete, spawn, …)\nTry:  switchboard agents   |   switchboard peers --as <agent_id>\nStop: Ctrl-C"
    );

    shutdown.cancelled().await;
    for task in tasks {
        if let Err(err) = task.await {
            tracing::error!(error = %err, "a service task failed");
        }
    }
    if let Err(err) = client.drain().await {
        tracing::warn!(error = %err, "draining the NATS connection failed");
    }
    if let Some(server) = embedded {
        server.stop(Duration::from_secs(10)).await;
    }
    // Not `println!`: whoever read the banner may be gone (a closed pipe), and stopping is
    // done whatever becomes of this line.
    let _ = writeln!(std::io::stdout(), "Switchboard stopped.");
    Ok(())
}
