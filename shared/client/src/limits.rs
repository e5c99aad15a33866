//! Provider limits (docs/protocol.md §15): take a lease before calling an LLM provider, give
//! it back with the tokens used. The fleet's leases never exceed what the operator declared
//! for the key, and a lease whose holder dies returns by itself at its expiry.
//!
//! ```no_run
//! # async fn demo(agent: &switchboard_client::Agent) -> Result<(), switchboard_client::ClientError> {
//! use std::time::Duration;
//! let lease = agent.limit("openai:gpt-4.1", 1_200, Duration::from_secs(30)).await?;
//! // … call the provider …
//! lease.release(Some(900)).await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use switchboard_proto::limits::{
    AcquireRequest, Lease, LimitList, LimitQuery, LimitSpec, LimitView, LimitsOp, LimitsOpsOp,
    ReleaseRequest, Released, RenewRequest,
};
use switchboard_request::request::{request_json, request_json_retrying};
use uuid::Uuid;

use crate::Agent;
use crate::error::ClientError;

/// A lease held: release it when the provider call is done (dropping it without a release
/// gives it back in the background, with the estimate as the tokens used).
#[derive(Debug)]
pub struct LimitLease {
    by: By,
    lease: Lease,
    released: bool,
}

/// How a lease's holder reaches the service.
#[derive(Debug, Clone)]
struct By {
    nats: async_nats::Client,
    agent: switchboard_proto::AgentId,
    timeout: Duration,
    retries: u32,
}

impl By {
    async fn request<Req, Resp>(&self, op: LimitsOp, body: &Req) -> Result<Resp, ClientError>
    where
        Req: serde::Serialize + ?Sized,
        Resp: serde::de::DeserializeOwned,
    {
        // Safe to repeat: a release and a renew are idempotent.
        request_json_retrying(
            &self.nats,
            &op.subject(&self.agent),
            body,
            self.timeout,
            self.retries,
        )
        .await
        .map_err(ClientError::from)
    }
}

impl LimitLease {
    /// What the service granted.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Gives the lease back with the tokens the call used (`None`: the estimate).
    pub async fn release(mut self, tokens_used: Option<u64>) -> Result<Released, ClientError> {
        self.released = true;
        release(&self.by, &self.lease, tokens_used).await
    }

    /// Holds the lease `hold` more from now (at most the limit's `max_hold_ms`).
    pub async fn renew(&mut self, hold: Option<Duration>) -> Result<(), ClientError> {
        let body = RenewRequest {
            key: self.lease.key.clone(),
            lease_id: self.lease.lease_id,
            hold_ms: hold.map(|h| u64::try_from(h.as_millis()).unwrap_or(u64::MAX)),
        };
        self.lease = self.by.request(LimitsOp::Renew, &body).await?;
        Ok(())
    }
}

async fn release(
    by: &By,
    lease: &Lease,
    tokens_used: Option<u64>,
) -> Result<Released, ClientError> {
    let body = ReleaseRequest {
        key: lease.key.clone(),
        lease_id: lease.lease_id,
        tokens_used,
    };
    by.request(LimitsOp::Release, &body).await
}

impl Drop for LimitLease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (by, lease) = (self.by.clone(), self.lease.clone());
            runtime.spawn(async move {
                if let Err(err) = release(&by, &lease, None).await {
                    tracing::warn!(lease = %lease.lease_id, error = %err, "lease not released; it returns at its expiry");
                }
            });
        }
    }
}

impl Agent {
    fn by(&self) -> By {
        By {
            nats: self.nats().clone(),
            agent: self.id().clone(),
            timeout: self.options().request_timeout,
            retries: self.options().send_retries,
        }
    }

    /// Takes a lease on `key` drawing `tokens` (an estimate), waiting up to `wait` (at most
    /// 60 s) for one; `limited` when none came in time.
    pub async fn limit(
        &self,
        key: &str,
        tokens: u64,
        wait: Duration,
    ) -> Result<LimitLease, ClientError> {
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let body = AcquireRequest {
            key: key.to_owned(),
            tokens,
            wait_ms,
            hold_ms: None,
            lease_id: Some(Uuid::now_v7()),
        };
        let by = self.by();
        // One attempt, not hedged: a copy sent while the first waits would queue again behind
        // it, and one arriving after the lease's release would take a second lease.
        let lease = request_json(
            &by.nats,
            &LimitsOp::Acquire.subject(&by.agent),
            &body,
            wait + by.timeout,
        )
        .await
        .map_err(ClientError::from)?;
        Ok(LimitLease {
            by,
            lease,
            released: false,
        })
    }

    /// A limit and what is in use, with this agent's own leases.
    pub async fn limit_view(&self, key: &str) -> Result<LimitView, ClientError> {
        let body = LimitQuery {
            key: key.to_owned(),
        };
        self.by().request(LimitsOp::Get, &body).await
    }
}

/// Operator: declares or changes a limit (the services' account; applies at once).
pub async fn limits_set(
    nats: &async_nats::Client,
    spec: &LimitSpec,
) -> Result<LimitView, ClientError> {
    ops(nats, LimitsOpsOp::Set, spec).await
}

/// Operator: removes a limit and its leases.
pub async fn limits_delete(nats: &async_nats::Client, key: &str) -> Result<LimitView, ClientError> {
    let body = LimitQuery {
        key: key.to_owned(),
    };
    ops(nats, LimitsOpsOp::Delete, &body).await
}

/// Operator: every limit, with every lease.
pub async fn limits_list(nats: &async_nats::Client) -> Result<LimitList, ClientError> {
    ops(nats, LimitsOpsOp::List, &serde_json::json!({})).await
}

async fn ops<Req, Resp>(
    nats: &async_nats::Client,
    op: LimitsOpsOp,
    body: &Req,
) -> Result<Resp, ClientError>
where
    Req: serde::Serialize + ?Sized,
    Resp: serde::de::DeserializeOwned,
{
    request_json(nats, &op.subject(), body, Duration::from_secs(10))
        .await
        .map_err(ClientError::from)
}
