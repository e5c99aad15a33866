//! The endpoint table: the agent-facing `agent.people.<op>.<agent>` and the person-side
//! `_SB.ops.people.<op>`. The micro scaffold decodes each request; the rules are in
//! [`crate::agents`] and [`crate::persons`].

use std::sync::Arc;

use switchboard_proto::ErrorReply;
use switchboard_proto::approval::{ApprovalRequest, ApprovalUse};
use switchboard_proto::people::ops::{AnswerRequest, InboxQuery, PeopleOpsOp, PersonItemQuery};
use switchboard_proto::people::{AskRequest, ItemRequest, NoteRequest, PeopleOp};
use switchboard_runtime::micro::{AgentRequest, Endpoint};

use crate::service::People;

/// Every endpoint.
pub(crate) fn endpoints(people: &Arc<People>) -> Vec<Endpoint> {
    macro_rules! agent {
        ($op:expr, $name:literal, $body:ty, |$me:ident, $req:ident| $call:expr) => {{
            let held = Arc::clone(people);
            Endpoint::agent($name, $op.prefix(), move |$req: AgentRequest<$body>| {
                let $me = Arc::clone(&held);
                async move { $call.await.map_err(ErrorReply::from) }
            })
        }};
    }
    macro_rules! ops {
        ($op:expr, $name:literal, $body:ty, |$me:ident, $req:ident| $call:expr) => {{
            let held = Arc::clone(people);
            Endpoint::json($name, $op.subject(), move |$req: $body| {
                let $me = Arc::clone(&held);
                async move { $call.await.map_err(ErrorReply::from) }
            })
        }};
    }
    vec![
        agent!(PeopleOp::Note, "note", NoteRequest, |me, req| me
            .note(&req.caller, req.body)),
        agent!(PeopleOp::Ask, "ask", AskRequest, |me, req| me
            .ask(&req.caller, req.body)),
        agent!(
            PeopleOp::ApprovalRequest,
            "approval_request",
            ApprovalRequest,
            |me, req| me.request_approval(&req.caller, req.body)
        ),
        agent!(
            PeopleOp::ApprovalUse,
            "approval_use",
            ApprovalUse,
            |me, req| me.use_approval(&req.caller, req.body)
        ),
        agent!(PeopleOp::Get, "get", ItemRequest, |me, req| me
            .get(&req.caller, req.body.item_id)),
        agent!(
            PeopleOp::Pending,
            "pending",
            serde::de::IgnoredAny,
            |me, req| me.pending(&req.caller)
        ),
        agent!(PeopleOp::List, "list", serde::de::IgnoredAny, |me, req| me
            .list(&req.caller)),
        ops!(PeopleOpsOp::Inbox, "ops_inbox", InboxQuery, |me, req| me
            .inbox(req)),
        ops!(PeopleOpsOp::Item, "ops_item", PersonItemQuery, |me, req| me
            .person_item(req)),
        ops!(
            PeopleOpsOp::Answer,
            "ops_answer",
            AnswerRequest,
            |me, req| me.answer(req)
        ),
    ]
}
