//! The wire contract as data (issue 29): the JSON Schemas under `docs/schema/` and the AsyncAPI
//! document `docs/asyncapi.yaml` are what `switchboard_proto::schema` generates from the Rust
//! types, and the document passes the official AsyncAPI parser.
//!
//! After changing a wire type, regenerate them:
//! `SWITCHBOARD_WRITE_CONTRACT=1 cargo test -p switchboard-tests --test contract`.

use std::path::PathBuf;

use switchboard_proto::schema;

const WRITE: &str = "SWITCHBOARD_WRITE_CONTRACT";

/// Held by each test: the validator must not read the files while they are rewritten.
static FILES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn docs() -> PathBuf {
    switchboard_testkit::workspace_root().join("docs")
}

/// Every generated file and its content: `docs/schema/<Type>.json` and `docs/asyncapi.yaml`.
fn generated() -> Vec<(PathBuf, String)> {
    let mut files: Vec<(PathBuf, String)> = schema::schemas()
        .into_iter()
        .map(|(name, value)| {
            let text = serde_json::to_string_pretty(&value).unwrap_or_default() + "\n";
            (docs().join("schema").join(format!("{name}.json")), text)
        })
        .collect();
    let header = "# Generated from the Rust wire types (shared/proto/src/schema.rs); do not edit.\n\
                  # Regenerate: SWITCHBOARD_WRITE_CONTRACT=1 cargo test -p switchboard-tests --test contract\n";
    files.push((
        docs().join("asyncapi.yaml"),
        format!("{header}{}", schema::yaml(&schema::asyncapi())),
    ));
    files
}

#[test]
fn the_committed_schemas_and_asyncapi_document_match_the_rust_types() {
    let _files = FILES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let files = generated();
    if std::env::var_os(WRITE).is_some() {
        let folder = docs().join("schema");
        // Types that are gone take their schema with them.
        if let Ok(entries) = std::fs::read_dir(&folder) {
            for entry in entries.flatten() {
                std::fs::remove_file(entry.path()).unwrap();
            }
        }
        std::fs::create_dir_all(&folder).unwrap();
        for (path, text) in &files {
            std::fs::write(path, text).unwrap();
        }
    }
    let mut stale = Vec::new();
    for (path, text) in &files {
        if std::fs::read_to_string(path).ok().as_deref() != Some(text.as_str()) {
            stale.push(path.display().to_string());
        }
    }
    let committed = std::fs::read_dir(docs().join("schema"))
        .map(|entries| entries.count())
        .unwrap_or(0);
    assert!(
        stale.is_empty() && committed == files.len() - 1,
        "the wire types changed and these are stale (or {committed} schema files for {} types): \
         {stale:?}\nregenerate with {WRITE}=1 cargo test -p switchboard-tests --test contract",
        files.len() - 1
    );
}

#[test]
fn the_asyncapi_document_passes_the_official_parser() {
    let _files = FILES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let root = switchboard_testkit::workspace_root();
    let mut schemas: Vec<String> = std::fs::read_dir(docs().join("schema"))
        .unwrap()
        .flatten()
        .map(|entry| entry.path().display().to_string())
        .collect();
    schemas.sort();
    let output = std::process::Command::new("node")
        .current_dir(&root)
        .arg("tests/asyncapi/validate.mjs")
        .arg("docs/asyncapi.yaml")
        .args(&schemas)
        .output()
        .expect("node runs (make test installs tests/asyncapi's packages first)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the AsyncAPI document or a schema is invalid:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("docs/asyncapi.yaml: valid"), "{stdout}");
}

/// Issue 38: `docs/mcp-tools.json` is the list of tools `switchboard mcp` offers, which both
/// SDKs turn into their OpenAI and Anthropic tool definitions at build time: the same names,
/// descriptions and schemas wherever an LLM meets the fabric. Regenerated with the contract.
#[test]
fn the_committed_tool_list_is_what_switchboard_mcp_offers() {
    let _files = FILES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let path = docs().join("mcp-tools.json");
    let text = serde_json::to_string_pretty(&switchboard::tool_definitions()).unwrap() + "\n";
    if std::env::var_os(WRITE).is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    assert!(
        std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()),
        "the MCP tools changed and docs/mcp-tools.json is stale: \
         regenerate with {WRITE}=1 cargo test -p switchboard-tests --test contract"
    );
    let tools = switchboard::tool_definitions();
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    assert_eq!(names.len(), 18, "{names:?}");
    assert!(names.contains(&"talk_to_agent") && names.contains(&"check_inbox"));
    // The disk tools of `--files-dir` are the MCP server's alone.
    assert!(names.contains(&"read_attachment") && !names.contains(&"upload_file"));
}
