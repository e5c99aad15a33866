//! Bounded polling instead of sleeps: [`eventually`] and
//! [`assert_eventually!`](crate::assert_eventually) re-check a condition every 20 ms until it
//! holds or a timeout passes.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::POLL_INTERVAL;

/// Polls `f` every 20 ms until it returns `true` (then returns `true`) or
/// `timeout` has passed (then returns `false`). `f` is called at least once,
/// and each call is itself bounded by the time left.
///
/// ```no_run
/// # async fn example(client: async_nats::Client) {
/// use std::time::Duration;
/// let ok = switchboard_testkit::eventually(Duration::from_secs(5), || async {
///     client.request("svc.ping", "".into()).await.is_ok()
/// })
/// .await;
/// assert!(ok, "svc.ping never answered");
/// # }
/// ```
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if let Ok(true) = tokio::time::timeout(remaining.max(POLL_INTERVAL), f()).await {
            return true;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return false;
        }
        sleep(POLL_INTERVAL.min(remaining)).await;
    }
}

/// Bounded polling assertion (never a bare sleep): re-evaluates an `async`
/// block every 20 ms until it yields `true`, and panics with the given
/// message if that has not happened within the timeout.
///
/// ```no_run
/// # async fn example(js: async_nats::jetstream::Context) {
/// use std::time::Duration;
/// use switchboard_testkit::assert_eventually;
///
/// assert_eventually!(
///     Duration::from_secs(5),
///     async { js.get_stream("ORDERS").await.is_ok() },
///     "stream {} never appeared",
///     "ORDERS"
/// );
/// // The message is optional.
/// assert_eventually!(Duration::from_secs(5), async { js.query_account().await.is_ok() });
/// # }
/// ```
///
/// The block is evaluated anew on every poll, so it should borrow what it
/// uses (`async { .. }`, not `async move { .. }` on non-`Copy` values). Must be
/// used inside an async context.
#[macro_export]
macro_rules! assert_eventually {
    ($timeout:expr, $cond:expr $(,)?) => {
        $crate::assert_eventually!(
            $timeout,
            $cond,
            "condition `{}` was not met",
            ::std::stringify!($cond)
        )
    };
    ($timeout:expr, $cond:expr, $($arg:tt)+) => {{
        let timeout: ::std::time::Duration = $timeout;
        if !$crate::eventually(timeout, || $cond).await {
            ::std::panic!(
                "assert_eventually failed after {:?}: {}",
                timeout,
                ::std::format_args!($($arg)+)
            );
        }
    }};
}
