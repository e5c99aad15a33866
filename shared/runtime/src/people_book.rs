//! The people file (`people.toml`, docs/protocol.md §14 "Who people are"): persons, roles,
//! console access and who may reach whom. Operators write it; no agent can add a person, so no
//! agent can name itself approver. It is read again when it changes, without a restart; a bad
//! file keeps the last good one.
//!
//! Here, not in the people service, because two services read it: the people service (who
//! may ask whom) and the console (who signs in, with which access).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::CancellationToken;
use figment::Figment;
use figment::providers::{Format, Toml};
use serde::{Deserialize, Serialize};
use switchboard_proto::acl;
use switchboard_proto::people::{Party, PeopleList, PersonEntry, RoleEntry};
use switchboard_proto::{AgentCard, AgentId};

/// What a person may do in the console (and, for `approver`, on approvals).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Read the map, conversations, tasks and dead letters.
    Viewer,
    /// Cancel task trees, redrive dead letters, talk to agents.
    Operator,
    /// Decide approvals addressed to them or their roles.
    Approver,
}

fn everyone() -> Vec<String> {
    vec!["*".to_owned()]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PersonFile {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    access: Vec<Access>,
    #[serde(default)]
    tokens: Vec<String>,
    #[serde(default = "everyone")]
    allow_from: Vec<String>,
    #[serde(default = "everyone")]
    can_talk_to: Vec<String>,
    #[serde(default)]
    deny_talk_to: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleFile {
    id: String,
    #[serde(default = "everyone")]
    allow_from: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeopleFile {
    #[serde(default)]
    person: Vec<PersonFile>,
    #[serde(default)]
    role: Vec<RoleFile>,
}

/// One person, as the file says.
#[derive(Debug, Clone, PartialEq)]
pub struct Person {
    /// The local id (`alice` of `person:alice`).
    pub id: AgentId,
    /// Display name.
    pub name: String,
    /// Roles held.
    pub roles: BTreeSet<AgentId>,
    /// Console access.
    pub access: BTreeSet<Access>,
    /// Sign-in token hashes (`sha256:<hex>`), never shown.
    pub token_hashes: Vec<String>,
    /// Agents that may reach them.
    pub allow_from: Vec<String>,
    /// Agents they may talk to.
    pub can_talk_to: Vec<String>,
    /// Agents they may not talk to.
    pub deny_talk_to: Vec<String>,
}

/// One role: who may reach it (its members come from the persons' `roles`).
#[derive(Debug, Clone, PartialEq)]
pub struct Role {
    /// Agents that may reach the role.
    pub allow_from: Vec<String>,
    /// Its members.
    pub members: BTreeSet<AgentId>,
}

/// Everyone in the file, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Book {
    persons: BTreeMap<AgentId, Person>,
    roles: BTreeMap<AgentId, Role>,
}

fn local(kind: &str, raw: &str) -> Result<AgentId, String> {
    AgentId::parse(raw).map_err(|err| format!("{kind} `{raw}`: {err}"))
}

impl Book {
    /// Parses and checks a people file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: PeopleFile = Figment::from(Toml::string(text))
            .extract()
            .map_err(|err| err.to_string())?;
        let mut book = Self::default();
        for role in file.role {
            let id = local("role", &role.id)?;
            let entry = Role {
                allow_from: role.allow_from,
                members: BTreeSet::new(),
            };
            if book.roles.insert(id.clone(), entry).is_some() {
                return Err(format!("role `{id}` appears twice"));
            }
        }
        for person in file.person {
            let id = local("person", &person.id)?;
            let mut roles = BTreeSet::new();
            for role in &person.roles {
                let role = local("role", role)?;
                book.roles
                    .entry(role.clone())
                    .or_insert_with(|| Role {
                        allow_from: everyone(),
                        members: BTreeSet::new(),
                    })
                    .members
                    .insert(id.clone());
                roles.insert(role);
            }
            for token in &person.tokens {
                let hex = token.strip_prefix("sha256:").unwrap_or_default();
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "person `{id}`: a token must be `sha256:<64 hex digits>` (the SHA-256 of the sign-in token)"
                    ));
                }
            }
            let name = person
                .name
                .unwrap_or_else(|| id.to_string())
                .chars()
                .filter(|c| !c.is_control())
                .take(128)
                .collect();
            let entry = Person {
                id: id.clone(),
                name,
                roles,
                access: person.access.into_iter().collect(),
                token_hashes: person.tokens,
                allow_from: person.allow_from,
                can_talk_to: person.can_talk_to,
                deny_talk_to: person.deny_talk_to,
            };
            if book.persons.insert(id.clone(), entry).is_some() {
                return Err(format!("person `{id}` appears twice"));
            }
        }
        Ok(book)
    }

    /// A person by local id.
    pub fn person(&self, id: &AgentId) -> Option<&Person> {
        self.persons.get(id)
    }

    /// Every person, in id order.
    pub fn persons(&self) -> impl Iterator<Item = &Person> {
        self.persons.values()
    }

    /// A person named `person:<id>` (or a bare `<id>`).
    pub fn person_named(&self, raw: &str) -> Option<&Person> {
        let local = raw.strip_prefix("person:").unwrap_or(raw);
        AgentId::parse(local)
            .ok()
            .and_then(|id| self.persons.get(&id))
    }

    /// Whether the party exists and someone can answer it (a role needs a member).
    pub fn exists(&self, party: &Party) -> bool {
        match party {
            Party::Person(id) => self.persons.contains_key(id),
            Party::Role(id) => self.roles.get(id).is_some_and(|r| !r.members.is_empty()),
        }
    }

    /// Whether `person` answers for `party` today: it is them, or they hold the role.
    pub fn answers_for(&self, person: &AgentId, party: &Party) -> bool {
        match party {
            Party::Person(id) => id == person,
            Party::Role(role) => self
                .persons
                .get(person)
                .is_some_and(|p| p.roles.contains(role)),
        }
    }

    /// Whether someone with approver access answers for `party`.
    pub fn can_approve(&self, party: &Party) -> bool {
        match party {
            Party::Person(id) => self
                .persons
                .get(id)
                .is_some_and(|p| p.access.contains(&Access::Approver)),
            Party::Role(role) => self.roles.get(role).is_some_and(|r| {
                r.members.iter().any(|m| {
                    self.persons
                        .get(m)
                        .is_some_and(|p| p.access.contains(&Access::Approver))
                })
            }),
        }
    }

    /// Whether the agent `from` may reach `party` (the ACL reason when not).
    pub fn check(&self, from: &AgentCard, party: &Party) -> Result<(), String> {
        let allow_from = match party {
            Party::Person(id) => self.persons.get(id).map(|p| p.allow_from.as_slice()),
            Party::Role(id) => self.roles.get(id).map(|r| r.allow_from.as_slice()),
        }
        .unwrap_or_default();
        let to = party.to_string();
        acl::check_party(from, &to, allow_from)
            .map_err(|denial| denial.reason(from.agent_id.as_str(), &to))
    }

    /// Everyone, with whether `from` may reach them.
    pub fn listing(&self, from: &AgentCard) -> PeopleList {
        let people = self
            .persons
            .values()
            .map(|p| {
                let id = Party::Person(p.id.clone());
                PersonEntry {
                    reachable: self.check(from, &id).is_ok(),
                    id,
                    name: p.name.clone(),
                    roles: p.roles.iter().cloned().map(Party::Role).collect(),
                    approver: p.access.contains(&Access::Approver),
                }
            })
            .collect();
        let roles = self
            .roles
            .iter()
            .filter(|(_, role)| !role.members.is_empty())
            .map(|(id, role)| {
                let id = Party::Role(id.clone());
                RoleEntry {
                    reachable: self.check(from, &id).is_ok(),
                    id,
                    members: role.members.iter().cloned().map(Party::Person).collect(),
                }
            })
            .collect();
        PeopleList { people, roles }
    }
}

/// The current book, read again from its file when the file changes.
#[derive(Debug, Clone, Default)]
pub struct Books {
    current: Arc<RwLock<Arc<Book>>>,
    /// The file text the current book was read from (what a change is measured against).
    loaded: Option<Arc<str>>,
}

impl Books {
    /// A fixed book (no file).
    pub fn fixed(book: Book) -> Self {
        Self {
            current: Arc::new(RwLock::new(Arc::new(book))),
            loaded: None,
        }
    }

    /// Loads `path`; a missing or bad file at start is an error (the operator named it).
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("reading {}: {err}", path.display()))?;
        let book = Book::parse(&text).map_err(|err| format!("{}: {err}", path.display()))?;
        Ok(Self {
            loaded: Some(text.into()),
            ..Self::fixed(book)
        })
    }

    /// The book now.
    pub fn now(&self) -> Arc<Book> {
        Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn replace(&self, book: Book) {
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(book);
    }

    /// Reads `path` again whenever its text changes, until `shutdown`.
    pub async fn follow(self, path: PathBuf, every: Duration, shutdown: CancellationToken) {
        let mut last = self.loaded.as_deref().map(str::to_owned);
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = shutdown.cancelled() => return,
            }
            let text = match tokio::fs::read_to_string(&path).await {
                Ok(text) => text,
                Err(err) => {
                    tracing::warn!(path = %path.display(), error = %err, "cannot read the people file; keeping the last one");
                    continue;
                }
            };
            if last.as_deref() == Some(text.as_str()) {
                continue;
            }
            match Book::parse(&text) {
                Ok(book) => {
                    tracing::info!(path = %path.display(), persons = book.persons.len(), roles = book.roles.len(), "people file reloaded");
                    self.replace(book);
                }
                Err(err) => {
                    tracing::error!(path = %path.display(), error = %err, "the people file is invalid; keeping the last good one");
                }
            }
            last = Some(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[person]]
id = "alice"
name = "Alice"
roles = ["oncall"]
access = ["viewer", "approver"]

[[person]]
id = "bob"
roles = ["oncall"]

[[role]]
id = "oncall"
allow_from = ["deploy-*"]
"#;

    fn card(id: &str) -> AgentCard {
        AgentCard::new(AgentId::parse(id).unwrap())
    }

    #[test]
    fn persons_roles_and_rules() {
        let book = Book::parse(FILE).unwrap();
        let alice = Party::parse("person:alice").unwrap();
        let oncall = Party::parse("role:oncall").unwrap();
        assert!(book.exists(&alice) && book.exists(&oncall));
        assert!(!book.exists(&Party::parse("person:carol").unwrap()));
        assert!(!book.exists(&Party::parse("role:nobody").unwrap()));
        assert!(book.answers_for(&AgentId::parse("bob").unwrap(), &oncall));
        assert!(!book.answers_for(&AgentId::parse("bob").unwrap(), &alice));
        assert!(book.can_approve(&oncall) && book.can_approve(&alice));
        assert!(!book.can_approve(&Party::parse("person:bob").unwrap()));
        assert!(book.check(&card("deploy-1"), &oncall).is_ok());
        assert_eq!(
            book.check(&card("writer"), &oncall).unwrap_err(),
            "`role:oncall` does not accept messages from `writer`"
        );
        assert!(book.check(&card("writer"), &alice).is_ok());
    }

    #[test]
    fn bad_files_are_refused() {
        for bad in [
            "[[person]]\nid = \"Alice\"",
            "[[person]]\nid = \"a\"\n[[person]]\nid = \"a\"",
            "[[person]]\nid = \"a\"\ntokens = [\"plain\"]",
            "[[person]]\nid = \"a\"\nunknown = 1",
            "[[person]]\nid = \"a\"\naccess = [\"root\"]",
        ] {
            assert!(Book::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_changed_file_applies_and_a_bad_one_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("people.toml");
        std::fs::write(&path, FILE).unwrap();
        let books = Books::load(&path).unwrap();
        let stop = CancellationToken::new();
        let follow = tokio::spawn(books.clone().follow(
            path.clone(),
            Duration::from_millis(20),
            stop.clone(),
        ));
        std::fs::write(&path, "[[person]]\nid = \"carol\"").unwrap();
        let carol = Party::parse("person:carol").unwrap();
        for _ in 0..200 {
            if books.now().exists(&carol) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(books.now().exists(&carol));
        std::fs::write(&path, "not toml [").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            books.now().exists(&carol),
            "a bad file keeps the last good one"
        );
        stop.cancel();
        follow.await.unwrap();
    }
}
