//! Carrying remote A2A agents (docs/a2a.md, "Outbound"): for each agent in `a2a_remotes`,
//! exactly one gateway replica — the one holding its lease in `a2a_leases` — registers it in
//! the directory with a card made from its A2A card, keeps it online with heartbeats while
//! its card can be fetched, and reads its inbox like any agent (`carrier.rs`).
//!
//! Messages are acknowledged after they are carried: a gateway that stops mid-way leaves them
//! for the next holder (at least once). A remote that cannot be reached keeps its messages in
//! its inbox until it can.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use serde_json::Value;
use switchboard_proto::AgentId;
use switchboard_proto::registry::{GoalOpenRequest, HeartbeatRequest};
use switchboard_proto::subject::RegistryOp;
use switchboard_runtime::CancellationToken;
use switchboard_runtime::lease::Lease;

use crate::carrier::Carrier;
use crate::gateway::Gateway;
use crate::outbound::RemoteClient;
use crate::remote::{self, RemoteAgent};
use crate::store::Paused;

/// How long a lease lives without renewal (the `a2a_leases` bucket's `max_age`).
pub const LEASE_TTL: Duration = Duration::from_secs(15);

/// How often each replica looks at `a2a_remotes`, renews its leases and tries to take the
/// free ones.
const TICK: Duration = Duration::from_secs(2);

/// Runs until `shutdown`: takes, renews and gives up the leases of the remote agents, and
/// carries the agents it holds.
pub(crate) async fn run(
    gateway: Arc<Gateway>,
    js: jetstream::Context,
    shutdown: CancellationToken,
) {
    let (remotes, leases) = match (
        remote::bucket(&js).await,
        js.get_key_value(switchboard_proto::A2A_LEASES_BUCKET).await,
    ) {
        (Ok(remotes), Ok(leases)) => (remotes, leases),
        (Err(err), _) => return tracing::error!(error = %err, "remote agents not carried"),
        (_, Err(err)) => return tracing::error!(error = %err, "remote agents not carried"),
    };
    let holder = switchboard_proto::new_id().to_string();
    let mut carried: HashMap<AgentId, Carried> = HashMap::new();
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let wanted = match remote::list(&remotes).await {
            Ok(wanted) => wanted,
            Err(err) => {
                tracing::warn!(error = %err, "remote agents not listed");
                continue;
            }
        };
        // Give up what was removed or changed (a changed record starts afresh below).
        let gone: Vec<AgentId> = carried
            .iter()
            .filter(|(id, held)| {
                !wanted
                    .iter()
                    .any(|w| w.agent_id == **id && *w == held.record)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(held) = carried.remove(&id) {
                held.stop().await;
            }
        }
        for record in wanted {
            let id = record.agent_id.clone();
            if let Some(held) = carried.get_mut(&id) {
                if !held.lease.renew().await {
                    tracing::warn!(agent_id = %id, "remote agent's lease lost; another replica carries it");
                    if let Some(held) = carried.remove(&id) {
                        held.stop().await;
                    }
                }
                continue;
            }
            let mut lease = Lease::new(leases.clone(), id.as_str(), holder.clone());
            if lease.acquire().await {
                tracing::info!(agent_id = %id, card_url = %record.card_url, "carrying remote agent");
                let stop = shutdown.child_token();
                let pauses = Paused::new(remotes.clone());
                let task = tokio::spawn(carry(
                    Arc::clone(&gateway),
                    record.clone(),
                    pauses,
                    stop.clone(),
                ));
                carried.insert(
                    id,
                    Carried {
                        record,
                        lease,
                        stop,
                        task,
                    },
                );
            }
        }
    }
    for (_, held) in carried.drain() {
        held.stop().await;
    }
}

/// A remote agent this replica carries.
struct Carried {
    record: RemoteAgent,
    lease: Lease,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Carried {
    /// Stops carrying (bounded wait) and gives the lease up so another replica can take it.
    async fn stop(mut self) {
        self.stop.cancel();
        if tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        self.lease.release().await;
    }
}

/// Carries one remote agent until `stop`: a session while its card can be fetched, a pause
/// (doubling to 30 s) after it cannot.
async fn carry(
    gateway: Arc<Gateway>,
    record: RemoteAgent,
    pauses: Paused,
    stop: CancellationToken,
) {
    let http = match remote::http_client(&gateway.roots) {
        Ok(http) => http,
        Err(err) => {
            return tracing::error!(agent_id = %record.agent_id, error = %err, "remote agent not carried");
        }
    };
    let mut pause = Duration::from_secs(1);
    while !stop.is_cancelled() {
        match session(&gateway, &http, &record, &pauses, &stop, &mut pause).await {
            Ok(()) => return,
            Err(err) => tracing::warn!(
                agent_id = %record.agent_id, error = %err,
                "remote agent unreachable; its messages wait in its inbox"
            ),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

/// One session: fetch the card, register, then carry the inbox until `stop` (`Ok`) or until
/// the card cannot be fetched or the remote cannot be reached (`Err`).
async fn session(
    gateway: &Arc<Gateway>,
    http: &reqwest::Client,
    record: &RemoteAgent,
    pauses: &Paused,
    stop: &CancellationToken,
    pause: &mut Duration,
) -> Result<(), String> {
    let card = remote::fetch_card(http, &record.card_url)
        .await
        .map_err(|err| err.to_string())?;
    let url = remote::jsonrpc_url(&card, &record.card_url).map_err(|err| err.to_string())?;
    let id = &record.agent_id;
    let carrier = Carrier {
        gateway: Arc::clone(gateway),
        agent: id.clone(),
        goal: record.goal_id,
        client: RemoteClient::new(http.clone(), url),
        streaming: card.capabilities.streaming == Some(true),
        pauses: pauses.clone(),
    };
    carrier.register(&card, &record.card_url).await?;
    carrier
        .fabric::<Value>(
            &RegistryOp::GoalOpen.subject(id),
            &GoalOpenRequest {
                goal_id: Some(record.goal_id),
                kind: None,
            },
        )
        .await?;
    *pause = Duration::from_secs(1);
    // Heartbeats and card refreshes run beside the inbox loop (never cancelling a fetch,
    // which would count as a hand-out of its messages); a card that cannot be fetched ends
    // the session.
    let lost = stop.child_token();
    let keep_alive = keep_alive(&carrier, http, record, lost.clone());
    let serve = carrier.serve(&lost);
    let (reason, ()) = tokio::join!(keep_alive, async {
        serve.await;
        lost.cancel();
    });
    if stop.is_cancelled() {
        return Ok(());
    }
    Err(reason)
}

/// Heartbeats every `remote_heartbeat_ms` and refreshes the card every `remote_refresh_ms` until `lost`;
/// returns why it stopped (a card that cannot be fetched, or the remote unreachable).
async fn keep_alive(
    carrier: &Carrier,
    http: &reqwest::Client,
    record: &RemoteAgent,
    lost: CancellationToken,
) -> String {
    let mut heartbeat = tokio::time::interval(Duration::from_millis(
        carrier.gateway.config.remote_heartbeat_ms,
    ));
    let refresh_every = Duration::from_millis(carrier.gateway.config.remote_refresh_ms);
    let mut refresh =
        tokio::time::interval_at(tokio::time::Instant::now() + refresh_every, refresh_every);
    loop {
        tokio::select! {
            () = lost.cancelled() => return "the remote agent stopped answering".to_owned(),
            _ = heartbeat.tick() => {
                let beat = HeartbeatRequest::default();
                if let Err(err) = carrier
                    .fabric::<Value>(&RegistryOp::Heartbeat.subject(&carrier.agent), &beat)
                    .await
                {
                    tracing::warn!(agent_id = %carrier.agent, error = %err, "heartbeat failed");
                }
            }
            _ = refresh.tick() => match remote::fetch_card(http, &record.card_url).await {
                Ok(card) => {
                    if let Err(err) = carrier.register(&card, &record.card_url).await {
                        tracing::warn!(agent_id = %carrier.agent, error = %err, "card not refreshed");
                    }
                }
                Err(err) => {
                    lost.cancel();
                    return err.to_string();
                }
            },
        }
    }
}
