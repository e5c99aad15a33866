//! Identifiers (docs/protocol.md §1, "Identifiers").
//!
//! `AgentId` is used as a NATS subject token, so its alphabet excludes dots, spaces, `*` and `>`
//! by construction. Goal, message, correlation and task ids are lowercase hyphenated UUIDs; the
//! ones the services mint are v7 so they sort by creation time.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Longest allowed agent id, in characters.
pub const MAX_AGENT_ID_CHARS: usize = 64;

/// Why an identifier was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The agent id is empty.
    #[error("agent_id is empty")]
    EmptyAgentId,
    /// The agent id is longer than [`MAX_AGENT_ID_CHARS`].
    #[error("agent_id `{0}` is longer than 64 characters")]
    AgentIdTooLong(String),
    /// The agent id contains a character outside `[a-z0-9_-]` or starts with `_`/`-`.
    #[error(
        "agent_id `{0}` is invalid: use 1-64 characters of [a-z0-9_-], starting with a letter or digit"
    )]
    AgentIdCharset(String),
    /// The goal id is not a UUID.
    #[error("goal_id `{0}` is not a UUID")]
    GoalId(String),
}

/// An agent's name: 1–64 chars of `[a-z0-9_-]`, starting with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AgentId(String);

impl AgentId {
    /// Validates `raw` as an agent id.
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        if raw.is_empty() {
            return Err(IdError::EmptyAgentId);
        }
        if raw.chars().count() > MAX_AGENT_ID_CHARS {
            return Err(IdError::AgentIdTooLong(truncate_for_error(raw)));
        }
        let mut chars = raw.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        let rest_ok = raw
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if !first_ok || !rest_ok {
            return Err(IdError::AgentIdCharset(truncate_for_error(raw)));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The id as text (also its subject token).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Keeps error messages bounded when someone sends a megabyte-long "id".
fn truncate_for_error(raw: &str) -> String {
    const KEEP: usize = 80;
    if raw.chars().count() <= KEEP {
        raw.to_owned()
    } else {
        let head: String = raw.chars().take(KEEP).collect();
        format!("{head}…")
    }
}

impl TryFrom<String> for AgentId {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<AgentId> for String {
    fn from(value: AgentId) -> Self {
        value.0
    }
}

impl FromStr for AgentId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for AgentId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for AgentId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for AgentId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// One live run of an agent (interactive session, background job, daemon). A UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GoalId(Uuid);

impl TryFrom<String> for GoalId {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<GoalId> for String {
    fn from(value: GoalId) -> Self {
        value.to_string()
    }
}

impl GoalId {
    /// A fresh, time-ordered goal id (UUID v7).
    pub fn new() -> Self {
        Self(new_id())
    }

    /// Parses a goal id: a UUID in lowercase hyphenated text (the only form on the wire, so
    /// one goal has one subject).
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        match Uuid::try_parse(raw) {
            Ok(uuid) if uuid.hyphenated().to_string() == raw => Ok(Self(uuid)),
            _ => Err(IdError::GoalId(truncate_for_error(raw))),
        }
    }

    /// The underlying UUID.
    pub fn uuid(&self) -> Uuid {
        self.0
    }

    /// Whether this id has the form the A2A gateway gives its clients' context goals: a UUID of
    /// version 8 (made from an HMAC). Only an A2A client's agent (`a2a-…`) may open such a goal
    /// (docs/protocol.md §4.4), so no agent can take a context goal after its client closed
    /// it. The directory mints version 7.
    pub fn is_a2a_context(&self) -> bool {
        self.0.get_version_num() == 8
    }

    /// The goal `agent` opens by `name` (`goal.open` with `name`, docs/protocol.md §4.4): a
    /// UUID of version 5 from the agent id and the name, so the same name always gives the
    /// same goal and a restarted agent resumes it. Only the directory opens ids of this form,
    /// and only for the agent they were made for.
    pub fn named(agent: &AgentId, name: &str) -> Self {
        let key = format!("{agent}/{name}");
        Self(Uuid::new_v5(&GOAL_NAMESPACE, key.as_bytes()))
    }

    /// Whether this id has the form of a named goal (UUID version 5, [`GoalId::named`]).
    pub fn is_named(&self) -> bool {
        self.0.get_version_num() == 5
    }
}

/// The namespace of named goal ids (a fixed, random UUID).
const GOAL_NAMESPACE: Uuid = Uuid::from_u128(0x6f1c_2b7e_9d4a_4c31_8e55_3a0f_b2d9_7c14);

/// The most characters of a goal's name.
pub const GOAL_NAME_MAX: usize = 64;

/// Checks a goal's name: 1–64 characters of `[a-z0-9_.-]`.
pub fn check_goal_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= GOAL_NAME_MAX
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "goal name `{}` is invalid: use 1-{GOAL_NAME_MAX} characters of [a-z0-9_.-]",
            name.chars().take(80).collect::<String>()
        ))
    }
}

impl Default for GoalId {
    fn default() -> Self {
        Self::new()
    }
}

impl From<Uuid> for GoalId {
    fn from(value: Uuid) -> Self {
        Self(value)
    }
}

impl FromStr for GoalId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for GoalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Lowercase hyphenated, the wire form.
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

/// A fresh time-ordered id (UUID v7) for messages, correlations, tasks, events.
pub fn new_id() -> Uuid {
    Uuid::now_v7()
}

/// The prefix of a person's id.
pub const PERSON_PREFIX: &str = "person:";
/// The prefix of a role's id.
pub const ROLE_PREFIX: &str = "role:";

/// A person or a role: whom an agent addresses (`person:alice`, `role:oncall`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Party {
    /// One person.
    Person(AgentId),
    /// Everyone holding a role: the first member to answer answers.
    Role(AgentId),
}

/// Why a `to` is not a party.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartyError {
    /// Neither `person:` nor `role:`.
    #[error("`to` must be person:<id> or role:<name>, not `{0}`")]
    NotAParty(String),
    /// The part after the prefix breaks the agent-id rule.
    #[error(
        "`{0}` is not a valid person or role: after the prefix use 1-64 characters of [a-z0-9_-]"
    )]
    Invalid(String),
}

impl Party {
    /// Parses `person:<id>` or `role:<id>`.
    pub fn parse(raw: &str) -> Result<Self, PartyError> {
        let shown = || raw.chars().take(80).collect::<String>();
        let (local, person) = if let Some(local) = raw.strip_prefix(PERSON_PREFIX) {
            (local, true)
        } else if let Some(local) = raw.strip_prefix(ROLE_PREFIX) {
            (local, false)
        } else {
            return Err(PartyError::NotAParty(shown()));
        };
        let id = AgentId::parse(local).map_err(|_| PartyError::Invalid(shown()))?;
        Ok(if person {
            Self::Person(id)
        } else {
            Self::Role(id)
        })
    }

    /// Whether `raw` names a person or a role (by its prefix), valid or not: what the SDKs
    /// route to `note` instead of `send`.
    pub fn looks_like(raw: &str) -> bool {
        raw.starts_with(PERSON_PREFIX) || raw.starts_with(ROLE_PREFIX)
    }

    /// The local part (`alice` of `person:alice`).
    pub fn local(&self) -> &AgentId {
        match self {
            Self::Person(id) | Self::Role(id) => id,
        }
    }

    /// The subject-safe spelling: `person.alice`, `role.oncall`.
    pub fn token(&self) -> String {
        match self {
            Self::Person(id) => format!("person.{id}"),
            Self::Role(id) => format!("role.{id}"),
        }
    }

    /// Whether this is a person (not a role).
    pub fn is_person(&self) -> bool {
        matches!(self, Self::Person(_))
    }
}

impl fmt::Display for Party {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Person(id) => write!(f, "{PERSON_PREFIX}{id}"),
            Self::Role(id) => write!(f, "{ROLE_PREFIX}{id}"),
        }
    }
}

impl TryFrom<String> for Party {
    type Error = PartyError;
    fn try_from(raw: String) -> Result<Self, Self::Error> {
        Self::parse(&raw)
    }
}

impl From<Party> for String {
    fn from(party: Party) -> Self {
        party.to_string()
    }
}

impl schemars::JsonSchema for Party {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Party".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^(person|role):[a-z0-9][a-z0-9_-]{0,63}$",
            "description": "A person (`person:alice`) or a role (`role:oncall`, answered by the first of its members).",
        })
    }
}

/// An agent id's schema: a string of 1–64 characters of `[a-z0-9_-]`, starting with a letter
/// or digit.
impl schemars::JsonSchema for AgentId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AgentId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$",
            "description": "An agent's name: 1-64 characters of [a-z0-9_-], starting with a letter or digit (used as a NATS subject token).",
        })
    }
}

/// A goal id's schema: a lowercase hyphenated UUID.
impl schemars::JsonSchema for GoalId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "GoalId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "format": "uuid",
            "description": "A goal: a lowercase hyphenated UUID.",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_ids_follow_the_contract() {
        for ok in [
            "a",
            "researcher",
            "agent-7",
            "0day",
            "a_b-c",
            &"x".repeat(64),
        ] {
            assert!(AgentId::parse(ok).is_ok(), "{ok} should be valid");
        }
        assert_eq!(AgentId::parse(""), Err(IdError::EmptyAgentId));
        assert!(matches!(
            AgentId::parse(&"x".repeat(65)),
            Err(IdError::AgentIdTooLong(_))
        ));
        for bad in [
            "a.b", "*", ">", "a b", "-lead", "_lead", "Upper", "é", "a\n",
        ] {
            assert!(
                matches!(AgentId::parse(bad), Err(IdError::AgentIdCharset(_))),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn agent_id_deserialization_validates() {
        let ok: AgentId = serde_json::from_str("\"writer\"").unwrap();
        assert_eq!(ok, "writer");
        assert!(serde_json::from_str::<AgentId>("\"a.b\"").is_err());
    }

    #[test]
    fn goal_ids_are_lowercase_uuids() {
        let id = GoalId::new();
        let text = id.to_string();
        assert_eq!(text, text.to_lowercase());
        assert_eq!(GoalId::parse(&text).unwrap(), id);
        assert!(GoalId::parse("not-a-uuid").is_err());
        // One goal, one spelling: uppercase, simple and braced forms are refused.
        assert!(GoalId::parse(&text.to_uppercase()).is_err());
        assert!(GoalId::parse(&text.replace('-', "")).is_err());
        assert!(GoalId::parse(&format!("{{{text}}}")).is_err());
        assert_eq!(new_id().get_version_num(), 7);
        // Minted ids are never of the A2A gateway's context form (version 8).
        assert!(!id.is_a2a_context());
        let context = uuid::Builder::from_custom_bytes([7; 16]).into_uuid();
        assert!(GoalId::from(context).is_a2a_context());
    }
}
