//! Serving an HTTP router (the A2A gateway's, every service's `/metrics`): HTTP/1.1, one task
//! per connection, a client that does not finish a request's headers within
//! [`HEADER_READ_TIMEOUT`] is disconnected (`axum::serve` sets no such timeout: 150
//! connections that never finished their headers stayed open at the gateway), and a graceful
//! stop that lets requests in flight finish.

use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio_util::sync::CancellationToken;

/// How long a client may take to send a request's headers (an idle kept-alive connection
/// too): a slow or silent client holds a connection only this long.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `stop`, then waits for the connections to finish (a
/// server's open streams end with its own stop). `name` labels its log lines.
pub async fn serve(
    name: &'static str,
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stop: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of file descriptors, most often: pause rather than spin.
                tracing::warn!(server = name, error = %err, "could not accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(server = name, error = %err, "connection ended");
            }
        });
    }
    graceful.shutdown().await;
}
