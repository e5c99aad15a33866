//! An agent card from the command line: a TOML file and/or flags (`register`, `mcp`).

use std::path::PathBuf;

use figment::providers::{Format, Toml};
use switchboard_client::proto::AgentId;
use switchboard_client::proto::registry::{AgentCard, GoalKind};

/// The card flags shared by `switchboard register` and `switchboard mcp`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CardArgs {
    /// The agent card as TOML (description, capabilities, skills, allow_from, can_talk_to,
    /// deny_talk_to, max_concurrent_tasks, metadata); the flags below override it.
    #[arg(long = "card", value_name = "FILE")]
    file: Option<PathBuf>,
    /// What the agent does, for other agents to read in list_peers.
    #[arg(long)]
    description: Option<String>,
    /// A capability label (repeat for more).
    #[arg(long = "capability", value_name = "LABEL")]
    capabilities: Vec<String>,
    /// Agents allowed to message this one, as globs (repeat; default: anyone).
    #[arg(long = "allow-from", value_name = "GLOB")]
    allow_from: Vec<String>,
    /// Agents this one may message, as globs (repeat; default: anyone).
    #[arg(long = "can-talk-to", value_name = "GLOB")]
    can_talk_to: Vec<String>,
    /// Agents this one may never message, as globs (repeat; beats --can-talk-to).
    #[arg(long = "deny-talk-to", value_name = "GLOB")]
    deny_talk_to: Vec<String>,
    /// Tasks the agent works on at once.
    #[arg(long, value_name = "N")]
    max_concurrent_tasks: Option<u32>,
}

impl CardArgs {
    /// The card: the TOML file (if any), then the flags, with the agent id `id`.
    pub fn card(&self, id: &AgentId) -> anyhow::Result<AgentCard> {
        let mut card = match &self.file {
            Some(path) => {
                let mut fields: serde_json::Map<String, serde_json::Value> =
                    figment::Figment::from(Toml::file_exact(path))
                        .extract()
                        .map_err(|err| anyhow::anyhow!("card {}: {err}", path.display()))?;
                fields.insert("agent_id".to_owned(), id.as_str().into());
                serde_json::from_value(serde_json::Value::Object(fields))
                    .map_err(|err| anyhow::anyhow!("card {}: {err}", path.display()))?
            }
            None => AgentCard::new(id.clone()),
        };
        if let Some(description) = &self.description {
            card.description.clone_from(description);
        }
        card.capabilities.extend(self.capabilities.iter().cloned());
        for (flag, field) in [
            (&self.allow_from, &mut card.allow_from),
            (&self.can_talk_to, &mut card.can_talk_to),
            (&self.deny_talk_to, &mut card.deny_talk_to),
        ] {
            if !flag.is_empty() {
                field.clone_from(flag);
            }
        }
        if let Some(max) = self.max_concurrent_tasks {
            card.max_concurrent_tasks = max;
        }
        Ok(card)
    }
}

/// `interactive`, `background` or `daemon`.
pub fn parse_goal_kind(text: &str) -> Result<GoalKind, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("unknown goal kind {text:?} (interactive, background or daemon)"))
}

/// `evict_oldest` or `refuse` (a goal's overflow policy).
pub fn parse_overflow(text: &str) -> Result<switchboard_proto::inbox::Overflow, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("unknown overflow policy {text:?} (evict_oldest or refuse)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_and_the_id_comes_from_the_command() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let path = dir.path().join("card.toml");
        std::fs::write(
            &path,
            "agent_id = \"ignored\"\ndescription = \"from file\"\ncapabilities = [\"search\"]\nallow_from = [\"team-*\"]\nmax_concurrent_tasks = 2\n",
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let args = CardArgs {
            file: Some(path),
            description: Some("from flag".to_owned()),
            capabilities: vec!["write".to_owned()],
            ..CardArgs::default()
        };
        let id = AgentId::parse("writer").unwrap_or_else(|err| panic!("{err}"));
        let card = args.card(&id).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(card.agent_id, id);
        assert_eq!(card.description, "from flag");
        assert_eq!(card.capabilities, ["search", "write"]);
        assert_eq!(card.allow_from, ["team-*"]);
        assert_eq!(card.max_concurrent_tasks, 2);
    }

    #[test]
    fn a_bad_card_file_names_the_file() {
        let args = CardArgs {
            file: Some(PathBuf::from("/nonexistent/card.toml")),
            ..CardArgs::default()
        };
        let id = AgentId::parse("writer").unwrap_or_else(|err| panic!("{err}"));
        let err = args
            .card(&id)
            .err()
            .map(|err| err.to_string())
            .unwrap_or_default();
        assert!(err.contains("/nonexistent/card.toml"), "{err}");
        assert_eq!(parse_goal_kind("daemon"), Ok(GoalKind::Daemon));
        assert!(parse_goal_kind("nap").is_err());
        assert_eq!(
            parse_overflow("refuse"),
            Ok(switchboard_proto::inbox::Overflow::Refuse)
        );
        assert!(parse_overflow("drop").is_err());
    }
}
