//! Adding a remote A2A agent (`switchboard a2a add <card-url>`, docs/a2a.md, "Outbound"):
//! fetch and check its card, have the directory register its card (the directory refuses an
//! id that is a Switchboard agent's: keyed in the agents file, or registered by the agent),
//! and record it in `a2a_remotes`; a gateway replica then carries it. Also the CLI's list and
//! remove, and [`release`]: what removing a remote gives up (its own goal, nothing else).

use async_nats::jetstream;
use serde::Serialize;
use serde_json::Value;
use switchboard_proto::registry::GoalCloseRequest;
use switchboard_proto::subject::RegistryOp;
use switchboard_proto::{AgentCard, AgentId, ErrorKind, GoalId};
use switchboard_request::request::{RequestFailure, request_json};

use crate::gateway::SERVICE_TIMEOUT;
use crate::remote::card::{
    MAX_REMOTES, RemoteError, agent_id_from_name, bounded, check_id, fabric_card, fetch_card,
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

/// Forgets remote agent `id`; false when it was not recorded. What it held on the fabric is
/// given up with [`release`].
pub async fn remove(remotes: &jetstream::kv::Store, id: &AgentId) -> Result<bool, RemoteError> {
    store::remove_remote(remotes, id)
        .await
        .map_err(RemoteError::store)
}

/// Gives up what a removed remote held on the fabric: its own goal (`remote.goal_id`, chosen
/// at `add`), closed as its agent id, which drops what is queued there. Nothing else: the
/// remote is not deregistered, since a deregister closes every goal of the id and the id may
/// be a Switchboard agent's by now (docs/a2a.md, "Outbound"); with its goal closed it is
/// unreachable at once, and the directory marks it offline when its heartbeats stop. Returns
/// how many messages were dropped (0 when the goal was closed already).
pub async fn release(
    client: &async_nats::Client,
    remote: &RemoteAgent,
) -> Result<u64, RemoteError> {
    let close = GoalCloseRequest {
        goal_id: remote.goal_id,
    };
    let closed: Result<Value, RequestFailure> = request_json(
        client,
        &RegistryOp::GoalClose.subject(&remote.agent_id),
        &close,
        SERVICE_TIMEOUT,
    )
    .await;
    match closed {
        Ok(reply) => Ok(reply.get("purged").and_then(Value::as_u64).unwrap_or(0)),
        Err(RequestFailure::Service(reply)) if reply.kind() == ErrorKind::NotFound => Ok(0),
        Err(failure) => Err(RemoteError::Directory(failure.to_string())),
    }
}

/// Registers `card` (a remote's, [`fabric_card`]) under `id`: the directory's word on whether
/// the id may be the remote's. It refuses (`not_allowed`) an id keyed in the agents file, and
/// one a Switchboard agent registered; a remote's own earlier card is replaced.
pub(crate) async fn claim(
    client: &async_nats::Client,
    id: &AgentId,
    card: &AgentCard,
) -> Result<(), RemoteError> {
    let registered: Result<Value, RequestFailure> = request_json(
        client,
        &RegistryOp::Register.subject(id),
        card,
        SERVICE_TIMEOUT,
    )
    .await;
    match registered {
        Ok(_) => Ok(()),
        Err(RequestFailure::Service(reply)) if reply.kind() == ErrorKind::NotAllowed => {
            Err(RemoteError::Taken(id.clone()))
        }
        Err(failure) => Err(RemoteError::Directory(failure.to_string())),
    }
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
/// from the card's name: checks the card and its JSON-RPC interface, has the directory
/// register the remote's card (it refuses an id that is a Switchboard agent's, keyed in the
/// agents file or registered by the agent: [`RemoteError::Taken`]), keeps the goal of an
/// earlier record of the same id. The `a2a_remotes` bucket must exist (a gateway that ran once
/// created it) and the directory must answer.
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
    if earlier.is_none() && known.len() >= MAX_REMOTES {
        return Err(RemoteError::TooMany);
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
    // The directory decides whether the id may be the remote's, before anything is recorded:
    // an id that is a Switchboard agent's is not taken over (messages meant for that agent
    // would go to the remote). The directory knows the keyed ids from the grants file
    // `nats-config` writes, so an agent that has not signed in yet keeps its id too.
    claim(&js.client(), &remote.agent_id, &fabric_card(&remote, &card)).await?;
    put(&remotes, &remote).await?;
    Ok(Added {
        remote,
        name: card.name.clone(),
        jsonrpc_url: url,
        streaming: card.capabilities.streaming == Some(true),
        skills: card.skills.iter().map(|skill| skill.id.clone()).collect(),
    })
}
