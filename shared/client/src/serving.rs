//! Which call the current task is serving, so calls it makes name their parent
//! (`parent_correlation_id`) without the agent code passing it around — the correlator derives
//! the call chain, and refuses cycles and over-deep chains, from it.

use std::future::Future;

use uuid::Uuid;

tokio::task_local! {
    static SERVING: Uuid;
}

/// Runs `work` as the handling of call `correlation_id`: every [`crate::Agent::call`] or
/// [`crate::Agent::call_parked`] made inside it names that call as its parent.
pub async fn serving<F: Future>(correlation_id: Uuid, work: F) -> F::Output {
    SERVING.scope(correlation_id, work).await
}

/// The call being served by this task, if any.
pub fn current() -> Option<Uuid> {
    SERVING.try_with(|id| *id).ok()
}
