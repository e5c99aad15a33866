//! The `[audit]` config section.

use serde::{Deserialize, Serialize};

/// Audit settings (`[audit]`, `SWITCHBOARD_AUDIT__*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// The query index's SQLite file; empty uses a private temporary file (rebuilt from `AGENT_AUDIT` at
    /// every start). With a file, a restart reads only what was appended since.
    pub index_path: String,
    /// Most source messages appended in one batch (their publishes are pipelined).
    pub batch: usize,
    /// How often the index reads records other replicas appended, in milliseconds.
    pub catch_up_interval_ms: u64,
    /// Name prefix of the durable consumers on `AGENT_INBOX` and `AGENT_EVENTS` (replicas
    /// sharing it share the work).
    pub consumer: String,
    /// How long a source message may stay unacknowledged before it is delivered again (to
    /// any replica), in milliseconds.
    pub ack_wait_ms: u64,
    /// The writer lease: one replica appends at a time and renews the lease every third of
    /// this; when it stops renewing, another replica takes over after this long, in
    /// milliseconds.
    pub lease_ttl_ms: u64,
    /// The audit binary's CPU priority, as a Linux nice value (0 to 19; 0 leaves it as it
    /// is). The trail is written asynchronously, so where the audit shares cores with
    /// nats-server and the message path it yields to them and catches up when they are idle.
    /// Only the `audit` binary applies it (`switchboard up` runs every service in one process).
    pub nice: i32,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            index_path: String::new(),
            batch: 256,
            catch_up_interval_ms: 500,
            consumer: "audit".to_owned(),
            ack_wait_ms: 30_000,
            lease_ttl_ms: 10_000,
            nice: 10,
        }
    }
}

impl switchboard_runtime::config::Section for AuditConfig {
    fn validate(&self) -> Result<(), String> {
        // Up to 4 × batch publishes are in flight; the client allows 5,000 outstanding acks.
        if !(0..=19).contains(&self.nice) {
            return Err(format!("nice must be 0 to 19, not {}", self.nice));
        }
        if self.batch == 0 || self.batch > 1_000 {
            return Err(format!("batch must be 1 to 1000, not {}", self.batch));
        }
        if self.catch_up_interval_ms == 0 || self.ack_wait_ms == 0 {
            return Err("catch_up_interval_ms and ack_wait_ms must be above 0".to_owned());
        }
        if self.lease_ttl_ms < 300 {
            return Err(format!(
                "lease_ttl_ms must be at least 300, not {}",
                self.lease_ttl_ms
            ));
        }
        if switchboard_proto::AgentId::parse(&self.consumer).is_err() {
            return Err(format!(
                "consumer `{}` must be a simple name ([a-z0-9_-])",
                self.consumer
            ));
        }
        Ok(())
    }
}

/// Config section name.
pub const SECTION: &str = "audit";

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::config::Section;

    #[test]
    fn defaults_are_valid_and_contradictions_are_not() {
        assert!(AuditConfig::default().validate().is_ok());
        for bad in [
            AuditConfig {
                batch: 0,
                ..AuditConfig::default()
            },
            AuditConfig {
                catch_up_interval_ms: 0,
                ..AuditConfig::default()
            },
            AuditConfig {
                consumer: "a.b".into(),
                ..AuditConfig::default()
            },
            AuditConfig {
                batch: 1_001,
                ..AuditConfig::default()
            },
            AuditConfig {
                lease_ttl_ms: 100,
                ..AuditConfig::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
