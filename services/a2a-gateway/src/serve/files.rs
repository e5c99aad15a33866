//! Files between A2A clients and the fabric (docs/protocol.md §17, docs/a2a.md "Files"); the
//! links themselves are `crate::links`.
//!
//! In: a message's `raw` part larger than `[a2a_gateway] inline_file_bytes` is uploaded to
//! the files service as the client's agent and travels as an attachment, not inside the
//! message (which could not hold it). Out: the files of a client's tasks and answers are
//! `url` parts pointing at the gateway, `GET /files/<token>`: a link signed for that client and
//! that file, good for `file_link_ttl_secs`. The gateway reads the file as the client, so a
//! link works only while the client may read the file (a revoked or deleted file is 404
//! whatever the link says), and the bytes are checked against the file's digest as they go.

use std::sync::Arc;
use std::time::Duration;

use a2a::{PartContent, SendMessageRequest};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use switchboard_client::{ClientError, Files};
use switchboard_proto::AgentId;
use switchboard_proto::files::{
    ATTACHMENTS_MAX, Attachment, FileState, check_media_type, check_name,
};

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::links::unix_now;
use crate::serve::checks::not_found;

/// Bytes buffered between the files service and the HTTP body.
const PIPE_BYTES: usize = 256 * 1024;
/// The slowest a download may go (bytes a second) before it is cut off: a reader that takes
/// no bytes cannot hold its client's stream slot for ever.
const SLOWEST_BYTES_PER_SEC: u64 = 64 * 1024;
/// What every download gets on top of its size at that rate.
const DOWNLOAD_GRACE: Duration = Duration::from_secs(60);

/// A file's name and media type as an attachment takes them: the part's, when valid, else
/// `file-<n>` (a name that is a path or holds control characters is not kept) and
/// `application/octet-stream`.
pub fn upload_names(
    filename: Option<&str>,
    media_type: Option<&str>,
    n: usize,
) -> (String, String) {
    let name = filename
        .filter(|name| check_name(name).is_ok())
        .map_or_else(|| format!("file-{n}"), str::to_owned);
    let media_type = media_type
        .filter(|media| check_media_type(media).is_ok())
        .unwrap_or("application/octet-stream")
        .to_owned();
    (name, media_type)
}

/// A message's content: its text, its parts, and its large files uploaded.
#[derive(Debug)]
pub(crate) struct Content {
    pub(crate) text: String,
    pub(crate) parts: Vec<switchboard_proto::Part>,
    pub(crate) attachments: Vec<Attachment>,
}

impl Gateway {
    /// A client's message as the fabric carries it: every `raw` part larger than
    /// `inline_file_bytes` uploaded to the files service as `caller` (its quota, its files;
    /// refused as the service refuses: `file_too_large`, `quota_exceeded`) and carried as an
    /// attachment, the rest as text and parts ([`crate::serve::params::message_content`]).
    pub(crate) async fn message_content(
        &self,
        caller: &AgentId,
        request: &SendMessageRequest,
    ) -> Result<Content, GatewayError> {
        crate::serve::params::check_part_count(request)?;
        let mut kept = Vec::with_capacity(request.message.parts.len());
        let mut large = Vec::new();
        for (n, part) in request.message.parts.iter().enumerate() {
            match &part.content {
                PartContent::Raw(bytes) if bytes.len() > self.config.inline_file_bytes => {
                    large.push((n, part, bytes));
                }
                _ => kept.push(part.clone()),
            }
        }
        if large.len() > ATTACHMENTS_MAX {
            return Err(GatewayError::InvalidParams(format!(
                "{} file parts above {} bytes; a message carries at most {ATTACHMENTS_MAX}",
                large.len(),
                self.config.inline_file_bytes
            )));
        }
        let (text, parts) = crate::serve::params::message_content(&kept, large.len())?;
        let mut attachments = Vec::with_capacity(large.len());
        if !large.is_empty() {
            self.ensure_registered(caller).await?;
            let files = Files::new(self.client.clone(), caller.clone());
            for (n, part, bytes) in large {
                let (name, media_type) =
                    upload_names(part.filename.as_deref(), part.media_type.as_deref(), n);
                let attachment = files
                    .upload_bytes(&name, &media_type, bytes)
                    .await
                    .map_err(|err| match err {
                        ClientError::Service(reply) => GatewayError::Refused(reply),
                        other => GatewayError::unavailable("uploading a file part", other),
                    })?;
                attachments.push(attachment);
            }
        }
        Ok(Content {
            text,
            parts,
            attachments,
        })
    }
}

impl Gateway {
    /// Deletes files uploaded for a message that was then refused (best effort: one left
    /// behind runs out with the retention).
    pub(crate) async fn forget_files(&self, caller: &AgentId, attachments: &[Attachment]) {
        let files = Files::new(self.client.clone(), caller.clone());
        for attachment in attachments {
            if let Err(err) = files.delete(attachment.file_ref).await {
                tracing::debug!(file = %attachment.file_ref, error = %err, "uploaded file of a refused message not deleted");
            }
        }
    }
}

/// `GET /files/<token>`: the file the link names, streamed, if the link is good and its
/// client may still read the file; 404 otherwise (the same for a bad link, one that ran out,
/// and a file that is gone).
pub async fn download(State(gateway): State<Arc<Gateway>>, Path(token): Path<String>) -> Response {
    let gone = || not_found("no such file, or the link ran out: ask for the task again");
    let Ok((reader, file)) = gateway.links.check(&token, unix_now()) else {
        return gone();
    };
    // A download holds one of the client's stream slots while it runs.
    let Some(slot) = gateway.try_stream_slot(&reader) else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            "too many downloads and streams open for this client",
        )
            .into_response();
    };
    let files = Files::new(gateway.client.clone(), reader.clone());
    let attachment = match files.stat(file).await {
        Ok(view) if view.state == FileState::Complete => view.attachment,
        Ok(_) => return gone(),
        Err(err) if err.kind() == Some(switchboard_proto::ErrorKind::NotFound) => return gone(),
        Err(err) => {
            tracing::warn!(%file, client = %reader, error = %err, "file link not served");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "the files service did not answer",
            )
                .into_response();
        }
    };
    let (mut into, out) = tokio::io::duplex(PIPE_BYTES);
    let sent = attachment.clone();
    let stopping = gateway.stopping.clone();
    let deadline = DOWNLOAD_GRACE + Duration::from_secs(attachment.size / SLOWEST_BYTES_PER_SEC);
    tokio::spawn(async move {
        let _slot = slot;
        // A digest that does not match, a read that fails, a reader slower than the slowest
        // rate allowed, or the gateway stopping ends the body short of its Content-Length:
        // the client sees a broken download, never wrong bytes as whole. (A client that
        // hangs up ends it at the next write.)
        tokio::select! {
            done = tokio::time::timeout(deadline, files.download(&sent, &mut into)) => match done {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => {
                    tracing::warn!(file = %sent.file_ref, error = %err, "file download broke off");
                }
                Err(_) => {
                    tracing::info!(file = %sent.file_ref, "file download cut off: too slow a reader");
                }
            },
            () = stopping.cancelled() => {}
        }
    });
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(out));
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    // The media type is the uploader's word: never rendered in the gateway's origin.
    if let Ok(value) = HeaderValue::from_str(&attachment.media_type) {
        headers.insert(header::CONTENT_TYPE, value);
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(attachment.size));
    headers.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&format!(
            "attachment; filename*=UTF-8''{}",
            percent_encoded(&attachment.name)
        ))
        .unwrap_or(HeaderValue::from_static("attachment")),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    headers.insert(
        "x-switchboard-sha256",
        HeaderValue::from_str(&attachment.sha256).unwrap_or(HeaderValue::from_static("")),
    );
    response
}

/// `text` percent-encoded for a header's `filename*` (RFC 8187): everything but unreserved
/// characters.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                (byte as char).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_paths_are_not_kept() {
        assert_eq!(
            upload_names(Some("../../etc/passwd"), Some("text/html; x=\u{7}"), 3),
            ("file-3".into(), "application/octet-stream".into())
        );
        assert_eq!(
            upload_names(Some("plan.pdf"), Some("application/pdf"), 0),
            ("plan.pdf".into(), "application/pdf".into())
        );
        assert_eq!(percent_encoded("a b\"é"), "a%20b%22%C3%A9");
    }
}
