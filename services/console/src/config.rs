//! The `[console]` config section.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Console settings (`[console]`, `SWITCHBOARD_CONSOLE__*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Where the page is served. Loopback by default: put a TLS proxy in front to serve it
    /// further.
    pub listen: SocketAddr,
    /// The people file (the same one the people service reads): who may sign in, with which
    /// access. Without one only the one-time local administrator link signs in.
    pub people_file: Option<PathBuf>,
    /// `Host` values the console answers besides `127.0.0.1:<port>` and `localhost:<port>`
    /// (e.g. `console.example.com`); any other is refused (421), against DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// A link from a conversation to its trace in the operator's OpenTelemetry backend, with
    /// `{trace_id}` where the id goes: `http://localhost:16686/trace/{trace_id}` (Jaeger),
    /// `http://localhost:6006/redirects/traces/{trace_id}` (Phoenix 14.2 and later).
    pub trace_url_template: Option<String>,
    /// How long a sign-in lasts, in milliseconds.
    pub session_ttl_ms: u64,
    /// The SHA-256 (hex) of a one-time sign-in token for `bootstrap_person`, minted by
    /// `switchboard up` and shown once in its banner as a link.
    pub bootstrap_token_sha256: Option<String>,
    /// Who the one-time token signs in as (must be in the people file).
    pub bootstrap_person: String,
    /// Server-sent event streams open at once, in all.
    pub max_streams: usize,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8090)),
            people_file: None,
            allowed_hosts: Vec::new(),
            trace_url_template: None,
            session_ttl_ms: 12 * 3_600_000,
            bootstrap_token_sha256: None,
            bootstrap_person: "admin".to_owned(),
            max_streams: 256,
        }
    }
}

impl switchboard_runtime::config::Section for ConsoleConfig {
    fn validate(&self) -> Result<(), String> {
        if self.session_ttl_ms == 0 || self.max_streams == 0 {
            return Err("session_ttl_ms and max_streams must be above 0".to_owned());
        }
        if let Some(template) = &self.trace_url_template {
            let http = template.starts_with("http://") || template.starts_with("https://");
            if !http || !template.contains("{trace_id}") {
                return Err(
                    "trace_url_template must be an http(s) URL with {trace_id} in it".to_owned(),
                );
            }
        }
        if let Some(hash) = &self.bootstrap_token_sha256
            && (hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err("bootstrap_token_sha256 must be 64 hex digits".to_owned());
        }
        Ok(())
    }
}

/// Config section name.
pub const SECTION: &str = "console";

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::config::Section;

    #[test]
    fn defaults_hold_and_bad_links_are_refused() {
        let config = ConsoleConfig::default();
        assert!(config.validate().is_ok());
        assert!(config.listen.ip().is_loopback());
        for bad in ["javascript:alert(1)/{trace_id}", "http://x/trace"] {
            let config = ConsoleConfig {
                trace_url_template: Some(bad.to_owned()),
                ..ConsoleConfig::default()
            };
            assert!(config.validate().is_err(), "{bad}");
        }
    }
}
