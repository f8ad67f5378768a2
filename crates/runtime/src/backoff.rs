//! Per-object exponential backoff for failed reconciles (kube-runtime retries with a fixed
//! `Action` from `error_policy`, so a broken object would otherwise be retried at a constant rate).
//!
//! Use it in `error_policy` with [`PerObjectBackoff::requeue_after_error`] and call
//! [`PerObjectBackoff::forget`] (or `reset`) at the end of a successful reconcile.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::Mutex;
use std::time::Duration;

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

/// Backoff parameters: delay `n` (1-based) is `min(base * factor^(n-1), max)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffConfig {
    pub base: Duration,
    pub max: Duration,
    pub factor: u32,
    /// Spread each delay uniformly over `[delay/2, delay]` so that objects failing together do
    /// not retry together. Off by default so delays are predictable.
    pub jitter: bool,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            max: Duration::from_secs(300),
            factor: 2,
            jitter: false,
        }
    }
}

impl BackoffConfig {
    /// The delay before retry number `attempt` (1 = first retry), without jitter.
    pub fn delay_for_attempt(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1);
        let multiplier = self.factor.max(1).saturating_pow(exponent);
        self.base.saturating_mul(multiplier).min(self.max)
    }
}

/// Failure counts per key (usually an `ObjectRef`), thread-safe.
#[derive(Debug)]
pub struct PerObjectBackoff<K> {
    config: BackoffConfig,
    attempts: Mutex<HashMap<K, u32>>,
    jitter_seed: std::collections::hash_map::RandomState,
}

impl<K: Hash + Eq + Clone> Default for PerObjectBackoff<K> {
    fn default() -> Self {
        Self::new(BackoffConfig::default())
    }
}

impl<K: Hash + Eq + Clone> PerObjectBackoff<K> {
    pub fn new(config: BackoffConfig) -> Self {
        Self {
            config,
            attempts: Mutex::new(HashMap::new()),
            jitter_seed: std::collections::hash_map::RandomState::new(),
        }
    }

    pub fn config(&self) -> &BackoffConfig {
        &self.config
    }

    /// Records one more failure of `key` and returns how long to wait before retrying it.
    pub fn next_delay(&self, key: &K) -> Duration {
        let attempt = {
            let mut attempts = self.lock();
            let count = attempts.entry(key.clone()).or_insert(0);
            *count = count.saturating_add(1);
            *count
        };
        let delay = self.config.delay_for_attempt(attempt);
        if self.config.jitter {
            self.jittered(delay, key, attempt)
        } else {
            delay
        }
    }

    /// Forgets `key`'s failures: the next failure starts again at `base`.
    pub fn reset(&self, key: &K) {
        self.lock().remove(key);
    }

    /// Failures recorded for `key` since its last reset.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().get(key).copied().unwrap_or(0)
    }

    /// Number of keys currently backing off.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, u32>> {
        crate::sync::lock(&self.attempts)
    }

    fn jittered(&self, delay: Duration, key: &K, attempt: u32) -> Duration {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        let random = self
            .jitter_seed
            .hash_one((key, attempt, std::time::SystemTime::now()));
        let half = nanos / 2;
        let spread = if half == 0 { 0 } else { random % (half + 1) };
        Duration::from_nanos(nanos - half + spread)
    }
}

impl<R> PerObjectBackoff<ObjectRef<R>>
where
    R: Resource,
    R::DynamicType: Default + Hash + Eq + Clone,
{
    /// For `error_policy`: records a failure of `obj` and requeues it after the backoff delay.
    pub fn requeue_after_error(&self, obj: &R) -> Action {
        Action::requeue(self.next_delay(&ObjectRef::from_obj(obj)))
    }

    /// For the end of a successful reconcile: the next failure of `obj` starts at `base` again.
    pub fn forget(&self, obj: &R) {
        self.reset(&ObjectRef::from_obj(obj));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn delays_double_from_base_up_to_max() {
        let backoff = PerObjectBackoff::<&str>::default();
        let delays: Vec<_> = (0..11).map(|_| backoff.next_delay(&"a")).collect();
        assert_eq!(
            delays,
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300].map(secs)
        );
        assert_eq!(backoff.failures(&"a"), 11);
    }

    #[test]
    fn many_failures_never_overflow_past_max() {
        let config = BackoffConfig {
            base: Duration::from_millis(100),
            max: secs(60),
            factor: 3,
            jitter: false,
        };
        assert_eq!(config.delay_for_attempt(1), Duration::from_millis(100));
        assert_eq!(config.delay_for_attempt(2), Duration::from_millis(300));
        assert_eq!(config.delay_for_attempt(5), Duration::from_millis(8100));
        assert_eq!(config.delay_for_attempt(200), secs(60));
        assert_eq!(config.delay_for_attempt(u32::MAX), secs(60));
    }

    #[test]
    fn reset_starts_over_and_keys_are_independent() {
        let backoff = PerObjectBackoff::<String>::default();
        let (a, b) = ("ns/a".to_owned(), "ns/b".to_owned());
        assert_eq!(backoff.next_delay(&a), secs(1));
        assert_eq!(backoff.next_delay(&a), secs(2));
        assert_eq!(backoff.next_delay(&a), secs(4));
        assert_eq!(backoff.next_delay(&b), secs(1), "b has its own count");
        backoff.reset(&a);
        assert_eq!(backoff.failures(&a), 0);
        assert_eq!(backoff.next_delay(&a), secs(1));
        assert_eq!(
            backoff.next_delay(&b),
            secs(2),
            "resetting a leaves b alone"
        );
        assert_eq!(backoff.len(), 2);
    }

    #[test]
    fn jitter_stays_within_half_to_full_delay() {
        let backoff = PerObjectBackoff::<u32>::new(BackoffConfig {
            jitter: true,
            ..BackoffConfig::default()
        });
        for key in 0..200 {
            for attempt in 1..=4 {
                let full = backoff.config().delay_for_attempt(attempt);
                let delay = backoff.next_delay(&key);
                assert!(delay <= full && delay >= full / 2, "{delay:?} vs {full:?}");
            }
        }
    }

    #[test]
    fn concurrent_failures_are_all_counted() {
        let backoff = std::sync::Arc::new(PerObjectBackoff::<&str>::default());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let backoff = backoff.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        backoff.next_delay(&"shared");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("thread finishes");
        }
        assert_eq!(backoff.failures(&"shared"), 800);
    }

    #[test]
    fn error_policy_helpers_key_by_object_ref() {
        let backoff = PerObjectBackoff::<ObjectRef<ConfigMap>>::default();
        let object = |name: &str| ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let (a, b) = (object("a"), object("b"));
        assert_eq!(backoff.requeue_after_error(&a), Action::requeue(secs(1)));
        assert_eq!(backoff.requeue_after_error(&a), Action::requeue(secs(2)));
        assert_eq!(backoff.requeue_after_error(&b), Action::requeue(secs(1)));
        backoff.forget(&a);
        assert_eq!(backoff.requeue_after_error(&a), Action::requeue(secs(1)));
        assert_eq!(backoff.failures(&ObjectRef::from_obj(&b)), 1);
    }
}
