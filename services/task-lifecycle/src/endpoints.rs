//! The task service's endpoints: one per op on `agent.task.<op>.<agent_id>`, each decoding
//! its request type and handing it to [`Tasks`]. A [`TaskError`](crate::TaskError) becomes
//! the wire `{code, kind}` at this boundary, through the one mapping in `error.rs`.

use std::sync::Arc;

use switchboard_proto::ErrorReply;
use switchboard_proto::task::ops::{OpsCancel, OpsListTasks, TaskOpsOp, TreeQuery};
use switchboard_proto::task::{CreateTask, ListTasks, TaskAction, TaskRequestOp};
use switchboard_runtime::micro::{AgentRequest, Endpoint};

use crate::tasks::Tasks;

/// One endpoint per [`TaskRequestOp`], the caller taken from the subject's last token, and
/// one per operator op ([`TaskOpsOp`]) on `_SB.ops.tasks.<op>`.
pub(crate) fn endpoints(tasks: &Arc<Tasks>) -> Vec<Endpoint> {
    let mut endpoints = agent_endpoints(tasks);
    endpoints.extend(TaskOpsOp::ALL.into_iter().map(|op| {
        let me = Arc::clone(tasks);
        let name = format!("ops_{}", op.token());
        match op {
            TaskOpsOp::List => Endpoint::json(&name, op.subject(), move |req: OpsListTasks| {
                let me = Arc::clone(&me);
                async move { Ok::<_, ErrorReply>(me.ops_list(req).await?) }
            }),
            TaskOpsOp::Tree => Endpoint::json(&name, op.subject(), move |req: TreeQuery| {
                let me = Arc::clone(&me);
                async move { Ok::<_, ErrorReply>(me.ops_tree(req).await?) }
            }),
            TaskOpsOp::Cancel => Endpoint::json(&name, op.subject(), move |req: OpsCancel| {
                let me = Arc::clone(&me);
                async move { Ok::<_, ErrorReply>(me.ops_cancel(req).await?) }
            }),
        }
    }));
    endpoints
}

fn agent_endpoints(tasks: &Arc<Tasks>) -> Vec<Endpoint> {
    TaskRequestOp::ALL
        .into_iter()
        .map(|op| {
            let me = Arc::clone(tasks);
            let name = op.token();
            let prefix = op.prefix();
            match op {
                TaskRequestOp::Create => {
                    Endpoint::agent(name, prefix, move |req: AgentRequest<CreateTask>| {
                        let me = Arc::clone(&me);
                        async move { Ok::<_, ErrorReply>(me.create(&req.caller, req.body).await?) }
                    })
                }
                TaskRequestOp::Spawn => {
                    Endpoint::agent(name, prefix, move |req: AgentRequest<CreateTask>| {
                        let me = Arc::clone(&me);
                        async move { Ok::<_, ErrorReply>(me.spawn(&req.caller, req.body).await?) }
                    })
                }
                TaskRequestOp::Transition(task_op) => {
                    Endpoint::agent(name, prefix, move |req: AgentRequest<TaskAction>| {
                        let me = Arc::clone(&me);
                        async move {
                            Ok::<_, ErrorReply>(me.act(&req.caller, task_op, req.body).await?)
                        }
                    })
                }
                TaskRequestOp::Get => {
                    Endpoint::agent(name, prefix, move |req: AgentRequest<TaskAction>| {
                        let me = Arc::clone(&me);
                        async move { Ok::<_, ErrorReply>(me.get(&req.caller, req.body).await?) }
                    })
                }
                TaskRequestOp::List => {
                    Endpoint::agent(name, prefix, move |req: AgentRequest<ListTasks>| {
                        let me = Arc::clone(&me);
                        async move { Ok::<_, ErrorReply>(me.list(&req.caller, req.body).await?) }
                    })
                }
            }
        })
        .collect()
}
