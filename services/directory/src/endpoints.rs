//! The directory's endpoint table: one endpoint per [`RegistryOp`] plus task load and skill
//! routing (services only), each
//! decoding its request and handing it to [`Registry`] (the rules are in [`crate::registry`]
//! and [`crate::goals`]); errors become error replies through [`crate::error`].

use std::sync::Arc;

use switchboard_proto::registry::{
    GoalCloseRequest, GoalOpenRequest, HeartbeatRequest, LookupRequest, PeersRequest, RouteRequest,
    TaskLoadReport,
};
use switchboard_proto::subject::{REGISTRY_ROUTE_PREFIX, REGISTRY_TASKS_PREFIX, RegistryOp};
use switchboard_proto::{ErrorReply, GoalId};
use switchboard_runtime::micro::{AgentRequest, Endpoint};

use crate::error::DirectoryError;
use crate::registry::Registry;

/// Goal requests take the id as text so a malformed one is `invalid_goal_id`, not a generic
/// decode error.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGoalOpen {
    #[serde(default)]
    goal_id: Option<String>,
    #[serde(default)]
    kind: Option<switchboard_proto::GoalKind>,
    #[serde(default)]
    overflow: Option<switchboard_proto::inbox::Overflow>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGoalClose {
    goal_id: String,
}

fn parse_goal(raw: &str) -> Result<GoalId, ErrorReply> {
    GoalId::parse(raw).map_err(|err| DirectoryError::InvalidAgentId(err).into())
}

/// Builds every endpoint of the directory: one per agent-facing op, plus the task-load
/// endpoint task-lifecycle reports to (services only).
pub(crate) fn endpoints(registry: Arc<Registry>) -> Vec<Endpoint> {
    let mut endpoints: Vec<Endpoint> = RegistryOp::ALL
        .into_iter()
        .map(|op| endpoint(op, Arc::clone(&registry)))
        .collect();
    let routing = Arc::clone(&registry);
    endpoints.push(Endpoint::agent(
        "route",
        REGISTRY_ROUTE_PREFIX.to_owned(),
        move |req: AgentRequest<RouteRequest>| {
            let registry = Arc::clone(&routing);
            async move { Ok::<_, ErrorReply>(registry.route(&req.caller, &req.body).await?) }
        },
    ));
    endpoints.push(Endpoint::agent(
        "task_load",
        REGISTRY_TASKS_PREFIX.to_owned(),
        move |req: AgentRequest<TaskLoadReport>| {
            let registry = Arc::clone(&registry);
            async move { Ok::<_, ErrorReply>(registry.task_load(&req.caller, req.body).await?) }
        },
    ));
    endpoints
}

fn endpoint(op: RegistryOp, registry: Arc<Registry>) -> Endpoint {
    let name = op.endpoint_name();
    let prefix = op.prefix();
    match op {
        RegistryOp::Register => {
            Endpoint::agent(name, prefix, move |req: AgentRequest<serde_json::Value>| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, ErrorReply>(registry.register(&req.caller, req.body).await?) }
            })
        }
        // An idle agent's heartbeats start no traces of their own.
        RegistryOp::Heartbeat => {
            Endpoint::agent(name, prefix, move |req: AgentRequest<HeartbeatRequest>| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, ErrorReply>(registry.heartbeat(&req.caller, req.body).await?) }
            })
            .quiet()
        }
        RegistryOp::Deregister => Endpoint::agent(
            name,
            prefix,
            move |req: AgentRequest<serde::de::IgnoredAny>| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, ErrorReply>(registry.deregister(&req.caller).await?) }
            },
        ),
        RegistryOp::GoalOpen => {
            Endpoint::agent(name, prefix, move |req: AgentRequest<RawGoalOpen>| {
                let registry = Arc::clone(&registry);
                async move {
                    let goal_id = req.body.goal_id.as_deref().map(parse_goal).transpose()?;
                    let request = GoalOpenRequest {
                        goal_id,
                        kind: req.body.kind,
                        overflow: req.body.overflow,
                        name: req.body.name,
                    };
                    Ok::<_, ErrorReply>(registry.open_goal(&req.caller, request).await?)
                }
            })
        }
        RegistryOp::GoalClose => {
            Endpoint::agent(name, prefix, move |req: AgentRequest<RawGoalClose>| {
                let registry = Arc::clone(&registry);
                async move {
                    let request = GoalCloseRequest {
                        goal_id: parse_goal(&req.body.goal_id)?,
                    };
                    Ok::<_, ErrorReply>(registry.close_goal(&req.caller, request.goal_id).await?)
                }
            })
        }
        RegistryOp::Peers => {
            Endpoint::agent(name, prefix, move |req: AgentRequest<PeersRequest>| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, ErrorReply>(registry.peers(&req.caller, &req.body).await?) }
            })
        }
        RegistryOp::Lookup => {
            Endpoint::agent(name, prefix, move |req: AgentRequest<LookupRequest>| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, ErrorReply>(registry.lookup(&req.body.agent_id).await?) }
            })
        }
    }
}
