//! Server-sent events, as both bindings stream: each item one SSE event whose `data` is what
//! the binding makes of it, its `id` the event's number within its task.

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use tokio::sync::mpsc;

use crate::error::GatewayError;
use crate::serve::events::Item;

/// The items as SSE, each `data` line what `frame` makes of an item (a JSON-RPC response
/// for JSON-RPC, the bare `StreamResponse` for HTTP+JSON). An item's `id` is the event's
/// number within its task (none on an artifact or a call's answer); a failure mid-stream is
/// the last item.
pub(crate) fn sse(
    mut items: mpsc::Receiver<Result<Item, GatewayError>>,
    frame: impl Fn(Result<&a2a::StreamResponse, &GatewayError>) -> String + Send + 'static,
) -> Response {
    let events = futures::stream::poll_fn(move |cx| items.poll_recv(cx)).map(move |item| {
        let event = match &item {
            Ok(Item { seq: Some(seq), .. }) => Event::default().id(seq.to_string()),
            // No id: the client's last id stays the event before (see `Item`).
            _ => Event::default(),
        };
        let data = frame(item.as_ref().map(|item| &item.response));
        Ok::<_, std::convert::Infallible>(event.data(data))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
