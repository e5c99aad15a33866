//! The `[files]` config section.

use serde::{Deserialize, Serialize};

/// Files settings (`[files]`, `SWITCHBOARD_FILES__*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilesConfig {
    /// The largest file an agent may upload, in bytes (1 to 2^40; default 1 GiB).
    pub max_file_bytes: u64,
    /// Bytes of files one agent may keep, complete or being uploaded (default 10 GiB). An
    /// upload over it is refused before any data moves.
    pub quota_bytes: u64,
    /// An upload with no chunk for this long is given up and its chunks removed, in seconds
    /// (10 to 86,400; default an hour).
    pub upload_idle_secs: u64,
    /// How often each replica removes the files whose time ran out, in ms (100 to 86,400,000;
    /// default a minute).
    pub sweep_ms: u64,
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self {
            max_file_bytes: 1 << 30,
            quota_bytes: 10 << 30,
            upload_idle_secs: 3600,
            sweep_ms: 60_000,
        }
    }
}

impl switchboard_runtime::config::Section for FilesConfig {
    fn validate(&self) -> Result<(), String> {
        let ranges: [(&str, u64, u64, u64); 4] = [
            ("max_file_bytes", self.max_file_bytes, 1, 1 << 40),
            ("quota_bytes", self.quota_bytes, 1, 1 << 50),
            ("upload_idle_secs", self.upload_idle_secs, 10, 86_400),
            ("sweep_ms", self.sweep_ms, 100, 86_400_000),
        ];
        for (name, value, low, high) in ranges {
            if !(low..=high).contains(&value) {
                return Err(format!("{name} is {value}; it must be {low}..={high}"));
            }
        }
        Ok(())
    }
}

/// Config section name.
pub const SECTION: &str = "files";

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::config::Section;

    #[test]
    fn defaults_hold_and_out_of_range_is_refused() {
        assert!(FilesConfig::default().validate().is_ok());
        let bad = [
            FilesConfig {
                max_file_bytes: 0,
                ..FilesConfig::default()
            },
            FilesConfig {
                upload_idle_secs: 86_401,
                ..FilesConfig::default()
            },
            FilesConfig {
                sweep_ms: 99,
                ..FilesConfig::default()
            },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }
}
