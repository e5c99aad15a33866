//! The NATS accounts that isolate agents from each other and from the fabric's storage
//! (docs/security.md), as written by `switchboard nats-config --agents agents.toml --out DIR`.
//!
//! - Account `SWITCHBOARD` has JetStream, every stream and bucket and the services' user, and
//!   *exports* every agent-facing request subject ([`switchboard_proto::endpoint::agent_endpoints`]).
//! - Account `AGENTS` has no JetStream; it *imports* those subjects and holds one NKey user per
//!   agent. A user may publish only the request subjects ending in its own id (audit queries
//!   only if granted) and subscribe only `_INBOX.<agent_id>.>`.
//!
//! A request crossing an import gets a reply subject the server makes up (`_R_.…`) in the
//! services' account, so no agent can choose where a service or JetStream writes; and no agent
//! can subscribe where another's replies travel. Seeds are written once and kept: regenerating
//! after adding an agent changes nobody else's key, and `nats-server --signal reload` picks the
//! new `auth.conf` up without a restart.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use switchboard_proto::AgentId;
use switchboard_proto::endpoint::{self, AgentEndpoint};
use switchboard_proto::subject;
use switchboard_runtime::nats::public_key_of;

/// The account holding JetStream and the services.
pub const SERVICES_ACCOUNT: &str = "SWITCHBOARD";
/// The account holding one NKey user per agent; it has no JetStream.
pub const AGENTS_ACCOUNT: &str = "AGENTS";
/// The generated config file (to `include` at the top level of a nats-server config).
pub const AUTH_FILE: &str = "auth.conf";
/// The services' NKey seed file.
pub const SERVICES_SEED_FILE: &str = "services.nk";
/// The console's NKey seed file: a user of the services' account with only what the console
/// does ([`console_publish_allow`]).
pub const CONSOLE_SEED_FILE: &str = "console.nk";
/// The folder of the agents' seed files (`<agent_id>.nk`).
pub const AGENTS_SEED_DIR: &str = "agents";

/// The input of `switchboard nats-config`: who may connect as an agent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsFile {
    /// One entry per agent.
    #[serde(default)]
    pub agents: Vec<AgentEntry>,
}

/// One agent allowed to connect.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentEntry {
    /// The agent id: the only id this agent may act as.
    pub id: String,
    /// May query the audit trail (`agent.audit.*`).
    #[serde(default)]
    pub audit: bool,
    /// The skills `to: "skill:<name>"` work may be routed to this agent for. Its card may list
    /// others (for other agents to read); routing ignores those. Written to
    /// [`SKILL_GRANTS_FILE`] for the directory.
    #[serde(default)]
    pub skills: Vec<String>,
}

/// The file `generate` writes beside `auth.conf` for the directory
/// (`directory.skill_grants_file`): each agent of the agents file and the skills it may be
/// routed, as a JSON object `{"<agent_id>": ["<skill>", …]}`.
pub const SKILL_GRANTS_FILE: &str = "skill-grants.json";

/// Why the config could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum PermissionsError {
    /// The agents file is wrong (bad id, an id twice, unreadable TOML).
    #[error("{0}")]
    Input(String),
    /// A seed file could not be read or written, or holds no user seed.
    #[error("{path}: {reason}")]
    Seed {
        /// Path of the seed file, e.g. `services.nk` or `agents/<agent_id>.nk`.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Writing the output failed.
    #[error("writing {path}: {source}")]
    Write {
        /// Path of the output file or folder that could not be written.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// One user of the generated config: who it is, its public NKey, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentUser {
    /// The agent id: its user may publish only request subjects ending in it (audit if granted).
    pub id: AgentId,
    /// Its public NKey (`U…`).
    pub public_key: String,
    /// May query the audit trail.
    pub audit: bool,
}

/// Subjects agent `id` may publish to: its own request subjects, the audit queries if granted.
pub fn agent_publish_allow(id: &AgentId, audit: bool) -> Vec<String> {
    endpoint::agent_endpoints()
        .iter()
        .filter(|endpoint| audit || !endpoint.audit)
        .map(|endpoint| endpoint.subject_for(id))
        .collect()
}

/// Subjects agent `id` may subscribe to: its own reply inboxes.
pub fn agent_subscribe_allow(id: &AgentId) -> Vec<String> {
    vec![format!("{}.>", subject::agent_inbox_prefix(id))]
}

/// Subjects the console may publish to: the operator endpoints (`_SB.ops.people.>`,
/// `_SB.ops.tasks.>`), the audit's thread and history, the JetStream calls behind its registry
/// watch and the dead-letter list, redrive (a copy back into `agent.inbox.<goal>`) and discard,
/// and, for each person in `talkers`, the requests of the agent they talk as
/// (`people-<id>`: register, open its goal, send, call, give a task, read its goal).
pub fn console_publish_allow(talkers: &[AgentId]) -> Vec<String> {
    use switchboard_proto::{DLQ_STREAM, GOALS_BUCKET, REGISTRY_BUCKET};
    let mut allow = vec![
        subject::ops("people", ">"),
        subject::ops("tasks", ">"),
        switchboard_proto::audit::AuditOp::Thread.subject(),
        switchboard_proto::audit::AuditOp::History.subject(),
        subject::JS_API_INFO.to_owned(),
        format!("{}.*", subject::INBOX_SUBJECT_PREFIX),
        // Flow control of the ordered consumers it reads with.
        subject::JS_FLOW_CONTROL_ALL.to_owned(),
    ];
    for bucket in [REGISTRY_BUCKET, GOALS_BUCKET] {
        let stream = format!("KV_{bucket}");
        allow.push(subject::js_api("STREAM.INFO", &stream));
        allow.push(subject::js_api("CONSUMER.CREATE", &stream));
        allow.push(subject::below(&subject::js_api("CONSUMER.CREATE", &stream)));
        allow.push(subject::below(&subject::js_api("CONSUMER.DELETE", &stream)));
    }
    for op in [
        "STREAM.INFO",
        "STREAM.MSG.GET",
        "STREAM.MSG.DELETE",
        "CONSUMER.CREATE",
    ] {
        allow.push(subject::js_api(op, DLQ_STREAM));
    }
    for op in [
        "CONSUMER.CREATE",
        "CONSUMER.DELETE",
        "CONSUMER.INFO",
        "CONSUMER.MSG.NEXT",
    ] {
        allow.push(subject::below(&subject::js_api(op, DLQ_STREAM)));
    }
    for person in talkers {
        let Ok(agent) = AgentId::parse(&format!(
            "{}{person}",
            switchboard_proto::PERSON_AGENT_PREFIX
        )) else {
            continue;
        };
        allow.extend([
            subject::RegistryOp::Register.subject(&agent),
            subject::RegistryOp::GoalOpen.subject(&agent),
            subject::send(&agent),
            subject::call(&agent),
            switchboard_proto::task::TaskRequestOp::Create.subject(&agent),
            subject::inbox_fetch(&agent),
        ]);
    }
    allow
}

/// Subjects the console may subscribe to: the registry's and the people service's events
/// (what its page updates live on) and its own reply subjects.
pub fn console_subscribe_allow() -> Vec<String> {
    vec![
        subject::REGISTRY_EVENTS_ALL.to_owned(),
        subject::below(subject::PEOPLE_EVENTS_PREFIX),
        format!("{}.>", switchboard_proto::CONSOLE_INBOX_PREFIX),
    ]
}

/// The console's user in `auth.conf`: its public key and who may talk from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleUser {
    /// Its public NKey (`U…`).
    pub public_key: String,
    /// The persons with `operator` access in the people file: they may talk to agents.
    pub talkers: Vec<AgentId>,
}

/// The text of `auth.conf` for the services' public key and the agents' users.
pub fn auth_conf(services_public_key: &str, agents: &[AgentUser]) -> String {
    auth_conf_with_console(services_public_key, None, agents)
}

/// [`auth_conf`] with the console's user in the services' account.
pub fn auth_conf_with_console(
    services_public_key: &str,
    console: Option<&ConsoleUser>,
    agents: &[AgentUser],
) -> String {
    let endpoints = endpoint::agent_endpoints();
    let mut out = String::new();
    out.push_str(
        "# Generated by `switchboard nats-config`; regenerate rather than edit.\n\
         # Include it at the top level of the nats-server config (`include auth.conf`).\n\
         # SWITCHBOARD: JetStream and the services; it exports the agent-facing requests.\n\
         # AGENTS: one NKey user per agent, no JetStream; each publishes only its own request\n\
         # subjects and subscribes only _INBOX.<agent_id>.> (docs/security.md).\n",
    );
    let _ = writeln!(out, "accounts {{");
    let _ = writeln!(out, "  {SERVICES_ACCOUNT} {{");
    let _ = writeln!(out, "    jetstream: enabled");
    let _ = writeln!(out, "    users: [");
    let _ = writeln!(out, "      {{ nkey: {} }}", quoted(services_public_key));
    if let Some(console) = console {
        let _ = writeln!(
            out,
            "      # the console (docs/console.md): only what its page does\n      {{ nkey: {}, permissions: {{\n          publish: {{ allow: {} }}\n          subscribe: {{ allow: {} }}\n      }} }}",
            quoted(&console.public_key),
            list(&console_publish_allow(&console.talkers)),
            list(&console_subscribe_allow()),
        );
    }
    let _ = writeln!(out, "    ]");
    let _ = writeln!(out, "    exports: [");
    for endpoint in &endpoints {
        let _ = writeln!(out, "      {}", export_line(endpoint));
    }
    let _ = writeln!(out, "    ]");
    let _ = writeln!(out, "  }}");
    let _ = writeln!(out, "  {AGENTS_ACCOUNT} {{");
    let _ = writeln!(out, "    users: [");
    for agent in agents {
        let _ = writeln!(
            out,
            "      # {}\n      {{ nkey: {}, permissions: {{\n          publish: {{ allow: {} }}\n          subscribe: {{ allow: {} }}\n      }} }}",
            agent.id,
            quoted(&agent.public_key),
            list(&agent_publish_allow(&agent.id, agent.audit)),
            list(&agent_subscribe_allow(&agent.id)),
        );
    }
    let _ = writeln!(out, "    ]");
    let _ = writeln!(out, "    imports: [");
    for endpoint in &endpoints {
        let _ = writeln!(
            out,
            "      {{ service: {{ account: {SERVICES_ACCOUNT}, subject: {} }} }}",
            quoted(&endpoint.export_subject())
        );
    }
    let _ = writeln!(out, "    ]");
    let _ = writeln!(out, "  }}");
    let _ = writeln!(out, "}}");
    out
}

fn export_line(endpoint: &AgentEndpoint) -> String {
    let mut line = format!("{{ service: {}", quoted(&endpoint.export_subject()));
    if endpoint.streamed {
        line.push_str(", response_type: stream");
    }
    let _ = write!(
        line,
        ", response_threshold: \"{}ms\" }}",
        endpoint.answer_within_ms
    );
    line
}

fn quoted(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

fn list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| quoted(s)).collect();
    format!("[{}]", quoted.join(", "))
}

/// What [`generate`] wrote.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The `auth.conf` path.
    pub auth_file: PathBuf,
    /// The services' seed file.
    pub services_seed: PathBuf,
    /// The console's seed file.
    pub console_seed: PathBuf,
    /// Each agent and its seed file.
    pub agent_seeds: Vec<(AgentId, PathBuf)>,
    /// Seed files that were new this time (the others were kept as they were).
    pub created: Vec<PathBuf>,
    /// Seed files of agents no longer in the agents file: no longer in `auth.conf`, so they
    /// cannot connect; left in place so re-adding the agent keeps its key.
    pub unused: Vec<PathBuf>,
}

/// Checks the agents file: valid ids, none twice, none an A2A client's (`a2a-…`: the A2A
/// gateway acts as those agents, so a key for one would let an agent pose as a client).
pub fn check_agents(file: &AgentsFile) -> Result<Vec<(AgentId, bool)>, PermissionsError> {
    let mut seen = BTreeSet::new();
    let mut agents = Vec::with_capacity(file.agents.len());
    for entry in &file.agents {
        let id = AgentId::parse(&entry.id)
            .map_err(|err| PermissionsError::Input(format!("agent `{}`: {err}", entry.id)))?;
        if id
            .as_str()
            .starts_with(switchboard_proto::A2A_CLIENT_PREFIX)
        {
            return Err(PermissionsError::Input(format!(
                "agent `{id}`: ids starting `{}` belong to A2A clients of the gateway",
                switchboard_proto::A2A_CLIENT_PREFIX
            )));
        }
        if id
            .as_str()
            .starts_with(switchboard_proto::PERSON_AGENT_PREFIX)
        {
            return Err(PermissionsError::Input(format!(
                "agent `{id}`: ids starting `{}` belong to persons talking from the console",
                switchboard_proto::PERSON_AGENT_PREFIX
            )));
        }
        if id.as_str() == switchboard_proto::PEOPLE_AGENT {
            return Err(PermissionsError::Input(format!(
                "agent `{id}`: the id is the people service's (persons' answers arrive from it)"
            )));
        }
        if !seen.insert(id.clone()) {
            return Err(PermissionsError::Input(format!(
                "agent `{id}` appears twice"
            )));
        }
        for skill in &entry.skills {
            switchboard_proto::send::check_skill(skill).map_err(|err| {
                PermissionsError::Input(format!("agent `{id}`: {}", err.error.message))
            })?;
        }
        agents.push((id, entry.audit));
    }
    Ok(agents)
}

/// Writes `dir/auth.conf`, `dir/services.nk` and `dir/agents/<agent_id>.nk` for `file`, keeping
/// every seed file that exists already (its key stays the same).
pub fn generate(file: &AgentsFile, dir: &Path) -> Result<Generated, PermissionsError> {
    generate_with(file, &[], dir)
}

/// [`generate`], and the console's seed `dir/console.nk` and user, with `talkers` (the people
/// file's operators) allowed to talk to agents from it.
pub fn generate_with(
    file: &AgentsFile,
    talkers: &[AgentId],
    dir: &Path,
) -> Result<Generated, PermissionsError> {
    let agents = check_agents(file)?;
    let seeds_dir = dir.join(AGENTS_SEED_DIR);
    create_dir(&seeds_dir)?;
    let mut created = Vec::new();
    let services_seed = dir.join(SERVICES_SEED_FILE);
    let services_key = load_or_create_seed(&services_seed, &mut created)?;
    let console_seed = dir.join(CONSOLE_SEED_FILE);
    let console = ConsoleUser {
        public_key: load_or_create_seed(&console_seed, &mut created)?,
        talkers: talkers.to_vec(),
    };
    let mut users = Vec::with_capacity(agents.len());
    let mut agent_seeds = Vec::with_capacity(agents.len());
    for (id, audit) in agents {
        let path = seeds_dir.join(format!("{id}.nk"));
        let public_key = load_or_create_seed(&path, &mut created)?;
        users.push(AgentUser {
            id: id.clone(),
            public_key,
            audit,
        });
        agent_seeds.push((id, path));
    }
    let listed: BTreeSet<&PathBuf> = agent_seeds.iter().map(|(_, path)| path).collect();
    let mut unused: Vec<PathBuf> = std::fs::read_dir(&seeds_dir)
        .map_err(|source| PermissionsError::Write {
            path: seeds_dir.clone(),
            source,
        })?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "nk") && !listed.contains(path))
        .collect();
    unused.sort();
    let auth_file = dir.join(AUTH_FILE);
    write_file(
        &auth_file,
        auth_conf_with_console(&services_key, Some(&console), &users).as_bytes(),
        0o644,
    )?;
    let grants: std::collections::BTreeMap<&str, &[String]> = file
        .agents
        .iter()
        .map(|entry| (entry.id.as_str(), entry.skills.as_slice()))
        .collect();
    let grants = serde_json::to_vec_pretty(&grants)
        .map_err(|err| PermissionsError::Input(format!("skill grants: {err}")))?;
    write_file(&dir.join(SKILL_GRANTS_FILE), &grants, 0o644)?;
    Ok(Generated {
        auth_file,
        services_seed,
        console_seed,
        agent_seeds,
        created,
        unused,
    })
}

/// The public key of the user seed in `path`, creating the file with a new seed if it is
/// missing.
fn load_or_create_seed(
    path: &Path,
    created: &mut Vec<PathBuf>,
) -> Result<String, PermissionsError> {
    match std::fs::read_to_string(path) {
        Ok(text) => public_key_of(text.trim()).map_err(|reason| PermissionsError::Seed {
            path: path.to_owned(),
            reason,
        }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            let pair = nkeys::KeyPair::new_user();
            let seed = pair.seed().map_err(|err| PermissionsError::Seed {
                path: path.to_owned(),
                reason: err.to_string(),
            })?;
            write_file(path, format!("{seed}\n").as_bytes(), 0o600)?;
            created.push(path.to_owned());
            Ok(pair.public_key())
        }
        Err(err) => Err(PermissionsError::Seed {
            path: path.to_owned(),
            reason: err.to_string(),
        }),
    }
}

fn create_dir(dir: &Path) -> Result<(), PermissionsError> {
    std::fs::create_dir_all(dir).map_err(|source| PermissionsError::Write {
        path: dir.to_owned(),
        source,
    })
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PermissionsError> {
    let fail = |source| PermissionsError::Write {
        path: path.to_owned(),
        source,
    };
    // Written next to the target and renamed over it, so a reload never reads half a file.
    let temp = path.with_extension("tmp");
    {
        use std::io::Write as _;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(mode);
        }
        #[cfg(not(unix))]
        let _ = mode;
        let mut file = options.open(&temp).map_err(fail)?;
        file.write_all(bytes).map_err(fail)?;
        file.sync_all().map_err(fail)?;
    }
    std::fs::rename(&temp, path).map_err(fail)
}

/// Reads an agents file (TOML).
pub fn read_agents(path: &Path) -> Result<AgentsFile, PermissionsError> {
    use figment::Figment;
    use figment::providers::{Format, Toml};
    if !path.exists() {
        return Err(PermissionsError::Input(format!(
            "{} does not exist",
            path.display()
        )));
    }
    Figment::from(Toml::file(path))
        .extract()
        .map_err(|err| PermissionsError::Input(format!("{}: {err}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::nats::read_seed;

    #[test]
    fn client_agent_ids_get_no_key() {
        let file = AgentsFile {
            agents: vec![AgentEntry {
                id: "a2a-planner".into(),
                audit: false,
                skills: Vec::new(),
            }],
        };
        let err = check_agents(&file).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("A2A clients"), "{err}");
    }

    #[test]
    fn person_agent_ids_get_no_key() {
        let err = check_agents(&file(&[("people-alice", false)]))
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains("persons talking"), "{err}");
    }

    #[test]
    fn the_console_may_talk_only_as_the_operators_it_was_given() {
        let alice = AgentId::parse("alice").unwrap();
        let allow = console_publish_allow(std::slice::from_ref(&alice));
        assert!(allow.contains(&"agent.send.people-alice".to_owned()));
        assert!(allow.contains(&"_SB.ops.tasks.>".to_owned()));
        // Nothing as an agent of the fabric, nothing that writes the trail or the streams.
        for forbidden in ["agent.send.*", "agent.send.>", "_SB.audit.records", ">"] {
            assert!(!allow.contains(&forbidden.to_owned()), "{forbidden}");
        }
        assert!(
            allow
                .iter()
                .filter(|s| s.starts_with("agent.") && !s.starts_with("agent.audit."))
                .filter(|s| *s != "agent.inbox.*")
                .all(|s| s.ends_with(".people-alice")),
            "{allow:?}"
        );
        assert!(
            !console_publish_allow(&[])
                .iter()
                .any(|s| s.contains("people-"))
        );
        assert_eq!(
            console_subscribe_allow().last().map(String::as_str),
            Some("_INBOX.console.>")
        );
    }

    #[test]
    fn the_people_service_id_gets_no_key() {
        let err = check_agents(&file(&[("people", false)]))
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains("people service"), "{err}");
    }

    fn file(ids: &[(&str, bool)]) -> AgentsFile {
        AgentsFile {
            agents: ids
                .iter()
                .map(|(id, audit)| AgentEntry {
                    id: (*id).into(),
                    audit: *audit,
                    skills: Vec::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn agents_are_pinned_to_their_own_subjects() {
        let alice = AgentId::parse("alice").unwrap();
        let allow = agent_publish_allow(&alice, false);
        assert!(allow.contains(&"agent.send.alice".to_owned()));
        assert!(allow.contains(&"agent.inbox.fetch.alice".to_owned()));
        assert!(allow.iter().all(|s| s.ends_with(".alice")), "{allow:?}");
        assert!(
            agent_publish_allow(&alice, true)
                .iter()
                .any(|s| s == "agent.audit.verify")
        );
        assert_eq!(agent_subscribe_allow(&alice), ["_INBOX.alice.>"]);
        let conf = auth_conf(
            "USERVICES",
            &[AgentUser {
                id: alice,
                public_key: "UALICE".into(),
                audit: false,
            }],
        );
        assert!(
            !conf.contains("$JS"),
            "agents never touch JetStream: {conf}"
        );
        assert!(!conf.contains("password"), "{conf}");
        assert!(conf.contains("{ service: \"agent.audit.export\", response_type: stream"));
        assert!(conf.contains("{ service: { account: SWITCHBOARD, subject: \"agent.send.*\" } }"));
        assert!(conf.contains("subscribe: { allow: [\"_INBOX.alice.>\"] }"));
    }

    #[test]
    fn seeds_are_kept_across_regenerations() {
        let dir = tempfile::tempdir().unwrap();
        let first = generate(&file(&[("alice", false)]), dir.path()).unwrap();
        // services.nk, console.nk, agents/alice.nk
        assert_eq!(first.created.len(), 3);
        let console_seed = std::fs::read_to_string(&first.console_seed).unwrap();
        let alice_seed = std::fs::read_to_string(&first.agent_seeds[0].1).unwrap();
        let services_seed = std::fs::read_to_string(&first.services_seed).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&first.services_seed)
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "seed files are private");
        }
        let second = generate(&file(&[("alice", true), ("bob", false)]), dir.path()).unwrap();
        assert_eq!(second.created, [dir.path().join("agents/bob.nk")]);
        assert_eq!(
            std::fs::read_to_string(&second.agent_seeds[0].1).unwrap(),
            alice_seed
        );
        assert_eq!(
            std::fs::read_to_string(&second.console_seed).unwrap(),
            console_seed
        );
        assert_eq!(
            std::fs::read_to_string(&second.services_seed).unwrap(),
            services_seed
        );
        let conf = std::fs::read_to_string(&second.auth_file).unwrap();
        assert!(conf.contains(&public_key_of(alice_seed.trim()).unwrap()));
        let third = generate(&file(&[("bob", false)]), dir.path()).unwrap();
        assert_eq!(third.unused, [dir.path().join("agents/alice.nk")]);
        let conf = std::fs::read_to_string(&third.auth_file).unwrap();
        assert!(!conf.contains(&public_key_of(alice_seed.trim()).unwrap()));
    }

    #[test]
    fn the_skills_each_agent_may_be_routed_are_written_for_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut agents = file(&[("alice", false), ("bob", false)]);
        agents.agents[0].skills = vec!["translate".into()];
        generate(&agents, dir.path()).unwrap();
        let grants: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(SKILL_GRANTS_FILE)).unwrap())
                .unwrap();
        assert_eq!(
            grants,
            serde_json::json!({"alice": ["translate"], "bob": []})
        );
        agents.agents[1].skills = vec!["no spaces allowed".into()];
        assert!(generate(&agents, dir.path()).is_err());
    }

    #[test]
    fn bad_agents_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(generate(&file(&[("a.b", false)]), dir.path()).is_err());
        assert!(generate(&file(&[("alice", false), ("alice", true)]), dir.path()).is_err());
        std::fs::create_dir_all(dir.path().join("agents")).unwrap();
        std::fs::write(dir.path().join("agents/carol.nk"), "not a seed").unwrap();
        let err = generate(&file(&[("carol", false)]), dir.path()).unwrap_err();
        assert!(err.to_string().contains("carol.nk"), "{err}");
        assert!(read_seed(&dir.path().join("agents/carol.nk")).is_err());
    }
}
