//! SIGINT/SIGTERM handling. Kubernetes sends SIGTERM; a terminal sends SIGINT. Both cancel one
//! token that every service watches, so in-flight requests finish under the grace period
//! instead of the process exiting mid-request.

use tokio_util::sync::CancellationToken;

/// Resolves on the first SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received, shutting down"),
        () = terminate => tracing::info!("SIGTERM received, shutting down"),
    }
}

/// A token cancelled by the first SIGINT/SIGTERM. The handlers are installed before this
/// returns (not later, in the task that waits), so a signal that arrives right after it is
/// never the default action, which would kill the process without its clean stop.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let child = token.clone();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut interrupt), Ok(mut terminate)) => {
                tokio::spawn(async move {
                    tokio::select! {
                        _ = interrupt.recv() => tracing::info!("SIGINT received, shutting down"),
                        _ = terminate.recv() => tracing::info!("SIGTERM received, shutting down"),
                    }
                    child.cancel();
                });
                return token;
            }
            (Err(err), _) | (_, Err(err)) => {
                tracing::error!(error = %err, "cannot install the signal handlers; waiting for them another way");
            }
        }
    }
    tokio::spawn(async move {
        shutdown_signal().await;
        child.cancel();
    });
    token
}
