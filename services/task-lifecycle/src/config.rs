//! The `[task_lifecycle]` config section.

use serde::{Deserialize, Serialize};
use switchboard_proto::{MAX_OPEN_CHILDREN, TASK_DEPTH_LIMIT};

/// Task service settings (`[task_lifecycle]`, `SWITCHBOARD_TASK_LIFECYCLE__*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskConfig {
    /// Deepest nesting of subagent tasks (a task without parent is depth 1).
    pub depth_limit: u32,
    /// Open (non-terminal) children one task may have at once.
    pub max_open_children: usize,
    /// Children one task may spawn over its life (bounds the record's size).
    pub max_children: usize,
    /// How often each replica looks for tasks past their deadline, in milliseconds.
    pub sweep_interval_ms: u64,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            depth_limit: TASK_DEPTH_LIMIT,
            max_open_children: MAX_OPEN_CHILDREN,
            max_children: 256,
            sweep_interval_ms: 1_000,
        }
    }
}

impl switchboard_runtime::config::Section for TaskConfig {
    fn validate(&self) -> Result<(), String> {
        if self.depth_limit == 0 {
            return Err("depth_limit must be at least 1".to_owned());
        }
        if self.max_open_children == 0 || self.sweep_interval_ms == 0 {
            return Err("max_open_children and sweep_interval_ms must be above 0".to_owned());
        }
        if self.max_children < self.max_open_children {
            return Err(format!(
                "max_children {} is below max_open_children {}",
                self.max_children, self.max_open_children
            ));
        }
        Ok(())
    }
}

/// Config section name.
pub const SECTION: &str = "task_lifecycle";

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::config::Section;

    #[test]
    fn defaults_are_the_issue_figures() {
        let config = TaskConfig::default();
        assert_eq!(config.depth_limit, 3);
        assert_eq!(config.max_open_children, 8);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn contradictions_are_refused() {
        let base = TaskConfig::default();
        for bad in [
            TaskConfig {
                depth_limit: 0,
                ..base.clone()
            },
            TaskConfig {
                max_open_children: 0,
                ..base.clone()
            },
            TaskConfig {
                max_children: 4,
                ..base.clone()
            },
            TaskConfig {
                sweep_interval_ms: 0,
                ..base.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
