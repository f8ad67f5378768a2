//! Deterministic fault injection: errors with chosen codes per verb/resource, added latency, watch
//! streams cut after N events or T seconds, forced `410 Gone` on watch resumption, and a network
//! partition. Every random choice is a hash of (seed, verb, resource, n-th such request, rule), so
//! the same seed gives the same faults for the same request sequence, even when requests of other
//! resources interleave differently.

use crate::error::ApiError;
use crate::request_info::RequestInfo;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Errors injected into a share of matching requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ErrorRule {
    /// Verbs this rule applies to (`get`, `list`, `watch`, `create`, ...); empty means all.
    #[serde(default)]
    pub verbs: Vec<String>,
    /// Resources (`pods`, `pods/status`, `deployments`); empty or `*` means all.
    #[serde(default)]
    pub resources: Vec<String>,
    /// Probability in [0, 1].
    pub rate: f64,
    /// 500, 429 (with `Retry-After`), 409, or any 4xx/5xx.
    #[serde(default = "default_code")]
    pub code: u16,
    /// `Retry-After` seconds for 429 (and 503).
    #[serde(default = "default_retry_after")]
    pub retry_after_seconds: u64,
}

fn default_code() -> u16 {
    500
}

fn default_retry_after() -> u64 {
    1
}

impl ErrorRule {
    fn applies(&self, info: &RequestInfo) -> bool {
        if !info.is_resource_request {
            return false;
        }
        let verb_ok = self.verbs.is_empty() || self.verbs.iter().any(|v| v == &info.verb);
        let full = info.resource_with_subresource();
        let res_ok = self.resources.is_empty()
            || self.resources.iter().any(|r| {
                r == "*" || *r == full || (*r == info.resource && info.subresource.is_empty())
            });
        verb_ok && res_ok
    }
}

/// The whole fault configuration; the default injects nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultConfig {
    #[serde(default)]
    pub seed: u64,
    /// Evaluated in order; the first rule that fires decides the error.
    #[serde(default)]
    pub errors: Vec<ErrorRule>,
    /// Added to every request (including discovery).
    #[serde(default)]
    pub latency_ms: u64,
    /// Up to this much more, drawn per request.
    #[serde(default)]
    pub latency_jitter_ms: u64,
    /// Watch streams end (cleanly, as a dropped connection would) after this many events.
    #[serde(default)]
    pub watch_max_events: Option<u64>,
    /// Watch streams end after this long.
    #[serde(default)]
    pub watch_max_seconds: Option<f64>,
    /// Share of watch resumptions (a watch with a resourceVersion) answered with `410 Gone`.
    #[serde(default)]
    pub watch_resume_gone_rate: f64,
    /// With `--data-dir`: the N-th fsync of the event log from when this is set (1 = the next)
    /// fails with EIO, as a failing disk's would; the writes it covered fail and kube-sim
    /// refuses every write until it is restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsync_fail_after: Option<u64>,
}

/// The longest latency or watch lifetime a fault may ask for: a day (beyond it a test hangs,
/// and far beyond it the deadline overflows).
pub const MAX_FAULT_SECONDS: u64 = 24 * 3600;

/// A probability: finite and within [0, 1].
fn check_rate(field: &str, rate: f64) -> Result<(), FaultConfigError> {
    if rate.is_finite() && (0.0..=1.0).contains(&rate) {
        return Ok(());
    }
    Err(FaultConfigError::invalid(
        field,
        format!("must be a number between 0 and 1, not {rate}"),
    ))
}

/// A number of seconds that becomes a `Duration`: finite, not negative, at most a day.
pub fn check_seconds(field: &str, secs: f64) -> Result<Duration, FaultConfigError> {
    if secs.is_finite() && (0.0..=MAX_FAULT_SECONDS as f64).contains(&secs) {
        return Ok(Duration::from_secs_f64(secs));
    }
    Err(FaultConfigError::invalid(
        field,
        format!("must be between 0 and {MAX_FAULT_SECONDS} seconds, not {secs}"),
    ))
}

impl FaultConfig {
    /// Parses and checks JSON (the admin endpoint's and `--faults`' format).
    pub fn from_json(text: &str) -> Result<Self, FaultConfigError> {
        let config: Self = serde_json::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Every number in range, so that no later conversion (rates, durations, deadlines) can
    /// fail; the error names the first field that is not.
    pub fn validate(&self) -> Result<(), FaultConfigError> {
        for (i, rule) in self.errors.iter().enumerate() {
            check_rate(&format!("errors[{i}].rate"), rule.rate)?;
            if !(400..=599).contains(&rule.code) {
                return Err(FaultConfigError::invalid(
                    &format!("errors[{i}].code"),
                    format!("must be an HTTP error code (400-599), not {}", rule.code),
                ));
            }
            if rule.retry_after_seconds > MAX_FAULT_SECONDS {
                return Err(FaultConfigError::invalid(
                    &format!("errors[{i}].retryAfterSeconds"),
                    format!("must be at most {MAX_FAULT_SECONDS}"),
                ));
            }
        }
        for (field, ms) in [
            ("latencyMs", self.latency_ms),
            ("latencyJitterMs", self.latency_jitter_ms),
        ] {
            if ms > MAX_FAULT_SECONDS * 1000 {
                return Err(FaultConfigError::invalid(
                    field,
                    format!("must be at most {} ms, not {ms}", MAX_FAULT_SECONDS * 1000),
                ));
            }
        }
        if let Some(secs) = self.watch_max_seconds {
            check_seconds("watchMaxSeconds", secs)?;
        }
        if self.fsync_fail_after == Some(0) {
            return Err(FaultConfigError::invalid(
                "fsyncFailAfter",
                "must be at least 1 (1 fails the next fsync)".into(),
            ));
        }
        check_rate("watchResumeGoneRate", self.watch_resume_gone_rate)
    }

    /// The `--faults` flag: inline JSON, `@path` to a JSON file, or nothing.
    pub fn from_flag(flag: Option<&str>) -> Result<Self, FaultConfigError> {
        let text = match flag {
            None => return Ok(Self::default()),
            Some(f) => match f.strip_prefix('@') {
                Some(path) => {
                    std::fs::read_to_string(path).map_err(|source| FaultConfigError::Read {
                        path: path.into(),
                        source,
                    })?
                }
                None => f.to_string(),
            },
        };
        Self::from_json(&text)
    }

    /// The same error rate and code for every verb and resource.
    pub fn uniform_errors(seed: u64, rate: f64, code: u16) -> Self {
        Self {
            seed,
            errors: vec![ErrorRule {
                verbs: vec![],
                resources: vec![],
                rate,
                code,
                retry_after_seconds: 1,
            }],
            ..Default::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FaultConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("invalid fault configuration: {0}")]
    Json(#[from] serde_json::Error),
    #[error("invalid fault configuration: {field}: {why}")]
    Invalid { field: String, why: String },
}

impl FaultConfigError {
    fn invalid(field: &str, why: String) -> Self {
        Self::Invalid {
            field: field.to_string(),
            why,
        }
    }
}

/// An error to answer instead of running the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedError {
    pub code: u16,
    pub retry_after_seconds: Option<u64>,
}

impl InjectedError {
    /// The `Status` kube-apiserver would send for this code.
    pub fn to_api_error(self, info: &RequestInfo) -> ApiError {
        let (group, resource, name) = (&info.api_group, &info.resource, &info.name);
        match self.code {
            409 => ApiError::stale(group, resource, name),
            429 => ApiError::new(
                429,
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
            )
            .with_details(serde_json::json!({
                "retryAfterSeconds": self.retry_after_seconds.unwrap_or(1),
                "causes": [{"message": "injected fault"}]
            })),
            503 => ApiError::new(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            500 => ApiError::internal("injected fault"),
            code if code >= 500 => ApiError::internal("injected fault").with_code(code),
            code => ApiError::new(code, "BadRequest", "injected fault"),
        }
    }
}

trait WithCode {
    fn with_code(self, code: u16) -> Self;
}

impl WithCode for ApiError {
    fn with_code(mut self, code: u16) -> Self {
        self.code = code;
        self
    }
}

/// What happens to one request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FaultDecision {
    pub latency: Duration,
    pub error: Option<InjectedError>,
    /// For watch resumptions only: answer `410 Gone`.
    pub watch_gone: bool,
}

/// 64-bit FNV-1a, then SplitMix64 finalisation: a stable, well-mixed hash without dependencies.
fn mix(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in [0, 1).
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[derive(Debug, Default)]
struct State {
    config: FaultConfig,
    /// Requests seen per (verb, resource), the sequence number in the hash.
    sequence: HashMap<(String, String), u64>,
    partition_until: Option<Instant>,
    /// Watch resumptions still to be answered with 410, whatever the rate says.
    forced_gone: u32,
}

/// The live fault state of one server.
#[derive(Debug, Default)]
pub struct FaultInjector {
    state: Mutex<State>,
}

impl FaultInjector {
    pub fn new(config: FaultConfig) -> Self {
        Self {
            state: Mutex::new(State {
                config,
                ..Default::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        capstan_runtime::sync::lock(&self.state)
    }

    /// Replaces the configuration and restarts the random sequence.
    pub fn configure(&self, config: FaultConfig) {
        let mut s = self.lock();
        s.config = config;
        s.sequence.clear();
    }

    pub fn config(&self) -> FaultConfig {
        self.lock().config.clone()
    }

    /// The next `n` watch resumptions get `410 Gone`.
    pub fn force_watch_gone(&self, n: u32) {
        self.lock().forced_gone += n;
    }

    /// The server refuses requests (dropping connections) for `d`.
    pub fn partition_for(&self, d: Duration) {
        // A library caller may ask for any length: an unrepresentable deadline is "a day".
        let now = Instant::now();
        let until = now
            .checked_add(d)
            .unwrap_or(now + Duration::from_secs(MAX_FAULT_SECONDS));
        self.lock().partition_until = Some(until);
    }

    pub fn heal_partition(&self) {
        self.lock().partition_until = None;
    }

    pub fn partitioned(&self) -> bool {
        let mut s = self.lock();
        match s.partition_until {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                s.partition_until = None;
                false
            }
            None => false,
        }
    }

    /// How long watch streams may live: (max events, max duration).
    pub fn watch_limits(&self) -> (Option<u64>, Option<Duration>) {
        let s = self.lock();
        (
            s.config.watch_max_events,
            s.config
                .watch_max_seconds
                .filter(|t| *t > 0.0)
                .and_then(|s| Duration::try_from_secs_f64(s).ok()),
        )
    }

    /// Decides the fate of one request; `resumes_watch` when it is a watch with a resourceVersion.
    pub fn decide(&self, info: &RequestInfo, resumes_watch: bool) -> FaultDecision {
        let mut s = self.lock();
        let idle = s.config.errors.is_empty()
            && s.config.latency_ms == 0
            && s.config.latency_jitter_ms == 0
            && s.config.watch_resume_gone_rate <= 0.0
            && s.forced_gone == 0;
        if idle {
            // Nothing to inject: skip the bookkeeping on the hot path.
            return FaultDecision::default();
        }
        let resource = info.resource_with_subresource();
        let seq_key = (info.verb.clone(), resource.clone());
        let n = {
            let e = s.sequence.entry(seq_key).or_insert(0);
            *e += 1;
            *e
        };
        let c = &s.config;
        let draw = |salt: &str| {
            unit(mix(
                c.seed,
                &[
                    info.verb.as_bytes(),
                    resource.as_bytes(),
                    &n.to_le_bytes(),
                    salt.as_bytes(),
                ],
            ))
        };
        let mut d = FaultDecision {
            latency: Duration::from_millis(c.latency_ms),
            ..Default::default()
        };
        if c.latency_jitter_ms > 0 {
            d.latency = d.latency.saturating_add(Duration::from_millis(
                (draw("latency") * c.latency_jitter_ms as f64) as u64,
            ));
        }
        for (i, rule) in c.errors.iter().enumerate() {
            if rule.applies(info) && draw(&format!("error{i}")) < rule.rate {
                d.error = Some(InjectedError {
                    code: rule.code,
                    retry_after_seconds: matches!(rule.code, 429 | 503)
                        .then_some(rule.retry_after_seconds),
                });
                break;
            }
        }
        if d.error.is_none() && resumes_watch && info.verb == "watch" {
            let rate = c.watch_resume_gone_rate;
            d.watch_gone = rate > 0.0 && draw("gone") < rate;
            if !d.watch_gone && s.forced_gone > 0 {
                s.forced_gone -= 1;
                d.watch_gone = true;
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &str, path: &str) -> RequestInfo {
        RequestInfo::parse(method, path, None)
    }

    fn sequence(seed: u64) -> Vec<Option<u16>> {
        let f = FaultInjector::new(FaultConfig {
            seed,
            errors: vec![
                ErrorRule {
                    verbs: vec!["create".into()],
                    resources: vec![],
                    rate: 0.3,
                    code: 409,
                    retry_after_seconds: 1,
                },
                ErrorRule {
                    verbs: vec![],
                    resources: vec!["pods".into()],
                    rate: 0.2,
                    code: 429,
                    retry_after_seconds: 3,
                },
            ],
            ..Default::default()
        });
        (0..200)
            .map(|i| {
                let req = if i % 2 == 0 {
                    info("POST", "/api/v1/namespaces/a/configmaps")
                } else {
                    info("GET", "/api/v1/namespaces/a/pods")
                };
                f.decide(&req, false).error.map(|e| e.code)
            })
            .collect()
    }

    #[test]
    fn same_seed_same_faults_other_seed_other_faults() {
        let a = sequence(7);
        assert_eq!(a, sequence(7));
        assert_ne!(a, sequence(8));
        let conflicts = a.iter().filter(|e| **e == Some(409)).count();
        let throttled = a.iter().filter(|e| **e == Some(429)).count();
        // 100 draws each at 30% and 20%: far from 0 and from 100 for any sane mixing.
        assert!((15..=45).contains(&conflicts), "{conflicts}");
        assert!((8..=35).contains(&throttled), "{throttled}");
    }

    #[test]
    fn rules_match_verbs_and_subresources() {
        let rule = ErrorRule {
            verbs: vec!["patch".into()],
            resources: vec!["pods/status".into()],
            rate: 1.0,
            code: 500,
            retry_after_seconds: 1,
        };
        assert!(rule.applies(&info("PATCH", "/api/v1/namespaces/a/pods/p/status")));
        assert!(!rule.applies(&info("PATCH", "/api/v1/namespaces/a/pods/p")));
        assert!(!rule.applies(&info("GET", "/api/v1/namespaces/a/pods/p/status")));
        assert!(!rule.applies(&info("GET", "/version")));
    }

    #[test]
    fn injected_errors_carry_kube_apiserver_status() {
        let i = info("PUT", "/apis/apps/v1/namespaces/a/deployments/web");
        let e = InjectedError {
            code: 409,
            retry_after_seconds: None,
        }
        .to_api_error(&i);
        assert_eq!(e.reason, "Conflict");
        assert_eq!(
            e.message,
            "Operation cannot be fulfilled on deployments.apps \"web\": the object has been modified; please apply your changes to the latest version and try again"
        );
        let e = InjectedError {
            code: 429,
            retry_after_seconds: Some(2),
        }
        .to_api_error(&i);
        assert_eq!(e.to_status()["details"]["retryAfterSeconds"], 2);
        let e = InjectedError {
            code: 500,
            retry_after_seconds: None,
        }
        .to_api_error(&i);
        assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    }

    #[test]
    fn out_of_range_numbers_are_refused_by_field_and_never_panic() {
        let nan = FaultConfig {
            watch_max_seconds: Some(f64::NAN),
            ..Default::default()
        };
        let err = nan.validate().expect_err("NaN");
        assert!(err.to_string().contains("watchMaxSeconds: "), "{err}");
        let rate = FaultConfig::uniform_errors(1, f64::INFINITY, 500);
        let err = rate.validate().expect_err("infinite rate");
        assert!(err.to_string().contains("errors[0].rate: "), "{err}");
        // A library caller may skip `validate`: the injector must still not panic.
        let f = FaultInjector::new(FaultConfig {
            watch_max_seconds: Some(1e300),
            latency_ms: u64::MAX,
            latency_jitter_ms: u64::MAX,
            ..Default::default()
        });
        assert_eq!(f.watch_limits().1, None);
        assert!(f.decide(&info("GET", "/version"), false).latency >= Duration::from_secs(1));
        f.partition_for(Duration::MAX);
        assert!(f.partitioned());
        assert!(FaultConfig::from_json(r#"{"latencyMs": 5, "errors": [{"rate": 1}]}"#).is_ok());
    }

    #[test]
    fn forced_gone_and_rates_for_resumed_watches() {
        let f = FaultInjector::new(FaultConfig::default());
        let w = RequestInfo::parse("GET", "/api/v1/pods", Some("watch=1&resourceVersion=9"));
        assert!(!f.decide(&w, true).watch_gone);
        f.force_watch_gone(1);
        assert!(
            !f.decide(&w, false).watch_gone,
            "a fresh watch is never gone"
        );
        assert!(f.decide(&w, true).watch_gone);
        assert!(!f.decide(&w, true).watch_gone, "only one was forced");
        f.configure(FaultConfig {
            watch_resume_gone_rate: 1.0,
            ..Default::default()
        });
        assert!(f.decide(&w, true).watch_gone);
    }

    #[test]
    fn config_json_and_partition() {
        let c = FaultConfig::from_json(
            r#"{"seed":3,"errors":[{"rate":0.1,"code":429}],"latencyMs":5,"watchMaxEvents":10}"#,
        )
        .expect("valid");
        assert_eq!(c.errors[0].retry_after_seconds, 1);
        assert_eq!(c.watch_max_events, Some(10));
        assert!(FaultConfig::from_json(r#"{"bogus":1}"#).is_err());
        let f = FaultInjector::new(c);
        assert_eq!(
            f.decide(&info("GET", "/version"), false).latency,
            Duration::from_millis(5)
        );
        assert!(!f.partitioned());
        f.partition_for(Duration::from_secs(60));
        assert!(f.partitioned());
        f.heal_partition();
        assert!(!f.partitioned());
    }
}
