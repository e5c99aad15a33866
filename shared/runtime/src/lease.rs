//! A lease in a KV bucket: one key, held by the replica whose id it holds. The bucket's
//! `max_age` is the lease's life: a holder that stops renewing (crash, pause, partition) loses
//! it when the key expires, and another replica takes it with a create (which only one of
//! several racing replicas wins). Used for the audit writer (one key) and the A2A gateway's
//! remote agents (one key per agent).

use async_nats::jetstream::kv;

/// This replica's handle on one lease key.
#[derive(Debug)]
pub struct Lease {
    kv: kv::Store,
    key: String,
    holder: String,
    revision: Option<u64>,
}

impl Lease {
    /// A handle on `key` of `kv` for `holder` (this replica's id: the value written while it
    /// holds the lease); nothing is held yet.
    pub fn new(kv: kv::Store, key: impl Into<String>, holder: impl Into<String>) -> Self {
        Self {
            kv,
            key: key.into(),
            holder: holder.into(),
            revision: None,
        }
    }

    /// The id this replica writes when it holds the lease.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether the last acquire or renew succeeded (and no release followed).
    pub fn held(&self) -> bool {
        self.revision.is_some()
    }

    /// Takes the lease if nobody holds it.
    pub async fn acquire(&mut self) -> bool {
        match self
            .kv
            .create(self.key.as_str(), self.holder.clone().into())
            .await
        {
            Ok(revision) => {
                self.revision = Some(revision);
                true
            }
            Err(_) => false,
        }
    }

    /// Renews the lease; false when it was lost (expired and taken, or unreachable).
    pub async fn renew(&mut self) -> bool {
        let Some(revision) = self.revision else {
            return false;
        };
        match self
            .kv
            .update(self.key.as_str(), self.holder.clone().into(), revision)
            .await
        {
            Ok(revision) => {
                self.revision = Some(revision);
                true
            }
            Err(err) => {
                tracing::warn!(key = %self.key, error = %err, "lease not renewed");
                self.revision = None;
                false
            }
        }
    }

    /// Renews the lease when held, else tries to take it; true when held afterwards.
    pub async fn keep_or_take(&mut self) -> bool {
        if self.held() {
            self.renew().await
        } else {
            self.acquire().await
        }
    }

    /// Gives the lease up (on shutdown), so another replica takes over at once.
    pub async fn release(&mut self) {
        if let Some(revision) = self.revision.take()
            && let Err(err) = self
                .kv
                .delete_expect_revision(self.key.as_str(), Some(revision))
                .await
        {
            tracing::debug!(key = %self.key, error = %err, "lease not released");
        }
    }
}
