//! The correlator's endpoint table: call, reply, pending and parts. The micro scaffold decodes each
//! request (caller from the subject, body as JSON); the rules are in [`crate::calls`], and
//! their errors become error replies through the one mapping in [`crate::error`].

use std::sync::Arc;

use switchboard_proto::ErrorReply;
use switchboard_proto::call::{CallPartsRequest, CallRequest, ReplyRequest};
use switchboard_proto::subject::{
    CALL_PREFIX, CALLS_PARTS_PREFIX, CALLS_PENDING_PREFIX, REPLY_PREFIX,
};
use switchboard_runtime::micro::{AgentRequest, Endpoint};

use crate::Correlator;

/// The four endpoints.
pub(crate) fn endpoints(correlator: Arc<Correlator>) -> Vec<Endpoint> {
    let (call, reply, pending, parts) = (
        Arc::clone(&correlator),
        Arc::clone(&correlator),
        Arc::clone(&correlator),
        correlator,
    );
    vec![
        Endpoint::agent(
            "call",
            CALL_PREFIX.to_owned(),
            move |req: AgentRequest<CallRequest>| {
                let me = Arc::clone(&call);
                async move {
                    me.call(&req.caller, req.body, req.reply)
                        .await
                        .map_err(ErrorReply::from)
                }
            },
        ),
        Endpoint::agent(
            "reply",
            REPLY_PREFIX.to_owned(),
            move |req: AgentRequest<ReplyRequest>| {
                let me = Arc::clone(&reply);
                async move {
                    me.reply(&req.caller, req.body)
                        .await
                        .map_err(ErrorReply::from)
                }
            },
        ),
        Endpoint::agent(
            "pending",
            CALLS_PENDING_PREFIX.to_owned(),
            move |req: AgentRequest<serde::de::IgnoredAny>| {
                let me = Arc::clone(&pending);
                async move { me.pending(&req.caller).await.map_err(ErrorReply::from) }
            },
        ),
        Endpoint::agent(
            "parts",
            CALLS_PARTS_PREFIX.to_owned(),
            move |req: AgentRequest<CallPartsRequest>| {
                let me = Arc::clone(&parts);
                async move {
                    me.parts(&req.caller, &req.body)
                        .await
                        .map_err(ErrorReply::from)
                }
            },
        ),
    ]
}
