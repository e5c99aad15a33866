//! The catalogue of agent-facing request subjects: which subjects an agent publishes to reach
//! a service, how long each may take to answer, and which may answer more than once. The
//! generated NATS accounts (`switchboard nats-config`) export, import and grant exactly these.

use crate::audit::AuditOp;
use crate::ids::AgentId;
use crate::subject::{
    CALL_PREFIX, CALLS_PARTS_PREFIX, CALLS_PENDING_PREFIX, INBOX_ACK_PREFIX, INBOX_FETCH_PREFIX,
    REPLY_PREFIX, RegistryOp, SEND_PREFIX, SEND_STATUS_PREFIX,
};
use crate::task::TaskRequestOp;

/// One family of agent-facing request subjects: what an agent publishes to reach a service.
/// The generated NATS config exports and imports exactly these, and grants each agent publish
/// rights on exactly its own ones, so the permissions and the services never disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEndpoint {
    /// The subject without the caller token (`agent.send`), or the whole subject when
    /// [`AgentEndpoint::by_caller`] is false (`agent.audit.verify`).
    pub prefix: String,
    /// Whether the subject ends with the caller's id (every request but the audit queries).
    pub by_caller: bool,
    /// Whether the service may answer more than once (audit export chunks, a streamed call's
    /// parts).
    pub streamed: bool,
    /// How long the service may take to answer, in ms: the longest a request may be held
    /// (a waiting call's maximum timeout, a long-poll fetch), plus a margin.
    pub answer_within_ms: u64,
    /// Whether only agents granted audit access may publish it.
    pub audit: bool,
}

impl AgentEndpoint {
    fn by_caller(prefix: impl Into<String>, answer_within_ms: u64) -> Self {
        Self {
            prefix: prefix.into(),
            by_caller: true,
            streamed: false,
            answer_within_ms,
            audit: false,
        }
    }

    /// The subject `agent` publishes to (the prefix itself for an audit query).
    pub fn subject_for(&self, agent: &AgentId) -> String {
        if self.by_caller {
            format!("{}.{agent}", self.prefix)
        } else {
            self.prefix.clone()
        }
    }

    /// The subject as exported by the services' account: `<prefix>.*` for a per-caller one.
    pub fn export_subject(&self) -> String {
        if self.by_caller {
            format!("{}.*", self.prefix)
        } else {
            self.prefix.clone()
        }
    }
}

/// A request answered at once (no holding), with a margin for a busy cluster.
const ANSWER_WITHIN_MS: u64 = 60_000;

/// Every agent-facing request subject (docs/protocol.md §3): the directory's ops, send, call,
/// reply, pending calls, inbox fetch and ack, the task ops and the audit queries.
pub fn agent_endpoints() -> Vec<AgentEndpoint> {
    let mut all: Vec<AgentEndpoint> = RegistryOp::ALL
        .iter()
        .map(|op| AgentEndpoint::by_caller(op.prefix(), ANSWER_WITHIN_MS))
        .collect();
    all.push(AgentEndpoint::by_caller(SEND_PREFIX, ANSWER_WITHIN_MS));
    all.push(AgentEndpoint::by_caller(
        SEND_STATUS_PREFIX,
        ANSWER_WITHIN_MS,
    ));
    // A call may answer several times: a streamed answer's parts, then the answer.
    all.push(AgentEndpoint {
        streamed: true,
        ..AgentEndpoint::by_caller(
            CALL_PREFIX,
            crate::names::CALL_TIMEOUT_MAX_MS + ANSWER_WITHIN_MS,
        )
    });
    all.push(AgentEndpoint::by_caller(REPLY_PREFIX, ANSWER_WITHIN_MS));
    all.push(AgentEndpoint::by_caller(
        CALLS_PENDING_PREFIX,
        ANSWER_WITHIN_MS,
    ));
    all.push(AgentEndpoint::by_caller(
        CALLS_PARTS_PREFIX,
        ANSWER_WITHIN_MS,
    ));
    all.push(AgentEndpoint::by_caller(
        INBOX_FETCH_PREFIX,
        crate::inbox::FETCH_WAIT_MAX_MS + ANSWER_WITHIN_MS,
    ));
    all.push(AgentEndpoint::by_caller(INBOX_ACK_PREFIX, ANSWER_WITHIN_MS));
    all.extend(
        TaskRequestOp::ALL
            .iter()
            .map(|op| AgentEndpoint::by_caller(op.prefix(), ANSWER_WITHIN_MS)),
    );
    all.extend(
        crate::people::PeopleOp::ALL
            .iter()
            .map(|op| AgentEndpoint::by_caller(op.prefix(), ANSWER_WITHIN_MS)),
    );
    // An acquire may wait for its lease.
    all.extend(crate::limits::LimitsOp::ALL.iter().map(|op| {
        let within = match op {
            crate::limits::LimitsOp::Acquire => crate::limits::ACQUIRE_WAIT_MAX_MS,
            _ => 0,
        };
        AgentEndpoint::by_caller(op.prefix(), within + ANSWER_WITHIN_MS)
    }));
    // A read answers with its chunks, then its end.
    all.extend(crate::files::FilesOp::ALL.iter().map(|op| AgentEndpoint {
        streamed: *op == crate::files::FilesOp::Read,
        ..AgentEndpoint::by_caller(op.prefix(), ANSWER_WITHIN_MS)
    }));
    all.extend(
        crate::budget::BudgetOp::ALL
            .iter()
            .map(|op| AgentEndpoint::by_caller(op.prefix(), ANSWER_WITHIN_MS)),
    );
    all.extend(AuditOp::ALL.iter().map(|op| AgentEndpoint {
        prefix: op.subject(),
        by_caller: false,
        streamed: *op == AuditOp::Export,
        answer_within_ms: 5 * ANSWER_WITHIN_MS,
        audit: true,
    }));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_agent_endpoint_is_listed_once() {
        let a = AgentId::parse("writer").unwrap();
        let subjects: Vec<String> = agent_endpoints()
            .iter()
            .map(|e| e.subject_for(&a))
            .collect();
        let unique: std::collections::BTreeSet<&String> = subjects.iter().collect();
        assert_eq!(unique.len(), subjects.len(), "{subjects:?}");
        for wanted in [
            crate::subject::send(&a),
            crate::subject::call(&a),
            crate::subject::reply(&a),
            crate::subject::calls_pending(&a),
            crate::subject::inbox_fetch(&a),
            crate::subject::inbox_ack(&a),
            RegistryOp::GoalOpen.subject(&a),
            TaskRequestOp::Create.subject(&a),
            AuditOp::Export.subject(),
            crate::people::PeopleOp::ApprovalUse.subject(&a),
            crate::budget::BudgetOp::Spend.subject(&a),
            AuditOp::Cost.subject(),
        ] {
            assert!(subjects.contains(&wanted), "{wanted} missing");
        }
        assert!(
            subjects.iter().all(|s| !s.starts_with("_SB.")
                && !s.starts_with("$")
                && s != crate::subject::INBOX_ALL),
            "{subjects:?}"
        );
    }
}
