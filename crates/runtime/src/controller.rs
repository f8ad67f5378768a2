//! The controller kit: what every Capstan controller binary is made of, written once.
//!
//! - [`main_with`]: runs a binary's `run` and maps its outcome to the exit code.
//! - [`Binary`]: the start-up and drain skeleton (telemetry, signals, metrics registry, admin
//!   server, leader election) around the binary's controllers.
//! - [`Reconciler`]: wraps each reconcile in a `reconcile` span (controller, object kind,
//!   namespace, name, outcome, trace id), times it, labels its failure, and decides the retry
//!   ([`Reconciler::next_after_error`]: a conflict retries soon, anything else backs off per
//!   object).
//! - [`Gates`]: what a [`crate::runner::Runner`] is gated on: it stops on shutdown and
//!   reconciles everything again when leadership is gained or the caches have synced.

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, TryStreamExt};
use kube::Resource;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::Instrument;

use crate::RuntimeError;
use crate::backoff::{BackoffConfig, PerObjectBackoff};
use crate::cli::CommonArgs;
use crate::kube_errors::{find_kube_error, is_conflict, is_failed_patch_test};
use crate::metrics::{ControllerMetrics, ErrorLabel};
use crate::own_writes::OwnWrites;
use crate::service::Service;
use crate::shutdown::Shutdown;
use crate::telemetry::{self, TelemetryGuard};

/// Runs a binary's `run` future and maps the outcome to the exit code: 0 after a clean drain,
/// 1 after printing the error chain (`{error:#}`) prefixed with the binary's name.
///
/// `run` is spawned as a task: `#[tokio::main]` polls its own future on the main thread, outside
/// the worker pool, so controllers driven there would hand every watch event and API response
/// across threads (profiles of nodeslo-controller showed the main thread as a third busy thread
/// on two cores).
pub async fn main_with<E: Display + Send + 'static>(
    name: &str,
    run: impl Future<Output = Result<(), E>> + Send + 'static,
) -> ExitCode {
    match tokio::spawn(run).await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(error)) => {
            eprintln!("{name}: {error:#}");
            ExitCode::FAILURE
        }
        // A panic has already printed its message through the panic hook.
        Err(join) => {
            eprintln!("{name}: {join}");
            ExitCode::FAILURE
        }
    }
}

/// A binary between start-up and drain: logs and traces installed, signal handlers set, a metrics
/// registry to fill. [`serve`](Self::serve) runs the controllers and drains in order.
#[derive(Debug)]
pub struct Binary {
    name: &'static str,
    common: CommonArgs,
    telemetry: TelemetryGuard,
    shutdown: Shutdown,
    registry: Registry,
}

impl Binary {
    /// Installs logging/tracing for `name` and the SIGTERM/SIGINT handlers. Call inside Tokio.
    pub fn start(name: &'static str, common: &CommonArgs) -> Result<Self, RuntimeError> {
        let telemetry = telemetry::init(name, common)?;
        let shutdown = Shutdown::on_signals()?;
        Ok(Self {
            name,
            common: common.clone(),
            telemetry,
            shutdown,
            registry: Registry::default(),
        })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The Kubernetes client, with this binary's User-Agent and request spans.
    pub async fn kube_client(&self) -> Result<kube::Client, RuntimeError> {
        self.common.kube_client_for(self.name).await
    }

    /// Where the binary registers its metrics before [`serve`](Self::serve).
    pub fn registry(&mut self) -> &mut Registry {
        &mut self.registry
    }

    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    /// Starts the admin server and leader election ([`Service::start`]), runs the future
    /// `controllers` builds from the started service until shutdown, drains in the documented
    /// order and flushes traces. `client` is needed only with `--leader-elect` (built when `None`).
    pub async fn serve<F, Fut>(
        self,
        client: Option<kube::Client>,
        controllers: F,
    ) -> Result<Fut::Output, RuntimeError>
    where
        F: FnOnce(&Service) -> Fut,
        Fut: Future,
    {
        let Self {
            name,
            common,
            telemetry,
            shutdown,
            registry,
        } = self;
        let service = Service::start(name, &common, registry, client, shutdown).await?;
        let controllers = controllers(&service);
        let output = service.run(controllers).await?;
        telemetry.shutdown().await;
        Ok(output)
    }
}

/// The object a reconcile is about: its kind, namespace (none when cluster-scoped) and name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    pub kind: &'a str,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
}

impl<'a> Target<'a> {
    pub fn new(kind: &'a str, namespace: Option<&'a str>, name: &'a str) -> Self {
        Self {
            kind,
            namespace,
            name,
        }
    }

    /// The target for a cached object of a static kind.
    pub fn of<K: Resource<DynamicType = ()>>(kind: &'a str, object: &'a K) -> Self {
        Self {
            kind,
            namespace: object.meta().namespace.as_deref(),
            name: object.meta().name.as_deref().unwrap_or_default(),
        }
    }

    fn backoff_key(&self) -> String {
        format!(
            "{}/{}/{}",
            self.kind,
            self.namespace.unwrap_or_default(),
            self.name
        )
    }
}

/// A reconcile error, as the kit needs to see it: a metric label and whether it only means the
/// cache was stale (a write conflict), which retries soon and without backoff.
pub trait ReconcileFailure: ErrorLabel + std::error::Error + 'static {
    /// By default: a 409 from the API server anywhere in the error's source chain, or the 422 of a
    /// JSON patch whose `test` op found the object changed.
    fn is_conflict(&self) -> bool
    where
        Self: Sized,
    {
        find_kube_error(self).is_some_and(|e| is_conflict(e) || is_failed_patch_test(e))
    }
}

impl ReconcileFailure for kube::Error {}

/// Retry timing of a controller's failed reconciles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// After a write conflict: the watch brings the newer object shortly.
    pub conflict: Duration,
    /// Any other failure: per-object exponential backoff.
    pub backoff: BackoffConfig,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            conflict: Duration::from_millis(200),
            backoff: BackoffConfig::default(),
        }
    }
}

/// Runs, measures and traces one controller's reconciles and decides their retries.
#[derive(Debug)]
pub struct Reconciler {
    metrics: ControllerMetrics,
    backoff: PerObjectBackoff<String>,
    conflict_retry: Duration,
}

impl Reconciler {
    pub fn new(metrics: ControllerMetrics, retry: RetryPolicy) -> Self {
        Self {
            metrics,
            backoff: PerObjectBackoff::new(retry.backoff),
            conflict_retry: retry.conflict,
        }
    }

    pub fn metrics(&self) -> &ControllerMetrics {
        &self.metrics
    }

    /// Runs `work`, the reconcile of `target`, inside a `reconcile` span with the trace id
    /// recorded (so its log lines carry it) and its outcome (`ok` or the error label); counts and
    /// times it; a success forgets the target's backoff.
    ///
    /// `work` is boxed before anything else: a reconcile's state machine is several KiB (gw-recycler's
    /// 8 KiB, machineclass's 17 KiB), and an `async fn` holding it by value lays it out once
    /// as its argument, once inside its own body and once in the `Instrumented` wrapper, a
    /// 25 KiB future that the caller and the runner then move (memcpy) several times
    /// per reconcile (perf: a quarter of gw-recycler's CPU under load). Boxed here, at the call,
    /// the future this returns is small and `work` is polled in place.
    pub fn reconcile<'a, T, E, Fut>(
        &'a self,
        target: Target<'a>,
        work: Fut,
    ) -> impl Future<Output = Result<T, E>> + 'a
    where
        Fut: Future<Output = Result<T, E>> + 'a,
        E: ErrorLabel,
    {
        let work = Box::pin(work);
        let span = tracing::info_span!(
            "reconcile",
            otel.name = %format!("reconcile {}", target.kind),
            controller = %self.metrics.controller(),
            object.kind = target.kind,
            object.namespace = target.namespace.unwrap_or_default(),
            object.name = target.name,
            outcome = tracing::field::Empty,
            error = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        );
        async move {
            telemetry::record_trace_id();
            let mut measure = self.metrics.measure(target.kind);
            let result = work.await;
            let current = tracing::Span::current();
            match &result {
                Ok(_) => {
                    self.backoff.reset(&target.backoff_key());
                    current.record("outcome", "ok");
                }
                Err(error) => {
                    measure.set_failure(error);
                    current.record("outcome", "error");
                    current.record("error", error.metric_label());
                    current.record("otel.status_code", "ERROR");
                }
            }
            result
        }
        .instrument(span)
    }

    /// How long to wait before retrying `target` after `error`: the conflict retry for a stale
    /// cache (logged at debug), else the next per-object backoff delay (logged at warn).
    pub fn retry_after<E: ReconcileFailure>(&self, target: Target<'_>, error: &E) -> Duration {
        if error.is_conflict() {
            tracing::debug!(
                kind = target.kind,
                namespace = target.namespace.unwrap_or_default(),
                name = target.name,
                %error,
                "stale cache, retrying soon"
            );
            return self.conflict_retry;
        }
        let delay = self.backoff.next_delay(&target.backoff_key());
        tracing::warn!(
            controller = %self.metrics.controller(),
            kind = target.kind,
            namespace = target.namespace.unwrap_or_default(),
            name = target.name,
            error = %error,
            label = error.metric_label(),
            retry_in = ?delay,
            "reconcile failed"
        );
        delay
    }

    /// The standard `error_policy` of a [`crate::runner::Runner`] for a cached object of a static
    /// kind: see [`retry_after`](Self::retry_after).
    pub fn next_after_error<K, E>(&self, object: &K, error: &E) -> crate::runner::Next
    where
        K: Resource<DynamicType = ()>,
        E: ReconcileFailure,
    {
        let kind = K::kind(&());
        crate::runner::Next::Requeue(self.retry_after(Target::of(&kind, object), error))
    }
}

/// When a [`crate::runner::Runner`] may run: until shutdown, reconciling everything again each
/// time work is allowed again or the caches finish syncing (reconciles park while either is
/// missing).
#[derive(Clone, Debug)]
pub struct Gates {
    /// `true` while this replica may write: its leadership ([`crate::leader::LeaderHandle::subscribe`]) or,
    /// sharded, its shard Lease ([`crate::sharding::ShardHandle::subscribe`]).
    pub work_allowed: watch::Receiver<bool>,
    pub caches_synced: watch::Receiver<bool>,
    pub shutdown: Shutdown,
}

impl Gates {
    /// Resolves when shutdown is requested before the caches synced, never otherwise: nothing
    /// can be in flight then (reconciles hold their writes until the caches are ready), so the
    /// binary stops at once, without waiting for the reflectors: `select!` this against the
    /// controllers.
    pub async fn shutdown_before_sync(&self) {
        self.shutdown.cancelled().await;
        if *self.caches_synced.borrow() {
            futures::future::pending::<()>().await;
        }
    }
}

/// Yields once each time the watched flag (leadership, caches synced) turns true.
pub fn turned_true(rx: watch::Receiver<bool>) -> impl Stream<Item = ()> + Send + Sync {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}

/// What a watched, cached kind must be: a static resource that decodes, clones and crosses
/// threads (kube-runtime's reflector and our `runner` ask the same).
pub trait Watched:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// The watch events of `api` with `config`; watch errors back off. Objects come without their
/// `managedFields`, never decoded ([`crate::lean`]): no controller decision reads them, and with a
/// few writers per object they are a large share of each object's decoding time and of each
/// cached object (peak RSS).
pub fn watch_events<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
) -> impl Stream<Item = Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>>
+ Send
+ use<K>
where
    K: Watched,
{
    use futures::TryStreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    watcher(crate::lean::lean_api(api), config)
        .default_backoff()
        .map_ok(crate::lean::unwrap_event)
}

/// A reflector over [`watch_events`] of `api` with `config`: the store, and the stream of touched
/// objects (applied or deleted) to hand to `Runner::for_stream` / `watches_stream`.
pub fn reflect<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
) -> (
    kube::runtime::reflector::Store<K>,
    impl Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + use<K>,
)
where
    K: Watched,
{
    let (store, writer) = kube::runtime::reflector::store();
    (
        store,
        reflect_observed(writer, api, config, keep_all, |_| {}),
    )
}

/// [`reflect`], with this process's own writes standing in for the cached objects until the
/// watch brings them back (see [`OwnWrites`]); `ttl` bounds a
/// stand-in's life.
pub fn reflect_own_writes<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
    ttl: Duration,
) -> (
    Arc<OwnWrites<K>>,
    impl Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + use<K>,
)
where
    K: Watched,
{
    reflect_own_writes_trimmed(api, config, ttl, keep_all)
}

/// [`reflect_own_writes`], caching each watched object, and each stand-in a write returns, as
/// `trim` leaves it: a controller that caches every object of a large kind keeps only the fields
/// its decisions read.
pub fn reflect_own_writes_trimmed<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
    ttl: Duration,
    trim: fn(&mut K),
) -> (
    Arc<OwnWrites<K>>,
    impl Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + use<K>,
)
where
    K: Watched,
{
    let (store, writer) = kube::runtime::reflector::store();
    let own = Arc::new(OwnWrites::trimmed(store, ttl, trim));
    let observer = own.clone();
    let stream = reflect_observed(writer, api, config, trim, move |event| {
        observer.observe(event)
    });
    (own, stream)
}

fn keep_all<K>(_: &mut K) {}

/// [`reflect`] into the store of `writer`, each object as `trim` leaves it, showing every watch
/// event to `observe` once the store has it (for example an [`OwnWrites`] over that store).
pub fn reflect_observed<K, F>(
    writer: kube::runtime::reflector::store::Writer<K>,
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
    trim: fn(&mut K),
    observe: F,
) -> impl Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + use<K, F>
where
    K: Watched,
    F: Fn(&kube::runtime::watcher::Event<K>) + Send + 'static,
{
    use kube::runtime::{WatchStreamExt, reflector};
    reflector::reflector(writer, watch_events(api, config).modify(trim))
        .inspect_ok(observe)
        .touched_objects()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Failure {
        #[error("writing status of {name}")]
        WriteStatus {
            name: String,
            #[source]
            source: kube::Error,
        },
        #[error("bad input")]
        Invalid,
    }

    impl ErrorLabel for Failure {
        fn metric_label(&self) -> &'static str {
            match self {
                Self::WriteStatus { .. } => "write_status",
                Self::Invalid => "invalid",
            }
        }
    }

    impl ReconcileFailure for Failure {}

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("message", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    fn reconciler() -> (Registry, Reconciler) {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::register(&mut registry, "test-controller");
        let retry = RetryPolicy {
            conflict: Duration::from_millis(200),
            backoff: BackoffConfig {
                base: Duration::from_secs(5),
                max: Duration::from_secs(20),
                factor: 2,
                jitter: false,
            },
        };
        (registry, Reconciler::new(metrics, retry))
    }

    #[tokio::test]
    async fn conflicts_retry_soon_other_failures_back_off_per_object_until_a_success() {
        let (_registry, reconciler) = reconciler();
        let a = Target::new("Machine", Some("default"), "a");
        let b = Target::new("Machine", Some("default"), "b");
        let conflict = Failure::WriteStatus {
            name: "a".into(),
            source: api(409),
        };
        assert_eq!(
            reconciler.retry_after(a, &conflict),
            Duration::from_millis(200)
        );
        let delays: Vec<_> = (0..4)
            .map(|_| reconciler.retry_after(a, &Failure::Invalid))
            .collect();
        assert_eq!(delays, [5, 10, 20, 20].map(Duration::from_secs));
        assert_eq!(
            reconciler.retry_after(b, &Failure::Invalid),
            Duration::from_secs(5),
            "b has its own backoff"
        );
        let ok: Result<(), Failure> = reconciler.reconcile(a, async { Ok(()) }).await;
        assert!(ok.is_ok());
        assert_eq!(
            reconciler.retry_after(a, &Failure::Invalid),
            Duration::from_secs(5),
            "a success starts the backoff over"
        );
    }

    #[tokio::test]
    async fn failures_are_counted_by_their_label() {
        let (registry, reconciler) = reconciler();
        let target = Target::new("Machine", Some("default"), "a");
        let failed: Result<(), Failure> = reconciler
            .reconcile(target, async { Err(Failure::Invalid) })
            .await;
        assert!(failed.is_err());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(
            text.contains(r#"capstan_controller_reconcile_failures_total{controller="test-controller",kind="Machine",error="invalid"} 1"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_shutdown_stops_at_once_only_before_the_caches_synced() {
        let shutdown = Shutdown::new();
        let (synced_tx, synced_rx) = watch::channel(false);
        let gates = Gates {
            work_allowed: crate::leader::LeaderHandle::always_leader(shutdown.clone()).subscribe(),
            caches_synced: synced_rx,
            shutdown: shutdown.clone(),
        };
        shutdown.trigger();
        gates.shutdown_before_sync().await;

        synced_tx.send(true).expect("receiver alive");
        let after_sync =
            tokio::time::timeout(Duration::from_millis(50), gates.shutdown_before_sync());
        assert!(
            after_sync.await.is_err(),
            "after the sync the controllers drain themselves"
        );
    }

    #[tokio::test]
    async fn exit_code_follows_the_outcome() {
        let ok = main_with("x", async { Ok::<(), String>(()) }).await;
        let failed = main_with("x", async { Err::<(), _>("boom".to_owned()) }).await;
        assert_eq!(format!("{ok:?}"), format!("{:?}", ExitCode::SUCCESS));
        assert_eq!(format!("{failed:?}"), format!("{:?}", ExitCode::FAILURE));
        let panicked = main_with("x", async {
            if true {
                panic!("a bug");
            }
            Ok::<(), String>(())
        })
        .await;
        assert_eq!(format!("{panicked:?}"), format!("{:?}", ExitCode::FAILURE));
    }
}
