//! Remote A2A agents on the fabric (docs/a2a.md, "Outbound"): `switchboard a2a add <card-url>`
//! fetches the agent's card, checks it, and records the agent in the `a2a_remotes` bucket; a
//! gateway replica then carries the agent (`bridge.rs`). This file holds the card checks and
//! how an A2A card becomes a directory card; `add.rs` adds an agent, and the record
//! (`RemoteAgent`) and its KV reads and writes are in `store.rs`.
//!
//! The card URL is the operator's word; everything the card says is the remote's. So the
//! gateway only ever POSTs to a JSON-RPC URL on the card URL's own origin (scheme, host and
//! port): a card cannot point the gateway at another host.

use std::time::Duration;

use a2a::AgentCard as A2aCard;
use serde_json::Value;
use switchboard_proto::{AgentCard, AgentId, Skill};

use crate::http::{BodyError, bounded_body};
pub use crate::store::RemoteAgent;

/// Largest card the gateway reads (a card is a few KiB; a bigger answer is not a card).
pub const MAX_CARD_BYTES: usize = 256 * 1024;

/// How long fetching a card may take.
pub const CARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Most remote agents one deployment carries (`switchboard a2a add` refuses past it).
pub const MAX_REMOTES: usize = 1_000;

/// Metadata key of a remote agent's card URL on its directory card: it marks the directory
/// record as the remote's ([`switchboard_proto::registry::REMOTE_CARD_URL_KEY`]).
pub const CARD_URL_KEY: &str = switchboard_proto::registry::REMOTE_CARD_URL_KEY;

/// Why a remote agent cannot be added or reached.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The card URL is not one the gateway can fetch.
    #[error("card URL `{url}`: {why}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Fetching the card failed (connection, status, size, time).
    #[error("fetching the card at {url}: {message}")]
    Unreachable {
        /// The card URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The answer is not an A2A v1.0 agent card.
    #[error("{url} did not answer with an A2A agent card: {message}")]
    NotACard {
        /// The card URL.
        url: String,
        /// The decoding error.
        message: String,
    },
    /// The card offers no JSON-RPC interface of protocol 1.x on the card URL's origin.
    #[error("the card at {url} has no JSON-RPC 1.x interface on {origin} (its interfaces: {seen})")]
    NoInterface {
        /// The card URL.
        url: String,
        /// The origin an interface must be on.
        origin: String,
        /// The interfaces the card lists, `binding version url`.
        seen: String,
    },
    /// No usable agent id: `--as` is invalid, or the card's name makes none.
    #[error("agent id: {0}")]
    BadId(String),
    /// The id is a Switchboard agent's (a remote agent would shadow it): keyed in the agents
    /// file, or registered by the agent; the directory refused it.
    #[error(
        "`{0}` is a Switchboard agent's id (keyed in the agents file, or registered by the \
         agent); choose another id with --as"
    )]
    Taken(AgentId),
    /// The directory did not answer, or refused the remote's card for another reason.
    #[error("the directory: {0}")]
    Directory(String),
    /// As many remote agents as allowed are carried already.
    #[error("{MAX_REMOTES} remote agents are carried already; remove one first")]
    TooMany,
    /// The HTTP client could not be built (its TLS setup).
    #[error("the HTTP client: {0}")]
    Client(String),
    /// Reading or writing the `a2a_remotes` bucket failed.
    #[error("the remote-agent bucket: {0}")]
    Store(#[source] async_nats::Error),
}

/// The HTTP client the gateway reaches remote agents with ([`crate::http::http_builder`]:
/// TLS with the platform's roots plus `extra_roots`, no redirects).
pub fn http_client(extra_roots: &[reqwest::Certificate]) -> Result<reqwest::Client, RemoteError> {
    crate::http::http_builder(extra_roots)
        .build()
        .map_err(|err| RemoteError::Client(err.to_string()))
}

/// Checks a card URL: http or https, with a host and no credentials.
pub fn check_card_url(url: &str) -> Result<reqwest::Url, RemoteError> {
    let bad = |why| RemoteError::BadUrl {
        url: url.to_owned(),
        why,
    };
    let parsed = reqwest::Url::parse(url).map_err(|_| bad("not a URL"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("only http and https"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad("no credentials in the URL"));
    }
    Ok(parsed)
}

/// The scheme, host and port of `url`.
fn origin(url: &reqwest::Url) -> String {
    format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str().unwrap_or_default(),
        url.port_or_known_default().unwrap_or_default()
    )
}

/// Fetches and decodes the card at `url`.
pub async fn fetch_card(http: &reqwest::Client, url: &str) -> Result<A2aCard, RemoteError> {
    check_card_url(url)?;
    let unreachable = |message: String| RemoteError::Unreachable {
        url: url.to_owned(),
        message,
    };
    let response = tokio::time::timeout(CARD_TIMEOUT, http.get(url).send())
        .await
        .map_err(|_| unreachable(format!("no answer within {CARD_TIMEOUT:?}")))?
        .map_err(|err| unreachable(err.to_string()))?;
    if !response.status().is_success() {
        return Err(unreachable(format!("HTTP {}", response.status())));
    }
    let body = tokio::time::timeout(CARD_TIMEOUT, bounded_body(response, MAX_CARD_BYTES))
        .await
        .map_err(|_| unreachable(format!("the card took over {CARD_TIMEOUT:?}")))?
        .map_err(|err| match err {
            BodyError::Read(err) => unreachable(err.to_string()),
            BodyError::TooLarge(limit) => unreachable(format!("a card larger than {limit} bytes")),
        })?;
    serde_json::from_slice(&body).map_err(|err| RemoteError::NotACard {
        url: url.to_owned(),
        message: printable(&err.to_string(), 300),
    })
}

/// The JSON-RPC URL the gateway sends to: the card's first JSON-RPC interface of protocol
/// 1.x on the card URL's origin.
pub fn jsonrpc_url(card: &A2aCard, card_url: &str) -> Result<String, RemoteError> {
    let base = check_card_url(card_url)?;
    let want = origin(&base);
    card.supported_interfaces
        .iter()
        .filter(|interface| {
            interface.protocol_binding == a2a::TRANSPORT_PROTOCOL_JSONRPC
                && (interface.protocol_version.starts_with("1.")
                    || interface.protocol_version == "1")
        })
        .find_map(|interface| {
            let url = base.join(&interface.url).ok()?;
            (origin(&url) == want && url.username().is_empty() && url.password().is_none())
                .then(|| url.to_string())
        })
        .ok_or_else(|| RemoteError::NoInterface {
            url: card_url.to_owned(),
            origin: want,
            seen: card
                .supported_interfaces
                .iter()
                .take(8)
                .map(|i| format!("{} {} {}", i.protocol_binding, i.protocol_version, i.url))
                .map(|seen| printable(&seen, 200))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// An agent id made from a card's name: lowercase, runs of other characters as `-`, at most
/// 64 characters; `None` when nothing is left or it would be a client id (`a2a-…`).
pub fn agent_id_from_name(name: &str) -> Option<AgentId> {
    let mut id = String::new();
    for c in name.trim().chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() || c == '_' {
            id.push(c);
        } else if !id.ends_with('-') && !id.is_empty() {
            id.push('-');
        }
        if id.len() >= 64 {
            break;
        }
    }
    let id = id.trim_end_matches('-');
    check_id(id).ok()
}

/// Checks an id for a remote agent: a valid agent id that is not a client's (`a2a-…`).
pub fn check_id(id: &str) -> Result<AgentId, RemoteError> {
    if id.starts_with(switchboard_proto::A2A_CLIENT_PREFIX) {
        return Err(RemoteError::BadId(format!(
            "`{id}`: ids starting `{}` are the gateway's A2A clients",
            switchboard_proto::A2A_CLIENT_PREFIX
        )));
    }
    AgentId::parse(id).map_err(|err| RemoteError::BadId(format!("`{id}`: {err}")))
}

/// The directory card of a remote agent: its description, skills (with examples and modes)
/// and skill ids as capabilities — only those pinned at `add` (`remote.skills`) — and its card
/// URL, name and version as metadata; unless the operator opened it to routing
/// (`remote.route_skills`), `routes_skills: false`. It takes messages from every agent (the
/// remote has its own auth; the ACLs of the callers apply).
pub fn fabric_card(remote: &RemoteAgent, card: &A2aCard) -> AgentCard {
    let (agent_id, card_url) = (&remote.agent_id, remote.card_url.as_str());
    let mut ours = AgentCard::new(agent_id.clone());
    ours.description = bounded(&card.description, 1_000);
    ours.skills = card
        .skills
        .iter()
        .filter(|skill| {
            remote
                .skills
                .as_ref()
                .is_none_or(|pinned| pinned.iter().any(|id| *id == bounded(&skill.id, 64)))
        })
        .take(64)
        .map(|skill| Skill {
            id: bounded(&skill.id, 64),
            name: bounded(&skill.name, 128),
            description: bounded(&skill.description, 1_000),
            tags: skill.tags.iter().take(16).map(|t| bounded(t, 64)).collect(),
            examples: few(skill.examples.as_deref()),
            input_modes: few(skill.input_modes.as_deref()),
            output_modes: few(skill.output_modes.as_deref()),
        })
        .collect();
    ours.capabilities = ours.skills.iter().map(|skill| skill.id.clone()).collect();
    ours.metadata
        .insert(CARD_URL_KEY.to_owned(), Value::String(card_url.to_owned()));
    if !remote.route_skills {
        ours.metadata.insert(
            switchboard_proto::registry::ROUTES_SKILLS_KEY.to_owned(),
            Value::Bool(false),
        );
    }
    ours.metadata.insert(
        "a2a_name".to_owned(),
        Value::String(printable(&card.name, 128)),
    );
    ours.metadata.insert(
        "a2a_version".to_owned(),
        Value::String(printable(&card.version, 64)),
    );
    // The directory takes cards of at most 16 KiB: the last skills give way until it fits
    // (with room for JSON escaping the byte counts above do not see).
    let fits = |card: &AgentCard| {
        serde_json::to_vec(card)
            .is_ok_and(|json| json.len() + 1024 <= switchboard_proto::MAX_CARD_BYTES)
    };
    while !fits(&ours) && ours.skills.pop().is_some() {
        ours.capabilities.pop();
    }
    ours.strip_control();
    ours
}

/// Remote text fit for an error message on a terminal: no control characters (escape
/// sequences), at most `max` bytes.
pub(crate) fn printable(text: &str, max: usize) -> String {
    let clean: String = text.chars().filter(|c| !c.is_control()).collect();
    bounded(&clean, max)
}

/// At most `max` bytes of `text`, cut at a character boundary (a remote's card is not trusted
/// to be small).
pub(crate) fn bounded(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

fn few(list: Option<&[String]>) -> Vec<String> {
    list.unwrap_or_default()
        .iter()
        .take(16)
        .map(|item| bounded(item, 256))
        .collect()
}

impl RemoteError {
    /// A failure of the `a2a_remotes` bucket.
    pub(crate) fn store(err: async_nats::Error) -> Self {
        Self::Store(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_proto::GoalId;

    fn card(interfaces: &[(&str, &str, &str)]) -> A2aCard {
        let interfaces: Vec<Value> = interfaces
            .iter()
            .map(|(binding, version, url)| {
                serde_json::json!({"url": url, "protocolBinding": binding, "protocolVersion": version})
            })
            .collect();
        let Ok(card) = serde_json::from_value(serde_json::json!({
            "name": "Echo Agent!", "description": "echoes", "version": "1.0",
            "supportedInterfaces": interfaces, "capabilities": {"streaming": true},
            "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
            "skills": [{"id": "echo", "name": "echo", "description": "echo", "tags": ["x"],
                        "examples": ["say hi"]}]
        })) else {
            panic!("a valid card")
        };
        card
    }

    #[test]
    fn the_jsonrpc_url_must_be_on_the_card_urls_origin() {
        let url = "http://127.0.0.1:8080/.well-known/agent-card.json";
        let ok = card(&[
            ("GRPC", "1.0", "http://127.0.0.1:8080/grpc"),
            ("JSONRPC", "1.0", "http://127.0.0.1:8080/rpc"),
        ]);
        assert_eq!(
            jsonrpc_url(&ok, url).ok().as_deref(),
            Some("http://127.0.0.1:8080/rpc")
        );
        let relative = card(&[("JSONRPC", "1.0", "/a2a")]);
        assert_eq!(
            jsonrpc_url(&relative, url).ok().as_deref(),
            Some("http://127.0.0.1:8080/a2a")
        );
        for elsewhere in [
            "http://169.254.169.254/latest",
            "http://127.0.0.1:9090/rpc",
            "http://user:pw@127.0.0.1:8080/rpc",
            "file:///etc/passwd",
        ] {
            let bad = card(&[("JSONRPC", "1.0", elsewhere)]);
            assert!(
                jsonrpc_url(&bad, url).is_err(),
                "{elsewhere} must be refused"
            );
        }
        let old = card(&[("JSONRPC", "0.3", "http://127.0.0.1:8080/rpc")]);
        assert!(jsonrpc_url(&old, url).is_err(), "protocol 0.3 is not 1.x");
    }

    #[test]
    fn card_urls_are_http_or_https_without_credentials() {
        assert!(check_card_url("http://agent.example/card.json").is_ok());
        assert!(check_card_url("https://agent.example/card.json").is_ok());
        for bad in ["ftp://x/card", "http://u:p@x/card", "card.json"] {
            assert!(check_card_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_come_from_names_and_never_name_a_client() {
        assert_eq!(
            agent_id_from_name("Echo Agent!").map(|id| id.to_string()),
            Some("echo-agent".to_owned())
        );
        assert!(agent_id_from_name("!!!").is_none());
        assert!(agent_id_from_name("A2A planner").is_none());
        assert!(check_id("a2a-x").is_err());
        assert_eq!(
            agent_id_from_name(&"x".repeat(500)).map(|id| id.as_str().len()),
            Some(64)
        );
    }

    #[test]
    fn a_remote_card_becomes_a_bounded_directory_card() {
        let Ok(id) = AgentId::parse("echo") else {
            panic!("valid id")
        };
        let mut remote = card(&[("JSONRPC", "1.0", "/")]);
        remote.description = "é".repeat(5_000);
        let ours = fabric_card(&record(&id), &remote);
        assert!(ours.description.len() <= 1_000);
        // 64 skills of 1,000-byte descriptions do not fit a directory card: some give way.
        let mut big = remote.clone();
        big.skills = (0..64)
            .map(|n| {
                let mut skill = remote.skills[0].clone();
                skill.id = format!("s{n}");
                skill.description = "d".repeat(1_000);
                skill
            })
            .collect();
        let fitted = fabric_card(&record(&id), &big);
        let size = serde_json::to_vec(&fitted).map_or(usize::MAX, |json| json.len());
        assert!(size <= switchboard_proto::MAX_CARD_BYTES, "{size}");
        assert!(!fitted.skills.is_empty() && fitted.skills.len() < 64);
        assert_eq!(fitted.skills.len(), fitted.capabilities.len());
        assert_eq!(ours.capabilities, ["echo"]);
        assert_eq!(ours.skills[0].examples, ["say hi"]);
        assert_eq!(ours.metadata[CARD_URL_KEY], "http://h/card");
    }

    fn record(id: &AgentId) -> RemoteAgent {
        RemoteAgent {
            agent_id: id.clone(),
            card_url: "http://h/card".to_owned(),
            goal_id: GoalId::default(),
            added_at: switchboard_proto::timestamp::now(),
            skills: None,
            route_skills: true,
        }
    }

    /// Issue 26, item 3: a remote's card that gains a skill after `add` does not get its work,
    /// and a remote the operator did not open to routing lists its skills but is not routed.
    #[test]
    fn a_remotes_skills_are_pinned_and_routed_only_when_opened() {
        let Ok(id) = AgentId::parse("echo") else {
            panic!("valid id")
        };
        let mut later = card(&[("JSONRPC", "1.0", "/")]);
        let mut gained = later.skills[0].clone();
        gained.id = "translate".to_owned();
        later.skills.push(gained);
        let pinned = RemoteAgent {
            skills: Some(vec!["echo".to_owned()]),
            ..record(&id)
        };
        let ours = fabric_card(&pinned, &later);
        assert!(ours.routes_skill("echo"));
        assert!(!ours.has_skill("translate"), "a skill gained after add");
        let closed = RemoteAgent {
            route_skills: false,
            ..pinned
        };
        let ours = fabric_card(&closed, &later);
        assert!(ours.has_skill("echo") && !ours.routes_skill("echo"));
    }

    /// Issue 26, item 7: a remote card's text reached every agent with terminal escape codes.
    #[test]
    fn a_remote_cards_escape_codes_are_taken_out() {
        let Ok(id) = AgentId::parse("echo") else {
            panic!("valid id")
        };
        let mut remote = card(&[("JSONRPC", "1.0", "/")]);
        remote.name = "\u{1b}]0;owned\u{7}Echo".to_owned();
        remote.description = "line one\n\u{1b}[2J\u{1b}[31mred\u{9b}31m".to_owned();
        remote.skills[0].name = "say\u{1b}[8m hidden".to_owned();
        remote.skills[0].description = "tab\tok\u{0}".to_owned();
        let ours = fabric_card(&record(&id), &remote);
        let text = serde_json::to_string(&ours).unwrap_or_default();
        assert!(
            !text.contains("\\u001b") && !text.contains('\u{9b}'),
            "{text}"
        );
        assert_eq!(ours.description, "line one\n[2J[31mred31m");
        assert_eq!(ours.skills[0].name, "say[8m hidden");
        assert_eq!(ours.skills[0].description, "tab\tok");
        assert_eq!(ours.metadata["a2a_name"], "]0;ownedEcho");
    }
}
