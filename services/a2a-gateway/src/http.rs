//! HTTP client pieces: the builder of every HTTP client the gateway uses (remote agents from
//! `remote/`, webhooks from `serve/push.rs`), the A2A protocol version and a bounded body
//! reader the remote side speaks with. A leaf: it imports nothing from the gateway, so neither
//! side imports the other for it.

use std::time::Duration;

/// The protocol version the gateway speaks.
pub const VERSION: &str = "1.0";

/// The builder of every HTTP client the gateway uses (remote agents, webhooks): rustls (ring,
/// like the NATS connection) verifying with the platform's roots plus `extra_roots` (a
/// private CA, `ca_file`), no redirects (one could leave the checked origin or address), 5 s
/// to connect, and no proxy from the environment: `HTTP_PROXY` and its kin would resolve the
/// host again and undo the pin to the checked address (issue 37).
pub fn http_builder(extra_roots: &[reqwest::Certificate]) -> reqwest::ClientBuilder {
    switchboard_runtime::nats::install_crypto_provider();
    reqwest::Client::builder()
        .tls_backend_rustls()
        .tls_certs_merge(extra_roots.iter().cloned())
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
}

/// Why a response body was not read.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// Reading it failed (connection, timeout).
    Read(reqwest::Error),
    /// It is larger than the limit.
    TooLarge(usize),
}

/// Reads a response body of at most `limit` bytes.
pub(crate) async fn bounded_body(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Read)? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
