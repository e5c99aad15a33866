//! Live updates: one server-sent event stream per open page. The console listens to the
//! registry's and the people service's events and passes each on as a hint (`agent` with the
//! agent's id, `inbox` when an item changed): the page then reads what changed through the
//! API, under the same checks as any read. No agent-written text travels on the stream.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use serde_json::{Value, json};
use switchboard_proto::subject;
use switchboard_runtime::CancellationToken;
use tokio::sync::broadcast;

use crate::Console;
use crate::error::ApiError;
use crate::store::Signed;
use axum::http::Method;
use std::sync::atomic::Ordering;
use switchboard_runtime::people_book::Access;

/// Hints buffered per stream; a page that falls behind gets a `resync` and reads afresh.
pub const HINTS: usize = 1024;

/// A hint on the stream: what changed, never what an agent wrote.
#[derive(Debug, Clone)]
pub struct Hint {
    /// `agent` or `inbox`.
    pub kind: &'static str,
    /// The agent (for `agent`), or the item's addressee and `to` (for `inbox`).
    pub about: Vec<String>,
}

/// Passes the fabric's events on as hints until `shutdown`.
pub async fn listen(
    client: async_nats::Client,
    hints: broadcast::Sender<Hint>,
    shutdown: CancellationToken,
) {
    let registry = client
        .subscribe(subject::REGISTRY_EVENTS_ALL.to_owned())
        .await;
    let people = client
        .subscribe(subject::below(subject::PEOPLE_EVENTS_PREFIX))
        .await;
    let (Ok(mut registry), Ok(mut people)) = (registry, people) else {
        tracing::error!(
            "the console cannot subscribe to the fabric's events; the page will not update live"
        );
        return;
    };
    loop {
        let hint = tokio::select! {
            () = shutdown.cancelled() => return,
            Some(message) = registry.next() => {
                let agent = message.subject.rsplit('.').next().unwrap_or_default().to_owned();
                Hint { kind: "agent", about: vec![agent] }
            }
            Some(message) = people.next() => {
                let event: Value = serde_json::from_slice(&message.payload).unwrap_or_default();
                let about = ["addressee", "to"]
                    .iter()
                    .filter_map(|key| event[key].as_str().map(str::to_owned))
                    .collect();
                Hint { kind: "inbox", about }
            }
            else => return,
        };
        let _ = hints.send(hint);
    }
}

/// `GET /api/events`: the hints a signed-in person may see (`agent` for viewers, `inbox` only
/// for items that concern them), and a keep-alive.
pub async fn events(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (signed, slot) = stream_slot(&console, &headers)?;
    let person = signed.person.id.clone();
    let mut hints = console.hints.subscribe();
    let books = console.books.clone();
    let stopping = console.stopping.clone();
    let viewer = signed.may(Access::Viewer);
    let stream = async_stream(move |tx| async move {
        let _slot = slot;
        if tx.send(json!({"type": "hello"})).await.is_err() {
            return;
        }
        loop {
            // The page went away, or the console stops: the stream (and its slot) ends now,
            // not at the next hint.
            let next = tokio::select! {
                next = hints.recv() => next,
                () = tx.closed() => return,
                () = stopping.cancelled() => return,
            };
            let hint = match next {
                Ok(hint) => hint,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if tx.send(json!({"type": "resync"})).await.is_err() {
                        return;
                    }
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let shown = match hint.kind {
                "inbox" => {
                    let book = books.now();
                    hint.about.iter().any(|party| {
                        switchboard_proto::people::Party::parse(party)
                            .is_ok_and(|party| book.answers_for(&person, &party))
                    })
                }
                // The map's hints are for those who may read the map.
                _ => viewer,
            };
            if shown {
                let about = hint.about.first().cloned().unwrap_or_default();
                let event = json!({"type": hint.kind, "about": about});
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
    });
    let events = stream
        .map(|value| Ok::<_, std::convert::Infallible>(Event::default().data(value.to_string())));
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// A stream fed by `produce` through a small channel (ends when `produce` returns or the
/// client goes).
fn async_stream<F, Fut>(produce: F) -> impl futures::Stream<Item = Value>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Value>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(produce(tx));
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A stream slot, released when the stream ends.
struct Slot(Arc<Console>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Takes a stream slot for a signed-in person, or refuses.
fn stream_slot(console: &Arc<Console>, headers: &HeaderMap) -> Result<(Signed, Slot), ApiError> {
    // Any signed-in person: a viewer gets the map's hints, everyone their inbox's.
    let signed = console.signed(headers, &Method::GET)?;
    let taken = console.streams.fetch_add(1, Ordering::Relaxed);
    let slot = Slot(Arc::clone(console));
    if taken >= console.config.max_streams {
        return Err(ApiError::Busy);
    }
    Ok((signed, slot))
}
