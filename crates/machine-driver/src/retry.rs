//! Retries with exponential backoff around the simulated provider's API calls.
//!
//! A cloud provider's own steps (registering the Node, turning it Ready) do not give up on one
//! 500 or 429: without this, one transient error left a VM half-made until the creation timeout.

use std::future::Future;
use std::time::Duration;

/// How often and how patiently a step is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Wait before the second attempt; doubled after each failure.
    pub initial: Duration,
    /// Longest wait between attempts.
    pub max: Duration,
    /// Attempts in all (at least one); `None` retries until success or a permanent error.
    pub attempts: Option<u32>,
}

impl RetryPolicy {
    /// For steps inside one driver call: a few quick attempts, then the call fails and the
    /// controller's own retry takes over.
    pub const STEP: RetryPolicy = RetryPolicy {
        initial: Duration::from_millis(50),
        max: Duration::from_secs(1),
        attempts: Some(5),
    };
    /// For background work nobody waits on (turning a Node Ready): until it is done.
    pub const BACKGROUND: RetryPolicy = RetryPolicy {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(5),
        attempts: None,
    };

    /// The wait after `failures` failed attempts (1-based).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// True for errors worth another attempt: server errors, 429, timeouts and transport failures.
/// Other 4xx (404, 409, 422, ...) are answers, not accidents.
pub fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        _ => true,
    }
}

/// Runs `op` until it succeeds, fails permanently, or the policy's attempts are used up.
pub async fn with_retries<T, F, Fut>(
    policy: RetryPolicy,
    what: &str,
    mut op: F,
) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut failures = 0u32;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(err) if is_transient(&err) => {
                failures = failures.saturating_add(1);
                if policy.attempts.is_some_and(|a| failures >= a.max(1)) {
                    return Err(err);
                }
                let wait = policy.delay(failures);
                tracing::debug!(%err, attempt = failures, ?wait, "{what} failed, retrying");
                tokio::time::sleep(wait).await;
            }
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("injected", "Injected")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn delay_doubles_up_to_the_cap_without_overflow() {
        let p = RetryPolicy::STEP;
        assert_eq!(p.delay(1), Duration::from_millis(50));
        assert_eq!(p.delay(2), Duration::from_millis(100));
        assert_eq!(p.delay(3), Duration::from_millis(200));
        assert_eq!(p.delay(100), Duration::from_secs(1));
        assert_eq!(p.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn only_server_errors_and_throttling_are_transient() {
        assert!(is_transient(&api_error(500)));
        assert!(is_transient(&api_error(503)));
        assert!(is_transient(&api_error(429)));
        assert!(!is_transient(&api_error(409)));
        assert!(!is_transient(&api_error(404)));
    }

    #[tokio::test]
    async fn transient_errors_are_retried_until_success() {
        let calls = AtomicU32::new(0);
        let result = with_retries(RetryPolicy::STEP, "test", || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 => Err(api_error(500)),
                1 => Err(api_error(429)),
                n => Ok(n),
            }
        })
        .await;
        assert_eq!(result.expect("third attempt succeeds"), 2);
    }

    #[tokio::test]
    async fn attempts_are_bounded_and_permanent_errors_are_not_retried() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = with_retries(RetryPolicy::STEP, "test", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(api_error(500))
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 5);

        let calls = AtomicU32::new(0);
        let result: Result<(), _> = with_retries(RetryPolicy::STEP, "test", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(api_error(409))
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
