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
use switchboard_proto::limits::{KEEPER_PREFIX, LimitSpec};

use tokio::sync::{mpsc, oneshot};

use super::{Job, Keeper, Keepers, Msg, now_ms, stopped};
use crate::error::LimitsError;
use crate::ledger::{Ledger, Op, Outcome};

/// How long a lost compare-and-set marks a key contended at a replica (its batches go to the
/// key's writer meanwhile).
pub(super) const CONTENDED: Duration = Duration::from_secs(2);
/// How long a keeper waits for the writer to answer a forwarded batch before it writes
/// itself.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the writer may still apply a forwarded batch: 250 ms less than the sender waits,
/// a margin for the replicas' clocks (which must agree, protocol §15 "Clocks").
const NOT_AFTER: Duration = Duration::from_millis(750);
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
    /// The writer applies none of them after this (ms since the epoch): the sender writes
    /// them itself once its request has timed out, later than this, so no op is applied by
    /// both.
    pub not_after_ms: u64,
}

/// What the writer made of a forwarded batch.
#[derive(Debug, Serialize, Deserialize)]
pub struct Forwarded {
    /// Each op's outcome, in order, or why it failed at the writer (answered as
    /// `unavailable`, never applied again by the sender).
    pub outcomes: Vec<Result<Outcome, String>>,
    /// The state's revision that holds them.
    pub revision: u64,
}

/// A batch back from the key's writer: its jobs and what the writer made of them.
pub(super) struct Returned {
    jobs: Vec<Job>,
    result: Result<Forwarded, String>,
}

impl Keepers {
    /// Applies another replica's batch here (written here whatever this replica's view of the
    /// key's writer), all of it or none: each op's own outcome or failure (`Waiting` for an
    /// acquire that waits), and the newest revision among them. An op still queued here at
    /// `not_after_ms` fails unapplied: its sender writes it itself after that.
    pub async fn submit_forwarded(
        &self,
        spec: &LimitSpec,
        ops: Vec<Op>,
        not_after_ms: u64,
    ) -> Result<Forwarded, LimitsError> {
        let count = ops.len();
        let mut pending = Vec::with_capacity(count);
        for _ in 0..2 {
            let sender = self.keeper(&spec.key);
            match sender.try_reserve_many(count) {
                Ok(permits) => {
                    for (permit, op) in permits.zip(ops) {
                        let (answer, outcome) = oneshot::channel();
                        permit.send(Msg::Job(Job {
                            spec: spec.clone(),
                            op,
                            answer,
                            forwarded: true,
                            not_after_ms,
                        }));
                        pending.push(outcome);
                    }
                    break;
                }
                Err(mpsc::error::TrySendError::Full(())) => {
                    return Err(LimitsError::Unavailable(
                        "this replica has too many requests queued for the key; retry".to_owned(),
                    ));
                }
                Err(mpsc::error::TrySendError::Closed(())) => self.forget(&spec.key),
            }
        }
        if pending.is_empty() {
            return Err(stopped());
        }
        let mut outcomes = Vec::with_capacity(count);
        let mut revision = 0;
        for answer in pending {
            match answer.await.unwrap_or_else(|_| Err(stopped())) {
                Ok((outcome, at)) => {
                    outcomes.push(Ok(outcome));
                    revision = revision.max(at);
                }
                Err(err) => outcomes.push(Err(err.to_string())),
            }
        }
        Ok(Forwarded { outcomes, revision })
    }
}

/// Answers, unapplied, every forwarded job past its `not_after_ms` (its sender writes it
/// itself from then on) and takes it out of `jobs`; `true` when it took any.
pub(super) fn expire_forwarded(jobs: &mut Vec<Job>) -> bool {
    let now = now_ms();
    if !jobs.iter().any(|job| job.not_after_ms <= now) {
        return false;
    }
    let (expired, kept): (Vec<Job>, Vec<Job>) = std::mem::take(jobs)
        .into_iter()
        .partition(|job| job.not_after_ms <= now);
    *jobs = kept;
    for job in expired {
        let _ = job.answer.send(Err(LimitsError::Unavailable(
            "the forwarded request was not written in time; its replica writes it".to_owned(),
        )));
    }
    true
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
            not_after_ms: now_ms() + NOT_AFTER.as_millis() as u64,
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
                    match outcome {
                        Ok(outcome) => self.answer(job, outcome, revision),
                        Err(why) => {
                            let _ = job.answer.send(Err(LimitsError::Unavailable(why)));
                        }
                    }
                }
            }
            Ok(_) | Err(_) => {
                self.contended_until_ms = 0;
                self.write_here(back.jobs, false, false).await;
            }
        }
    }
}
