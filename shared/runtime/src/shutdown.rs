//! SIGINT/SIGTERM handling. Kubernetes sends SIGTERM; a terminal sends SIGINT. Both cancel one
//! token that every service watches, so in-flight requests finish under the grace period
//! instead of the process exiting mid-request.

use std::future::Future;

use tokio_util::sync::CancellationToken;

/// Installs the SIGINT and SIGTERM handlers now, and returns a future that resolves on the
/// first of them. The handlers are in place when this returns (not when the future is first
/// polled), so a signal that arrives right after is never the default action, which would
/// kill the process without its clean stop. A handler that cannot be installed is logged and
/// that signal is not waited for.
pub fn listen() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (interrupt, terminate) = {
        use tokio::signal::unix::{SignalKind, signal};
        let install = |kind: SignalKind, name: &str| {
            signal(kind)
                .inspect_err(|err| tracing::error!(error = %err, "cannot listen for {name}"))
                .ok()
        };
        (
            install(SignalKind::interrupt(), "SIGINT"),
            install(SignalKind::terminate(), "SIGTERM"),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |signal: Option<tokio::signal::unix::Signal>| async move {
                match signal {
                    Some(mut signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(interrupt) => tracing::info!("SIGINT received, shutting down"),
                () = wait(terminate) => tracing::info!("SIGTERM received, shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            tracing::info!("SIGINT received, shutting down");
        }
    }
}

/// A token cancelled by the first SIGINT/SIGTERM, with the handlers installed before this
/// returns ([`listen`]).
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let child = token.clone();
    let signalled = listen();
    tokio::spawn(async move {
        signalled.await;
        child.cancel();
    });
    token
}

#[cfg(all(test, unix))]
mod tests {
    use std::time::Duration;

    use super::on_signal;

    /// A SIGTERM sent the moment `on_signal` returns cancels the token; were the handler
    /// installed later, the default action would kill this test process.
    #[tokio::test]
    async fn a_signal_right_after_on_signal_cancels_the_token() {
        let token = on_signal();
        // Blocking, so the runtime (current-thread) runs nothing else before the signal lands:
        // no task spawned by `on_signal` gets a chance to install a handler late.
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .map(|status| status.success());
        assert!(matches!(sent, Ok(true)), "kill -TERM failed: {sent:?}");
        let cancelled = tokio::time::timeout(Duration::from_secs(5), token.cancelled()).await;
        assert!(cancelled.is_ok(), "the token was not cancelled");
    }
}
