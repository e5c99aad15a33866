//! The endpoint table: one micro endpoint per `agent.audit.<op>`, decoding each request and
//! handing it to [`Queries`], whose errors become error replies here.

use std::sync::Arc;

use async_nats::Message;
use switchboard_proto::ErrorReply;
use switchboard_proto::audit::{AuditOp, HistoryRequest, ThreadRequest};
use switchboard_proto::budget::CostQuery;
use switchboard_runtime::micro::{Endpoint, decode};

use crate::queries::Queries;

/// One endpoint per op. Their subjects name no caller, so they share one request bucket per
/// replica: a loop of `verify` or `export` (each reads the whole trail) is bounded.
pub(crate) fn endpoints(queries: &Arc<Queries>) -> Vec<Endpoint> {
    AuditOp::ALL
        .into_iter()
        .map(|op| {
            let me = Arc::clone(queries);
            let name = op.token();
            let subject = op.subject();
            match op {
                AuditOp::Thread => Endpoint::json(name, subject, move |req: ThreadRequest| {
                    let me = Arc::clone(&me);
                    async move { Ok::<_, ErrorReply>(me.thread(req).await?) }
                }),
                AuditOp::History => Endpoint::json(name, subject, move |req: HistoryRequest| {
                    let me = Arc::clone(&me);
                    async move { Ok::<_, ErrorReply>(me.history(req).await?) }
                }),
                AuditOp::Cost => Endpoint::json(name, subject, move |req: CostQuery| {
                    let me = Arc::clone(&me);
                    async move { Ok::<_, ErrorReply>(me.cost(req).await?) }
                }),
                AuditOp::Pending => {
                    Endpoint::json(name, subject, move |_: serde::de::IgnoredAny| {
                        let me = Arc::clone(&me);
                        async move { Ok::<_, ErrorReply>(me.pending().await?) }
                    })
                }
                AuditOp::Verify => {
                    Endpoint::json(name, subject, move |_: serde::de::IgnoredAny| {
                        let me = Arc::clone(&me);
                        async move { Ok::<_, ErrorReply>(me.verify().await?) }
                    })
                }
                AuditOp::Export => Endpoint::raw(name, subject, move |message: Message| {
                    let me = Arc::clone(&me);
                    async move {
                        let filter: HistoryRequest = decode(&message.payload)?;
                        Ok::<_, ErrorReply>(me.export(filter, message.reply).await?)
                    }
                }),
            }
            .shared_budget()
        })
        .collect()
}
