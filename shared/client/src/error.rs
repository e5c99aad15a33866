//! Client errors.

use switchboard_proto::{ErrorKind, ErrorReply};

/// What went wrong talking to the fabric.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An agent or goal id is invalid.
    #[error(transparent)]
    InvalidId(#[from] switchboard_proto::IdError),
    /// Connecting to NATS failed.
    #[error("connecting to NATS: {0}")]
    Connect(String),
    /// The connection's reply inboxes are not the agent's own (`_INBOX.<agent_id>`): build it
    /// with `agent_connect_options`.
    #[error(
        "agent `{agent}` must use the reply inbox prefix `{expected}` (its connection makes `{got}`); build the connection with switchboard_client::agent_connect_options"
    )]
    InboxPrefix {
        /// The agent the connection was built for.
        agent: String,
        /// `_INBOX.<agent_id>`.
        expected: String,
        /// A reply inbox the connection made, showing the prefix it uses instead.
        got: String,
    },
    /// No service answers on the subject (is `switchboard up` running?).
    #[error("no service answers on {subject}; is the service running?")]
    NoResponders {
        /// The request subject nobody subscribes to.
        subject: String,
    },
    /// The request timed out.
    #[error("request to {subject} timed out")]
    Timeout {
        /// The request subject that gave no reply within the request timeout.
        subject: String,
    },
    /// NATS failed the request.
    #[error("request to {subject}: {message}")]
    Request {
        /// The request subject whose send or reply failed.
        subject: String,
        /// Why.
        message: String,
    },
    /// The service answered with an error reply.
    #[error("{0}")]
    Service(ErrorReply),
    /// The reply did not decode.
    #[error("decoding the reply from {subject}: {message}")]
    Decode {
        /// The request subject whose reply did not decode (for a KV read: `<bucket>/<key>`).
        subject: String,
        /// Why.
        message: String,
    },
    /// Reading or acknowledging the inbox failed.
    #[error("inbox: {0}")]
    Inbox(String),
}

impl ClientError {
    /// The service error kind, when the service answered with an error reply.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            Self::Service(reply) => Some(reply.kind()),
            _ => None,
        }
    }
}

impl From<switchboard_request::request::RequestFailure> for ClientError {
    fn from(failure: switchboard_request::request::RequestFailure) -> Self {
        use switchboard_request::request::RequestFailure;
        match failure {
            RequestFailure::NoResponders { subject } => Self::NoResponders { subject },
            RequestFailure::Timeout { subject } => Self::Timeout { subject },
            RequestFailure::Service(reply) => Self::Service(reply),
            RequestFailure::Other { subject, message } => Self::Request { subject, message },
        }
    }
}
