//! Waiting on a condition instead of sleeping: a test polls what it expects until it holds or a
//! deadline passes, so it is as fast as the system and fails with what it waited for.

use std::future::Future;
use std::time::Duration;

/// How often [`eventually`] probes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Polls `probe` until it returns `Some`, panicking with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_with(what, timeout, String::new, probe).await
}

/// Like [`eventually`], with `context()` (a process's output, the last state seen) appended to
/// the failure message, so a timeout says why.
pub async fn eventually_with<T, F, Fut>(
    what: &str,
    timeout: Duration,
    context: impl Fn() -> String,
    mut probe: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                context()
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
