//! Agent cards: each registered agent's directory card as an A2A v1.0 `AgentCard`, at
//! `/agents/<agent_id>/.well-known/agent-card.json`.
//!
//! Skills come from the card's `skills` (id, name, description, tags, examples, input and
//! output modes) and its `capabilities` (one skill each, named after it). The one interface is
//! JSON-RPC at `/agents/<agent_id>`, protocol 1.0; `streaming` and `pushNotifications` are
//! true (SSE, resumable; webhooks). A caller needs a bearer token unless anonymous callers are
//! allowed, and the card says so.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::gateway::Gateway;
use crate::serve::checks::{agent_id, not_found};
use std::collections::HashMap;

use a2a::{
    AgentCapabilities, AgentCard, AgentInterface, AgentSkill, HttpAuthSecurityScheme,
    SecurityScheme, TRANSPORT_PROTOCOL_HTTP_JSON, TRANSPORT_PROTOCOL_JSONRPC,
};
use switchboard_proto::{AgentRecord, AgentStatus};

use crate::config::GatewayConfig;

/// The name of the bearer scheme in the cards' `securitySchemes`.
pub const BEARER_SCHEME: &str = "bearer";

/// `Some(list)` when it has entries (A2A omits an empty optional list).
fn listed(list: &[String]) -> Option<Vec<String>> {
    (!list.is_empty()).then(|| list.to_vec())
}

/// The A2A card of `record`, served by a gateway with `config`.
pub fn card(record: &AgentRecord, config: &GatewayConfig) -> AgentCard {
    let ours = &record.card;
    let id = ours.agent_id.as_str();
    let mut skills: Vec<AgentSkill> = ours
        .skills
        .iter()
        .map(|skill| AgentSkill {
            id: skill.id.clone(),
            name: skill.name.clone(),
            description: skill.description.clone(),
            tags: skill.tags.clone(),
            examples: listed(&skill.examples),
            input_modes: listed(&skill.input_modes),
            output_modes: listed(&skill.output_modes),
            security_requirements: None,
        })
        .collect();
    for capability in &ours.capabilities {
        if skills.iter().any(|skill| skill.id == *capability) {
            continue;
        }
        skills.push(AgentSkill {
            id: capability.clone(),
            name: capability.clone(),
            description: format!("{id} can {capability}"),
            tags: vec![capability.clone()],
            examples: None,
            input_modes: None,
            output_modes: None,
            security_requirements: None,
        });
    }
    let mut description = if ours.description.is_empty() {
        format!("The Switchboard agent `{id}`")
    } else {
        ours.description.clone()
    };
    if record.status == AgentStatus::Offline {
        description = format!(
            "Unavailable: `{id}` is offline (its tasks wait until it is back). {description}"
        );
    }
    let (security_schemes, security_requirements) = if config.allow_anonymous {
        (None, None)
    } else {
        (
            Some(HashMap::from([(
                BEARER_SCHEME.to_owned(),
                SecurityScheme::HttpAuth(HttpAuthSecurityScheme {
                    scheme: "Bearer".to_owned(),
                    description: Some(
                        "a token the gateway's operator issued (`[a2a_gateway] clients`)"
                            .to_owned(),
                    ),
                    bearer_format: None,
                }),
            )])),
            Some(vec![HashMap::from([(
                BEARER_SCHEME.to_owned(),
                Vec::new(),
            )])]),
        )
    };
    AgentCard {
        name: id.to_owned(),
        description,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        // Both bindings on one URL: JSON-RPC is posted to it, the REST paths are under it.
        supported_interfaces: vec![
            AgentInterface::new(
                format!("{}/agents/{id}", config.base_url()),
                TRANSPORT_PROTOCOL_JSONRPC,
            ),
            AgentInterface::new(
                format!("{}/agents/{id}", config.base_url()),
                TRANSPORT_PROTOCOL_HTTP_JSON,
            ),
        ],
        capabilities: AgentCapabilities {
            streaming: Some(true),
            push_notifications: Some(true),
            extensions: None,
            extended_agent_card: Some(false),
        },
        default_input_modes: vec!["text/plain".to_owned(), "application/json".to_owned()],
        default_output_modes: vec!["text/plain".to_owned(), "application/json".to_owned()],
        skills,
        provider: None,
        documentation_url: None,
        icon_url: None,
        security_schemes,
        security_requirements,
        signatures: None,
    }
}

/// A strong `ETag` for a card's JSON: its SHA-256, so a client's cached copy is valid exactly
/// as long as nothing in the card changed.
pub fn etag(json: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, json);
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\"{hex}\"")
}

/// How long a client may cache a card, in seconds.
const CARD_MAX_AGE_SECS: u32 = 60;

pub(crate) async fn default_card(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
) -> Response {
    let agent = gateway.config().default_agent.clone();
    if agent.is_empty() {
        return not_found(
            "no default agent is configured; cards are at /agents/<agent_id>/.well-known/agent-card.json",
        );
    }
    card_response(&gateway, &agent, &headers).await
}

pub(crate) async fn agent_card(
    State(gateway): State<Arc<Gateway>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> Response {
    card_response(&gateway, &agent, &headers).await
}

async fn card_response(gateway: &Gateway, agent: &str, headers: &HeaderMap) -> Response {
    let Some(id) = agent_id(agent) else {
        return not_found("not an agent id");
    };
    let record = match gateway.store.agent(&id).await {
        Ok(Some(record)) => record,
        Ok(None) => return not_found(&format!("no agent `{id}` is registered")),
        Err(err) => {
            return (StatusCode::SERVICE_UNAVAILABLE, err.to_string()).into_response();
        }
    };
    let card = card(&record, gateway.config());
    let json = serde_json::to_vec(&card).unwrap_or_default();
    let etag = etag(&json);
    let cache = format!("public, max-age={CARD_MAX_AGE_SECS}");
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|seen| seen.split(',').any(|tag| tag.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, "application/json")], json).into_response()
    };
    let out = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&etag) {
        out.insert(header::ETAG, value);
    }
    if let Ok(value) = HeaderValue::from_str(&cache) {
        out.insert(header::CACHE_CONTROL, value);
    }
    // No earlier than the card's last change: an online agent's card changes only when it
    // registers or comes back (its latest register or heartbeat); an offline one's changed
    // when the directory marked it, which the record does not date.
    let modified = match record.status {
        switchboard_proto::registry::AgentStatus::Offline => time::OffsetDateTime::now_utc(),
        _ => record.last_heartbeat,
    };
    if let Some(value) = http_date(modified).and_then(|date| HeaderValue::from_str(&date).ok()) {
        out.insert(header::LAST_MODIFIED, value);
    }
    response
}

/// `at` as an HTTP date (IMF-fixdate, RFC 9110: `Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date(at: time::OffsetDateTime) -> Option<String> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    at.to_offset(time::UtcOffset::UTC).format(&format).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_proto::{AgentCard as Card, Skill};

    fn record(card: Card, status: AgentStatus) -> AgentRecord {
        let now = switchboard_proto::timestamp::now();
        AgentRecord {
            card,
            status,
            current_tasks: Vec::new(),
            task_load: 0,
            registered_at: now,
            last_heartbeat: now,
        }
    }

    #[test]
    fn a_card_lists_skills_and_capabilities_and_says_when_offline() {
        let Some(id) = agent_id("writer") else {
            panic!("a valid id")
        };
        let mut ours = Card::new(id);
        ours.description = "writes".into();
        ours.capabilities = vec!["summarize".into(), "draft".into()];
        ours.skills = vec![Skill {
            id: "draft".into(),
            name: "Drafting".into(),
            description: "first drafts".into(),
            tags: vec![],
            examples: vec!["draft a launch note".into()],
            input_modes: vec![],
            output_modes: vec!["text/markdown".into()],
        }];
        let config = GatewayConfig::default();
        let online = card(&record(ours.clone(), AgentStatus::Idle), &config);
        assert_eq!(online.name, "writer");
        assert_eq!(online.description, "writes");
        let ids: Vec<&str> = online.skills.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["draft", "summarize"]);
        let draft = &online.skills[0];
        assert_eq!(
            draft.examples.as_deref(),
            Some(&["draft a launch note".to_owned()][..])
        );
        assert_eq!(draft.input_modes, None, "an empty list is left out");
        assert_eq!(
            draft.output_modes.as_deref(),
            Some(&["text/markdown".to_owned()][..])
        );
        assert_eq!(
            online.supported_interfaces[0].url,
            "http://127.0.0.1:9999/agents/writer"
        );
        assert_eq!(online.capabilities.streaming, Some(true));
        assert!(online.security_schemes.is_some());
        let offline = card(&record(ours, AgentStatus::Offline), &config);
        assert!(offline.description.starts_with("Unavailable"));
    }

    #[test]
    fn last_modified_is_an_imf_fixdate() {
        let at = time::macros::datetime!(1994-11-06 08:49:37 +02:00);
        assert_eq!(
            http_date(at).as_deref(),
            Some("Sun, 06 Nov 1994 06:49:37 GMT")
        );
    }
}
