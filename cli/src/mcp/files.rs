//! Files in the MCP tools (docs/protocol.md §17). A model passes files on by reference: the
//! `attachments` of send_to_peer, talk_to_agent, reply_to_peer, create_task, update_task and
//! complete_task are file refs (of a file this agent uploaded, or one a message delivered to
//! it), resolved here to attachments through `agent.files.stat`, so the model never types a
//! digest or a size. `read_attachment` shows a file's text to the model.
//!
//! With `--files-dir DIR` the host also gets `upload_file` and `save_attachment`, which read
//! and write files there and nowhere else: a prompt-injected model names a path, so a path
//! that leaves the folder (`..`, an absolute path, a link out of it) is refused, and a saved
//! file never replaces one that is there.

use std::path::{Component, Path, PathBuf};

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use switchboard_client::proto::files::{ATTACHMENTS_MAX, Attachment, FileState, check_name};
use uuid::Uuid;

use super::SwitchboardMcp;
use super::tools::{failure, outcome, refused, reply};

/// Most bytes of a file `read_attachment` shows as text.
pub const TEXT_SHOWN_MAX: u64 = 64 * 1024;

/// `read_attachment` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadAttachmentParams {
    /// The file's ref: the `ref` of an <attachment> in check_inbox, or of a file you uploaded.
    #[serde(rename = "ref")]
    #[schemars(with = "String")]
    pub file_ref: Uuid,
}

/// `upload_file` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct UploadFileParams {
    /// The file's path inside the files folder this server was given (relative to it).
    pub path: String,
    /// Its media type, e.g. "application/pdf" (default: guessed from the name's extension).
    #[serde(default)]
    pub media_type: Option<String>,
}

/// `save_attachment` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SaveAttachmentParams {
    /// The file's ref: the `ref` of an <attachment> in check_inbox.
    #[serde(rename = "ref")]
    #[schemars(with = "String")]
    pub file_ref: Uuid,
    /// The name to save it under in the files folder (default: the attachment's name; a name,
    /// not a path).
    #[serde(default)]
    pub name: Option<String>,
}

impl SwitchboardMcp {
    /// The attachments `refs` name, as the files service has them: each a complete file this
    /// agent may pass on. A tool result to return when one is not.
    pub(super) async fn attachments(
        &self,
        refs: &[Uuid],
    ) -> Result<Vec<Attachment>, CallToolResult> {
        if refs.len() > ATTACHMENTS_MAX {
            return Err(refused(
                "bad_request",
                &format!(
                    "{} attachments; a message carries at most {ATTACHMENTS_MAX}",
                    refs.len()
                ),
            ));
        }
        let mut attachments = Vec::with_capacity(refs.len());
        for file in refs {
            let view = self
                .agent
                .file_stat(*file)
                .await
                .map_err(|err| failure(&err))?;
            if view.state != FileState::Complete {
                return Err(refused(
                    "bad_request",
                    &format!("file {file} is still being uploaded"),
                ));
            }
            attachments.push(view.attachment);
        }
        Ok(attachments)
    }

    /// The folder `upload_file` and `save_attachment` work in, if the server was given one.
    fn files_dir(&self) -> Result<&Path, CallToolResult> {
        self.files_dir.as_deref().ok_or_else(|| {
            refused(
                "not_allowed",
                "this server has no files folder (switchboard mcp --files-dir DIR)",
            )
        })
    }
}

#[tool_router(router = files_router, vis = "pub(super)")]
impl SwitchboardMcp {
    #[tool(
        description = "Read a file a message carried (an <attachment> in check_inbox) or one \
                       you uploaded: its name, media type, size and digest, and its text when \
                       it is text of at most 64 KiB (otherwise a note saying it was not shown). \
                       To pass a file on, put its ref in the attachments of send_to_peer, \
                       talk_to_agent, reply_to_peer, create_task, update_task or complete_task: \
                       the bytes are not copied."
    )]
    async fn read_attachment(
        &self,
        Parameters(params): Parameters<ReadAttachmentParams>,
    ) -> CallToolResult {
        let attachment = match self.attachments(&[params.file_ref]).await {
            Ok(mut found) => found.remove(0),
            Err(result) => return result,
        };
        if !is_text(&attachment.media_type) || attachment.size > TEXT_SHOWN_MAX {
            let note = format!(
                "not shown: {} of {} bytes (text of at most {TEXT_SHOWN_MAX} bytes is shown)",
                attachment.media_type, attachment.size
            );
            return reply(&json!({ "attachment": attachment, "note": note }));
        }
        match self.agent.read_attachment(&attachment).await {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => reply(&json!({ "attachment": attachment, "text": text })),
                Err(_) => reply(&json!({
                    "attachment": attachment,
                    "note": "not shown: the bytes are not UTF-8 text",
                })),
            },
            Err(err) => failure(&err),
        }
    }
}

#[tool_router(router = disk_router, vis = "pub(super)")]
impl SwitchboardMcp {
    #[tool(
        description = "Upload a file from your files folder so you can attach it: returns its \
                       attachment, whose ref goes in the attachments of send_to_peer, \
                       talk_to_agent, reply_to_peer, create_task, update_task or complete_task. \
                       Any size up to the fabric's limit (1 GiB by default)."
    )]
    async fn upload_file(
        &self,
        Parameters(params): Parameters<UploadFileParams>,
    ) -> CallToolResult {
        let dir = match self.files_dir() {
            Ok(dir) => dir,
            Err(result) => return result,
        };
        let path = match inside(dir, &params.path) {
            Ok(path) => path,
            Err(message) => return refused("bad_request", &message),
        };
        let media_type = params
            .media_type
            .unwrap_or_else(|| media_type_of(&path).to_owned());
        outcome(self.agent.upload_file(&path, &media_type).await)
    }

    #[tool(
        description = "Save a file a message carried (an <attachment> in check_inbox) into your \
                       files folder, its size and digest checked: returns the path it was saved \
                       at. An existing file is never replaced: the name gets a number instead."
    )]
    async fn save_attachment(
        &self,
        Parameters(params): Parameters<SaveAttachmentParams>,
    ) -> CallToolResult {
        let dir = match self.files_dir() {
            Ok(dir) => dir.to_path_buf(),
            Err(result) => return result,
        };
        let attachment = match self.attachments(&[params.file_ref]).await {
            Ok(mut found) => found.remove(0),
            Err(result) => return result,
        };
        let name = params.name.unwrap_or_else(|| attachment.name.clone());
        if let Err(err) = check_name(&name) {
            return refused("bad_request", &format!("name: {err}"));
        }
        if name.starts_with('.') {
            // A dotfile is configuration some tool reads (`.envrc`, `.gitconfig`…): a sender
            // does not get to plant one.
            return refused(
                "bad_request",
                &format!("`{name}` is a hidden file's name; give another with `name`"),
            );
        }
        // The bytes go to a file of our own first and take the name only once their size and
        // digest are checked: no partial or unchecked file ever has it.
        let (partial, file) = match fresh_file(
            &dir,
            &format!(".partial-{}", switchboard_client::proto::new_id()),
        ) {
            Ok(created) => created,
            Err(err) => return refused("internal", &format!("saving {name}: {err}")),
        };
        let mut out = tokio::fs::File::from_std(file);
        let saved = match self.agent.download(&attachment, &mut out).await {
            Ok(_) => tokio::io::AsyncWriteExt::flush(&mut out)
                .await
                .map_err(|err| refused("internal", &format!("saving {name}: {err}"))),
            Err(err) => Err(failure(&err)),
        };
        drop(out);
        let placed = saved.and_then(|()| {
            place(&partial, &dir, &name)
                .map_err(|err| refused("internal", &format!("saving {name}: {err}")))
        });
        let _ = std::fs::remove_file(&partial);
        match placed {
            Ok(path) => {
                reply(&json!({ "saved": path.display().to_string(), "attachment": attachment }))
            }
            Err(result) => result,
        }
    }
}

/// Whether a media type is text a model can read.
fn is_text(media_type: &str) -> bool {
    let media_type = media_type.to_ascii_lowercase();
    media_type.starts_with("text/")
        || [
            "application/json",
            "application/xml",
            "application/yaml",
            "application/toml",
            "application/csv",
        ]
        .contains(&media_type.as_str())
        || media_type.ends_with("+json")
        || media_type.ends_with("+xml")
}

/// A media type for a file name by its extension (`application/octet-stream` when unknown).
pub fn media_type_of(path: &Path) -> &'static str {
    let extension = path
        .extension()
        .and_then(|ext| ext.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    match extension.as_str() {
        "txt" | "log" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "json" => "application/json",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "zip" => "application/zip",
        _ => "application/octet-stream",
    }
}

/// `relative` inside `dir`, as a real path that stays inside it: no absolute path, no `..`,
/// and no link that points out of the folder.
pub fn inside(dir: &Path, relative: &str) -> Result<PathBuf, String> {
    let given = Path::new(relative);
    if relative.is_empty()
        || given
            .components()
            .any(|part| !matches!(part, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "`{relative}` is not a path inside the files folder (no absolute path, no `..`)"
        ));
    }
    // Hidden files and folders (`.env`, `.git/config`) are not the model's to send.
    if given.components().any(
        |part| matches!(part, Component::Normal(name) if name.to_string_lossy().starts_with('.')),
    ) {
        return Err(format!(
            "`{relative}` is a hidden file or inside a hidden folder"
        ));
    }
    let root = dir
        .canonicalize()
        .map_err(|err| format!("the files folder: {err}"))?;
    let real = root
        .join(given)
        .canonicalize()
        .map_err(|err| format!("`{relative}`: {err}"))?;
    if !real.starts_with(&root) || !real.is_file() {
        return Err(format!(
            "`{relative}` is not a file inside the files folder"
        ));
    }
    Ok(real)
}

/// `partial` (a checked download) linked into `dir` as `name`, or `name (2)`, `name (3)`…
/// when that exists: a hard link never replaces a file or follows one.
fn place(partial: &Path, dir: &Path, name: &str) -> std::io::Result<PathBuf> {
    for candidate in candidates(name) {
        let path = dir.join(candidate);
        match std::fs::hard_link(partial, &path) {
            Ok(()) => return Ok(path),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err),
        }
    }
    Err(std::io::Error::other("a thousand files by that name"))
}

/// `name`, then `name (2)`, `name (3)`… up to a thousand.
fn candidates(name: &str) -> impl Iterator<Item = String> + '_ {
    let (stem, extension) = match name.rsplit_once('.') {
        Some((stem, extension)) if !stem.is_empty() => (stem, format!(".{extension}")),
        _ => (name, String::new()),
    };
    (1..=1000).map(move |n| {
        if n == 1 {
            name.to_owned()
        } else {
            format!("{stem} ({n}){extension}")
        }
    })
}

/// A new file in `dir` named `name`, or `name (2)`, `name (3)`… when that exists: created
/// exclusively, so nothing there is replaced or written through a link.
fn fresh_file(dir: &Path, name: &str) -> std::io::Result<(PathBuf, std::fs::File)> {
    for candidate in candidates(name) {
        let path = dir.join(candidate);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => return Ok((path, file)),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err),
        }
    }
    Err(std::io::Error::other("a thousand files by that name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_never_leaves_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ok.txt"), "x").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/in.md"), "x").unwrap();
        assert!(inside(dir.path(), "ok.txt").is_ok());
        assert!(inside(dir.path(), "./sub/in.md").is_ok());
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        for bad in [
            "",
            "../secret",
            "/etc/passwd",
            "sub/../../x",
            "link",
            "sub",
            "missing.txt",
        ] {
            assert!(inside(dir.path(), bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_checked_download_takes_a_free_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "mine").unwrap();
        let (partial, _) = fresh_file(dir.path(), ".partial-1").unwrap();
        std::fs::write(&partial, "theirs").unwrap();
        let placed = place(&partial, dir.path(), "a.txt").unwrap();
        assert_eq!(placed, dir.path().join("a (2).txt"));
        assert_eq!(std::fs::read(dir.path().join("a.txt")).unwrap(), b"mine");
        assert_eq!(std::fs::read(placed).unwrap(), b"theirs");
        assert!(inside(dir.path(), ".env").is_err());
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join(".git/config"), "x").unwrap();
        assert!(inside(dir.path(), ".git/config").is_err());
    }

    #[test]
    fn a_saved_file_never_replaces_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "mine").unwrap();
        let (path, _) = fresh_file(dir.path(), "a.txt").unwrap();
        assert_eq!(path, dir.path().join("a (2).txt"));
        assert_eq!(std::fs::read(dir.path().join("a.txt")).unwrap(), b"mine");
        let (path, _) = fresh_file(dir.path(), "README").unwrap();
        assert_eq!(path, dir.path().join("README"));
    }

    #[test]
    fn text_is_told_from_bytes() {
        assert!(is_text("text/csv"));
        assert!(is_text("application/ld+json"));
        assert!(!is_text("application/pdf"));
        assert_eq!(media_type_of(Path::new("x.PDF")), "application/pdf");
        assert_eq!(media_type_of(Path::new("x")), "application/octet-stream");
    }
}
