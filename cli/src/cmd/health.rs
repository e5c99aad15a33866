//! `switchboard health`: whether every service answers, and whether its telemetry leaves the
//! process — each instance's own count of failed OTLP exports, from its `$SRV.STATS`.

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt as _;
use switchboard_client::proto::subject;
use switchboard_runtime::service::export_line;

use super::args::Connection;

/// How long the instances of a service have to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// Whether every service answers, and whether each exports its telemetry (exit 1 if not).
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  switchboard health")]
pub struct HealthArgs {
    #[command(flatten)]
    conn: Connection,
}

/// Prints one line per service instance; exits 1 when a service has no instance answering or
/// an instance's export fails.
pub async fn run(args: &HealthArgs, json: bool) -> ExitCode {
    let client = match crate::nats::connect(&args.conn.nats_url).await {
        Ok(client) => client,
        Err(err) => {
            eprintln!("switchboard: {err:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut healthy = true;
    let mut report = Vec::new();
    for service in super::SERVICES {
        let instances = stats_of(&client, service).await;
        if instances.is_empty() {
            healthy = false;
        }
        let mut lines = Vec::new();
        for stats in &instances {
            let id = stats
                .get("id")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("?")
                .to_owned();
            let bytes = serde_json::to_vec(stats).unwrap_or_default();
            let telemetry = export_line(&bytes).unwrap_or_else(|| {
                "telemetry not reported (no NATS endpoints to report it on)".to_owned()
            });
            if telemetry.contains("NOT EXPORTED") {
                healthy = false;
            }
            lines.push((id, telemetry));
        }
        report.push((service, lines));
    }
    if json {
        let value: Vec<serde_json::Value> = report
            .iter()
            .map(|(service, lines)| {
                serde_json::json!({
                    "service": service,
                    "instances": lines.iter().map(|(id, telemetry)| {
                        serde_json::json!({ "id": id, "telemetry": telemetry })
                    }).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(value));
    } else {
        for (service, lines) in &report {
            if lines.is_empty() {
                println!("{service:<17} NO INSTANCE ANSWERS");
            }
            for (id, telemetry) in lines {
                println!("{service:<17} {id}  {telemetry}");
            }
        }
    }
    if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Every instance's `$SRV.STATS` reply for `service` within [`ANSWER_WITHIN`].
async fn stats_of(client: &async_nats::Client, service: &str) -> Vec<serde_json::Value> {
    let inbox = client.new_inbox();
    let Ok(mut replies) = client.subscribe(inbox.clone()).await else {
        return Vec::new();
    };
    if client
        .publish_with_reply(subject::service_stats(service, None), inbox, "".into())
        .await
        .is_err()
    {
        return Vec::new();
    }
    let mut found = Vec::new();
    let until = tokio::time::Instant::now() + ANSWER_WITHIN;
    while let Ok(Some(reply)) = tokio::time::timeout_at(until, replies.next()).await {
        if let Ok(stats) = serde_json::from_slice(&reply.payload) {
            found.push(stats);
        }
    }
    found
}
