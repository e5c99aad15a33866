//! Directory errors, named after the step that failed, and their stable error kinds.

use switchboard_proto::{AgentId, ErrorKind, ErrorReply, GoalId, IdError};

/// Why a directory request failed.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// The body is not a JSON object or does not describe a valid card.
    #[error("invalid card: {0}")]
    InvalidCard(String),
    /// The body names another agent than the subject.
    #[error("the body names agent `{body}` but the request came from `{caller}`")]
    IdentityMismatch {
        /// Identity from the subject.
        caller: AgentId,
        /// Identity claimed in the body.
        body: String,
    },
    /// An agent id in the body is invalid.
    #[error(transparent)]
    InvalidAgentId(#[from] IdError),
    /// A heartbeat tried to set `offline`.
    #[error("a heartbeat cannot set status `offline`; use deregister")]
    HeartbeatOffline,
    /// A heartbeat's `current_tasks` is longer than the card's `max_concurrent_tasks`, or an
    /// entry is too long.
    #[error("{0}")]
    BadHeartbeat(String),
    /// The caller is not registered.
    #[error("agent `{0}` is not registered")]
    NotRegistered(AgentId),
    /// The agent asked about is not registered.
    #[error("agent `{0}` is not registered")]
    UnknownAgent(AgentId),
    /// The caller has no such goal.
    #[error("agent `{agent}` has no open goal `{goal}`")]
    UnknownGoal {
        /// The caller.
        agent: AgentId,
        /// The goal.
        goal: GoalId,
    },
    /// The goal id is already used by another agent's inbox.
    #[error("goal `{goal}` belongs to another agent")]
    GoalOwnedElsewhere {
        /// The goal.
        goal: GoalId,
    },
    /// A goal id of the A2A gateway's context form (UUID version 8) opened by an agent that is
    /// not an A2A client's (`a2a-…`).
    #[error(
        "goal `{goal}` has the form of an A2A client's context goal (UUID version 8): only \
         `a2a-` agents open those"
    )]
    ReservedGoal {
        /// The goal.
        goal: GoalId,
    },
    /// A named goal's request that does not hold together: a bad name, a name with a
    /// `goal_id`, or a `goal_id` of the named form (version 5) given directly.
    #[error("{0}")]
    BadGoalName(String),
    /// The id is reserved for a service's own agent (`people`, whose messages carry persons'
    /// answers).
    #[error("`{0}` is reserved for the people service; register under another id")]
    ReservedId(AgentId),
    /// A remote A2A agent's card (`metadata.a2a_card_url`) registered under an id that is a
    /// Switchboard agent's: keyed in the agents file, or registered by the agent itself.
    #[error("`{agent}` {why}: a remote A2A agent's card cannot be registered under it")]
    NotForRemotes {
        /// The caller.
        agent: AgentId,
        /// Whose id it is.
        why: &'static str,
    },
    /// The caller holds the most live goals allowed; close one first.
    #[error("you already hold {cap} live goals, the most allowed; close one first")]
    TooManyGoals {
        /// `max_goals_per_agent`.
        cap: usize,
    },
    /// Compare-and-set kept losing to concurrent writers.
    #[error("too much concurrent change to `{key}`; retry")]
    Contention {
        /// The contended key.
        key: String,
    },
    /// No agent fits a `skill:<name>` message.
    #[error("no reachable agent has skill `{skill}`{why}")]
    NoSkill {
        /// The skill asked for.
        skill: String,
        /// Why those that list it do not fit, when some do (`: 2 at their task cap`).
        why: String,
    },
    /// A JetStream/KV call failed.
    #[error("{step}: {source}")]
    Store {
        /// What we were doing.
        step: &'static str,
        /// The underlying error.
        #[source]
        source: async_nats::Error,
    },
    /// A stored record does not decode (a bug or a foreign writer).
    #[error("corrupt record `{key}`: {message}")]
    CorruptRecord {
        /// The key.
        key: String,
        /// The decode error.
        message: String,
    },
}

impl DirectoryError {
    /// Wraps a store error with the step that failed.
    pub fn store(step: &'static str, err: impl Into<async_nats::Error>) -> Self {
        Self::Store {
            step,
            source: err.into(),
        }
    }

    /// The stable kind callers match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidCard(_)
            | Self::HeartbeatOffline
            | Self::BadHeartbeat(_)
            | Self::BadGoalName(_) => ErrorKind::BadRequest,
            Self::IdentityMismatch { .. } => ErrorKind::IdentityMismatch,
            Self::InvalidAgentId(IdError::GoalId(_)) => ErrorKind::InvalidGoalId,
            Self::InvalidAgentId(_) => ErrorKind::InvalidAgentId,
            Self::NotRegistered(_) => ErrorKind::NotRegistered,
            Self::UnknownAgent(_) | Self::UnknownGoal { .. } => ErrorKind::NotFound,
            Self::GoalOwnedElsewhere { .. }
            | Self::ReservedGoal { .. }
            | Self::Contention { .. } => ErrorKind::Conflict,
            Self::NotForRemotes { .. } | Self::ReservedId(_) => ErrorKind::NotAllowed,
            Self::TooManyGoals { .. } => ErrorKind::TooManyGoals,
            Self::NoSkill { .. } => ErrorKind::Unreachable,
            Self::Store { .. } => ErrorKind::Unavailable,
            Self::CorruptRecord { .. } => ErrorKind::Internal,
        }
    }
}

impl From<switchboard_runtime::store::StoreError> for DirectoryError {
    fn from(err: switchboard_runtime::store::StoreError) -> Self {
        match err {
            switchboard_runtime::store::StoreError::Unavailable { step, source } => {
                Self::Store { step, source }
            }
            switchboard_runtime::store::StoreError::Corrupt(key) => Self::CorruptRecord {
                key,
                message: "not an agent record".to_owned(),
            },
        }
    }
}

impl From<DirectoryError> for ErrorReply {
    fn from(err: DirectoryError) -> Self {
        ErrorReply::new(err.kind(), err.to_string())
    }
}
