//! Files by reference (docs/protocol.md §17): upload a file of any size to the files service,
//! put the [`Attachment`] it gives back on a send or a call, and read the attachments of the
//! messages delivered to you. The bytes are stored once whoever reads or forwards them.
//!
//! ```no_run
//! # async fn demo(agent: &switchboard_client::Agent) -> Result<(), switchboard_client::ClientError> {
//! use switchboard_client::proto::send::SendRequest;
//! let report = agent.upload_file("report.pdf".as_ref(), "application/pdf").await?;
//! agent.send(SendRequest {
//!     to: Some("reviewer".into()),
//!     message: Some("the report, attached".into()),
//!     attachments: vec![report],
//!     ..Default::default()
//! }).await?;
//! # Ok(()) }
//! ```
//!
//! A reader saves an attachment with [`Agent::download`] (or reads it whole with
//! [`Agent::read_attachment`]); the digest is checked as the bytes come.

use std::path::Path;
use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use switchboard_proto::files::{
    Attachment, ChunkReply, DeleteReply, FileQuery, FileView, FilesOp, HEADER_FILE_ID,
    HEADER_FILE_OFFSET, ReadEnd, ReadRequest, RevokeReply, RevokeRequest, UploadReply,
    UploadRequest,
};
use switchboard_proto::{AgentId, ErrorReply, HEADER_SERVICE_ERROR_CODE};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWrite, AsyncWriteExt};
use uuid::Uuid;

use crate::Agent;
use crate::error::ClientError;

/// Chunks of an upload in flight at once.
const UPLOAD_WINDOW: usize = 3;
/// Chunks asked for by one read (the service answers with at most 16).
const READ_CHUNKS: u32 = 16;
/// Attempts of one chunk or read while no replica answers or a reply is lost.
const ATTEMPTS: u32 = 6;
/// How long one chunk's or read's reply may take.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(10);

/// The files service as one agent uses it: what [`Agent::files`] returns, and what a tool
/// with only a connection and an agent id (the command line) builds with [`Files::new`].
#[derive(Debug, Clone)]
pub struct Files {
    nats: async_nats::Client,
    agent: AgentId,
    timeout: Duration,
    retries: u32,
}

impl Agent {
    /// This agent's handle on the files service (docs/protocol.md §17).
    pub fn files(&self) -> Files {
        Files {
            timeout: self.request_timeout(),
            ..Files::new(self.nats().clone(), self.id().clone())
        }
    }

    /// [`Files::upload_file`] as this agent.
    pub async fn upload_file(
        &self,
        path: &Path,
        media_type: &str,
    ) -> Result<Attachment, ClientError> {
        self.files().upload_file(path, media_type).await
    }

    /// [`Files::upload_bytes`] as this agent.
    pub async fn upload_bytes(
        &self,
        name: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<Attachment, ClientError> {
        self.files().upload_bytes(name, media_type, bytes).await
    }

    /// [`Files::download`] as this agent.
    pub async fn download(
        &self,
        attachment: &Attachment,
        out: &mut (impl AsyncWrite + Unpin),
    ) -> Result<u64, ClientError> {
        self.files().download(attachment, out).await
    }

    /// [`Files::read_attachment`] as this agent.
    pub async fn read_attachment(&self, attachment: &Attachment) -> Result<Vec<u8>, ClientError> {
        self.files().read_attachment(attachment).await
    }

    /// [`Files::stat`] as this agent.
    pub async fn file_stat(&self, file: Uuid) -> Result<FileView, ClientError> {
        self.files().stat(file).await
    }

    /// [`Files::revoke`] as this agent.
    pub async fn file_revoke(
        &self,
        file: Uuid,
        agent: Option<AgentId>,
    ) -> Result<RevokeReply, ClientError> {
        self.files().revoke(file, agent).await
    }

    /// [`Files::delete`] as this agent.
    pub async fn file_delete(&self, file: Uuid) -> Result<DeleteReply, ClientError> {
        self.files().delete(file).await
    }
}

impl Files {
    /// The files service as `agent` on `nats`: a connection that may publish as the agent and
    /// subscribe to its reply inboxes, `_INBOX.<agent_id>.>` (the agent's own, from
    /// [`crate::agent_connect_options`], or a service's that speaks for it).
    pub fn new(nats: async_nats::Client, agent: AgentId) -> Self {
        Self {
            nats,
            agent,
            timeout: Duration::from_secs(10),
            retries: switchboard_request::request::IDEMPOTENT_RETRIES,
        }
    }

    /// Uploads the file at `path` as `media_type` (its name is the path's last part) and
    /// returns its attachment. A dropped connection or a replica that went away resumes from
    /// where the service stands; the service checks the digest at the end.
    pub async fn upload_file(
        &self,
        path: &Path,
        media_type: &str,
    ) -> Result<Attachment, ClientError> {
        let io = |err: std::io::Error| ClientError::Request {
            subject: path.display().to_string(),
            message: err.to_string(),
        };
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut file = tokio::fs::File::open(path).await.map_err(io)?;
        let size = file.metadata().await.map_err(io)?.len();
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 16];
        loop {
            let n = file.read(&mut buffer).await.map_err(io)?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
        }
        let sha256 = hex(&hasher.finalize());
        file.rewind().await.map_err(io)?;
        self.upload(&name, media_type, size, &sha256, &mut file)
            .await
    }

    /// Uploads `bytes` as a file named `name` of `media_type`.
    pub async fn upload_bytes(
        &self,
        name: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<Attachment, ClientError> {
        let sha256 = hex(&Sha256::digest(bytes));
        let mut reader = bytes;
        self.upload(name, media_type, bytes.len() as u64, &sha256, &mut reader)
            .await
    }

    /// Uploads `size` bytes read from `data`, declared with their SHA-256: the upload, then
    /// each chunk in order (a chunk whose reply is lost is sent again; the service takes it
    /// once).
    pub async fn upload(
        &self,
        name: &str,
        media_type: &str,
        size: u64,
        sha256: &str,
        data: &mut (impl AsyncRead + Unpin),
    ) -> Result<Attachment, ClientError> {
        let started: UploadReply = self
            .files_request(
                FilesOp::Upload,
                &UploadRequest {
                    name: name.to_owned(),
                    media_type: media_type.to_owned(),
                    size,
                    sha256: sha256.to_owned(),
                    upload_id: Some(switchboard_proto::new_id()),
                },
            )
            .await?;
        if size == 0 {
            let view: FileView = self
                .files_request(
                    FilesOp::Stat,
                    &FileQuery {
                        file_id: started.file_id,
                    },
                )
                .await?;
            return Ok(view.attachment);
        }
        self.send_chunks(started.file_id, started.chunk_bytes, size, name, data)
            .await
    }

    /// The chunks of an upload, three in flight: the next is sent before the previous one's
    /// reply (the replica storing one holds the next until it is stored). One refused
    /// `conflict` because it reached another replica first goes again once the one before
    /// it is answered.
    async fn send_chunks(
        &self,
        file: Uuid,
        chunk_bytes: usize,
        size: u64,
        name: &str,
        data: &mut (impl AsyncRead + Unpin),
    ) -> Result<Attachment, ClientError> {
        let mut read = 0u64;
        let mut window = futures::stream::FuturesOrdered::new();
        loop {
            while window.len() < UPLOAD_WINDOW && read < size {
                let want =
                    usize::try_from((size - read).min(chunk_bytes as u64)).unwrap_or(chunk_bytes);
                let mut chunk = vec![0u8; want];
                data.read_exact(&mut chunk)
                    .await
                    .map_err(|err| ClientError::Request {
                        subject: name.to_owned(),
                        message: format!("reading the file at {read}: {err}"),
                    })?;
                let (offset, bytes) = (read, Bytes::from(chunk));
                read += want as u64;
                window.push_back(async move {
                    let sent = self.send_chunk(file, offset, bytes.clone()).await;
                    (offset, bytes, sent)
                });
            }
            let Some((offset, bytes, sent)) = window.next().await else {
                return Err(ClientError::Request {
                    subject: FilesOp::Chunk.subject(&self.agent),
                    message: "the upload ended without its last chunk's reply".to_owned(),
                });
            };
            let end = offset + bytes.len() as u64;
            let reply = match sent {
                // Ahead of the one before it at another replica: that one is answered now.
                Err(err) if err.kind() == Some(switchboard_proto::ErrorKind::Conflict) => {
                    self.send_chunk(file, offset, bytes).await?
                }
                other => other?,
            };
            if let Some(attachment) = reply.attachment {
                return Ok(attachment);
            }
            if reply.received < end {
                return Err(ClientError::Request {
                    subject: FilesOp::Chunk.subject(&self.agent),
                    message: format!(
                        "the service stands at {} after the chunk at {offset}",
                        reply.received
                    ),
                });
            }
        }
    }

    /// One chunk, sent again while no replica answers or its reply is lost.
    async fn send_chunk(
        &self,
        file: Uuid,
        offset: u64,
        bytes: Bytes,
    ) -> Result<ChunkReply, ClientError> {
        let subject = FilesOp::Chunk.subject(&self.agent);
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_FILE_ID, file.to_string().as_str());
        headers.insert(HEADER_FILE_OFFSET, offset.to_string().as_str());
        let mut pause = Duration::from_millis(100);
        for attempt in 1..=ATTEMPTS {
            let request = async_nats::Request::new()
                .payload(bytes.clone())
                .headers(headers.clone())
                .timeout(Some(CHUNK_TIMEOUT));
            match &self.nats.send_request(subject.clone(), request).await {
                Ok(reply) => return decode(&subject, &reply.headers, &reply.payload),
                Err(err) if attempt < ATTEMPTS => {
                    tracing::debug!(%file, offset, error = %err, "a chunk goes again");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(err) => {
                    return Err(ClientError::Request {
                        subject,
                        message: err.to_string(),
                    });
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Reads the file of `attachment` into `out`, checking its size and SHA-256 as it comes.
    pub async fn download(
        &self,
        attachment: &Attachment,
        out: &mut (impl AsyncWrite + Unpin),
    ) -> Result<u64, ClientError> {
        let mut hasher = Sha256::new();
        let mut offset = 0u64;
        let mut after_seq = None;
        loop {
            let (chunks, end) = self
                .read_chunks(attachment.file_ref, offset, after_seq)
                .await?;
            for (at, bytes) in chunks {
                if at != offset {
                    return Err(self.corrupt(attachment, "a chunk out of order"));
                }
                hasher.update(&bytes);
                out.write_all(&bytes)
                    .await
                    .map_err(|err| self.corrupt(attachment, &err.to_string()))?;
                offset += bytes.len() as u64;
            }
            after_seq = end.after_seq;
            if end.eof {
                break;
            }
            if end.next_offset != offset {
                return Err(self.corrupt(attachment, "a read that skipped bytes"));
            }
        }
        out.flush()
            .await
            .map_err(|err| self.corrupt(attachment, &err.to_string()))?;
        if offset != attachment.size || hex(&hasher.finalize()) != attachment.sha256 {
            return Err(self.corrupt(
                attachment,
                "the bytes read do not match its size and sha256",
            ));
        }
        Ok(offset)
    }

    /// The whole file of `attachment` in memory (for small files; see [`Agent::download`]).
    pub async fn read_attachment(&self, attachment: &Attachment) -> Result<Vec<u8>, ClientError> {
        let mut bytes = Vec::with_capacity(usize::try_from(attachment.size).unwrap_or(0));
        self.download(attachment, &mut bytes).await?;
        Ok(bytes)
    }

    /// One read from `offset`: its chunks (offset, bytes) and its end. Sent again while no
    /// replica answers or a reply is lost (a read changes nothing).
    async fn read_chunks(
        &self,
        file: Uuid,
        offset: u64,
        after_seq: Option<u64>,
    ) -> Result<(Vec<(u64, Bytes)>, ReadEnd), ClientError> {
        let subject = FilesOp::Read.subject(&self.agent);
        let body = serde_json::to_vec(&ReadRequest {
            file_id: file,
            offset,
            after_seq,
            chunks: Some(READ_CHUNKS),
        })
        .map_err(|err| ClientError::Request {
            subject: subject.clone(),
            message: err.to_string(),
        })?;
        let mut pause = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.read_once(&subject, Bytes::from(body.clone())).await {
                Err(ClientError::Timeout { .. } | ClientError::NoResponders { .. })
                    if attempt < ATTEMPTS =>
                {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                outcome => return outcome,
            }
        }
    }

    async fn read_once(
        &self,
        subject: &str,
        body: Bytes,
    ) -> Result<(Vec<(u64, Bytes)>, ReadEnd), ClientError> {
        let nats = &self.nats;
        // The agent's own reply inbox (the service sends chunks nowhere else), whatever
        // prefix the connection has: a service speaking for an agent (the A2A gateway for
        // its clients) reads as that agent too.
        let inbox = format!(
            "{}.{}",
            switchboard_proto::subject::agent_inbox_prefix(&self.agent),
            switchboard_proto::new_id().simple()
        );
        let mut replies =
            nats.subscribe(inbox.clone())
                .await
                .map_err(|err| ClientError::Request {
                    subject: subject.to_owned(),
                    message: err.to_string(),
                })?;
        nats.publish_with_reply(subject.to_owned(), inbox, body)
            .await
            .map_err(|err| ClientError::Request {
                subject: subject.to_owned(),
                message: err.to_string(),
            })?;
        let mut chunks = Vec::new();
        let read = async {
            while let Some(message) = replies.next().await {
                if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                    return Err(ClientError::NoResponders {
                        subject: subject.to_owned(),
                    });
                }
                let offset = message
                    .headers
                    .as_ref()
                    .and_then(|headers| headers.get(HEADER_FILE_OFFSET))
                    .and_then(|value| value.as_str().parse::<u64>().ok());
                match offset {
                    Some(offset) => chunks.push((offset, message.payload)),
                    None => {
                        let end: ReadEnd = decode(subject, &message.headers, &message.payload)?;
                        return Ok(end);
                    }
                }
            }
            Err(ClientError::Request {
                subject: subject.to_owned(),
                message: "the reply subscription ended".to_owned(),
            })
        };
        let end = tokio::time::timeout(CHUNK_TIMEOUT, read)
            .await
            .map_err(|_| ClientError::Timeout {
                subject: subject.to_owned(),
            })??;
        Ok((chunks, end))
    }

    /// What a file is (an upload in progress: how far it got).
    pub async fn stat(&self, file: Uuid) -> Result<FileView, ClientError> {
        self.files_request(FilesOp::Stat, &FileQuery { file_id: file })
            .await
    }

    /// Takes back one reader of your file (`Some(agent)`), or every one (`None`).
    pub async fn revoke(
        &self,
        file: Uuid,
        agent: Option<AgentId>,
    ) -> Result<RevokeReply, ClientError> {
        self.files_request(
            FilesOp::Revoke,
            &RevokeRequest {
                file_id: file,
                agent_id: agent,
            },
        )
        .await
    }

    /// Deletes your file now.
    pub async fn delete(&self, file: Uuid) -> Result<DeleteReply, ClientError> {
        self.files_request(FilesOp::Delete, &FileQuery { file_id: file })
            .await
    }

    async fn files_request<Req, Resp>(&self, op: FilesOp, body: &Req) -> Result<Resp, ClientError>
    where
        Req: serde::Serialize + ?Sized,
        Resp: serde::de::DeserializeOwned,
    {
        // Safe to repeat: an upload carries its `upload_id` (a copy is the same upload); the
        // rest read, or revoke and delete what is gone already.
        switchboard_request::request::request_json_retrying(
            &self.nats,
            &op.subject(&self.agent),
            body,
            self.timeout,
            self.retries,
        )
        .await
        .map_err(ClientError::from)
    }

    fn corrupt(&self, attachment: &Attachment, why: &str) -> ClientError {
        ClientError::Request {
            subject: FilesOp::Read.subject(&self.agent),
            message: format!("reading {}: {why}", attachment.file_ref),
        }
    }
}

/// A reply's JSON, or its error reply.
fn decode<T: serde::de::DeserializeOwned>(
    subject: &str,
    headers: &Option<HeaderMap>,
    payload: &[u8],
) -> Result<T, ClientError> {
    let is_error = headers
        .as_ref()
        .is_some_and(|headers| headers.get(HEADER_SERVICE_ERROR_CODE).is_some());
    if is_error {
        let error: ErrorReply =
            serde_json::from_slice(payload).map_err(|err| ClientError::Decode {
                subject: subject.to_owned(),
                message: err.to_string(),
            })?;
        return Err(ClientError::Service(error));
    }
    serde_json::from_slice(payload).map_err(|err| ClientError::Decode {
        subject: subject.to_owned(),
        message: err.to_string(),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
