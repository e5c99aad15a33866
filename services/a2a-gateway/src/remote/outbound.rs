//! The A2A client the gateway speaks to remote agents with: JSON-RPC 2.0 over HTTP
//! (`SendMessage`, `SendStreamingMessage` read as server-sent events, `GetTask`), the
//! `A2A-Version` header, and the current span's W3C trace context as `traceparent`.
//!
//! Everything a remote answers is bounded (body size, event size, time) and decoded into the
//! A2A types; anything else is a protocol error, never a panic. Written on reqwest and the
//! `a2a-lf` types rather than the official `a2a-client-lf`: that crate pulls in tonic, prost
//! and pbjson for its gRPC and protobuf-JSON paths, a build cost the JSON-RPC client (about
//! 150 lines) does not justify.

use std::time::Duration;

use a2a::{
    Part as A2aPart, PartContent, SendMessageRequest, SendMessageResponse, StreamResponse, Task,
};

use crate::http::{BodyError, bounded_body};
pub use crate::remote::answer::{MAX_ANSWER_BYTES, OutboundError};

/// The certificates of the PEM file at `path` (`ca_file`); an error when it cannot be read
/// or holds none.
pub fn read_roots(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(path).map_err(|err| err.to_string())?;
    let roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|err| err.to_string())?;
    if roots.is_empty() {
        return Err("no PEM certificate in it".to_owned());
    }
    Ok(roots)
}

/// How often a remote task that is still working is asked about again.
const POLL_EVERY: Duration = Duration::from_millis(500);

/// Where a carried task stands when the remote stops talking about it.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The remote task's state (`Completed` for a direct message answer).
    pub state: Option<a2a::TaskState>,
    /// The answer's text parts, in order.
    pub text: Vec<String>,
    /// Its data and url parts (at most 16).
    pub parts: Vec<switchboard_proto::Part>,
    /// The last status message's text (a question, a reason, a note).
    pub status_text: Option<String>,
    /// The remote task's id and context id, when it made a task.
    pub remote_task: Option<(String, String)>,
    /// The size of `parts` as JSON.
    parts_bytes: usize,
    /// The size of `text` joined (each part and its line break): kept as parts come, so
    /// an answer of many parts costs time linear in its size.
    text_bytes: usize,
}

impl Outcome {
    /// Adds one text part, unless the text held is past the body limit already (each part
    /// counts its line break, so a flood of empty parts stops there too).
    fn add_text(&mut self, text: &str) {
        if self.text_bytes <= switchboard_proto::MAX_BODY_BYTES {
            self.text_bytes += text.len() + 1;
            self.text.push(text.to_owned());
        }
    }

    /// Starts over (a polled task's artifacts replace what an earlier poll held).
    fn clear_answer(&mut self) {
        self.text.clear();
        self.parts.clear();
        self.parts_bytes = 0;
        self.text_bytes = 0;
    }

    /// The answer as text (artifacts first, else the last status message), never empty.
    pub fn answer(&self) -> String {
        let text = if self.text.is_empty() {
            self.status_text.clone().unwrap_or_default()
        } else {
            self.text.join("\n")
        };
        let text = if text.trim().is_empty() {
            "(the remote agent answered without text)".to_owned()
        } else {
            text
        };
        fit(text)
    }
}

impl OutboundError {
    /// Whether trying again later may succeed (the message stays queued).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unreachable(_))
    }
}

/// A remote agent's JSON-RPC endpoint.
#[derive(Debug, Clone)]
pub struct RemoteClient {
    http: reqwest::Client,
    url: String,
}

impl RemoteClient {
    /// A client for the JSON-RPC endpoint at `url` (checked by `card::jsonrpc_url`).
    pub fn new(http: reqwest::Client, url: String) -> Self {
        Self { http, url }
    }

    /// Posts one JSON-RPC request; the response as it came (not yet read).
    async fn post(
        &self,
        method: &str,
        params: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<reqwest::Response, OutboundError> {
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": switchboard_proto::new_id().to_string(),
            "method": method,
            "params": params,
        });
        let body =
            serde_json::to_vec(&body).map_err(|err| OutboundError::Protocol(err.to_string()))?;
        let mut request = self
            .http
            .post(&self.url)
            .timeout(timeout)
            .header("Content-Type", "application/json")
            .header("A2A-Version", crate::http::VERSION)
            .body(body);
        for (name, value) in trace_context() {
            request = request.header(name, value);
        }
        let response = request
            .send()
            .await
            .map_err(|err| OutboundError::transport(&err, timeout))?;
        let status = response.status();
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(OutboundError::Unreachable(format!("HTTP {status}")));
        }
        if !status.is_success() {
            return Err(OutboundError::Http(status.as_u16()));
        }
        Ok(response)
    }

    /// One request, one JSON-RPC response decoded by `decoder`.
    async fn call<T: Send + 'static>(
        &self,
        method: &str,
        params: &impl serde::Serialize,
        timeout: Duration,
        decoder: fn(&[u8]) -> Result<T, OutboundError>,
    ) -> Result<T, OutboundError> {
        let response = self.post(method, params, timeout).await?;
        let body = bounded_body(response, MAX_ANSWER_BYTES)
            .await
            .map_err(|err| match err {
                BodyError::Read(err) => OutboundError::transport(&err, timeout),
                BodyError::TooLarge(limit) => {
                    OutboundError::Protocol(format!("an answer larger than {limit} bytes"))
                }
            })?;
        decode(body, decoder).await
    }

    /// `SendMessage`: the remote's answer, a task or a message.
    pub async fn send_message(
        &self,
        request: &SendMessageRequest,
        timeout: Duration,
    ) -> Result<SendMessageResponse, OutboundError> {
        self.call(
            a2a::methods::SEND_MESSAGE,
            request,
            timeout,
            crate::remote::answer::send_message_response,
        )
        .await
    }

    /// `GetTask`: the remote task as it is now.
    pub async fn get_task(&self, id: &str, timeout: Duration) -> Result<Task, OutboundError> {
        let params = serde_json::json!({ "id": id });
        self.call(
            a2a::methods::GET_TASK,
            &params,
            timeout,
            crate::remote::answer::task,
        )
        .await
    }

    /// `SendStreamingMessage`: the remote's events as they come.
    pub async fn stream_message(
        &self,
        request: &SendMessageRequest,
        timeout: Duration,
    ) -> Result<EventStream, OutboundError> {
        let response = self
            .post(a2a::methods::SEND_STREAMING_MESSAGE, request, timeout)
            .await?;
        Ok(EventStream {
            response,
            buffer: Vec::new(),
            scanned: 0,
            timeout,
        })
    }

    /// Sends `request` and follows the remote until its task ends, asks for input, or
    /// `timeout` passes: streamed when `streaming` (each status note of a working task is
    /// handed to `on_note`), else a blocking send followed by `GetTask` polls.
    pub async fn exchange<F, Fut>(
        &self,
        request: &SendMessageRequest,
        streaming: bool,
        timeout: Duration,
        mut on_note: F,
    ) -> Result<Outcome, OutboundError>
    where
        F: FnMut(String) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut outcome = Outcome::default();
        if streaming {
            let mut events = self.stream_message(request, timeout).await?;
            while let Some(event) = events.next().await {
                let note = absorb(&mut outcome, event?);
                if let Some(note) = note
                    && outcome.state == Some(a2a::TaskState::Working)
                {
                    on_note(note).await;
                }
                if settled(outcome.state.as_ref()) {
                    return Ok(outcome);
                }
            }
        } else {
            let event = match self.send_message(request, timeout).await? {
                a2a::SendMessageResponse::Task(task) => StreamResponse::Task(task),
                a2a::SendMessageResponse::Message(message) => StreamResponse::Message(message),
            };
            absorb(&mut outcome, event);
        }
        // Not settled yet (a stream that ended early, a task still working): poll.
        while !settled(outcome.state.as_ref()) {
            let Some((remote_task, _)) = outcome.remote_task.clone() else {
                return Err(OutboundError::Protocol("a task without an id".to_owned()));
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(OutboundError::TimedOut(timeout));
            }
            tokio::time::sleep(POLL_EVERY).await;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let task = self.get_task(&remote_task, left.max(POLL_EVERY)).await?;
            outcome.clear_answer();
            absorb(&mut outcome, StreamResponse::Task(task));
        }
        Ok(outcome)
    }
}

/// Bodies up to this size are decoded on the async runtime; larger ones on a blocking thread,
/// so a remote's large answer never holds up another request's task.
const DECODE_INLINE_BYTES: usize = 64 * 1024;

/// Decodes `body` with `decoder` ([`crate::remote::answer`]), off the async runtime when it is large.
async fn decode<T: Send + 'static>(
    body: Vec<u8>,
    decoder: fn(&[u8]) -> Result<T, OutboundError>,
) -> Result<T, OutboundError> {
    if body.len() <= DECODE_INLINE_BYTES {
        return decoder(&body);
    }
    tokio::task::spawn_blocking(move || decoder(&body))
        .await
        .map_err(|err| OutboundError::Protocol(format!("decoding the answer failed: {err}")))?
}

/// The current span's `traceparent`/`tracestate`, as HTTP header pairs.
fn trace_context() -> Vec<(&'static str, String)> {
    let headers = switchboard_runtime::telemetry::traced_headers();
    [
        switchboard_proto::HEADER_TRACEPARENT,
        switchboard_proto::HEADER_TRACESTATE,
    ]
    .into_iter()
    .filter_map(|name| Some((name, headers.get(name)?.as_str().to_owned())))
    .collect()
}

/// The events of a `SendStreamingMessage` (server-sent events, each a JSON-RPC response).
#[derive(Debug)]
pub struct EventStream {
    response: reqwest::Response,
    buffer: Vec<u8>,
    /// How much of `buffer` holds no event boundary (each chunk is searched once).
    scanned: usize,
    timeout: Duration,
}

impl EventStream {
    /// The next event; `None` when the remote ends the stream.
    pub async fn next(&mut self) -> Option<Result<StreamResponse, OutboundError>> {
        loop {
            // A boundary may straddle the last chunk's end: look from 3 bytes before it.
            let from = self.scanned.saturating_sub(3);
            if let Some((end, skip)) = event_boundary(&self.buffer[from..]) {
                let (end, skip) = (from + end, skip);
                let event: Vec<u8> = self.buffer.drain(..end + skip).take(end).collect();
                self.scanned = 0;
                match event_data(&event) {
                    Some(data) => {
                        return Some(decode(data, crate::remote::answer::stream_response).await);
                    }
                    None => continue,
                }
            }
            self.scanned = self.buffer.len();
            match self.response.chunk().await {
                Ok(Some(chunk)) => {
                    if self.buffer.len() + chunk.len() > MAX_ANSWER_BYTES {
                        return Some(Err(OutboundError::Protocol(format!(
                            "an event larger than {MAX_ANSWER_BYTES} bytes"
                        ))));
                    }
                    self.buffer.extend_from_slice(&chunk);
                }
                Ok(None) => {
                    // A last event without its blank line still counts.
                    let rest = std::mem::take(&mut self.buffer);
                    return match event_data(&rest) {
                        Some(data) => {
                            Some(decode(data, crate::remote::answer::stream_response).await)
                        }
                        None => None,
                    };
                }
                Err(err) => return Some(Err(OutboundError::transport(&err, self.timeout))),
            }
        }
    }
}

/// Where the first event in `buffer` ends, and the length of the blank line after it.
fn event_boundary(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|at| (at, 2));
    let crlf = buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| (at, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The joined `data:` lines of one event; `None` for an event without data (a comment, a
/// keep-alive).
fn event_data(event: &[u8]) -> Option<Vec<u8>> {
    let mut data: Option<Vec<u8>> = None;
    for line in event.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            let joined = data.get_or_insert_with(Vec::new);
            if !joined.is_empty() {
                joined.push(b'\n');
            }
            joined.extend_from_slice(value);
        }
    }
    data
}

/// Whether a remote task stopped (ended, or waits for input).
pub fn settled(state: Option<&a2a::TaskState>) -> bool {
    matches!(
        state,
        Some(
            a2a::TaskState::Completed
                | a2a::TaskState::Failed
                | a2a::TaskState::Rejected
                | a2a::TaskState::Canceled
                | a2a::TaskState::InputRequired
                | a2a::TaskState::AuthRequired
        )
    )
}

/// Folds one event into `outcome`; returns a status message's text (a progress note).
fn absorb(outcome: &mut Outcome, event: StreamResponse) -> Option<String> {
    match event {
        StreamResponse::Message(message) => {
            collect(outcome, &message.parts);
            outcome.state = Some(a2a::TaskState::Completed);
            None
        }
        StreamResponse::Task(task) => {
            outcome.remote_task = Some((task.id.clone(), task.context_id.clone()));
            outcome.state = Some(task.status.state);
            outcome.status_text = task.status.message.as_ref().map(|m| text_of(&m.parts));
            for artifact in task.artifacts.iter().flatten() {
                collect(outcome, &artifact.parts);
            }
            None
        }
        StreamResponse::StatusUpdate(update) => {
            outcome.remote_task = Some((update.task_id.clone(), update.context_id.clone()));
            outcome.state = Some(update.status.state);
            let note = update.status.message.as_ref().map(|m| text_of(&m.parts));
            outcome.status_text = note.clone().or(outcome.status_text.take());
            note.filter(|n| !n.is_empty())
        }
        StreamResponse::ArtifactUpdate(update) => {
            collect(outcome, &update.artifact.parts);
            None
        }
    }
}

/// Adds `parts` to the answer: text joined, data and url parts carried, inline bytes named.
/// Adds `parts` to the answer: text joined, data and url parts carried, inline bytes named.
/// The fabric's limits bound it, whatever the remote sends: text past 64 KiB and parts past
/// 16 or 32 KiB (as JSON) are left out.
fn collect(outcome: &mut Outcome, parts: &[A2aPart]) {
    const PARTS_MAX: usize = 16;
    const PARTS_BYTES_MAX: usize = 32 * 1024;
    for part in parts {
        let carried = match &part.content {
            PartContent::Text(text) => {
                outcome.add_text(text);
                continue;
            }
            PartContent::Raw(_) => {
                outcome.add_text("[inline bytes not carried]");
                continue;
            }
            PartContent::Data(data) => switchboard_proto::Part::Data { data: data.clone() },
            PartContent::Url(url) => switchboard_proto::Part::File {
                uri: url.clone(),
                mime: part.media_type.clone(),
                name: part.filename.clone(),
            },
        };
        let size = serde_json::to_vec(&carried).map_or(usize::MAX, |json| json.len());
        if outcome.parts.len() < PARTS_MAX && outcome.parts_bytes + size <= PARTS_BYTES_MAX {
            outcome.parts_bytes += size;
            outcome.parts.push(carried);
        }
    }
}

fn text_of(parts: &[A2aPart]) -> String {
    parts
        .iter()
        .filter_map(|part| match &part.content {
            PartContent::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` cut to the fabric's body limit (64 KiB), marked when cut.
pub fn fit(text: String) -> String {
    const MARK: &str = "\n[cut at 64 KiB]";
    let max = switchboard_proto::MAX_BODY_BYTES;
    if text.len() <= max {
        return text;
    }
    let mut end = max - MARK.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_text_parts_keeps_what_fits_the_body_limit() {
        let mut outcome = Outcome::default();
        let empty = vec![A2aPart::text(""); 200_000];
        collect(&mut outcome, &empty);
        collect(&mut outcome, &[A2aPart::text("late")]);
        // Each part counts its line break: the flood stops at the body limit.
        assert_eq!(outcome.text.len(), switchboard_proto::MAX_BODY_BYTES + 1);
        assert!(outcome.answer().len() <= switchboard_proto::MAX_BODY_BYTES);
    }

    #[test]
    fn long_answers_are_cut_to_the_body_limit_at_a_character() {
        let text = "é".repeat(40_000);
        let cut = fit(text);
        assert!(cut.len() <= switchboard_proto::MAX_BODY_BYTES);
        assert!(cut.ends_with("[cut at 64 KiB]"));
        assert_eq!(fit("short".to_owned()), "short");
    }

    #[test]
    fn a_stream_settles_at_an_end_or_a_question() {
        assert!(!settled(None));
        assert!(!settled(Some(&a2a::TaskState::Working)));
        assert!(settled(Some(&a2a::TaskState::InputRequired)));
        assert!(settled(Some(&a2a::TaskState::Completed)));
    }

    #[test]
    fn artifacts_are_the_answer_and_a_status_note_the_fallback() {
        let mut outcome = Outcome::default();
        assert_eq!(outcome.answer(), "(the remote agent answered without text)");
        outcome.status_text = Some("thinking".to_owned());
        assert_eq!(outcome.answer(), "thinking");
        collect(&mut outcome, &[A2aPart::text("a"), A2aPart::text("b")]);
        assert_eq!(outcome.answer(), "a\nb");
    }

    #[test]
    fn events_split_on_blank_lines_and_join_their_data_lines() {
        let stream = b": keep-alive\n\nid: 1\ndata: {\"a\":\ndata: 1}\n\r\n\r\ndata: x";
        let Some((end, skip)) = event_boundary(stream) else {
            panic!("a boundary")
        };
        assert_eq!(event_data(&stream[..end]), None, "a comment has no data");
        let rest = &stream[end + skip..];
        let Some((end, _)) = event_boundary(rest) else {
            panic!("a second boundary")
        };
        assert_eq!(
            event_data(&rest[..end]).as_deref(),
            Some(&b"{\"a\":\n1}"[..])
        );
    }
}
