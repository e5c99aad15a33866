//! `switchboard files …`: files by reference as an agent (docs/protocol.md §17): upload one and
//! print its attachment, read one delivered to you into a file, see, revoke or delete one.
//! `switchboard send --attach FILE` uploads and attaches in one go.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::Value;
use switchboard_client::Files;
use switchboard_client::proto::AgentId;
use uuid::Uuid;

use super::args::{Acting, Connection};

/// Files by reference: upload, download, stat, revoke, delete (as an agent; `switchboard
/// attachments get` is `files get`).
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  switchboard files put --as writer report.pdf   # prints the attachment to send\n  switchboard send --as writer --to reviewer \"the report\" --attach report.pdf\n  switchboard files get --as reviewer <ref> --out report.pdf   # size and SHA-256 checked\n  switchboard files stat --as reviewer <ref>\n  switchboard files revoke --as writer <ref> --agent reviewer\n  switchboard files delete --as writer <ref>",
    mut_args(super::args::agent_help("The agent"))
)]
pub struct FilesArgs {
    #[command(flatten)]
    acting: Acting,
    #[command(subcommand)]
    command: FilesCommand,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Debug, Subcommand)]
enum FilesCommand {
    /// Upload a file; prints its attachment (`{name, media_type, size, sha256, ref}`).
    Put {
        /// The file.
        path: PathBuf,
        /// Its media type (default: from its extension, else application/octet-stream).
        #[arg(long)]
        media_type: Option<String>,
    },
    /// Read a file you uploaded or were delivered into `--out` (whole, or nothing).
    Get {
        /// The attachment's `ref`.
        file: Uuid,
        /// Where to write it.
        #[arg(long)]
        out: PathBuf,
    },
    /// What a file is, and how far its upload got.
    Stat {
        /// The file id.
        file: Uuid,
    },
    /// Take back one reader of your file (`--agent`), or every one.
    Revoke {
        /// The file id.
        file: Uuid,
        /// The reader.
        #[arg(long)]
        agent: Option<String>,
    },
    /// Delete your file now.
    Delete {
        /// The file id.
        file: Uuid,
    },
}

/// A media type from a file's extension, for the common kinds.
pub(crate) fn media_type(path: &Path) -> &'static str {
    let extension = path
        .extension()
        .and_then(|extension| extension.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("pdf") => "application/pdf",
        Some("json") => "application/json",
        Some("txt" | "log") => "text/plain",
        Some("md") => "text/markdown",
        Some("csv") => "text/csv",
        Some("html" | "htm") => "text/html",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("zip") => "application/zip",
        _ => "application/octet-stream",
    }
}

/// Runs a files command.
pub async fn run(args: FilesArgs) -> anyhow::Result<Value> {
    let agent = args.acting.id()?;
    let nats = crate::nats::connect_as(&args.conn.nats_url, Some(&agent)).await?;
    let files = Files::new(nats, agent);
    Ok(match args.command {
        FilesCommand::Put { path, media_type } => {
            let media_type = media_type.unwrap_or_else(|| self::media_type(&path).to_owned());
            serde_json::to_value(files.upload_file(&path, &media_type).await?)?
        }
        FilesCommand::Get { file, out } => {
            let view = files.stat(file).await?;
            let partial = out.with_extension("part");
            let mut writer = tokio::fs::File::create(&partial).await?;
            let written = match files.download(&view.attachment, &mut writer).await {
                Ok(written) => written,
                Err(err) => {
                    let _ = tokio::fs::remove_file(&partial).await;
                    return Err(err.into());
                }
            };
            tokio::fs::rename(&partial, &out).await?;
            serde_json::json!({"file": out, "bytes": written, "sha256": view.attachment.sha256})
        }
        FilesCommand::Stat { file } => serde_json::to_value(files.stat(file).await?)?,
        FilesCommand::Revoke { file, agent } => {
            let agent = agent.as_deref().map(AgentId::parse).transpose()?;
            serde_json::to_value(files.revoke(file, agent).await?)?
        }
        FilesCommand::Delete { file } => serde_json::to_value(files.delete(file).await?)?,
    })
}
