//! The workspace's shape, checked (issue 18, CONTRIBUTING.md "Where things live"):
//!
//! - every subject, stream, bucket and header name is spelled in `shared/proto` only, so
//!   renaming one there renames it for the services, the clients and the NATS permissions;
//! - every service has the same files for the same jobs;
//! - no source file grows past what anyone reads at once without saying why;
//! - the concept → file map in CONTRIBUTING.md names the file that holds each concept, and
//!   docs/architecture.md names only files that exist;
//! - no two files of one crate import each other, directly or in a longer circle (issue 30);
//! - no service crate depends on another (what services share is in `shared/`);
//! - no function on the send, call or fetch path is longer than 80 lines;
//! - the Rust client needs neither the services' runtime nor its config loader and exporter.
//!
//! These read the source tree; they need no nats-server.

use std::path::{Path, PathBuf};

use switchboard_tests::rust_files;

/// The workspace root (this crate lives in `tests/`).
fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The code a file ships: everything before its `#[cfg(test)]` module, without comments.
fn shipped_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let end = text.find("#[cfg(test)]").unwrap_or(text.len());
    text[..end]
        .lines()
        .enumerate()
        .map(|(index, line)| (index + 1, line))
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
}

/// The string literals on one line (plain `"…"` literals, escapes skipped).
fn literals(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut chars = line.chars();
    let mut current: Option<String> = None;
    while let Some(c) = chars.next() {
        match (&mut current, c) {
            (None, '"') => current = Some(String::new()),
            (Some(text), '"') => {
                found.push(std::mem::take(text));
                current = None;
            }
            (Some(text), '\\') => {
                text.push('\\');
                if let Some(next) = chars.next() {
                    text.push(next);
                }
            }
            (Some(text), c) => text.push(c),
            (None, _) => {}
        }
    }
    found
}

/// The stream, bucket and header names `shared/proto` defines (`pub const …: &str`).
fn proto_names() -> Vec<String> {
    let mut names = Vec::new();
    for path in rust_files(&root().join("shared/proto/src")) {
        for line in read(&path).lines() {
            let Some(rest) = line.trim().strip_prefix("pub const ") else {
                continue;
            };
            let Some((name, value)) = rest.split_once(": &str = ") else {
                continue;
            };
            let is_name = name.starts_with("HEADER_")
                || name.ends_with("_STREAM")
                || name.ends_with("_BUCKET");
            if is_name && let Some(value) = literals(value).into_iter().next() {
                names.push(value);
            }
        }
    }
    assert!(
        names.len() > 20,
        "proto names not found: {names:?} (did names.rs move?)"
    );
    names
}

/// What starts a subject or a NATS header name.
const SUBJECT_ROOTS: [&str; 9] = [
    "agent.", "_SB.", "$JS.", "$KV.", "$SRV.", "_INBOX", "_R_.", "Nats-", "KV-",
];

#[test]
fn no_subject_stream_bucket_or_header_is_spelled_outside_proto() {
    let names = proto_names();
    let mut found = Vec::new();
    for dir in ["services", "shared", "cli/src"] {
        for path in rust_files(&root().join(dir)) {
            let shown = relative(&path);
            if shown.starts_with("shared/proto/") || shown.contains("/tests/") {
                continue;
            }
            let text = read(&path);
            for (number, line) in shipped_lines(&text) {
                for literal in literals(line) {
                    // Prose (help text, error messages) may mention a subject; a name the code
                    // uses has no whitespace.
                    if literal.contains(char::is_whitespace) {
                        continue;
                    }
                    let spelled = SUBJECT_ROOTS.iter().any(|root| literal.starts_with(root))
                        || names.contains(&literal);
                    if spelled {
                        found.push(format!("{shown}:{number}: \"{literal}\""));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "subject/stream/bucket/header names spelled outside shared/proto (use \
         switchboard_proto::subject or names):\n{}",
        found.join("\n")
    );
}

/// The files every service has, each with one job (CONTRIBUTING.md).
const SERVICE_FILES: [&str; 6] = [
    "main.rs",
    "lib.rs",
    "config.rs",
    "error.rs",
    "endpoints.rs",
    "store.rs",
];

#[test]
fn every_service_has_the_same_files_for_the_same_jobs() {
    let mut missing = Vec::new();
    let services = std::fs::read_dir(root().join("services")).expect("services/");
    let mut count = 0;
    for service in services.flatten() {
        let src = service.path().join("src");
        if !src.is_dir() {
            continue;
        }
        count += 1;
        for file in SERVICE_FILES {
            if !src.join(file).is_file() {
                missing.push(relative(&src.join(file)));
            }
        }
    }
    assert_eq!(count, 10, "ten services expected");
    assert!(missing.is_empty(), "missing: {missing:?}");
}

/// The package names of the services (`services/*/Cargo.toml`).
fn service_packages() -> Vec<String> {
    let mut packages = Vec::new();
    let services =
        std::fs::read_dir(root().join("services")).unwrap_or_else(|err| panic!("services/: {err}"));
    for service in services.flatten() {
        let manifest = service.path().join("Cargo.toml");
        if !manifest.is_file() {
            continue;
        }
        let name = read(&manifest)
            .lines()
            .find_map(|line| line.strip_prefix("name = "))
            .map(|name| name.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|| panic!("no package name in {}", manifest.display()));
        packages.push(name);
    }
    packages
}

/// A service owns its rules; what two services share lives in `shared/` (the door into every
/// inbox, the registry view, the people file). So no service crate depends on another — not
/// directly, and not through a shared crate (issue 40): a change to one service's code can
/// break no other service. Read from `Cargo.lock`, which records every edge.
#[test]
fn no_service_crate_depends_on_another() {
    let services = service_packages();
    assert_eq!(services.len(), 10, "ten services expected: {services:?}");
    let mut found = Vec::new();
    for name in &services {
        let closure = locked_closure(name);
        for other in &services {
            if other != name && closure.contains(other) {
                found.push(format!("{name} → {other}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "service crates depending on another: {found:?}"
    );
    // The check reads what it must: the CLI, which embeds every service, depends on them all.
    let cli = locked_closure("switchboard");
    for name in &services {
        assert!(
            cli.contains(name),
            "the lock file shows switchboard → {name}"
        );
    }
}

/// docs/architecture.md walks a newcomer through the code file by file: every path it names
/// in backticks must exist, so a moved or renamed file fails here until the page follows it.
#[test]
fn the_architecture_page_names_files_that_exist() {
    let page = read(&root().join("docs/architecture.md"));
    let roots = [
        "shared/",
        "services/",
        "cli/",
        "sdk/",
        "tests/",
        "docs/",
        "helm/",
        "nats/",
        "deploy/",
    ];
    let mut named = 0;
    let mut missing = Vec::new();
    for span in page.split('`').skip(1).step_by(2) {
        let path = span.trim_end_matches('/');
        if !roots.iter().any(|root| span.starts_with(root)) || path.contains(['<', '*', ' ']) {
            continue;
        }
        named += 1;
        if !root().join(path).exists() {
            missing.push(path.to_owned());
        }
    }
    assert!(
        named >= 40,
        "the page names {named} paths; the check reads too little"
    );
    assert!(
        missing.is_empty(),
        "docs/architecture.md names missing paths: {missing:?}"
    );
    for linking in ["README.md", "CONTRIBUTING.md"] {
        assert!(
            read(&root().join(linking)).contains("docs/architecture.md"),
            "{linking} links docs/architecture.md"
        );
    }
}

/// The longest a function on the send, call or fetch path may be (issue 40): a reader follows
/// a send, a call or a fetch through named steps, not through a screenful of one loop.
const MAX_PATH_FN_LINES: usize = 80;

/// The files the send, call and fetch paths run through.
const PATH_FILES: [&str; 6] = [
    "shared/delivery/src",
    "services/inbox-fanout/src",
    "services/reply-correlator/src",
    "services/task-lifecycle/src/create.rs",
    "services/task-lifecycle/src/transitions.rs",
    "shared/proto/src/send.rs",
];

/// The functions of `text` (before its tests) with their length in lines, from the line that
/// names them to their closing brace (braces in strings and comments aside: none of these
/// files puts one there unbalanced).
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = shipped_lines(text).map(|(_, line)| line).collect();
    let mut found = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let words: Vec<&str> = lines[at].split_whitespace().collect();
        let Some(fn_at) = words.iter().position(|word| *word == "fn") else {
            at += 1;
            continue;
        };
        let name = words
            .get(fn_at + 1)
            .map_or("", |name| name.split(['(', '<']).next().unwrap_or_default());
        let (mut depth, mut opened, mut end) = (0i64, false, at);
        while end < lines.len() {
            for c in lines[end].chars() {
                match c {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (opened && depth <= 0) || (!opened && lines[end].trim_end().ends_with(';')) {
                break;
            }
            end += 1;
        }
        found.push((name.to_owned(), end - at + 1));
        at = end + 1;
    }
    found
}

#[test]
fn no_function_on_the_send_call_or_fetch_path_is_longer_than_80_lines() {
    let mut files = Vec::new();
    for path in PATH_FILES {
        let path = root().join(path);
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else {
            files.push(path);
        }
    }
    let mut long = Vec::new();
    let mut seen = 0;
    for file in &files {
        for (name, lines) in function_lengths(&read(file)) {
            seen += 1;
            if lines > MAX_PATH_FN_LINES {
                long.push(format!("{}: {name} ({lines} lines)", relative(file)));
            }
        }
    }
    assert!(
        seen > 200,
        "only {seen} functions read: the check reads too little"
    );
    assert!(
        long.is_empty(),
        "split these into named steps (at most {MAX_PATH_FN_LINES} lines each): {long:#?}"
    );
}

#[test]
fn the_function_length_check_measures_from_name_to_closing_brace() {
    let text = "fn a() {\n    if x {\n        y();\n    }\n}\n\npub async fn b(\n    x: u8,\n) -> u8 {\n    x\n}\n";
    assert_eq!(
        function_lengths(text),
        vec![("a".to_owned(), 5), ("b".to_owned(), 5)]
    );
}

/// Longest a source file may be without a stated reason.
const MAX_LINES: usize = 600;
/// The comment that states why a file is longer.
const LONG_FILE_REASON: &str = "// Longer than 600 lines because";

/// Counts the lines a reader of the code reads: a file's unit tests (its `#[cfg(test)]`
/// module, at the end by convention) are read on their own and do not count.
#[test]
fn no_source_file_is_over_600_lines_without_a_reason() {
    let mut long = Vec::new();
    for path in rust_files(&root()) {
        let text = read(&path);
        let code = &text[..text.find("#[cfg(test)]").unwrap_or(text.len())];
        let lines = code.lines().count();
        if lines > MAX_LINES && !text.contains(LONG_FILE_REASON) {
            long.push(format!("{} ({lines} lines)", relative(&path)));
        }
    }
    assert!(
        long.is_empty(),
        "split these, or say why in a `{LONG_FILE_REASON} …` comment:\n{}",
        long.join("\n")
    );
}

/// The six concepts a newcomer looked up (issue 18), the file CONTRIBUTING.md must name for
/// each, and what that file must hold.
const CONCEPTS: [(&str, &str, &str); 6] = [
    ("a subject", "shared/proto/src/subject.rs", "pub fn send("),
    (
        "a wire type",
        "shared/proto/src/message.rs",
        "pub struct InboxMessage",
    ),
    (
        "the send handler",
        "services/inbox-fanout/src/send.rs",
        "pub async fn send(",
    ),
    (
        "the call timeout sweep",
        "services/reply-correlator/src/sweep.rs",
        "pub async fn sweep(",
    ),
    (
        "the task state machine",
        "shared/proto/src/task.rs",
        "pub fn apply(",
    ),
    (
        "the audit hash chain",
        "services/audit/src/verify.rs",
        "pub async fn verify(",
    ),
];

#[test]
fn the_contributing_map_names_the_file_that_holds_each_concept() {
    let map = read(&root().join("CONTRIBUTING.md"));
    for (concept, file, holds) in CONCEPTS {
        let row = map
            .lines()
            .find(|line| line.starts_with(&format!("| {concept} ")))
            .unwrap_or_else(|| panic!("CONTRIBUTING.md has no row for {concept:?}"));
        assert!(
            row.contains(&format!("`{file}`")),
            "the row for {concept:?} should name `{file}`: {row}"
        );
        assert!(
            read(&root().join(file)).contains(holds),
            "{file} should hold {holds:?} ({concept})"
        );
    }
    // Every path the map names exists.
    for line in map.lines().filter(|line| line.starts_with("| ")) {
        for path in line.split('`').skip(1).step_by(2) {
            let looks_like_path = path.contains('/') && !path.contains('<') && !path.contains(' ');
            if looks_like_path {
                assert!(
                    root().join(path).exists(),
                    "CONTRIBUTING.md names {path}: missing"
                );
            }
        }
    }
}

/// The modules of one crate: module path (`serve::tasks`, `""` for the root) → its file.
fn crate_modules(src: &Path) -> Vec<(String, PathBuf)> {
    let mut modules = Vec::new();
    for path in rust_files(src) {
        let inside = path.strip_prefix(src).unwrap_or(&path);
        let mut parts: Vec<String> = inside
            .iter()
            .map(|part| part.to_string_lossy().into_owned())
            .collect();
        let Some(file) = parts.pop() else { continue };
        let stem = file.trim_end_matches(".rs");
        if parts.first().is_some_and(|first| first == "bin") {
            continue; // extra binaries are crates of their own
        }
        if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
            parts.push(stem.to_string());
        }
        modules.push((parts.join("::"), path));
    }
    modules
}

/// The paths a file names through `crate::`, `super::` and `self::`, with `use` groups
/// (`crate::{a, b::{c, d}}`) spread out, each as its segments from the crate root.
fn named_paths(code: &str, module: &str) -> Vec<Vec<String>> {
    let here: Vec<String> = module
        .split("::")
        .filter(|part| !part.is_empty())
        .map(str::to_string)
        .collect();
    // Module `a::b` is `a/b.rs` or `a/b/mod.rs`; either way its `super` is `a`.
    let parent =
        |levels: usize| -> Vec<String> { here[..here.len().saturating_sub(levels)].to_vec() };
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &code[at..];
        let boundary = at == 0 || !is_ident(bytes[at - 1] as char) && bytes[at - 1] != b':';
        let start = if !boundary {
            None
        } else if rest.starts_with("crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("super::") {
            let mut levels = 0;
            let mut skip = 0;
            while code[at + skip..].starts_with("super::") {
                levels += 1;
                skip += "super::".len();
            }
            Some((parent(levels), skip))
        } else if rest.starts_with("self::") {
            Some((here.clone(), "self::".len()))
        } else {
            None
        };
        match start {
            Some((base, skip)) => {
                let (paths, used) = parse_path(&code[at + skip..]);
                for path in paths {
                    let mut full = base.clone();
                    full.extend(path);
                    found.push(full);
                }
                at += skip + used.max(1);
            }
            None => at += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    found
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Parses `a::b::{c, d::e}` (or `a::b`) from the start of `text`: the paths it names and how
/// many bytes it took.
fn parse_path(text: &str) -> (Vec<Vec<String>>, usize) {
    let mut segments = Vec::new();
    let mut at = 0;
    loop {
        let rest = &text[at..];
        let trimmed = rest.trim_start();
        at += rest.len() - trimmed.len();
        if trimmed.starts_with('{') {
            at += 1;
            let mut paths = Vec::new();
            loop {
                let rest = &text[at..];
                let trimmed = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
                at += rest.len() - trimmed.len();
                if trimmed.is_empty() {
                    break;
                }
                if trimmed.starts_with('}') {
                    at += 1;
                    break;
                }
                let (inner, used) = parse_path(trimmed);
                at += used.max(1);
                for path in inner {
                    let mut full = segments.clone();
                    full.extend(path);
                    paths.push(full);
                }
            }
            return (paths, at);
        }
        let ident: String = trimmed.chars().take_while(|c| is_ident(*c)).collect();
        if ident.is_empty() {
            break;
        }
        at += ident.len();
        segments.push(ident);
        if text[at..].starts_with("::") {
            at += 2;
        } else {
            break;
        }
    }
    (vec![segments], at)
}

/// The files of the crate in `dir` (module path, file) and, for each, the files it names
/// (indices into the first list); the crate root and `mod.rs` files name none.
fn import_graph(dir: &Path) -> (Vec<(String, PathBuf)>, Vec<Vec<usize>>) {
    let modules = crate_modules(&dir.join("src"));
    let index = |path: &[String]| -> Option<usize> {
        // The longest prefix of `path` that is a module of this crate.
        (0..=path.len()).rev().find_map(|len| {
            let name = path[..len].join("::");
            modules.iter().position(|(module, _)| *module == name)
        })
    };
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); modules.len()];
    for (from, (module, path)) in modules.iter().enumerate() {
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        let is_mod_file = name.as_deref() == Some("mod.rs");
        if module.is_empty() || is_mod_file {
            continue;
        }
        let text = read(path);
        let code: String = shipped_lines(&text)
            .map(|(_, line)| line)
            .collect::<Vec<_>>()
            .join("\n");
        for named in named_paths(&code, module) {
            if let Some(to) = index(&named)
                && to != from
                && !edges[from].contains(&to)
            {
                edges[from].push(to);
            }
        }
    }
    (modules, edges)
}

/// Import circles between the files of each crate: a file uses another that (through others)
/// uses it back. The crate root and each folder's `mod.rs` are left out as the side that
/// names its modules: they assemble the crate, so every module may use what they define.
#[test]
fn no_import_circle_between_the_files_of_a_crate() {
    /// A circle may stay when a file in it says why.
    const CIRCLE_REASON: &str = "// In an import circle because";
    let mut circles = Vec::new();
    let crates: Vec<PathBuf> = ["shared", "services"]
        .iter()
        .flat_map(|group| std::fs::read_dir(root().join(group)).into_iter().flatten())
        .flatten()
        .map(|entry| entry.path())
        .chain([root().join("cli"), root().join("tests")])
        .filter(|dir| dir.join("src").is_dir())
        .collect();
    for dir in crates {
        let (modules, edges) = import_graph(&dir);
        for component in strongly_connected(&edges) {
            if component.len() < 2 {
                continue;
            }
            let files: Vec<&PathBuf> = component.iter().map(|at| &modules[*at].1).collect();
            if files.iter().any(|file| read(file).contains(CIRCLE_REASON)) {
                continue;
            }
            let uses: Vec<String> = component
                .iter()
                .map(|from| {
                    let to: Vec<String> = edges[*from]
                        .iter()
                        .filter(|to| component.contains(to))
                        .map(|to| modules[*to].0.clone())
                        .collect();
                    format!("  {} uses {}", relative(&modules[*from].1), to.join(", "))
                })
                .collect();
            circles.push(uses.join("\n"));
        }
    }
    assert!(
        circles.is_empty(),
        "these files import each other in a circle; point the dependency one way (move what \
         both need into a leaf), or say why in a `{CIRCLE_REASON} …` comment:\n{}",
        circles.join("\n")
    );
}

/// Tarjan's strongly connected components of a directed graph given as adjacency lists.
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct Walk<'a> {
        edges: &'a [Vec<usize>],
        next: usize,
        order: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        found: Vec<Vec<usize>>,
    }
    fn visit(walk: &mut Walk, node: usize) {
        walk.order[node] = Some(walk.next);
        walk.low[node] = walk.next;
        walk.next += 1;
        walk.stack.push(node);
        walk.on_stack[node] = true;
        for &to in &walk.edges[node] {
            match walk.order[to] {
                None => {
                    visit(walk, to);
                    walk.low[node] = walk.low[node].min(walk.low[to]);
                }
                Some(order) if walk.on_stack[to] => walk.low[node] = walk.low[node].min(order),
                Some(_) => {}
            }
        }
        if Some(walk.low[node]) == walk.order[node] {
            let mut component = Vec::new();
            while let Some(top) = walk.stack.pop() {
                walk.on_stack[top] = false;
                component.push(top);
                if top == node {
                    break;
                }
            }
            walk.found.push(component);
        }
    }
    let count = edges.len();
    let mut walk = Walk {
        edges,
        next: 0,
        order: vec![None; count],
        low: vec![0; count],
        stack: Vec::new(),
        on_stack: vec![false; count],
        found: Vec::new(),
    };
    for node in 0..count {
        if walk.order[node].is_none() {
            visit(&mut walk, node);
        }
    }
    walk.found
}

/// The packages `package` needs, directly or not, as `Cargo.lock` records them (dev-dependencies
/// included, so this errs on the side of more).
fn locked_closure(package: &str) -> std::collections::BTreeSet<String> {
    let lock = read(&root().join("Cargo.lock"));
    let mut needs: std::collections::HashMap<String, Vec<String>> = Default::default();
    for block in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|line| {
                line.strip_prefix(key)
                    .map(|value| value.trim().trim_matches('"').to_owned())
            })
        };
        let Some(name) = field("name = ") else {
            continue;
        };
        let deps = block
            .split("dependencies = [")
            .nth(1)
            .and_then(|list| list.split(']').next())
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let entry = line.trim().trim_end_matches(',').trim_matches('"');
                entry.split(' ').next().filter(|dep| !dep.is_empty())
            })
            .map(str::to_owned)
            .collect::<Vec<_>>();
        needs.entry(name).or_default().extend(deps);
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec![package.to_owned()];
    while let Some(next) = todo.pop() {
        if seen.insert(next.clone()) {
            todo.extend(needs.get(&next).into_iter().flatten().cloned());
        }
    }
    seen
}

/// An agent built on the Rust client gets proto and the thin request layer, not the services'
/// runtime: no config loader, no OpenTelemetry exporter (issue 30).
#[test]
fn the_rust_client_pulls_in_no_config_loader_or_exporter() {
    let closure = locked_closure("switchboard-client");
    assert!(closure.contains("switchboard-request"), "{closure:?}");
    for heavy in [
        "switchboard-runtime",
        "figment",
        "opentelemetry-otlp",
        "tonic",
    ] {
        assert!(
            !closure.contains(heavy),
            "switchboard-client depends on {heavy}"
        );
    }
}

/// The circle check sees what it must: an import the gateway has, grouped `use` paths, and a
/// circle in a graph made for the purpose (so a parser that saw nothing would fail here).
#[test]
fn the_circle_check_sees_imports_and_circles() {
    let (modules, edges) = import_graph(&root().join("services/a2a-gateway"));
    let at = |name: &str| {
        modules
            .iter()
            .position(|(module, _)| module == name)
            .unwrap_or_else(|| panic!("no module {name}"))
    };
    assert!(edges[at("serve::tasks")].contains(&at("mapping")));
    assert!(edges[at("remote::bridge")].contains(&at("remote::attempts")));
    let named = named_paths("use crate::{a::{b, c}, d};\nsuper::e::f();", "x::y");
    let named: Vec<String> = named.iter().map(|path| path.join("::")).collect();
    assert_eq!(named, ["a::b", "a::c", "d", "x::e::f"]);
    let circles: Vec<Vec<usize>> = strongly_connected(&[vec![1], vec![2], vec![0], vec![]])
        .into_iter()
        .filter(|component| component.len() > 1)
        .collect();
    assert_eq!(circles.len(), 1);
    assert_eq!(circles[0].len(), 3);
}
