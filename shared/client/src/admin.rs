//! Operator views read straight from the registry buckets (for `switchboard agents`).

use std::collections::BTreeMap;

use async_nats::jetstream;
use serde::{Deserialize, Serialize};
use switchboard_proto::{AgentRecord, AgentStatus, GOALS_BUCKET, REGISTRY_BUCKET};
use switchboard_request::kv::snapshot;

use crate::error::ClientError;

/// One agent as an operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentListing {
    /// The agent id, from its card.
    pub agent_id: String,
    /// What the agent does, from its card (empty when it gave none).
    pub description: String,
    /// Idle, busy or offline, as the directory last recorded it.
    pub status: AgentStatus,
    /// Number of live goals; with none, nothing can be delivered to the agent.
    pub live_goals: usize,
    /// Last heartbeat (RFC 3339).
    pub last_heartbeat: String,
}

/// Every registered agent with its status and goal count, sorted by id.
pub async fn list_agents(nats: &async_nats::Client) -> Result<Vec<AgentListing>, ClientError> {
    let js = jetstream::new(nats.clone());
    let open = |bucket: &'static str| {
        let js = js.clone();
        async move {
            js.get_key_value(bucket)
                .await
                .map_err(|err| ClientError::Inbox(format!("opening bucket {bucket}: {err}")))
        }
    };
    let agents = open(REGISTRY_BUCKET).await?;
    let goals = open(GOALS_BUCKET).await?;
    let mut goal_counts: BTreeMap<String, usize> = BTreeMap::new();
    for entry in snapshot(&js, &goals, ">")
        .await
        .map_err(|err| ClientError::Inbox(err.to_string()))?
    {
        if let Some((agent, _)) = entry.key.split_once('.') {
            *goal_counts.entry(agent.to_owned()).or_default() += 1;
        }
    }
    let mut listings = Vec::new();
    for entry in snapshot(&js, &agents, ">")
        .await
        .map_err(|err| ClientError::Inbox(err.to_string()))?
    {
        let record: AgentRecord =
            serde_json::from_slice(&entry.value).map_err(|err| ClientError::Decode {
                subject: format!("{REGISTRY_BUCKET}/{}", entry.key),
                message: err.to_string(),
            })?;
        let id = record.card.agent_id.to_string();
        listings.push(AgentListing {
            live_goals: goal_counts.get(&id).copied().unwrap_or(0),
            agent_id: id,
            description: record.card.description,
            status: record.status,
            last_heartbeat: switchboard_proto::timestamp::format(record.last_heartbeat),
        });
    }
    listings.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
    Ok(listings)
}
