//! Who may talk to whom: the sender's `can_talk_to` / `deny_talk_to` globs and the receiver's
//! `allow_from` globs. Deny beats allow. Globs support `*` (any run) and `?` (one character).
//!
//! Pure functions, shared by the directory (list_peers `reachable`) and the send path, so both
//! always agree.

use wildmatch::WildMatch;

use crate::registry::AgentCard;

/// True when `pattern` (a glob) matches `agent_id`.
pub fn glob_matches(pattern: &str, agent_id: &str) -> bool {
    WildMatch::new(pattern).matches(agent_id)
}

fn first_match<'a>(patterns: &'a [String], agent_id: &str) -> Option<&'a str> {
    patterns
        .iter()
        .map(String::as_str)
        .find(|p| glob_matches(p, agent_id))
}

/// Why a pair may not talk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// The sender's `deny_talk_to` names the receiver.
    SenderDenies {
        /// The first deny glob that matched the receiver, quoted in the unreachable reason.
        pattern: String,
    },
    /// The sender's `can_talk_to` does not name the receiver.
    SenderNotAllowed,
    /// The receiver's `allow_from` does not name the sender.
    ReceiverRefuses,
}

impl Denial {
    /// The unreachable reason an agent (and its LLM) reads.
    pub fn reason(&self, from: &str, to: &str) -> String {
        match self {
            Self::SenderDenies { pattern } => {
                format!("`{from}` may not talk to `{to}` (deny_talk_to `{pattern}`)")
            }
            Self::SenderNotAllowed => {
                format!("`{from}` may not talk to `{to}` (not in can_talk_to)")
            }
            Self::ReceiverRefuses => format!("`{to}` does not accept messages from `{from}`"),
        }
    }
}

/// Checks whether `from` may send to `to`: sender deny first (deny beats allow), then sender
/// allow, then the receiver's `allow_from`.
pub fn check(from: &AgentCard, to: &AgentCard) -> Result<(), Denial> {
    let to_id = to.agent_id.as_str();
    if let Some(pattern) = first_match(&from.deny_talk_to, to_id) {
        return Err(Denial::SenderDenies {
            pattern: pattern.to_owned(),
        });
    }
    if first_match(&from.can_talk_to, to_id).is_none() {
        return Err(Denial::SenderNotAllowed);
    }
    if first_match(&to.allow_from, from.agent_id.as_str()).is_none() {
        return Err(Denial::ReceiverRefuses);
    }
    Ok(())
}

/// Whether `from` may reach a person or a role (docs/protocol.md §14): the same three steps as
/// between agents, with the party's full id (`person:alice`, `role:oncall`) matched against
/// the sender's `deny_talk_to` and `can_talk_to`, and the sender's id against the party's
/// `allow_from` (for a role, the role's own, not its members').
pub fn check_party(from: &AgentCard, to: &str, allow_from: &[String]) -> Result<(), Denial> {
    if let Some(pattern) = first_match(&from.deny_talk_to, to) {
        return Err(Denial::SenderDenies {
            pattern: pattern.to_owned(),
        });
    }
    if first_match(&from.can_talk_to, to).is_none() {
        return Err(Denial::SenderNotAllowed);
    }
    if first_match(allow_from, from.agent_id.as_str()).is_none() {
        return Err(Denial::ReceiverRefuses);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::AgentId;

    fn card(id: &str) -> AgentCard {
        AgentCard::new(AgentId::parse(id).unwrap())
    }

    #[test]
    fn globs() {
        assert!(glob_matches("*", "anyone"));
        assert!(glob_matches("research*", "researcher"));
        assert!(glob_matches("agent-?", "agent-7"));
        assert!(!glob_matches("agent-?", "agent-77"));
        assert!(!glob_matches("writer", "writers"));
    }

    #[test]
    fn open_cards_talk() {
        assert_eq!(check(&card("a"), &card("b")), Ok(()));
    }

    #[test]
    fn deny_beats_allow() {
        let mut a = card("a");
        a.can_talk_to = vec!["w*".into()];
        a.deny_talk_to = vec!["writer".into()];
        assert_eq!(
            check(&a, &card("writer")),
            Err(Denial::SenderDenies {
                pattern: "writer".into()
            })
        );
        assert_eq!(check(&a, &card("wiki")), Ok(()));
        assert_eq!(check(&a, &card("other")), Err(Denial::SenderNotAllowed));
    }

    #[test]
    fn parties_follow_the_same_steps() {
        let mut a = card("deployer");
        assert_eq!(check_party(&a, "person:alice", &["*".into()]), Ok(()));
        assert_eq!(
            check_party(&a, "person:alice", &["ops-*".into()]),
            Err(Denial::ReceiverRefuses)
        );
        a.deny_talk_to = vec!["person:*".into()];
        assert!(matches!(
            check_party(&a, "person:alice", &["*".into()]),
            Err(Denial::SenderDenies { .. })
        ));
        assert_eq!(check_party(&a, "role:oncall", &["*".into()]), Ok(()));
        a.can_talk_to = vec!["writer".into()];
        assert_eq!(
            check_party(&a, "role:oncall", &["*".into()]),
            Err(Denial::SenderNotAllowed)
        );
    }

    #[test]
    fn receiver_allow_from() {
        let mut b = card("b");
        b.allow_from = vec!["coord*".into()];
        assert_eq!(check(&card("a"), &b), Err(Denial::ReceiverRefuses));
        assert_eq!(check(&card("coordinator"), &b), Ok(()));
        b.allow_from = vec![];
        assert_eq!(
            check(&card("coordinator"), &b),
            Err(Denial::ReceiverRefuses)
        );
        assert_eq!(
            Denial::ReceiverRefuses.reason("y", "x"),
            "`x` does not accept messages from `y`"
        );
    }
}
