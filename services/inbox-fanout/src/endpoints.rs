//! Every endpoint of the inbox-fanout in one table: send (writing, [`crate::send`]), send
//! status ([`crate::receipts`]), and fetch and ack (reading, [`crate::reader`]). The micro scaffold decodes each request
//! (caller from the subject, body as JSON); errors become error replies through
//! [`crate::error`].

use std::sync::Arc;

use switchboard_proto::inbox::{AckRequest, FetchRequest};
use switchboard_proto::receipt::SendStatusRequest;
use switchboard_proto::send::SendRequest;
use switchboard_proto::subject::{
    INBOX_ACK_PREFIX, INBOX_FETCH_PREFIX, SEND_PREFIX, SEND_STATUS_PREFIX,
};
use switchboard_runtime::micro::{AgentRequest, Endpoint};

use crate::reader::Reader;
use crate::receipts::Receipts;
use crate::send::Fanout;

/// The send endpoint on `agent.send.>` (but for `agent.send.status.>`, the status endpoint's),
/// then the fetch and ack endpoints.
pub(crate) fn endpoints(
    fanout: Arc<Fanout>,
    reader: Arc<Reader>,
    receipts: Receipts,
) -> Vec<Endpoint> {
    let (fetch, ack) = (Arc::clone(&reader), reader);
    vec![
        Endpoint::agent(
            "send",
            SEND_PREFIX.to_owned(),
            move |req: AgentRequest<SendRequest>| {
                let fanout = Arc::clone(&fanout);
                async move { fanout.send_request(req).await }
            },
        )
        .except(SEND_STATUS_PREFIX),
        Endpoint::agent(
            "send_status",
            SEND_STATUS_PREFIX.to_owned(),
            move |req: AgentRequest<SendStatusRequest>| {
                let receipts = receipts.clone();
                async move { Ok(receipts.status(&req.caller, &req.body).await?) }
            },
        )
        .nested(),
        Endpoint::agent(
            "inbox_fetch",
            INBOX_FETCH_PREFIX.to_owned(),
            move |req: AgentRequest<FetchRequest>| {
                let reader = Arc::clone(&fetch);
                async move { Ok(reader.fetch(&req.caller, &req.body).await?) }
            },
        )
        // An idle reader's long polls and acks start no traces of their own.
        .quiet(),
        Endpoint::agent(
            "inbox_ack",
            INBOX_ACK_PREFIX.to_owned(),
            move |req: AgentRequest<AckRequest>| {
                let reader = Arc::clone(&ack);
                async move { Ok(reader.ack(&req.caller, &req.body).await?) }
            },
        )
        .quiet(),
    ]
}
