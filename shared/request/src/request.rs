//! JSON requests to Switchboard services, the one way every party asks: trace context in the
//! headers, the reply decoded, an error reply (`Nats-Service-Error-Code`) turned into its
//! `ErrorReply`.

use std::time::Duration;

use async_nats::Client;
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchboard_proto::{ErrorKind, ErrorReply, HEADER_SERVICE_ERROR_CODE};

use crate::trace;

/// Why a request got no usable reply.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RequestFailure {
    /// Nobody subscribes to the subject.
    #[error("no service answers on {subject}")]
    NoResponders {
        /// The request subject nobody subscribes to (its service is not running).
        subject: String,
    },
    /// No reply in time.
    #[error("request to {subject} timed out")]
    Timeout {
        /// The request subject that gave no reply within the timeout.
        subject: String,
    },
    /// The service answered with an error reply.
    #[error("{0}")]
    Service(ErrorReply),
    /// Sending failed, or the reply did not decode.
    #[error("request to {subject}: {message}")]
    Other {
        /// The request subject whose send or reply failed.
        subject: String,
        /// Why.
        message: String,
    },
}

/// Sends `body` as JSON to `subject` and decodes the reply.
pub async fn request_json<Req, Resp>(
    client: &Client,
    subject: &str,
    body: &Req,
    timeout: Duration,
) -> Result<Resp, RequestFailure>
where
    Req: Serialize + ?Sized,
    Resp: DeserializeOwned,
{
    let other = |message: String| RequestFailure::Other {
        subject: subject.to_owned(),
        message,
    };
    let payload = serde_json::to_vec(body).map_err(|err| other(err.to_string()))?;
    let request = async_nats::Request::new()
        .payload(Bytes::from(payload))
        .headers(trace::traced_headers())
        .timeout(Some(timeout));
    let reply = client
        .send_request(subject.to_owned(), request)
        .await
        .map_err(|err| match err.kind() {
            async_nats::RequestErrorKind::NoResponders => RequestFailure::NoResponders {
                subject: subject.to_owned(),
            },
            async_nats::RequestErrorKind::TimedOut => RequestFailure::Timeout {
                subject: subject.to_owned(),
            },
            _ => other(err.to_string()),
        })?;
    let is_error = reply
        .headers
        .as_ref()
        .is_some_and(|headers| headers.get(HEADER_SERVICE_ERROR_CODE).is_some());
    if is_error {
        let error: ErrorReply = serde_json::from_slice(&reply.payload)
            .map_err(|err| other(format!("undecodable error reply: {err}")))?;
        return Err(RequestFailure::Service(error));
    }
    serde_json::from_slice(&reply.payload).map_err(|err| other(err.to_string()))
}

/// Default number of retries of an idempotent request while no service answers.
pub const IDEMPOTENT_RETRIES: u32 = 5;

/// [`request_json`] for idempotent requests (e.g. a send carrying its own message id):
/// retried up to `retries` times while nobody answers or the reply times out, pausing 100 ms
/// and doubling, so a service restart is ridden out. Other failures return at once.
///
/// Each attempt is hedged: a request still unanswered after [`HEDGE_AFTER`] is sent again
/// beside the first (then after twice that, up to [`HEDGES`] times) and the first reply wins
/// — except a `conflict` error while another copy is still out: that copy is the one holding
/// the resource, and its reply is awaited instead.
/// A reply lost with a NATS server or a service replica that went away then costs a fraction
/// of a second instead of the whole `timeout`; the service recognises the copies as the same
/// request, so nothing happens twice.
pub async fn request_json_retrying<Req, Resp>(
    client: &Client,
    subject: &str,
    body: &Req,
    timeout: Duration,
    retries: u32,
) -> Result<Resp, RequestFailure>
where
    Req: Serialize + ?Sized,
    Resp: DeserializeOwned,
{
    let mut pause = Duration::from_millis(100);
    let mut attempt = 0;
    loop {
        match hedged(client, subject, body, timeout).await {
            Err(RequestFailure::NoResponders { .. } | RequestFailure::Timeout { .. })
                if attempt < retries =>
            {
                attempt += 1;
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            outcome => return outcome,
        }
    }
}

/// How long an idempotent request waits before its first hedge (well above a healthy
/// system's p99, a few tens of milliseconds).
pub const HEDGE_AFTER: Duration = Duration::from_millis(250);
/// Most copies sent beside the first within one attempt.
pub const HEDGES: u32 = 3;

/// One attempt of [`request_json_retrying`]: the request, and its hedges while it waits.
async fn hedged<Req, Resp>(
    client: &Client,
    subject: &str,
    body: &Req,
    timeout: Duration,
) -> Result<Resp, RequestFailure>
where
    Req: Serialize + ?Sized,
    Resp: DeserializeOwned,
{
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut in_flight = futures::stream::FuturesUnordered::new();
    in_flight.push(request_json::<Req, Resp>(client, subject, body, timeout));
    let mut hedges = 0;
    let mut wait = HEDGE_AFTER;
    let mut last = RequestFailure::Timeout {
        subject: subject.to_owned(),
    };
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let may_hedge = hedges < HEDGES && left > wait;
        tokio::select! {
            next = in_flight.next() => match next {
                // A copy that timed out or found nobody: the others may still answer.
                Some(Err(failure @ (RequestFailure::Timeout { .. }
                    | RequestFailure::NoResponders { .. }))) => {
                    if in_flight.is_empty() {
                        // Nobody answered at all: the caller's retry pauses first.
                        return Err(failure);
                    }
                    last = failure;
                }
                // Another copy of this very request holds the resource (it is delivering
                // right now): its outcome is the request's, so wait for it.
                Some(Err(RequestFailure::Service(reply)))
                    if reply.kind() == ErrorKind::Conflict && !in_flight.is_empty() =>
                {
                    last = RequestFailure::Service(reply);
                }
                Some(outcome) => return outcome,
                None => return Err(last),
            },
            () = tokio::time::sleep(wait), if may_hedge => {
                hedges += 1;
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                in_flight.push(request_json(client, subject, body, left));
                wait *= 2;
            }
        }
    }
}

/// How long the directory may take to pick an agent for a skill.
const ROUTE_TIMEOUT: Duration = Duration::from_secs(5);

/// The agent the directory picks for `caller`'s `skill:<name>` message, call or (with `task`)
/// task: `_SB.registry.route.<caller>`. `Err` is the reason to report as unreachable (none
/// fits, or the directory did not answer).
pub async fn route_by_skill(
    client: &Client,
    caller: &switchboard_proto::AgentId,
    skill: &str,
    task: bool,
) -> Result<switchboard_proto::AgentId, String> {
    let request = switchboard_proto::registry::RouteRequest {
        skill: skill.to_owned(),
        task,
    };
    let subject = switchboard_proto::subject::registry_route(caller);
    match request_json::<_, switchboard_proto::registry::RouteReply>(
        client,
        &subject,
        &request,
        ROUTE_TIMEOUT,
    )
    .await
    {
        Ok(reply) => Ok(reply.agent_id),
        Err(RequestFailure::Service(reply)) => Err(reply.error.message),
        Err(failure) => Err(format!("skill `{skill}` could not be routed: {failure}")),
    }
}
