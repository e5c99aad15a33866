//! Files between agents, by reference (docs/protocol.md §17): an agent uploads a file to the
//! files service in chunks, gets an [`Attachment`] back, and puts it on any message; whoever
//! the message is delivered to may then read the file, nobody else. The data lives once in the
//! JetStream Object Store bucket `agent_files`, whatever the number of messages, hops and
//! readers.
//!
//! This module is the contract: the requests on `agent.files.<op>.<agent_id>`, the chunk and
//! read headers, the records the files service and the door keep in KV `agent_files_index`,
//! and the pure checks of names, media types and digests.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::AgentId;

/// The least chunk size (128 KiB, the Object Store's default): every chunk but the last of a
/// file uploaded through a server whose `max_payload` is below 320 KiB (or before chunk sizes
/// followed the server), and what any file counts at least against the quota. Every chunk
/// size is a multiple of SHA-256's 64-byte block, so the service can carry the digest's state
/// from one chunk to the next.
pub const FILE_CHUNK_BYTES: usize = 128 * 1024;
/// The largest chunk size the files service chooses (512 KiB).
pub const FILE_CHUNK_BYTES_MAX: usize = 512 * 1024;
/// Room a chunk message leaves for its headers below the server's `max_payload`.
const CHUNK_HEADROOM: usize = 64 * 1024;

/// The chunk size of uploads through a server whose `max_payload` is `max_payload`: the
/// largest power of two from [`FILE_CHUNK_BYTES`] to [`FILE_CHUNK_BYTES_MAX`] that leaves
/// 64 KiB for headers (512 KiB for the default 1 MiB; 128 KiB for 256 KiB). Fewer, larger
/// chunks cost fewer round trips per byte.
pub fn chunk_bytes_for(max_payload: usize) -> usize {
    let room = max_payload.saturating_sub(CHUNK_HEADROOM);
    let mut chunk = FILE_CHUNK_BYTES;
    while chunk * 2 <= room && chunk * 2 <= FILE_CHUNK_BYTES_MAX {
        chunk *= 2;
    }
    chunk
}

fn legacy_chunk_bytes() -> u64 {
    FILE_CHUNK_BYTES as u64
}
/// Most characters in a file's name.
pub const FILE_NAME_MAX_CHARS: usize = 255;
/// Most characters in a media type.
pub const MEDIA_TYPE_MAX_CHARS: usize = 127;
/// Most attachments on one message.
pub const ATTACHMENTS_MAX: usize = 16;
/// Most chunks one read answers (8 MiB of 512 KiB chunks).
pub const READ_CHUNKS_MAX: u32 = 16;
/// Prefix of the files requests: `agent.files.<op>.<agent_id>` ([`FilesOp`]). (Here rather
/// than in [`crate::subject`], which re-exports it: `subject` reaches this module through
/// `call`, and this one must not reach back.)
pub const FILES_PREFIX: &str = "agent.files";
/// Header of an upload's chunk: the file it belongs to.
pub const HEADER_FILE_ID: &str = "Switchboard-File-Id";
/// Header of an upload's chunk and of a read's chunk: where in the file its bytes start.
pub const HEADER_FILE_OFFSET: &str = "Switchboard-File-Offset";
/// Header of a read's chunk: its sequence in the Object Store's stream (what a reader passes
/// back as `after_seq` to read on from it without a search).
pub const HEADER_CHUNK_SEQ: &str = "Switchboard-Chunk-Seq";
/// Header of a stored chunk: the SHA-256 state after it (eight 32-bit words in hex), so a
/// replica that did not see the chunks before can go on hashing.
pub const HEADER_DIGEST_STATE: &str = "Switchboard-Digest-State";

/// A file on a message: what the receiver needs to decide whether to read it, and the
/// reference to read it by. The files service writes it when an upload completes; a sender
/// copies it onto any message, and the door checks every field against the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    /// The file's name as the uploader gave it (no path: 1–255 characters, no `/`, `\`,
    /// control characters, not `.` or `..`).
    pub name: String,
    /// Its media type, e.g. `application/pdf`.
    pub media_type: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, 64 lowercase hex digits, checked by the service over the bytes it stored.
    pub sha256: String,
    /// The reference to read it by: the file id.
    #[serde(rename = "ref")]
    pub file_ref: Uuid,
}

/// An agent-facing files request: `agent.files.<op>.<agent_id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FilesOp {
    /// Declare an upload ([`UploadRequest`] → [`UploadReply`]): quota and size are checked
    /// before any data moves.
    Upload,
    /// One chunk of an upload: the body is the bytes, the headers [`HEADER_FILE_ID`] and
    /// [`HEADER_FILE_OFFSET`] (→ [`ChunkReply`]).
    Chunk,
    /// Read chunks of a file ([`ReadRequest`] → chunk messages, then [`ReadEnd`]).
    Read,
    /// What a file is and how far its upload got ([`FileQuery`] → [`FileView`]).
    Stat,
    /// Take back who may read a file ([`RevokeRequest`] → [`RevokeReply`]); the uploader only.
    Revoke,
    /// Delete a file now ([`FileQuery`] → [`DeleteReply`]); the uploader only.
    Delete,
}

impl FilesOp {
    /// Every op, for the endpoint table and the NATS exports.
    pub const ALL: [Self; 6] = [
        Self::Upload,
        Self::Chunk,
        Self::Read,
        Self::Stat,
        Self::Revoke,
        Self::Delete,
    ];

    /// The op's token after `agent.files`.
    pub fn token(self) -> &'static str {
        match self {
            Self::Upload => "upload",
            Self::Chunk => "chunk",
            Self::Read => "read",
            Self::Stat => "stat",
            Self::Revoke => "revoke",
            Self::Delete => "delete",
        }
    }

    /// `agent.files.<op>`.
    pub fn prefix(self) -> String {
        format!("{FILES_PREFIX}.{}", self.token())
    }

    /// `agent.files.<op>.<agent>`.
    pub fn subject(self, agent: &AgentId) -> String {
        format!("{}.{agent}", self.prefix())
    }
}

/// `agent.files.upload`: a file about to be uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadRequest {
    /// The file's name (see [`Attachment::name`]).
    pub name: String,
    /// Its media type (`type/subtype`, RFC 6838 characters; no parameters).
    pub media_type: String,
    /// Its size in bytes (0 up to the service's `max_file_bytes`, 1 GiB by default).
    pub size: u64,
    /// Its SHA-256 (64 hex digits): the upload completes only if the bytes match it.
    pub sha256: String,
    /// The uploader's own id for this upload, so a retry (its reply lost, or a hedged copy) is
    /// the same upload: the file id is [`scoped_file_id`] of the caller and this, and the same
    /// request again answers with it (and where it stands) instead of a second upload. A
    /// fresh file id when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<Uuid>,
}

/// The namespace of [`scoped_file_id`].
pub const FILE_ID_NAMESPACE: Uuid = Uuid::from_u128(0x5b1f_2c0e_8a4d_4e4f_9d43_1f6a_7c2e_91b0);

/// The file id of the upload `agent` names `upload_id`: the UUID v5 of
/// `<agent>:<upload_id>` in [`FILE_ID_NAMESPACE`]. Scoped to the uploader, so no agent can
/// name or block another's upload, and a retry is the same upload.
pub fn scoped_file_id(agent: &AgentId, upload_id: Uuid) -> Uuid {
    Uuid::new_v5(
        &FILE_ID_NAMESPACE,
        format!("{agent}:{upload_id}").as_bytes(),
    )
}

/// The reply to [`UploadRequest`]: the file id to send chunks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UploadReply {
    /// The new file's id (the attachment's `ref` once complete).
    pub file_id: Uuid,
    /// Bytes of every chunk but the last: chosen by the service from its server's
    /// `max_payload` ([`chunk_bytes_for`], 128 KiB to 512 KiB); take it from here.
    pub chunk_bytes: usize,
    /// Bytes received so far (0).
    pub received: u64,
    /// The upload is given up (and its chunks removed) if no chunk comes for this long, in ms.
    pub idle_ms: u64,
}

/// The reply to a chunk: how far the upload got, and the attachment once it is complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChunkReply {
    /// Bytes stored so far: the offset of the next chunk.
    pub received: u64,
    /// The file, once its last chunk is stored and its digest checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<Attachment>,
}

/// `agent.files.read`: chunks of a file from `offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadRequest {
    /// The file (an attachment's `ref`).
    pub file_id: Uuid,
    /// Where to start: a multiple of the file's chunk size (any `next_offset`), at most the
    /// size.
    #[serde(default)]
    pub offset: u64,
    /// The stream sequence of the chunk before `offset`, from the last read's
    /// [`ReadEnd::after_seq`] or [`HEADER_CHUNK_SEQ`]: the read goes on from it without a
    /// search. Any other value is ignored (the service finds the chunk itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_seq: Option<u64>,
    /// Chunks to answer with (1–[`READ_CHUNKS_MAX`], default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<u32>,
}

/// The last message of a read's answer, after its chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReadEnd {
    /// Where the next read starts (the size once the file is read).
    pub next_offset: u64,
    /// The stream sequence of the last chunk sent: the next read's `after_seq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_seq: Option<u64>,
    /// Chunks sent before this message.
    pub chunks: u32,
    /// The file's size.
    pub size: u64,
    /// Whether the file is read to its end.
    pub eof: bool,
}

/// `agent.files.stat` and `agent.files.delete`: one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    /// The file id.
    pub file_id: Uuid,
}

/// Where a file stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileState {
    /// Chunks are coming.
    Uploading,
    /// Stored, its digest checked: it can be attached and read.
    Complete,
}

/// The reply to `agent.files.stat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FileView {
    /// Name, media type, size, digest and reference.
    pub attachment: Attachment,
    /// Who uploaded it.
    pub owner: AgentId,
    /// Uploading or complete.
    pub state: FileState,
    /// Bytes stored so far.
    pub received: u64,
    /// When it is removed unless a message delivered later keeps it longer.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub expires_at: OffsetDateTime,
}

/// `agent.files.revoke`: take back who may read a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    /// The file id.
    pub file_id: Uuid,
    /// The one agent that may no longer read it; absent: every agent but the uploader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<AgentId>,
}

/// The reply to a revoke.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RevokeReply {
    /// Readers taken back.
    pub revoked: usize,
}

/// The reply to a delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeleteReply {
    /// Whether a file was removed (false: it was gone already).
    pub deleted: bool,
}

/// KV `agent_files_index`, `file.<file_id>`: a file and its upload's progress. Written by the
/// files service only; the door reads it to check an attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Name, media type, size, digest and reference as declared.
    pub attachment: Attachment,
    /// Who uploaded it.
    pub owner: AgentId,
    /// Uploading or complete.
    pub state: FileState,
    /// The Object Store's object id of its chunks (`$O.agent_files.C.<nuid>`).
    pub nuid: String,
    /// When the upload was declared.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Uploading: given up after this; complete: removed after this unless a grant's
    /// `until` is later.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// Complete: the stream sequences of its first and last chunk (a read searches between
    /// them for a chunk by its offset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_seqs: Option<(u64, u64)>,
    /// Bytes of every chunk but the last (chosen at the upload: [`chunk_bytes_for`]); a record
    /// written before there was a choice has 128 KiB chunks.
    #[serde(default = "legacy_chunk_bytes")]
    pub chunk_bytes: u64,
}

/// KV `agent_files_index`, `grant.<file_id>.<agent_id>`: the agent was delivered a message
/// carrying the file, so it may read it until `until`. Written by the door at delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Who passed the reference on (the uploader or an earlier reader).
    pub from: AgentId,
    /// Readable until then (the delivery plus the retention).
    #[serde(with = "time::serde::rfc3339")]
    pub until: OffsetDateTime,
}

/// KV key of a file's record.
pub fn file_key(file: &Uuid) -> String {
    format!("file.{file}")
}

/// KV key of an agent's grant on a file.
pub fn grant_key(file: &Uuid, agent: &AgentId) -> String {
    format!("grant.{file}.{agent}")
}

/// KV key filter of every grant on a file.
pub fn grants_of(file: &Uuid) -> String {
    format!("grant.{file}.*")
}

/// KV key of an agent's storage in use (a [`QuotaRecord`]).
pub fn quota_key(agent: &AgentId) -> String {
    format!("quota.{agent}")
}

/// KV `agent_files_index`, `quota.<agent_id>`: bytes of the agent's files, complete or being
/// uploaded (an upload counts its declared size from its start).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaRecord {
    /// Bytes counted.
    pub used: u64,
}

/// Why a field of an upload or attachment is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileFieldError {
    /// The name is empty, too long, a path or holds a control character.
    #[error(
        "name must be 1-255 characters without `/`, `\\`, control characters, and not `.` or `..`"
    )]
    Name,
    /// The media type is not `type/subtype` of RFC 6838 characters.
    #[error("media_type must be `type/subtype` (RFC 6838 characters, at most 127, no parameters)")]
    MediaType,
    /// The digest is not 64 hex digits.
    #[error("sha256 must be 64 hexadecimal digits")]
    Sha256,
    /// Too many attachments on one message.
    #[error("at most 16 attachments on one message")]
    TooMany,
}

/// Checks a file name: no path, no control characters (a name is shown to people and used
/// by readers to save the file, so it must never climb out of a folder or forge a line).
pub fn check_name(name: &str) -> Result<(), FileFieldError> {
    let chars = name.chars().count();
    let bad_char = |c: char| c == '/' || c == '\\' || c.is_control() || is_format_char(c);
    if chars == 0
        || chars > FILE_NAME_MAX_CHARS
        || name == "."
        || name == ".."
        || name.chars().any(bad_char)
    {
        return Err(FileFieldError::Name);
    }
    Ok(())
}

/// Unicode format characters that reorder or hide text (bidi overrides, zero-width).
fn is_format_char(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// Checks a media type: `type/subtype`, each 1–63 of RFC 6838's restricted-name characters.
pub fn check_media_type(media_type: &str) -> Result<(), FileFieldError> {
    let token = |part: &str| {
        !part.is_empty()
            && part.len() <= 63
            && part
                .chars()
                .enumerate()
                .all(|(i, c)| c.is_ascii_alphanumeric() || (i > 0 && "!#$&-^_.+".contains(c)))
    };
    match media_type.split_once('/') {
        Some((kind, sub))
            if media_type.len() <= MEDIA_TYPE_MAX_CHARS && token(kind) && token(sub) =>
        {
            Ok(())
        }
        _ => Err(FileFieldError::MediaType),
    }
}

/// Checks a SHA-256 in hex; returns it in lowercase.
pub fn check_sha256(sha256: &str) -> Result<String, FileFieldError> {
    if sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(sha256.to_ascii_lowercase())
    } else {
        Err(FileFieldError::Sha256)
    }
}

/// Checks the attachments of a message: at most [`ATTACHMENTS_MAX`], each well formed.
/// (Whether the sender may pass each on, and that it matches its file, the door checks.)
pub fn check_attachments(attachments: &[Attachment]) -> Result<(), FileFieldError> {
    if attachments.len() > ATTACHMENTS_MAX {
        return Err(FileFieldError::TooMany);
    }
    for attachment in attachments {
        check_name(&attachment.name)?;
        check_media_type(&attachment.media_type)?;
        check_sha256(&attachment.sha256)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_follow_the_servers_max_payload() {
        assert_eq!(chunk_bytes_for(1024 * 1024), 512 * 1024);
        assert_eq!(chunk_bytes_for(256 * 1024), 128 * 1024);
        assert_eq!(chunk_bytes_for(8 * 1024 * 1024), 512 * 1024);
        assert_eq!(chunk_bytes_for(576 * 1024), 512 * 1024);
        assert_eq!(chunk_bytes_for(575 * 1024), 256 * 1024);
        assert_eq!(chunk_bytes_for(319 * 1024), 128 * 1024);
        assert_eq!(chunk_bytes_for(0), FILE_CHUNK_BYTES);
        let old: FileRecord = serde_json::from_value(serde_json::json!({
            "attachment": {"name": "a", "media_type": "a/b", "size": 1,
                           "sha256": "0".repeat(64), "ref": Uuid::nil()},
            "owner": "x", "state": "complete", "nuid": "n",
            "created_at": "2026-11-30T00:00:00Z", "expires_at": "2026-11-30T00:00:00Z",
        }))
        .unwrap();
        assert_eq!(old.chunk_bytes, 128 * 1024);
    }

    #[test]
    fn names_that_climb_or_forge_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "../etc/passwd",
            "a/b",
            "a\\b",
            "line\nbreak",
            "nul\0",
            "bell\u{7}",
            "rtl\u{202e}fdp.exe",
            &"x".repeat(256),
        ] {
            assert_eq!(check_name(bad), Err(FileFieldError::Name), "{bad:?}");
        }
        for good in ["report.pdf", "..hidden", "a b ü.txt", &"x".repeat(255)] {
            assert_eq!(check_name(good), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn media_types_are_two_tokens_without_parameters() {
        for good in ["application/pdf", "image/svg+xml", "text/x-rust", "a/b.c"] {
            assert_eq!(check_media_type(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "text",
            "text/",
            "/plain",
            "text/plain; charset=utf-8",
            "text/pla\tin",
            "text/pla\r\nX-Injected: 1",
            "tëxt/plain",
            "-text/plain",
            &format!("a/{}", "b".repeat(64)),
        ] {
            assert_eq!(
                check_media_type(bad),
                Err(FileFieldError::MediaType),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn digests_are_64_hex_digits_kept_in_lowercase() {
        let upper = "A".repeat(64);
        assert_eq!(check_sha256(&upper), Ok("a".repeat(64)));
        assert!(check_sha256(&"g".repeat(64)).is_err());
        assert!(check_sha256(&"a".repeat(63)).is_err());
    }

    #[test]
    fn an_attachment_is_written_with_ref() {
        let attachment = Attachment {
            name: "a.txt".into(),
            media_type: "text/plain".into(),
            size: 3,
            sha256: "0".repeat(64),
            file_ref: Uuid::nil(),
        };
        let json = serde_json::to_value(&attachment).unwrap();
        assert_eq!(json["ref"], "00000000-0000-0000-0000-000000000000");
        let back: Attachment = serde_json::from_value(json).unwrap();
        assert_eq!(back, attachment);
    }
}
