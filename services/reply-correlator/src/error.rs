//! Correlator errors. Store failures use the shared [`StoreError`] (so every service maps them
//! to the same kinds); rule violations (cycle, depth, gates) come as ready-made error replies
//! from `switchboard_proto`.

pub use switchboard_runtime::store::StoreError as CorrelatorError;
