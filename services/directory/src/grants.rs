//! Skill grants (docs/protocol.md §8, "Skill routing"): who may be routed `skill:<name>`
//! work. A card lists what its agent says it can do, and anyone who registers writes it; where
//! the operator manages identities (the generated NATS accounts), the operator also says which
//! skills each agent may serve — `skills` in `agents.toml`, written by `switchboard
//! nats-config` to `skill-grants.json` and named by `directory.skill_grants_file`. Then an
//! agent of that file is routed only the skills granted to it (and listed on its card). An
//! agent not in the file cannot sign in as itself, so only a service registered it: a remote
//! A2A agent, whose card the gateway writes from what the operator pinned. Without the file
//! (the open laptop mode) a card's skills are taken as they are.
//!
//! The file is read at start and again when it changes (checked at most every 2 s), so
//! `nats-config` after an edit takes effect without a restart.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// How often the file's modification time is looked at.
const CHECK_EVERY: Duration = Duration::from_secs(2);

type Table = HashMap<String, BTreeSet<String>>;

/// The grants, from `directory.skill_grants_file` (none: every card is taken at its word).
#[derive(Debug, Default)]
pub struct Grants {
    path: Option<PathBuf>,
    loaded: Mutex<Loaded>,
}

#[derive(Debug, Default)]
struct Loaded {
    table: Arc<Table>,
    modified: Option<SystemTime>,
    checked: Option<Instant>,
}

impl Grants {
    /// Grants read from `path`; an unreadable or malformed file is refused (a directory that
    /// started without its grants would route to anyone who claims a skill).
    pub fn open(path: Option<PathBuf>) -> Result<Self, String> {
        let grants = Self {
            path,
            loaded: Mutex::default(),
        };
        if let Some(path) = &grants.path {
            let (table, modified) = read(path)?;
            let mut loaded = grants.lock();
            loaded.table = Arc::new(table);
            loaded.modified = modified;
            loaded.checked = Some(Instant::now());
        }
        Ok(grants)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether routing may give `agent` work for `skill` (its card lists it: checked apart).
    pub fn allows(&self, agent: &str, skill: &str) -> bool {
        let Some(table) = self.table() else {
            return true;
        };
        table
            .get(agent)
            .is_none_or(|granted| granted.contains(skill))
    }

    /// The table now (re-read when the file changed), `None` without a grants file.
    fn table(&self) -> Option<Arc<Table>> {
        let path = self.path.as_ref()?;
        let mut loaded = self.lock();
        let due = loaded
            .checked
            .is_none_or(|checked| checked.elapsed() >= CHECK_EVERY);
        if due {
            loaded.checked = Some(Instant::now());
            let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
            if modified != loaded.modified {
                match read(path) {
                    Ok((table, modified)) => {
                        tracing::info!(file = %path.display(), agents = table.len(), "skill grants read");
                        loaded.table = Arc::new(table);
                        loaded.modified = modified;
                    }
                    // The grants in force stay: a half-written file grants nobody more.
                    Err(err) => {
                        tracing::warn!(error = %err, "skill grants not re-read; keeping the last ones")
                    }
                }
            }
        }
        Some(Arc::clone(&loaded.table))
    }
}

impl Grants {
    /// Whether `agent` is listed in the grants file: an agent of `agents.toml`, which signs in
    /// with an NKey of its own (false without a file). A remote A2A agent never takes such an
    /// id (docs/a2a.md, "Outbound").
    pub fn lists(&self, agent: &str) -> bool {
        self.table().is_some_and(|table| table.contains_key(agent))
    }
}

fn read(path: &PathBuf) -> Result<(Table, Option<SystemTime>), String> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let text = std::fs::read(path)
        .map_err(|err| format!("reading skill grants {}: {err}", path.display()))?;
    let table: Table = serde_json::from_slice(&text)
        .map_err(|err| format!("skill grants {}: {err}", path.display()))?;
    Ok((table, modified))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_file_every_card_counts_and_with_one_only_grants_do() {
        assert!(Grants::default().allows("anyone", "translate"));
        let dir = std::env::temp_dir().join(format!("grants-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let path = dir.join("skill-grants.json");
        std::fs::write(&path, r#"{"alice": ["translate"], "mallory": []}"#).unwrap_or_default();
        let grants = Grants::open(Some(path.clone())).unwrap_or_default();
        assert!(grants.allows("alice", "translate"));
        assert!(!grants.allows("alice", "summarize"));
        assert!(
            !grants.allows("mallory", "translate"),
            "listed, granted nothing"
        );
        assert!(
            grants.allows("remote-echo", "translate"),
            "not a signed-in agent"
        );
        std::fs::write(&path, "not json").unwrap_or_default();
        assert!(Grants::open(Some(path)).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Rewrites `path` with `text` and moves its modification time on, as an operator's edit
    /// does (two writes within the file system's timestamp granularity would look unchanged).
    fn edit(path: &PathBuf, text: &str, seconds_later: u64) {
        std::fs::write(path, text).unwrap_or_default();
        let at = SystemTime::now() + std::time::Duration::from_secs(seconds_later);
        if let Ok(file) = std::fs::File::options().write(true).open(path) {
            let _ = file.set_modified(at);
        }
    }

    #[test]
    fn an_edited_grants_file_is_read_again_and_a_broken_edit_keeps_the_last_grants() {
        let dir = std::env::temp_dir().join(format!("grants-edit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let path = dir.join("skill-grants.json");
        edit(&path, r#"{"alice": ["translate"]}"#, 0);
        let grants = Grants::open(Some(path.clone())).unwrap_or_default();
        assert!(grants.allows("alice", "translate"));
        assert!(!grants.allows("alice", "summarize"));

        // The operator grants `summarize` and takes `translate` away: read at the next check
        // (every CHECK_EVERY; the test makes the check due).
        edit(&path, r#"{"alice": ["summarize"]}"#, 10);
        grants.lock().checked = None;
        assert!(grants.allows("alice", "summarize"));
        assert!(!grants.allows("alice", "translate"));

        // A half-written file grants nobody more: the grants in force stay.
        edit(&path, r#"{"alice": ["summarize", "transl"#, 20);
        grants.lock().checked = None;
        assert!(grants.allows("alice", "summarize"));
        assert!(!grants.allows("alice", "translate"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
