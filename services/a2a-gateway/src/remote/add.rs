//! Adding a remote A2A agent (`switchboard a2a add <card-url>`, docs/a2a.md, "Outbound"):
//! fetch and check its card, refuse an id a Switchboard agent holds, and record it in
//! `a2a_remotes`; a gateway replica then carries it. Also the CLI's list and remove.

use async_nats::jetstream;
use serde::Serialize;
use switchboard_proto::{AgentId, GoalId};

use crate::remote::card::{
    CARD_URL_KEY, MAX_REMOTES, RemoteError, agent_id_from_name, bounded, check_id, fetch_card,
    jsonrpc_url, printable,
};
use crate::store::{self, RemoteAgent};

/// Opens `a2a_remotes` (created by the gateway at start-up).
pub async fn bucket(js: &jetstream::Context) -> Result<jetstream::kv::Store, RemoteError> {
    store::remotes_bucket(js).await.map_err(RemoteError::store)
}

/// Every remote agent recorded (unreadable entries are skipped with a warning).
pub async fn list(remotes: &jetstream::kv::Store) -> Result<Vec<RemoteAgent>, RemoteError> {
    store::remotes(remotes).await.map_err(RemoteError::store)
}

/// Records `agent` (replacing an earlier record of the same id, whose goal it keeps).
pub async fn put(remotes: &jetstream::kv::Store, agent: &RemoteAgent) -> Result<(), RemoteError> {
    store::put_remote(remotes, agent)
        .await
        .map_err(RemoteError::store)
}

/// Forgets remote agent `id`; false when it was not recorded.
pub async fn remove(remotes: &jetstream::kv::Store, id: &AgentId) -> Result<bool, RemoteError> {
    store::remove_remote(remotes, id)
        .await
        .map_err(RemoteError::store)
}

/// What `switchboard a2a add` did.
#[derive(Debug, Clone, Serialize)]
pub struct Added {
    /// The record written.
    pub remote: RemoteAgent,
    /// The card's name.
    pub name: String,
    /// Where the gateway sends to.
    pub jsonrpc_url: String,
    /// Whether the remote streams (its answers then come as they are made).
    pub streaming: bool,
    /// The skill ids it lists (its capabilities on the fabric).
    pub skills: Vec<String>,
}

/// Adds (or updates) the remote agent whose card is at `card_url`, as `as_id` or an id made
/// from the card's name: checks the card and its JSON-RPC interface, refuses an id a
/// Switchboard agent holds, keeps the goal of an earlier record of the same id. The
/// `a2a_remotes` bucket must exist (a gateway that ran once created it).
pub async fn add(
    js: &jetstream::Context,
    http: &reqwest::Client,
    card_url: &str,
    as_id: Option<&str>,
) -> Result<Added, RemoteError> {
    add_with(js, http, card_url, as_id, false).await
}

/// [`add`], and with `route_skills` open it to `skill:` routing for the skills its card lists
/// now (pinned: a later card cannot add to them).
pub async fn add_with(
    js: &jetstream::Context,
    http: &reqwest::Client,
    card_url: &str,
    as_id: Option<&str>,
    route_skills: bool,
) -> Result<Added, RemoteError> {
    let requested = as_id.map(check_id).transpose()?;
    let card = fetch_card(http, card_url).await?;
    let url = jsonrpc_url(&card, card_url)?;
    let agent_id = match requested {
        Some(id) => id,
        None => agent_id_from_name(&card.name).ok_or_else(|| {
            RemoteError::BadId(format!(
                "the card's name `{}` makes no agent id; give one with --as",
                printable(&card.name, 80)
            ))
        })?,
    };
    let remotes = bucket(js).await.map_err(|err| {
        RemoteError::Store(
            format!("{err} (start the A2A gateway once: it creates the bucket)").into(),
        )
    })?;
    let known = list(&remotes).await?;
    let earlier = known.iter().find(|r| r.agent_id == agent_id);
    if earlier.is_none() {
        if known.len() >= MAX_REMOTES {
            return Err(RemoteError::TooMany);
        }
        // An id a Switchboard agent registered is not taken over: messages meant for that
        // agent would go to the remote.
        if let Some(value) = store::registered(js, &agent_id)
            .await
            .map_err(RemoteError::store)?
        {
            let remote_card = serde_json::from_slice::<switchboard_proto::AgentRecord>(&value)
                .is_ok_and(|record| record.card.metadata.contains_key(CARD_URL_KEY));
            if !remote_card {
                return Err(RemoteError::Taken(agent_id));
            }
        }
    }
    let remote = RemoteAgent {
        agent_id,
        card_url: card_url.to_owned(),
        goal_id: earlier.map_or_else(GoalId::default, |r| r.goal_id),
        added_at: earlier.map_or_else(switchboard_proto::timestamp::now, |r| r.added_at),
        skills: Some(
            card.skills
                .iter()
                .take(64)
                .map(|skill| bounded(&skill.id, 64))
                .collect(),
        ),
        route_skills,
    };
    put(&remotes, &remote).await?;
    Ok(Added {
        remote,
        name: card.name.clone(),
        jsonrpc_url: url,
        streaming: card.capabilities.streaming == Some(true),
        skills: card.skills.iter().map(|skill| skill.id.clone()).collect(),
    })
}
