//! README.md, checked against the code (issue 30): it stays short, and what it counts and
//! lists is what the repository holds.
//!
//! - at most 10 KB;
//! - the number of services it states is the number of crates under `services/`;
//! - the number of MCP tools it states is the number of `#[tool(…)]` methods in `cli/src`;
//! - its two commands: the test command is the one CI (`.ci/run`) runs, the run command is a
//!   Makefile target;
//! - its crate map names every crate under `shared/` and `services/`, and nothing else there;
//! - its echo agent is the Python SDK's, which the SDK's tests run as written;
//! - every relative link resolves to a file or folder.
//!
//! These read the source tree; they need no nats-server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use switchboard_tests::rust_files;

/// README.md's size limit, in bytes.
const MAX_README_BYTES: usize = 10 * 1024;

/// The workspace root (this crate lives in `tests/`).
fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn readme() -> String {
    read("README.md")
}

/// The README's section under `## <title>`, up to the next `## ` heading.
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let heading = format!("\n## {title}\n");
    let start = text
        .find(&heading)
        .unwrap_or_else(|| panic!("README.md has no `## {title}` section"))
        + heading.len();
    let end = text[start..]
        .find("\n## ")
        .map_or(text.len(), |offset| start + offset);
    &text[start..end]
}

/// The first fenced code block of `language` in `text`, without its fences.
fn code_block<'a>(text: &'a str, language: &str) -> Option<&'a str> {
    let fence = format!("```{language}\n");
    let start = text.find(&fence)? + fence.len();
    let end = start + text[start..].find("```")?;
    Some(&text[start..end])
}

/// A number written as digits or as an English word (one to twenty).
fn number(word: &str) -> Option<usize> {
    const WORDS: [&str; 20] = [
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
        "twenty",
    ];
    let word = word.to_ascii_lowercase();
    word.parse()
        .ok()
        .or_else(|| WORDS.iter().position(|w| *w == word).map(|i| i + 1))
}

/// Every number the README puts right before `noun` ("six services", "13 tools").
fn counts_before(text: &str, noun: &str) -> Vec<(String, usize)> {
    let words: Vec<&str> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|pair| pair[1] == noun)
        .filter_map(|pair| number(pair[0]).map(|n| (format!("{} {}", pair[0], pair[1]), n)))
        .collect()
}

/// The folders directly under `dir` (relative to the root) that hold a `Cargo.toml`.
fn crates_under(dir: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|err| panic!("{dir}: {err}"))
        .flatten()
        .filter(|entry| entry.path().join("Cargo.toml").is_file())
        .map(|entry| format!("{dir}/{}", entry.file_name().to_string_lossy()))
        .collect();
    found.sort();
    found
}

#[test]
fn the_readme_fits_in_ten_kilobytes() {
    let size = readme().len();
    assert!(
        size <= MAX_README_BYTES,
        "README.md is {size} bytes, more than {MAX_README_BYTES}: move detail into docs/"
    );
}

#[test]
fn the_service_count_is_the_number_of_service_crates() {
    let services = crates_under("services");
    let stated = counts_before(&readme(), "services");
    assert!(
        !stated.is_empty(),
        "README.md should say how many services there are (\"six services\")"
    );
    for (phrase, count) in stated {
        assert_eq!(
            count,
            services.len(),
            "README.md says \"{phrase}\", services/ holds {services:?}"
        );
    }
}

/// What declares one MCP tool (the `rmcp` attribute on each tool method).
const TOOL_MARKER: &str = "#[tool(";

#[test]
fn the_tool_count_is_the_number_of_mcp_tools() {
    let mut tools = 0;
    for path in rust_files(&root().join("cli/src")) {
        let text = std::fs::read_to_string(&path).unwrap();
        tools += text
            .lines()
            .filter(|line| {
                let line = line.trim_start();
                line.starts_with(TOOL_MARKER) || line.starts_with("#[tool]")
            })
            .count();
    }
    assert!(tools > 0, "no `{TOOL_MARKER}` found under cli/src");
    let stated = counts_before(&readme(), "tools");
    assert!(
        !stated.is_empty(),
        "README.md should say how many MCP tools there are (\"thirteen tools\")"
    );
    for (phrase, count) in stated {
        assert_eq!(
            count, tools,
            "README.md says \"{phrase}\", cli/src declares {tools} tools"
        );
    }
}

#[test]
fn the_two_commands_are_what_ci_and_the_makefile_run() {
    let text = readme();
    let block = code_block(section(&text, "The two commands"), "sh")
        .expect("a ```sh block in `## The two commands`");
    let commands: Vec<&str> = block
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|command| !command.is_empty())
        .collect();
    let [run, test] = commands[..] else {
        panic!("`## The two commands` should hold two commands, run then test: {commands:?}");
    };

    let ci = read(".ci/run");
    assert!(
        ci.lines().any(|line| line.trim() == test),
        "the README's test command `{test}` is not what .ci/run runs"
    );

    let makefile = read("Makefile");
    for command in [run, test] {
        let target = command
            .strip_prefix("make ")
            .unwrap_or_else(|| panic!("`{command}` is not a make command"));
        assert!(
            makefile
                .lines()
                .any(|line| line.starts_with(&format!("{target}:"))),
            "the Makefile has no target `{target}` (README: `{command}`)"
        );
    }
}

#[test]
fn the_readme_says_what_the_tests_need() {
    let text = readme();
    let package = read("sdk/typescript/package.json");
    let node = package
        .split("\"node\":")
        .nth(1)
        .and_then(|rest| rest.split('"').nth(1))
        .expect("sdk/typescript/package.json names a node engine");
    let major = node.trim_start_matches(['>', '=', '^', '~']);
    let prerequisites = section(&text, "The two commands");
    assert!(
        prerequisites.contains(&format!("Node {major}")) && prerequisites.contains("npm"),
        "README.md's two commands should say the tests need Node {major} and npm"
    );
}

#[test]
fn the_crate_map_names_every_crate() {
    let text = readme();
    let map = section(&text, "Crate map");
    let mut crates = crates_under("shared");
    crates.extend(crates_under("services"));
    let mut missing = Vec::new();
    for path in &crates {
        if !map.contains(&format!("`{path}`")) {
            missing.push(path.as_str());
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's crate map lacks {missing:?}"
    );

    // The map's `shared/<x>` and `services/<x>` paths (code spans: every other piece).
    let mut stale = Vec::new();
    for span in map.split('`').skip(1).step_by(2) {
        let is_crate_path = (span.starts_with("shared/") || span.starts_with("services/"))
            && span.matches('/').count() == 1;
        if is_crate_path && !crates.iter().any(|path| path == span) {
            stale.push(span);
        }
    }
    assert!(
        stale.is_empty(),
        "README.md's crate map names crates that do not exist: {stale:?}"
    );
}

#[test]
fn the_echo_agent_is_the_one_the_python_sdk_runs() {
    let text = readme();
    let ours = code_block(&text, "python").expect("README.md has a ```python block");
    let sdk = read("sdk/python/README.md");
    assert!(
        sdk.contains(ours),
        "README.md's Python agent differs from sdk/python/README.md's (whose tests run it): \
         copy it from there"
    );
}

/// The targets of the Markdown links in `text` outside code blocks: `[text](target)`.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        for piece in line.split("](").skip(1) {
            if let Some(end) = piece.find(')') {
                targets.push(piece[..end].to_owned());
            }
        }
    }
    targets
}

#[test]
fn every_relative_link_resolves() {
    let text = readme();
    let mut broken = Vec::new();
    for target in link_targets(&text) {
        if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
            continue;
        }
        let path = target.split('#').next().unwrap_or_default();
        if !root().join(path).exists() {
            broken.push(target);
        }
    }
    assert!(
        broken.is_empty(),
        "README.md links to missing files: {broken:?}"
    );
}
