//! Carrying remote A2A agents (docs/a2a.md, "Outbound"): for each agent in `a2a_remotes`,
//! exactly one gateway replica — the one holding its lease in `a2a_leases` — registers it in
//! the directory with a card made from its A2A card, keeps it online with heartbeats while
//! its card can be fetched, and reads its inbox like any agent (`carrier.rs`).
//!
//! Messages are acknowledged after they are carried: a gateway that stops mid-way leaves them
//! for the next holder (at least once). A remote that cannot be reached keeps its messages in
//! its inbox until it can.
//!
//! A remote never holds a Switchboard agent's id: when the directory refuses its card, or the
//! agent signs in and its own card replaces the remote's, the carrier stops at once (no more
//! heartbeats, fetches or sends), closes the remote's own goal and carries it no more. A
//! removed remote gives up only its own goal ([`crate::remote::add::release`]), never
//! deregisters the id.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream;
use serde_json::Value;
use switchboard_proto::AgentId;
use switchboard_proto::registry::{GoalOpenRequest, HeartbeatRequest};
use switchboard_proto::subject::RegistryOp;
use switchboard_runtime::CancellationToken;
use switchboard_runtime::lease::Lease;

use crate::gateway::Gateway;
use crate::remote::add;
use crate::remote::attempts::Attempts;
use crate::remote::card::{self, RemoteAgent};
use crate::remote::carrier::Carrier;
use crate::remote::outbound::RemoteClient;
use crate::store::{self, Paused};

/// How long a lease lives without renewal (the `a2a_leases` bucket's `max_age`).
pub const LEASE_TTL: Duration = Duration::from_secs(15);

/// How often each replica looks at `a2a_remotes`, renews its leases and tries to take the
/// free ones.
const TICK: Duration = Duration::from_secs(2);

/// Why a session ends when the remote lost its id.
const LOST: &str = "the id is a Switchboard agent's";

/// Runs until `shutdown`: takes, renews and gives up the leases of the remote agents, and
/// carries the agents it holds.
pub(crate) async fn run(
    gateway: Arc<Gateway>,
    js: jetstream::Context,
    shutdown: CancellationToken,
) {
    let buckets = (
        store::remotes_bucket(&js).await,
        js.get_key_value(switchboard_proto::A2A_LEASES_BUCKET).await,
        js.get_key_value(switchboard_proto::A2A_PAUSED_BUCKET).await,
    );
    let (remotes, leases, paused) = match buckets {
        (Ok(remotes), Ok(leases), Ok(paused)) => (remotes, leases, Paused::new(paused)),
        (Err(err), _, _) => return tracing::error!(error = %err, "remote agents not carried"),
        (_, Err(err), _) | (_, _, Err(err)) => {
            return tracing::error!(error = %err, "remote agents not carried");
        }
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
        // Renew first, whatever the listing does: a lease lapses only when this replica
        // stops renewing it. Stopping runs beside the loop, never holding up a renewal.
        let mut lost = Vec::new();
        for (id, held) in &mut carried {
            if !held.lease.renew().await {
                lost.push(id.clone());
            }
        }
        for id in lost {
            tracing::warn!(agent_id = %id, "remote agent's lease lost; another replica carries it");
            if let Some(held) = carried.remove(&id) {
                tokio::spawn(held.stop(None));
            }
        }
        let wanted = match store::remotes(&remotes).await {
            Ok(wanted) => wanted,
            Err(err) => {
                tracing::warn!(error = %err, "remote agents not listed");
                continue;
            }
        };
        // Give up what was removed (and close its goal: its open work fails over to nobody)
        // or changed (a changed record starts afresh below).
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
            let removed = !wanted.iter().any(|w| w.agent_id == id);
            if let Some(held) = carried.remove(&id) {
                tokio::spawn(held.stop(removed.then(|| Arc::clone(&gateway))));
            }
        }
        for record in wanted {
            let id = record.agent_id.clone();
            if carried.contains_key(&id) {
                continue;
            }
            let mut lease = Lease::new(leases.clone(), id.as_str(), holder.clone());
            if lease.acquire().await {
                tracing::info!(agent_id = %id, card_url = %record.card_url, "carrying remote agent");
                let stop = shutdown.child_token();
                let task = tokio::spawn(carry(
                    Arc::clone(&gateway),
                    record.clone(),
                    paused.clone(),
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
    futures::future::join_all(carried.into_values().map(|held| held.stop(None))).await;
}

/// A remote agent this replica carries.
struct Carried {
    record: RemoteAgent,
    lease: Lease,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Carried {
    /// Stops carrying (bounded wait), gives up the remote's own goal when `release` says (it
    /// was removed: `switchboard a2a remove`; in case a session opened the goal again after the
    /// command closed it), and gives the lease up so another replica can take it. The id is
    /// never deregistered: it may be a Switchboard agent's by now, and a deregister would
    /// close that agent's goals.
    async fn stop(mut self, release: Option<Arc<Gateway>>) {
        self.stop.cancel();
        if tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        if let Some(gateway) = release {
            let id = &self.record.agent_id;
            match add::release(&gateway.client, &self.record).await {
                Ok(purged) => {
                    tracing::info!(agent_id = %id, purged, "remote agent removed; its goal is closed")
                }
                Err(err) => {
                    tracing::warn!(agent_id = %id, error = %err, "removed remote agent's goal not closed")
                }
            }
        }
        self.lease.release().await;
    }
}

/// Carries one remote agent until `stop`: a session while its card can be fetched and its
/// messages reach it, a pause after each session that ends otherwise (1 s after one that
/// carried a message, else doubling to 30 s).
async fn carry(
    gateway: Arc<Gateway>,
    record: RemoteAgent,
    pauses: Paused,
    stop: CancellationToken,
) {
    let http = match card::http_client(&gateway.roots) {
        Ok(http) => http,
        Err(err) => {
            return tracing::error!(agent_id = %record.agent_id, error = %err, "remote agent not carried");
        }
    };
    let attempts = Arc::new(Attempts::default());
    let lost = CancellationToken::new();
    let mut pause = Duration::from_secs(1);
    while !stop.is_cancelled() {
        let ended = session(&gateway, &http, &record, &pauses, &attempts, &stop, &lost).await;
        if lost.is_cancelled() {
            // The id is a Switchboard agent's: the remote gets none of its traffic. Its own
            // goal (chosen at `add`) is closed, so no copy of the agent's messages waits there.
            let closed = add::release(&gateway.client, &record).await;
            return tracing::warn!(
                agent_id = %record.agent_id, goal_closed = closed.is_ok(),
                "the id is a Switchboard agent's (keyed, or signed in): the remote agent is not \
                 carried; `switchboard a2a remove` forgets it"
            );
        }
        match ended {
            Ok(()) => return,
            Err(err) => tracing::warn!(
                agent_id = %record.agent_id, error = %err,
                "remote agent unreachable; its messages wait in its inbox"
            ),
        }
        if attempts.carried.swap(false, Ordering::Relaxed) {
            pause = Duration::from_secs(1);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

/// One session: fetch the card, register, then carry the inbox until `stop` (`Ok`) or until
/// the card cannot be fetched, the remote cannot be reached, or the id turns out to be a
/// Switchboard agent's (`Err`; `lost` is cancelled then).
async fn session(
    gateway: &Arc<Gateway>,
    http: &reqwest::Client,
    record: &RemoteAgent,
    pauses: &Paused,
    attempts: &Arc<Attempts>,
    stop: &CancellationToken,
    lost: &CancellationToken,
) -> Result<(), async_nats::Error> {
    let card = card::fetch_card(http, &record.card_url).await?;
    let url = card::jsonrpc_url(&card, &record.card_url)?;
    let id = &record.agent_id;
    let carrier = Carrier {
        gateway: Arc::clone(gateway),
        agent: id.clone(),
        goal: record.goal_id,
        client: RemoteClient::new(http.clone(), url),
        streaming: card.capabilities.streaming == Some(true),
        pauses: pauses.clone(),
        attempts: Arc::clone(attempts),
        record: record.clone(),
        lost: lost.clone(),
    };
    carrier.register(&card).await?;
    carrier
        .fabric::<Value>(
            &RegistryOp::GoalOpen.subject(id),
            &GoalOpenRequest {
                goal_id: Some(record.goal_id),
                name: None,
                kind: None,
                overflow: None,
            },
        )
        .await
        .map_err(|failure| failure.to_string())?;
    // Heartbeats and card refreshes run beside the inbox loop (never cancelling a fetch,
    // which would count as a hand-out of its messages, unless the id is lost: then nothing
    // more is read); a card that cannot be fetched ends the session, and so does the inbox
    // loop when a message cannot reach the remote.
    let ended = stop.child_token();
    let keep_alive = keep_alive(&carrier, http, record, ended.clone());
    let serve = carrier.serve(&ended);
    let (reason, ()) = tokio::join!(keep_alive, async {
        serve.await;
        ended.cancel();
    });
    if stop.is_cancelled() && !lost.is_cancelled() {
        return Ok(());
    }
    Err(reason.into())
}

/// Heartbeats every `remote_heartbeat_ms` and refreshes the card every `remote_refresh_ms`
/// until `ended`; returns why the session ended (a card that cannot be fetched, the inbox
/// loop giving up: the remote or the fabric unreachable, or the id lost to a Switchboard
/// agent: checked before every heartbeat, and by the directory at every refresh).
async fn keep_alive(
    carrier: &Carrier,
    http: &reqwest::Client,
    record: &RemoteAgent,
    ended: CancellationToken,
) -> String {
    let mut heartbeat = tokio::time::interval(Duration::from_millis(
        carrier.gateway.config.remote_heartbeat_ms,
    ));
    let refresh_every = Duration::from_millis(carrier.gateway.config.remote_refresh_ms);
    let mut refresh =
        tokio::time::interval_at(tokio::time::Instant::now() + refresh_every, refresh_every);
    loop {
        tokio::select! {
            () = ended.cancelled() => {
                return "a message could not reach the remote agent, or the inbox service".to_owned();
            }
            () = carrier.lost.cancelled() => {
                ended.cancel();
                return LOST.to_owned();
            }
            _ = heartbeat.tick() => {
                // Never a heartbeat for an id a Switchboard agent signed in as.
                if carrier.taken_over().await {
                    ended.cancel();
                    return LOST.to_owned();
                }
                let beat = HeartbeatRequest::default();
                if let Err(err) = carrier
                    .fabric::<Value>(&RegistryOp::Heartbeat.subject(&carrier.agent), &beat)
                    .await
                {
                    tracing::warn!(agent_id = %carrier.agent, error = %err, "heartbeat failed");
                }
            }
            _ = refresh.tick() => match card::fetch_card(http, &record.card_url).await {
                Ok(card) => {
                    if let Err(err) = carrier.register(&card).await {
                        if carrier.lost.is_cancelled() {
                            ended.cancel();
                            return LOST.to_owned();
                        }
                        tracing::warn!(agent_id = %carrier.agent, error = %err, "card not refreshed");
                    }
                }
                Err(err) => {
                    ended.cancel();
                    return err.to_string();
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::attempts::MAX_ATTEMPTS;

    #[test]
    fn a_message_has_five_attempts() {
        let attempts = Attempts::default();
        for _ in 1..MAX_ATTEMPTS {
            assert!(!attempts.failed(7));
        }
        assert!(
            attempts.last(7),
            "four failed: the fifth attempt is the last"
        );
        assert!(attempts.failed(7));
        attempts.done(7);
        assert!(!attempts.last(7));
    }
}
