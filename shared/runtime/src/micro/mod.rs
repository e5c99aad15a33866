//! The NATS micro service scaffold every Switchboard service is built on.
//!
//! A service is a [`ServiceSpec`] plus [`Endpoint`]s. Each endpoint is a typed JSON handler:
//! the scaffold decodes the body (an empty body reads as `{}`), takes the caller's identity from
//! the subject's last token ([`Endpoint::agent`]), runs the handler in a span parented on the
//! request's `traceparent`, and replies with JSON. Errors become the contract's error reply
//! `{"error":{code,kind,message}}` *with* the `Nats-Service-Error` / `Nats-Service-Error-Code`
//! headers — async-nats' own error path sends an empty body, so we set the headers ourselves
//! and count errors by kind in the endpoint's `$SRV.STATS` `data`.
//!
//! Handlers run concurrently (one task per request). A panicking handler is answered with
//! `internal`; the service keeps serving. On shutdown each endpoint unsubscribes, the requests
//! already received are still answered, and in-flight handlers get the grace period to finish.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::service::ServiceExt;
use async_nats::{Client, Message};
use futures::FutureExt;
use futures::StreamExt;
use switchboard_proto::subject::{caller_from_subject, is_reply_inbox};
use switchboard_proto::{
    AgentId, ErrorKind, ErrorReply, HEADER_SERVICE_ERROR, HEADER_SERVICE_ERROR_CODE,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::telemetry;

/// Name, version and description announced on `$SRV.INFO`.
#[derive(Debug, Clone, Copy)]
pub struct ServiceSpec {
    /// Service name; also its queue group.
    pub name: &'static str,
    /// Version, normally `env!("CARGO_PKG_VERSION")`.
    pub version: &'static str,
    /// One line for `nats micro info`.
    pub description: &'static str,
}

mod endpoint;

use endpoint::Handler;
pub use endpoint::{AgentRequest, Endpoint, decode};

/// The service could not start.
#[derive(Debug, thiserror::Error)]
pub enum MicroError {
    /// Registering the micro service failed.
    #[error("starting micro service {name}: {source}")]
    Start {
        /// The micro service's name (also its queue group), e.g. `directory`.
        name: String,
        /// Why.
        source: async_nats::Error,
    },
    /// Subscribing an endpoint failed.
    #[error("adding endpoint {endpoint} on {subject}: {source}")]
    Endpoint {
        /// The endpoint's name, e.g. `goal_open`.
        endpoint: String,
        /// The subject the endpoint was to subscribe to, e.g. `agent.send.>`.
        subject: String,
        /// Why.
        source: async_nats::Error,
    },
}

type ErrorCounts = Arc<Mutex<HashMap<String, BTreeMap<&'static str, u64>>>>;

/// A started micro service: endpoints are subscribed (and flushed) when [`start`] returns.
pub struct Running {
    name: &'static str,
    service: async_nats::service::Service,
    endpoints: Vec<Subscribed>,
}

/// An endpoint as subscribed: its request stream and what [`handle`] needs of it.
struct Subscribed {
    stream: async_nats::service::endpoint::Endpoint,
    handler: Handler,
    name: String,
    except: Vec<String>,
    quiet: bool,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Registers the micro service and subscribes every endpoint (queue group = service name).
/// Every agent-facing request first takes a token from its caller's `budget` (shared by all
/// endpoints of this replica).
pub async fn start(
    client: &Client,
    spec: ServiceSpec,
    endpoints: Vec<Endpoint>,
    budget: &crate::config::RequestBudget,
) -> Result<Running, MicroError> {
    let errors: ErrorCounts = Arc::default();
    let limiter = Arc::new(crate::budget::Limiter::new(budget));
    let stats_errors = Arc::clone(&errors);
    let service = client
        .service_builder()
        .description(spec.description)
        .queue_group(spec.name)
        .stats_handler(move |endpoint, _stats| {
            let counts = stats_errors
                .lock()
                .map(|counts| counts.get(&endpoint).cloned().unwrap_or_default())
                .unwrap_or_default();
            serde_json::json!({
                "errors_by_kind": counts,
                "telemetry": telemetry::export::status(),
            })
        })
        .start(spec.name, spec.version)
        .await
        .map_err(|source| MicroError::Start {
            name: spec.name.to_owned(),
            source,
        })?;

    let mut subscribed = Vec::with_capacity(endpoints.len());
    for endpoint in endpoints {
        let mut builder = service.endpoint_builder().name(&endpoint.name);
        if endpoint.nested {
            builder = builder.queue_group(format!("{}.{}", spec.name, endpoint.name));
        }
        let stream = builder
            .add(endpoint.subject.as_str())
            .await
            .map_err(|source| MicroError::Endpoint {
                endpoint: endpoint.name.clone(),
                subject: endpoint.subject.clone(),
                source,
            })?;
        let handler = wrap_errors(
            endpoint.handler,
            endpoint.name.clone(),
            Arc::clone(&errors),
            Arc::clone(&limiter),
            endpoint.shared_budget,
            Refusals {
                js: async_nats::jetstream::new(client.clone()),
                service: spec.name,
                prefix: endpoint.subject.strip_suffix(".>").map(str::to_owned),
            },
        );
        subscribed.push(Subscribed {
            stream,
            handler,
            name: endpoint.name,
            except: endpoint.except,
            quiet: endpoint.quiet,
        });
    }
    // Ready means the server has registered every endpoint subscription (a real round trip;
    // `flush` alone does not wait for the server).
    crate::nats::sync(client)
        .await
        .map_err(|err| MicroError::Start {
            name: spec.name.to_owned(),
            source: err.into(),
        })?;
    write_health_id(spec.name, &service.info().await.id);
    Ok(Running {
        name: spec.name,
        service,
        endpoints: subscribed,
    })
}

/// Where a running service leaves its micro instance id for `<service> health`:
/// `SWITCHBOARD_HEALTH_ID_FILE`, or `switchboard-<service>.id` in the temp folder.
pub fn health_id_file(name: &str) -> std::path::PathBuf {
    std::env::var_os("SWITCHBOARD_HEALTH_ID_FILE").map_or_else(
        || std::env::temp_dir().join(format!("switchboard-{name}.id")),
        std::path::PathBuf::from,
    )
}

fn write_health_id(name: &str, id: &str) {
    let path = health_id_file(name);
    if let Err(err) = std::fs::write(&path, id) {
        tracing::warn!(path = %path.display(), error = %err, "health id not written; `health` will fail");
    }
}

/// Where refusals are published for the audit trail.
#[derive(Clone)]
struct Refusals {
    js: async_nats::jetstream::Context,
    service: &'static str,
    /// The endpoint's subject prefix when the caller is its tail (agent endpoints).
    prefix: Option<String>,
}

impl Refusals {
    /// The caller a request subject names, on an agent endpoint.
    fn caller(&self, subject: &str) -> Option<AgentId> {
        self.prefix
            .as_deref()
            .and_then(|prefix| caller_from_subject(subject, prefix).ok())
    }

    /// Publishes a rule refusal for the audit trail (see [`crate::publish::publish_refusal`]).
    fn publish(&self, subject: &str, err: &ErrorReply) {
        // Not the two a flood makes: an agent over its request budget, or polling a provider
        // limit (each would write a record per request).
        if err.kind().is_refusal()
            && !matches!(err.kind(), ErrorKind::RateLimited | ErrorKind::Limited)
        {
            let caller = self.caller(subject);
            crate::publish::publish_refusal(
                &self.js,
                self.service,
                subject,
                caller.as_ref(),
                err.kind(),
                &err.error.message,
            );
        }
    }
}

fn wrap_errors(
    handler: Handler,
    endpoint: String,
    errors: ErrorCounts,
    limiter: Arc<crate::budget::Limiter>,
    shared_budget: bool,
    refusals: Refusals,
) -> Handler {
    Arc::new(move |message: Message| {
        let handler = Arc::clone(&handler);
        let errors = Arc::clone(&errors);
        let endpoint = endpoint.clone();
        let refusals = refusals.clone();
        let subject = message.subject.to_string();
        // 1. Where the answer would go. A reply subject that is not a reply inbox is refused
        // unrun and (in `handle`) unanswered. An agent request without one is refused too: under
        // the generated accounts a service's answer delivered to a reply subject the requester
        // chose — another agent's request subject, imported — arrives as a request with no reply
        // subject, in that other agent's name. Such a refusal names a caller who may not have
        // sent it, so no agent's budget pays for it; the replica's refusal budget bounds how
        // many are audited.
        let reply_problem = match &message.reply {
            Some(reply) if !is_reply_inbox(reply.as_str()) => Some(format!(
                "reply subject `{}` is not a reply inbox (_INBOX.…); not run, not answered",
                reply.chars().take(120).collect::<String>()
            )),
            None if refusals.prefix.is_some() => Some(
                "an agent request needs a reply inbox (_INBOX.…): one without is not run"
                    .to_owned(),
            ),
            _ => None,
        };
        if let Some(problem) = reply_problem {
            let err = ErrorReply::new(ErrorKind::BadReplySubject, problem);
            count(&errors, endpoint, &err);
            if limiter.allow_refusal() {
                refusals.publish(&subject, &err);
            }
            return async move { Err(err) }.boxed();
        }
        // 2. Over budget: refused before any work, counted, not published as a refusal (a
        // flood must not become a flood of audit records). Endpoints without a caller in the
        // subject (the audit queries) share one bucket per replica.
        let key = refusals
            .caller(&subject)
            .map(|caller| caller.to_string())
            .or_else(|| shared_budget.then(|| SHARED_BUDGET_KEY.to_owned()));
        if let Some(key) = key
            && !limiter.allow(&key)
        {
            let err = ErrorReply::new(
                ErrorKind::RateLimited,
                format!(
                    "`{key}` is over its request budget ({} per second, bursts of {}); retry after a pause",
                    limiter.per_second(),
                    limiter.burst()
                ),
            );
            count(&errors, endpoint, &err);
            return async move { Err(err) }.boxed();
        }
        async move {
            let result = AssertUnwindSafe(handler(message))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    Err(ErrorReply::new(
                        ErrorKind::Internal,
                        "the handler panicked; see the service log",
                    ))
                });
            if let Err(err) = &result {
                refusals.publish(&subject, err);
                count(&errors, endpoint, err);
            }
            result
        }
        .boxed()
    })
}

/// The bucket endpoints without a caller in their subject share (`*` is no valid agent id).
const SHARED_BUDGET_KEY: &str = "*";

/// Counts an error reply by endpoint and kind (`$SRV.STATS` `data.errors_by_kind`).
fn count(errors: &ErrorCounts, endpoint: String, err: &ErrorReply) {
    if let Ok(mut counts) = errors.lock() {
        *counts
            .entry(endpoint)
            .or_default()
            .entry(err.kind().as_str())
            .or_default() += 1;
    }
}

impl Running {
    /// Serves until `shutdown` is cancelled, then drains: endpoints unsubscribe, requests already
    /// received are answered, and in-flight handlers get `grace` to finish.
    pub async fn run(self, shutdown: CancellationToken, grace: Duration) {
        let tracker = TaskTracker::new();
        let mut loops = Vec::new();
        for Subscribed {
            mut stream,
            handler,
            name: endpoint,
            except,
            quiet,
        } in self.endpoints
        {
            let tracker = tracker.clone();
            let shutdown = shutdown.clone();
            let service = self.name;
            loops.push(tokio::spawn(async move {
                let mut stopping = false;
                loop {
                    let next = if stopping {
                        stream.next().await
                    } else {
                        tokio::select! {
                            request = stream.next() => request,
                            () = shutdown.cancelled() => {
                                stopping = true;
                                if let Err(err) = stream.stop().await {
                                    tracing::warn!(%endpoint, error = %err, "unsubscribe failed");
                                }
                                continue;
                            }
                        }
                    };
                    let Some(request) = next else { break };
                    let subject = request.message.subject.as_str();
                    if except
                        .iter()
                        .any(|prefix| subject.starts_with(prefix.as_str()))
                    {
                        continue;
                    }
                    tracker.spawn(handle(
                        request,
                        Arc::clone(&handler),
                        service,
                        endpoint.clone(),
                        quiet,
                    ));
                }
            }));
        }
        shutdown.cancelled().await;
        let drained = tokio::time::timeout(grace, async {
            for handle in loops {
                let _ = handle.await;
            }
            tracker.close();
            tracker.wait().await;
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                service = self.name,
                ?grace,
                "grace period over with requests still in flight"
            );
        }
        if let Err(err) = self.service.stop().await {
            tracing::warn!(service = self.name, error = %err, "stopping micro service failed");
        }
        tracing::info!(service = self.name, "stopped");
    }
}

async fn handle(
    request: async_nats::service::Request,
    handler: Handler,
    service: &'static str,
    endpoint: String,
    quiet: bool,
) {
    let started = std::time::Instant::now();
    let message = &request.message;
    // OpenTelemetry messaging conventions: a NATS message processed by a consumer group. The
    // Switchboard ids the request and its answer name are attributes, so the id a send report
    // or a task names finds its trace.
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{service}.{endpoint}"),
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        otel.status_message = tracing::field::Empty,
        messaging.system = "nats",
        messaging.operation.type = "process",
        messaging.operation.name = %endpoint,
        messaging.destination.name = %message.subject,
        messaging.consumer.group.name = service,
        messaging.message.id = tracing::field::Empty,
        messaging.message.body.size = message.payload.len(),
        switchboard.service = service,
        switchboard.agent_id = message.subject.rsplit('.').next().unwrap_or(""),
        switchboard.goal_id = tracing::field::Empty,
        switchboard.correlation_id = tracing::field::Empty,
        switchboard.task_id = tracing::field::Empty,
        switchboard.duplicate = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    let parent = telemetry::extract(message.headers.as_ref());
    let parent = if quiet {
        telemetry::unless_traced(parent)
    } else {
        parent
    };
    telemetry::set_parent(&span, parent);
    telemetry::ids::record(&span, &message.payload);
    let result = handler(message.clone()).instrument(span.clone()).await;
    let _entered = span.enter();
    // Only a reply inbox is answered (see `wrap_errors`): never write where a caller points.
    let has_reply = message
        .reply
        .as_ref()
        .is_some_and(|reply| is_reply_inbox(reply.as_str()));
    let mut attributes = vec![
        telemetry::metrics::service(service),
        opentelemetry::KeyValue::new("messaging.system", "nats"),
        opentelemetry::KeyValue::new("messaging.operation.name", endpoint.clone()),
    ];
    let outcome = match result {
        Ok(body) => {
            telemetry::ids::record(&span, &body);
            record_duration(started, &attributes);
            if has_reply {
                request
                    .respond_with_headers(Ok(body), telemetry::traced_headers())
                    .await
            } else {
                Ok(())
            }
        }
        Err(err) => {
            let kind = err.kind().as_str();
            span.record("error.type", kind);
            span.record("otel.status_code", "ERROR");
            span.record(
                "otel.status_message",
                format!("{kind}: {}", err.error.message).as_str(),
            );
            attributes.push(opentelemetry::KeyValue::new("error.type", kind));
            record_duration(started, &attributes);
            match err.kind() {
                ErrorKind::Internal | ErrorKind::Unavailable => {
                    tracing::warn!(kind = %err.kind(), message = %err.error.message, "request failed")
                }
                _ => {
                    tracing::debug!(kind = %err.kind(), message = %err.error.message, "request refused")
                }
            }
            if !has_reply {
                tracing::debug!("no reply subject; error dropped");
                return;
            }
            let mut headers = telemetry::traced_headers();
            // The message may quote the caller's own words (a bad id, a reason).
            headers.insert(
                HEADER_SERVICE_ERROR,
                switchboard_request::headers::safe_value(&err.error.message),
            );
            headers.insert(
                HEADER_SERVICE_ERROR_CODE,
                err.error.code.to_string().as_str(),
            );
            match serde_json::to_vec(&err) {
                Ok(body) => request.respond_with_headers(Ok(body.into()), headers).await,
                Err(encode_err) => {
                    tracing::error!(error = %encode_err, "encoding an error reply failed");
                    Ok(())
                }
            }
        }
    };
    if let Err(err) = outcome {
        tracing::debug!(error = %err, "reply could not be sent");
    }
}

/// One point of `messaging.process.duration` for a request handled since `started`.
fn record_duration(started: std::time::Instant, attributes: &[opentelemetry::KeyValue]) {
    telemetry::metrics::instruments()
        .process_duration
        .record(started.elapsed().as_secs_f64(), attributes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Optional {
        goal_id: Option<String>,
        kind: Option<String>,
    }

    #[test]
    fn a_body_is_an_object_or_nothing() {
        let empty: Optional = decode(b"  ").unwrap_or_else(|err| panic!("{err:?}"));
        assert_eq!(
            empty,
            Optional {
                goal_id: None,
                kind: None
            }
        );
        assert!(decode::<Optional>(br#"{"kind": "daemon"}"#).is_ok());
        // serde alone would read these arrays as the struct's fields in order.
        for body in [&b"[]"[..], br#"[null, "daemon"]"#, b"7", b"\"x\"", b"null"] {
            let err = decode::<Optional>(body).expect_err("not an object");
            assert_eq!(err.kind(), ErrorKind::BadRequest);
        }
        // Endpoints that ignore the body still want an object.
        assert!(decode::<serde::de::IgnoredAny>(b"[1]").is_err());
        assert!(decode::<serde::de::IgnoredAny>(b"{}").is_ok());
    }
}
