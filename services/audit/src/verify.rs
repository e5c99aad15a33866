//! Verifying the hash chain: `agent.audit.verify` reads `AGENT_AUDIT` itself (not the index)
//! and checks every record against its hash header and the record before it, so a changed,
//! removed or inserted record is found.

use switchboard_proto::audit::{
    AuditRecord, ChainBreak, GENESIS_HASH, HEADER_AUDIT_HASH, VerifyReply,
};

use crate::error::AuditError;
use crate::record;
use crate::store::read_range;
use crate::trail::Trail;

impl Trail {
    /// Walks the chain over everything the stream holds and reports the first break: a body
    /// whose hash is not its header, a `prev_hash` that is not the hash of the record before,
    /// or a sequence gap (a record removed). The first record checked is the stream's first
    /// (earlier ones aged out); only a chain starting at sequence 1 must start at `genesis`.
    pub async fn verify(&self) -> Result<VerifyReply, AuditError> {
        let mut reply = VerifyReply {
            ok: true,
            records: 0,
            first_seq: 0,
            last_seq: 0,
            first_break: None,
        };
        let mut prev: Option<(u64, String)> = None;
        read_range(&self.stream, 1, |stored| {
            if reply.records == 0 {
                reply.first_seq = stored.seq;
            }
            reply.records += 1;
            reply.last_seq = stored.seq;
            if reply.first_break.is_some() {
                return Ok(());
            }
            let computed = record::hash(&stored.payload);
            let claimed = stored
                .headers
                .as_ref()
                .and_then(|h| h.get(HEADER_AUDIT_HASH))
                .map(|h| h.as_str().to_owned());
            let record = serde_json::from_slice::<AuditRecord>(&stored.payload);
            let broken = |reason: String| ChainBreak {
                seq: stored.seq,
                reason,
            };
            let found = match (&record, claimed) {
                (Err(err), _) => Some(broken(format!("the record does not decode: {err}"))),
                (_, None) => Some(broken("the record has no hash header".to_owned())),
                (_, Some(claimed)) if claimed != computed => Some(broken(format!(
                    "the body hashes to {computed}, not to its header {claimed}: it was changed"
                ))),
                (Ok(record), Some(_)) => match &prev {
                    Some((seq, _)) if stored.seq != seq + 1 => Some(broken(format!(
                        "records {} to {} are missing",
                        seq + 1,
                        stored.seq - 1
                    ))),
                    Some((_, hash)) if record.prev_hash != *hash => Some(broken(format!(
                        "prev_hash {} is not the hash of record {} ({hash})",
                        record.prev_hash,
                        stored.seq - 1
                    ))),
                    None if stored.seq == 1 && record.prev_hash != GENESIS_HASH => {
                        Some(broken(format!(
                            "the first record names {} before it, not `{GENESIS_HASH}`",
                            record.prev_hash
                        )))
                    }
                    _ => None,
                },
            };
            if found.is_some() {
                reply.ok = false;
                reply.first_break = found;
            }
            prev = Some((stored.seq, computed));
            Ok(())
        })
        .await?;
        Ok(reply)
    }
}
