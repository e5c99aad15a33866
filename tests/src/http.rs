//! A minimal HTTP/1.1 client over a plain TCP stream, enough to drive the A2A gateway the
//! way any client would (and to send what no well-behaved client sends): one request per
//! connection, chunked bodies decoded, Server-Sent Events read one event at a time.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A response read whole.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == &name.to_ascii_lowercase())
            .map(|(_, value)| value.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|err| {
            panic!("not JSON ({err}): {}", String::from_utf8_lossy(&self.body))
        })
    }
}

fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if method != "GET" || !body.is_empty() {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

async fn head(reader: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP status line: {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            return (status, headers);
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
}

/// Sends one request and reads the whole response (at most 30 s).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(&request_bytes(method, path, headers, body))
            .await
            .unwrap();
        let mut reader = BufReader::new(stream);
        let (status, headers) = head(&mut reader).await;
        let chunked = headers
            .iter()
            .any(|(name, value)| name == "transfer-encoding" && value.contains("chunked"));
        let mut body = Vec::new();
        if chunked {
            while let Some(chunk) = read_chunk(&mut reader).await {
                body.extend_from_slice(&chunk);
            }
        } else {
            reader.read_to_end(&mut body).await.unwrap();
        }
        HttpResponse {
            status,
            headers,
            body,
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{method} {path}: no full response within 30 s"))
}

async fn read_chunk(reader: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut size = String::new();
    if reader.read_line(&mut size).await.ok()? == 0 {
        return None;
    }
    let size = usize::from_str_radix(size.trim().split(';').next()?.trim(), 16).ok()?;
    if size == 0 {
        return None;
    }
    let mut chunk = vec![0; size + 2];
    reader.read_exact(&mut chunk).await.ok()?;
    chunk.truncate(size);
    Some(chunk)
}

/// One Server-Sent Event.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    /// Its `id:` field, if any.
    pub id: Option<String>,
    /// Its `data:` lines, joined.
    pub data: String,
}

/// An open SSE response, read an event at a time.
pub struct SseStream {
    /// The response status.
    pub status: u16,
    /// The response headers (lowercased names).
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    pending: String,
}

impl SseStream {
    /// Sends the request and reads the response head.
    pub async fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Self {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(&request_bytes("POST", path, headers, body))
            .await
            .unwrap();
        let mut reader = BufReader::new(stream);
        let (status, headers) = head(&mut reader).await;
        Self {
            status,
            headers,
            reader,
            pending: String::new(),
        }
    }

    /// The next event (keep-alive comments skipped), `None` when the stream ends, at most
    /// `within` of waiting.
    pub async fn next(&mut self, within: Duration) -> Option<SseEvent> {
        tokio::time::timeout(within, async {
            loop {
                if let Some(end) = self.pending.find("\n\n") {
                    let block: String = self.pending.drain(..end + 2).collect();
                    let mut event = SseEvent {
                        id: None,
                        data: String::new(),
                    };
                    for line in block.lines() {
                        if let Some(id) = line.strip_prefix("id:") {
                            event.id = Some(id.trim().to_owned());
                        } else if let Some(data) = line.strip_prefix("data:") {
                            if !event.data.is_empty() {
                                event.data.push('\n');
                            }
                            event.data.push_str(data.strip_prefix(' ').unwrap_or(data));
                        }
                    }
                    if event.data.is_empty() {
                        continue;
                    }
                    return Some(event);
                }
                let chunk = read_chunk(&mut self.reader).await?;
                self.pending
                    .push_str(&String::from_utf8_lossy(&chunk).replace("\r\n", "\n"));
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no SSE event within {within:?}"))
    }
}

/// One POST a [`webhook_sink`] received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The request headers (lowercased names).
    pub headers: Vec<(String, String)>,
    /// The body, as JSON.
    pub body: serde_json::Value,
}

/// A webhook receiver on loopback: answers its first `fail_first` POSTs with 503 (to make the
/// sender retry), then records each POST's headers and JSON body and answers 200. Returns its
/// URL and what it recorded.
pub async fn webhook_sink(
    fail_first: usize,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Received>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&received);
    let failures = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(fail_first));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let sink = std::sync::Arc::clone(&sink);
            let failures = std::sync::Arc::clone(&failures);
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let mut headers = Vec::new();
                    let mut length = 0usize;
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).await.unwrap_or(0);
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':') {
                            let name = name.trim().to_ascii_lowercase();
                            if name == "content-length" {
                                length = value.trim().parse().unwrap_or(0);
                            }
                            headers.push((name, value.trim().to_owned()));
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let fail = failures
                        .fetch_update(
                            std::sync::atomic::Ordering::SeqCst,
                            std::sync::atomic::Ordering::SeqCst,
                            |left| left.checked_sub(1),
                        )
                        .is_ok();
                    let status = if fail {
                        "503 Service Unavailable"
                    } else {
                        sink.lock().unwrap().push(Received {
                            headers,
                            body: serde_json::from_slice(&body).unwrap_or_default(),
                        });
                        "200 OK"
                    };
                    let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                    if reader.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, received)
}
