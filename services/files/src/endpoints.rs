//! The endpoint table: `agent.files.<op>.<agent>`. The micro scaffold decodes each JSON
//! request; a chunk is taken whole (its body is the bytes). The rules are in `upload.rs`,
//! `read.rs` and `service.rs`.

use std::sync::Arc;

use switchboard_proto::ErrorReply;
use switchboard_proto::files::{FileQuery, FilesOp, ReadRequest, RevokeRequest, UploadRequest};
use switchboard_proto::subject::caller_from_subject;
use switchboard_proto::{ErrorKind, ErrorReply as Reply};
use switchboard_runtime::micro::{AgentRequest, Endpoint};

use crate::service::Files;

/// Every endpoint of the files service.
pub(crate) fn endpoints(files: &Arc<Files>) -> Vec<Endpoint> {
    macro_rules! agent {
        ($op:expr, $name:literal, $body:ty, |$me:ident, $req:ident| $call:expr) => {{
            let held = Arc::clone(files);
            Endpoint::agent($name, $op.prefix(), move |$req: AgentRequest<$body>| {
                let $me = Arc::clone(&held);
                async move { $call.await.map_err(ErrorReply::from) }
            })
        }};
    }
    let chunk = {
        let held = Arc::clone(files);
        let prefix = FilesOp::Chunk.prefix();
        Endpoint::raw(
            "chunk",
            switchboard_proto::subject::below(&prefix),
            move |message: async_nats::Message| {
                let me = Arc::clone(&held);
                let prefix = prefix.clone();
                async move {
                    let caller = caller_from_subject(message.subject.as_str(), &prefix)
                        .map_err(|err| Reply::new(ErrorKind::InvalidAgentId, err.to_string()))?;
                    let reply = me.chunk(&caller, &message).await.map_err(Reply::from)?;
                    serde_json::to_vec(&reply)
                        .map(bytes::Bytes::from)
                        .map_err(|err| Reply::new(ErrorKind::Internal, err.to_string()))
                }
            },
        )
    };
    vec![
        agent!(FilesOp::Upload, "upload", UploadRequest, |me, req| me
            .upload(&req.caller, req.body)),
        chunk,
        agent!(FilesOp::Read, "read", ReadRequest, |me, req| me.read(
            &req.caller,
            req.body,
            req.reply
        )),
        agent!(FilesOp::Stat, "stat", FileQuery, |me, req| me
            .stat(&req.caller, req.body)),
        agent!(FilesOp::Revoke, "revoke", RevokeRequest, |me, req| me
            .revoke(&req.caller, req.body)),
        agent!(FilesOp::Delete, "delete", FileQuery, |me, req| me
            .delete(&req.caller, req.body)),
    ]
}
