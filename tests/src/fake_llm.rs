//! A fake LLM provider over HTTP on loopback, for the fleet test of provider limits (issue 41):
//! it answers each `POST` after a fixed latency, and — as a real provider does — answers `429`
//! to a request past its concurrency or its rate (a token bucket of one second's worth of
//! requests, refilled continuously). It counts what it saw.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the provider allows.
#[derive(Debug, Clone, Copy)]
pub struct ProviderLimits {
    /// Requests in progress at once.
    pub concurrent: usize,
    /// Requests per second (the bucket holds one second's worth).
    pub per_second: f64,
    /// How long each request takes.
    pub latency: Duration,
}

/// What the provider saw.
#[derive(Debug, Default, Clone)]
pub struct ProviderStats {
    /// Requests answered 200.
    pub served: usize,
    /// Requests answered 429.
    pub refused: usize,
    /// Most requests in progress at once.
    pub most_at_once: usize,
    /// When the first and the last request arrived.
    pub first: Option<Instant>,
    /// When the last request was answered.
    pub last: Option<Instant>,
}

#[derive(Debug)]
struct State {
    stats: ProviderStats,
    in_progress: usize,
    bucket: f64,
    at: Instant,
}

/// A running fake provider.
#[derive(Debug, Clone)]
pub struct FakeLlm {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl FakeLlm {
    /// Serves on a free loopback port until the test ends.
    pub async fn start(limits: ProviderLimits) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            stats: ProviderStats::default(),
            in_progress: 0,
            bucket: limits.per_second,
            at: Instant::now(),
        }));
        let shared = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, limits, Arc::clone(&shared)));
            }
        });
        Self { url, state }
    }

    /// What it saw so far.
    pub fn stats(&self) -> ProviderStats {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stats
            .clone()
    }
}

async fn serve(mut stream: TcpStream, limits: ProviderLimits, state: Arc<Mutex<State>>) {
    // Keep-alive: one request after another on the connection.
    let mut buffer = Vec::new();
    loop {
        let Some(end) = read_request(&mut stream, &mut buffer).await else {
            return;
        };
        buffer.drain(..end);
        let admitted = {
            let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            state.stats.first.get_or_insert(now);
            let refill = now.duration_since(state.at).as_secs_f64() * limits.per_second;
            state.bucket = (state.bucket + refill).min(limits.per_second);
            state.at = now;
            if state.in_progress >= limits.concurrent || state.bucket < 1.0 {
                state.stats.refused += 1;
                false
            } else {
                state.bucket -= 1.0;
                state.in_progress += 1;
                state.stats.most_at_once = state.stats.most_at_once.max(state.in_progress);
                true
            }
        };
        let response: &[u8] = if admitted {
            tokio::time::sleep(limits.latency).await;
            let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
            state.in_progress -= 1;
            state.stats.served += 1;
            state.stats.last = Some(Instant::now());
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 42\r\n\r\n{\"text\":\"ok\",\"usage\":{\"total_tokens\":100}}"
        } else {
            b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: 22\r\n\r\n{\"error\":\"rate limit\"}"
        };
        if stream.write_all(response).await.is_err() {
            return;
        }
    }
}

/// Reads one request (headers and a `content-length` body) into `buffer`; the bytes it took.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<usize> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(head) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let headers = String::from_utf8_lossy(&buffer[..head]).to_ascii_lowercase();
            let length: usize = headers
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let end = head + 4 + length;
            if buffer.len() >= end {
                return Some(end);
            }
        }
        if buffer.len() > 1 << 20 {
            return None;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}
