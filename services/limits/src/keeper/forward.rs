//! One writer while a key is contended (docs/protocol.md §15, "How leases are kept"): a
//! keeper that lost a compare-and-set round on its key in the last [`CONTENDED`] sends its
//! batches to the replica named as the writer of the state it holds, on
//! `_SB.limits.keeper.<replica>`, if that replica's id sorts before its own; the writer
//! applies them in its own next batch and answers each op's outcome and the revision it
//! wrote. Forwarded batches are never sent on, and only ever to a smaller id, so no two
//! keepers wait on each other. A writer that does not answer is skipped: the keeper writes the
//! batch itself. Correctness rests on the compare-and-set alone.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchboard_proto::limits::KEEPER_PREFIX;

use super::{Job, Keeper, now_ms};
use crate::ledger::{Ledger, Op, Outcome};

/// How long a lost compare-and-set marks a key contended at a replica (its batches go to the
/// key's writer meanwhile).
pub(super) const CONTENDED: Duration = Duration::from_secs(2);
/// How long a keeper waits for the writer to answer a forwarded batch before it writes
/// itself.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(1);
/// Batches one keeper has at the writer at once; past that it takes no new request until one
/// comes back.
pub(super) const FORWARDS_IN_FLIGHT: usize = 4;

/// A batch one replica sends the writer of a contended key.
#[derive(Debug, Serialize, Deserialize)]
pub struct Forward {
    /// The limit key.
    pub key: String,
    /// The ops, in order (at most a keeper's batch, 512).
    pub ops: Vec<Op>,
}

/// What the writer made of a forwarded batch.
#[derive(Debug, Serialize, Deserialize)]
pub struct Forwarded {
    /// Each op's outcome, in order.
    pub outcomes: Vec<Outcome>,
    /// The state's revision that holds them.
    pub revision: u64,
}

/// A batch back from the key's writer: its jobs and what the writer made of them.
pub(super) struct Returned {
    jobs: Vec<Job>,
    result: Result<Forwarded, String>,
}

impl Keeper {
    /// The replica to send this replica's batches to: the one that wrote `ledger`, while the
    /// key is contended here and its id sorts before this replica's.
    pub(super) fn writer_to_forward_to(&self, ledger: &Ledger) -> Option<String> {
        if now_ms() >= self.contended_until_ms {
            return None;
        }
        ledger
            .writer
            .as_deref()
            .filter(|writer| *writer < &*self.me)
            .map(str::to_owned)
    }

    /// Sends `jobs` to `writer` without waiting: they come back through `returns`.
    pub(super) fn send_on(&mut self, writer: String, jobs: Vec<Job>) {
        self.in_flight += 1;
        let forward = Forward {
            key: self.key.clone(),
            ops: jobs.iter().map(|job| job.op.clone()).collect(),
        };
        let (client, returns) = (self.client.clone(), self.returns.clone());
        tokio::spawn(async move {
            let result = switchboard_request::request::request_json(
                &client,
                &format!("{KEEPER_PREFIX}.{writer}"),
                &forward,
                FORWARD_TIMEOUT,
            )
            .await
            .map_err(|err| err.to_string());
            let _ = returns.send(Returned { jobs, result });
        });
    }

    /// A batch back from the writer: its answers, or, if the writer failed it (gone, slow,
    /// refusing), the batch written here.
    pub(super) async fn came_back(&mut self, back: Returned) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match back.result {
            Ok(Forwarded { outcomes, revision }) if outcomes.len() == back.jobs.len() => {
                for (job, outcome) in back.jobs.into_iter().zip(outcomes) {
                    self.answer(job, outcome, revision);
                }
            }
            Ok(_) | Err(_) => {
                self.contended_until_ms = 0;
                self.write_here(back.jobs, false, false).await;
            }
        }
    }
}
