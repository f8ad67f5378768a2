//! Common controller metrics (the kube-rs controller-rs model), shared by every controller.
//!
//! - `capstan_controller_reconciles_total{controller,kind}`
//! - `capstan_controller_reconcile_failures_total{controller,kind,error}`
//! - `capstan_controller_reconcile_duration_seconds{controller,kind}` (histogram)

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A short, stable label for an error, used in metrics and Events (`snake_case`, never the
/// message: messages carry names and would explode label cardinality).
pub trait ErrorLabel {
    fn metric_label(&self) -> &'static str;
}

/// Labels for Kubernetes client errors, by API status code or failure class.
impl ErrorLabel for kube::Error {
    fn metric_label(&self) -> &'static str {
        match self {
            kube::Error::Api(status) => match status.code {
                400 => "bad_request",
                401 | 403 => "forbidden",
                404 => "not_found",
                409 if status.reason == "AlreadyExists" => "already_exists",
                409 => "conflict",
                410 => "gone",
                422 => "invalid",
                429 => "throttled",
                500..=599 => "api_server_error",
                _ => "api_error",
            },
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_) => {
                "transport"
            }
            kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) => "decode",
            _ => "kube_client",
        }
    }
}

/// Registers `capstan_build_info{service,version} 1`, so every binary exposes at least one
/// sample and dashboards can tell versions apart.
pub fn register_build_info(registry: &mut Registry, service: &str, version: &str) {
    let info = prometheus_client::metrics::info::Info::new(vec![
        ("service".to_owned(), service.to_owned()),
        ("version".to_owned(), version.to_owned()),
    ]);
    registry.register("capstan_build", "Build information", info);
}

/// Registers `capstan_leader` (1 while this replica holds the Lease or election is off, else 0)
/// and returns the gauge to update.
pub fn register_leader_gauge(registry: &mut Registry) -> prometheus_client::metrics::gauge::Gauge {
    let gauge = prometheus_client::metrics::gauge::Gauge::default();
    registry.register(
        "capstan_leader",
        "Whether this replica is the leader (1) or a standby (0)",
        gauge.clone(),
    );
    gauge
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    controller: String,
    kind: String,
    error: String,
}

type DurationFamily = Family<ReconcileLabels, Histogram, fn() -> Histogram>;

/// Reconcile duration buckets: 5 ms .. ~20 s, doubling.
fn duration_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.005, 2.0, 13,
    ))
}

/// Reconcile counters and durations for one controller. Cheap to clone.
///
/// Register once per process with [`register`](Self::register); a second controller in the same
/// process shares the families through [`for_controller`](Self::for_controller) (registering the
/// same names twice would make the exposition invalid).
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    controller: String,
    reconciles: Family<ReconcileLabels, Counter>,
    failures: Family<FailureLabels, Counter>,
    durations: DurationFamily,
}

impl ControllerMetrics {
    pub fn register(registry: &mut Registry, controller: &str) -> Self {
        let metrics = Self {
            controller: controller.to_owned(),
            reconciles: Family::default(),
            failures: Family::default(),
            durations: DurationFamily::new_with_constructor(duration_histogram),
        };
        // prometheus-client appends `_total` to counters.
        registry.register(
            "capstan_controller_reconciles",
            "Reconciliations started",
            metrics.reconciles.clone(),
        );
        registry.register(
            "capstan_controller_reconcile_failures",
            "Reconciliations that returned an error, by error label",
            metrics.failures.clone(),
        );
        registry.register_with_unit(
            "capstan_controller_reconcile_duration",
            "Time spent in one reconciliation",
            prometheus_client::registry::Unit::Seconds,
            metrics.durations.clone(),
        );
        metrics
    }

    /// The same metric families labelled with another controller name.
    pub fn for_controller(&self, controller: &str) -> Self {
        Self {
            controller: controller.to_owned(),
            ..self.clone()
        }
    }

    pub fn controller(&self) -> &str {
        &self.controller
    }

    /// Counts a reconcile of `kind` and returns a guard that records its duration (and failure,
    /// if [`ReconcileMeasurer::set_failure`] was called) when dropped.
    pub fn measure(&self, kind: &str) -> ReconcileMeasurer {
        let labels = ReconcileLabels {
            controller: self.controller.clone(),
            kind: kind.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        ReconcileMeasurer {
            metrics: self.clone(),
            labels,
            start: Instant::now(),
            failure: None,
        }
    }

    /// Counts a failed reconcile directly (for callers that do not hold a measurer, such as an
    /// `error_policy`).
    pub fn record_failure(&self, kind: &str, error: &impl ErrorLabel) {
        self.inc_failure(kind, error.metric_label());
    }

    fn inc_failure(&self, kind: &str, error: &str) {
        self.failures
            .get_or_create(&FailureLabels {
                controller: self.controller.clone(),
                kind: kind.to_owned(),
                error: error.to_owned(),
            })
            .inc();
    }
}

/// Records one reconcile's duration on drop; see [`ControllerMetrics::measure`].
#[derive(Debug)]
#[must_use = "the duration is recorded when the measurer is dropped"]
pub struct ReconcileMeasurer {
    metrics: ControllerMetrics,
    labels: ReconcileLabels,
    start: Instant,
    failure: Option<&'static str>,
}

impl ReconcileMeasurer {
    /// Marks this reconcile failed with `error`'s label; counted once, on drop.
    pub fn set_failure(&mut self, error: &impl ErrorLabel) {
        self.failure = Some(error.metric_label());
    }
}

impl Drop for ReconcileMeasurer {
    fn drop(&mut self) {
        let seconds = self.start.elapsed().as_secs_f64();
        self.metrics
            .durations
            .get_or_create(&self.labels)
            .observe(seconds);
        if let Some(error) = self.failure {
            self.metrics.inc_failure(&self.labels.kind, error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Conflict;
    impl ErrorLabel for Conflict {
        fn metric_label(&self) -> &'static str {
            "conflict"
        }
    }

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
        text
    }

    #[test]
    fn measurer_counts_reconciles_durations_and_failures() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::register(&mut registry, "machineclass");
        {
            let _ok = metrics.measure("Machine");
        }
        {
            let mut failed = metrics.measure("Machine");
            failed.set_failure(&Conflict);
        }
        {
            let _other_kind = metrics.measure("MachineClass");
        }
        let text = encode(&registry);
        assert!(
            text.contains(
                r#"capstan_controller_reconciles_total{controller="machineclass",kind="Machine"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"capstan_controller_reconciles_total{controller="machineclass",kind="MachineClass"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"capstan_controller_reconcile_failures_total{controller="machineclass",kind="Machine",error="conflict"} 1"#
            ),
            "{text}"
        );
        assert!(
            !text.contains(r#"kind="MachineClass",error="#),
            "no failure for a successful kind: {text}"
        );
        assert!(
            text.contains(
                r#"capstan_controller_reconcile_duration_seconds_count{controller="machineclass",kind="Machine"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE capstan_controller_reconcile_duration_seconds histogram"),
            "{text}"
        );
    }

    #[test]
    fn duration_reflects_elapsed_time() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::register(&mut registry, "nodeslo");
        {
            let _slow = metrics.measure("Node");
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        let text = encode(&registry);
        let sum_line = text
            .lines()
            .find(|l| l.starts_with("capstan_controller_reconcile_duration_seconds_sum"))
            .expect("sum line");
        let sum: f64 = sum_line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("numeric sum");
        assert!((0.03..5.0).contains(&sum), "sum {sum}");
        // At least 30 ms: not in the 20 ms bucket (upper buckets depend on machine load).
        assert!(
            text.contains(r#"le="0.02",controller="nodeslo",kind="Node"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"le="+Inf",controller="nodeslo",kind="Node"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn kube_errors_get_stable_labels() {
        let api = |code, reason: &str| {
            kube::Error::Api(
                kube::core::Status::failure("message", reason)
                    .with_code(code)
                    .boxed(),
            )
        };
        assert_eq!(api(409, "Conflict").metric_label(), "conflict");
        assert_eq!(api(409, "AlreadyExists").metric_label(), "already_exists");
        assert_eq!(api(404, "NotFound").metric_label(), "not_found");
        assert_eq!(api(422, "Invalid").metric_label(), "invalid");
        assert_eq!(
            api(503, "ServiceUnavailable").metric_label(),
            "api_server_error"
        );
        assert_eq!(api(418, "Teapot").metric_label(), "api_error");
        let decode = serde_json::from_str::<u8>("x").expect_err("not a number");
        assert_eq!(kube::Error::SerdeError(decode).metric_label(), "decode");
    }

    #[test]
    fn build_info_and_leader_gauge_are_exposed() {
        let mut registry = Registry::default();
        register_build_info(&mut registry, "nodeslo-controller", "0.1.0");
        let leader = register_leader_gauge(&mut registry);
        leader.set(1);
        let text = encode(&registry);
        assert!(
            text.contains(r#"capstan_build_info{service="nodeslo-controller",version="0.1.0"} 1"#),
            "{text}"
        );
        assert!(text.contains("capstan_leader 1\n"), "{text}");
    }

    #[test]
    fn controllers_share_families_with_distinct_labels() {
        let mut registry = Registry::default();
        let server = ControllerMetrics::register(&mut registry, "gw-recycler-server");
        let client = server.for_controller("gw-recycler-client");
        drop(server.measure("WorkerSliceGwRecycler"));
        client.record_failure("WorkerSliceGwRecycler", &Conflict);
        let text = encode(&registry);
        assert_eq!(
            text.matches("# TYPE capstan_controller_reconciles counter")
                .count(),
            1
        );
        assert!(
            text.contains(r#"controller="gw-recycler-server",kind="WorkerSliceGwRecycler"} 1"#)
        );
        assert!(text.contains(
            r#"capstan_controller_reconcile_failures_total{controller="gw-recycler-client",kind="WorkerSliceGwRecycler",error="conflict"} 1"#
        ));
    }
}
