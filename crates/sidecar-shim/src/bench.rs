//! Throughput and latency of the sidecars' hot calls, for `cargo xtask bench sidecars`.
//!
//! Each case runs one method at a given number of concurrent streams (tasks
//! issuing unary calls back to back over one HTTP/2 connection) against the real
//! service (memory or kernel backend) and against an empty handler on the same
//! tonic stack (metrics layer, health service) in the same run, so the report
//! shows the cost of the sidecar's own work as a ratio. Every loop is bounded in
//! time and count, and all traffic stays on 127.0.0.1.
//!
//! The kernel cases run in a throw-away network namespace (see [`BenchNetns`]):
//! `nsm0` at 10.1.1.1/24 holds the next hops, `tun0` is the tunnel. They need root
//! and `ip` (iproute2); without them the report says why they were skipped.
//! UpdateSliceGwConnectionContext alternates between two next-hop sets for one
//! remote subnet, so every call really replaces one kernel route and the table
//! never grows.

use std::fmt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_proto::router::slice_router_sidecar_service_server::SliceRouterSidecarService;
use capstan_proto::router::{self as rt, SliceGwConContext, VerifyRouteAddRequest};
use capstan_proto::sidecar::gw_sidecar_service_client::GwSidecarServiceClient;
use capstan_proto::sidecar::gw_sidecar_service_server::GwSidecarService;
use capstan_proto::sidecar::{self as gwp, GwPodStatus};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::backend::BackendError;
use crate::gw::kernel::KernelGw;
use crate::gw::memory::{MemoryGw, MemoryGwStatus, MemoryTunnel};
use crate::gw::{GwSidecar, PeerConfig, PodIdentity};
use crate::metrics::GrpcMetrics;
use crate::router::RouterSidecar;
use crate::router::kernel::KernelRouter;
use crate::router::memory::MemoryRouter;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Measured time per case (after the warm-up).
    pub duration: Duration,
    pub warmup: Duration,
    /// Concurrent streams per case.
    pub concurrency: Vec<usize>,
    /// Upper bound of calls per case, whatever the duration.
    pub max_requests: usize,
    /// Backends to measure, in this order.
    pub backends: Vec<Backend>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(3),
            warmup: Duration::from_millis(300),
            concurrency: vec![1, 16, 64],
            max_requests: 2_000_000,
            backends: Backend::ALL.to_vec(),
        }
    }
}

/// Which sidecar backend serves the measured calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// In-process route table and status.
    Memory,
    /// Netlink and tc in a throw-away network namespace.
    Kernel,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Memory, Backend::Kernel];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Kernel => "kernel",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "memory" => Ok(Backend::Memory),
            "kernel" => Ok(Backend::Kernel),
            other => Err(format!(
                "unknown backend {other:?} (expected memory or kernel)"
            )),
        }
    }
}

/// The measured methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    GetStatus,
    GetRouteInKernel,
    UpdateSliceGwConnectionContext,
}

impl Method {
    pub const ALL: [Method; 3] = [
        Method::GetStatus,
        Method::GetRouteInKernel,
        Method::UpdateSliceGwConnectionContext,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::GetStatus => "GetStatus",
            Method::GetRouteInKernel => "GetRouteInKernel",
            Method::UpdateSliceGwConnectionContext => "UpdateSliceGwConnectionContext",
        }
    }
}

/// Throughput and latency of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measurement {
    pub requests: usize,
    pub errors: usize,
    pub requests_per_sec: f64,
    pub p50: Duration,
    pub p99: Duration,
}

/// One method at one concurrency, against the sidecar and the empty handler.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseResult {
    pub backend: Backend,
    pub method: Method,
    pub concurrency: usize,
    pub sidecar: Measurement,
    pub empty: Measurement,
}

impl CaseResult {
    /// Sidecar throughput as a fraction of the empty handler's.
    pub fn throughput_ratio(&self) -> f64 {
        ratio(self.sidecar.requests_per_sec, self.empty.requests_per_sec)
    }

    pub fn p50_ratio(&self) -> f64 {
        ratio(self.sidecar.p50.as_secs_f64(), self.empty.p50.as_secs_f64())
    }

    pub fn p99_ratio(&self) -> f64 {
        ratio(self.sidecar.p99.as_secs_f64(), self.empty.p99.as_secs_f64())
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub options_duration: Duration,
    pub cases: Vec<CaseResult>,
    /// Backends that were asked for but could not run, with the reason.
    pub skipped: Vec<(Backend, String)>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "sidecar gRPC benchmark (127.0.0.1, {:?} per case; ratios are sidecar / empty handler)",
            self.options_duration
        )?;
        for (backend, reason) in &self.skipped {
            writeln!(f, "{} cases skipped: {reason}", backend.name())?;
        }
        writeln!(
            f,
            "{:<7} {:<32} {:>7} {:>11} {:>9} {:>9} {:>11} {:>9} {:>9} {:>7} {:>7} {:>7}",
            "backend",
            "method",
            "streams",
            "req/s",
            "p50",
            "p99",
            "empty req/s",
            "empty p50",
            "empty p99",
            "x req/s",
            "x p50",
            "x p99"
        )?;
        for case in &self.cases {
            writeln!(
                f,
                "{:<7} {:<32} {:>7} {:>11.0} {:>9} {:>9} {:>11.0} {:>9} {:>9} {:>7.2} {:>7.2} {:>7.2}",
                case.backend.name(),
                case.method.name(),
                case.concurrency,
                case.sidecar.requests_per_sec,
                micros(case.sidecar.p50),
                micros(case.sidecar.p99),
                case.empty.requests_per_sec,
                micros(case.empty.p50),
                micros(case.empty.p99),
                case.throughput_ratio(),
                case.p50_ratio(),
                case.p99_ratio(),
            )?;
            if case.sidecar.errors + case.empty.errors > 0 {
                writeln!(
                    f,
                    "  errors: sidecar {}, empty {}",
                    case.sidecar.errors, case.empty.errors
                )?;
            }
        }
        Ok(())
    }
}

fn micros(d: Duration) -> String {
    format!("{}us", d.as_micros())
}

/// Answers every call with an empty message: the baseline of the tonic stack.
#[derive(Clone, Copy, Debug, Default)]
struct EmptyHandler;

#[tonic::async_trait]
impl SliceRouterSidecarService for EmptyHandler {
    async fn update_slice_gw_connection_context(
        &self,
        _: Request<SliceGwConContext>,
    ) -> Result<Response<rt::SidecarResponse>, Status> {
        Ok(Response::new(rt::SidecarResponse::default()))
    }
    async fn get_slice_router_client_connection_info(
        &self,
        _: Request<()>,
    ) -> Result<Response<rt::ClientConnectionInfo>, Status> {
        Ok(Response::new(rt::ClientConnectionInfo::default()))
    }
    async fn get_route_in_kernel(
        &self,
        _: Request<VerifyRouteAddRequest>,
    ) -> Result<Response<rt::VerifyRouteAddResponse>, Status> {
        Ok(Response::new(rt::VerifyRouteAddResponse::default()))
    }
    async fn update_ecmp_routes(
        &self,
        _: Request<rt::EcmpUpdateInfo>,
    ) -> Result<Response<rt::SidecarResponse>, Status> {
        Ok(Response::new(rt::SidecarResponse::default()))
    }
}

#[tonic::async_trait]
impl GwSidecarService for EmptyHandler {
    async fn get_status(&self, _: Request<()>) -> Result<Response<GwPodStatus>, Status> {
        Ok(Response::new(GwPodStatus::default()))
    }
    async fn get_slice_gw_remote_pod_name(
        &self,
        _: Request<gwp::RemoteGwVpnIp>,
    ) -> Result<Response<GwPodStatus>, Status> {
        Ok(Response::new(GwPodStatus::default()))
    }
    async fn update_connection_context(
        &self,
        _: Request<gwp::SliceGwConnectionContext>,
    ) -> Result<Response<gwp::SidecarResponse>, Status> {
        Ok(Response::new(gwp::SidecarResponse::default()))
    }
    async fn update_slice_qos_profile(
        &self,
        _: Request<gwp::SliceQosProfile>,
    ) -> Result<Response<gwp::SidecarResponse>, Status> {
        Ok(Response::new(gwp::SidecarResponse::default()))
    }
}

/// A server on 127.0.0.1:0, stopped when dropped.
struct BenchServer {
    channel: Channel,
    _stop: oneshot::Sender<()>,
}

async fn start<S>(service: S) -> std::io::Result<BenchServer>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let metrics = GrpcMetrics::register(&mut Registry::default());
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        if let Err(error) = crate::server::serve(listener, service, metrics, None, shutdown).await {
            tracing::error!(%error, "bench server failed");
        }
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(std::io::Error::other)?
        .connect()
        .await
        .map_err(std::io::Error::other)?;
    Ok(BenchServer {
        channel,
        _stop: stop,
    })
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("starting a bench server: {0}")]
    Server(#[from] std::io::Error),
}

/// The sidecar servers of one backend, plus what must outlive them.
struct Sidecars {
    router: BenchServer,
    gw: BenchServer,
    /// Deleted after the servers stop (fields drop in declaration order).
    _netns: Option<BenchNetns>,
}

fn gw_identity() -> PodIdentity {
    PodIdentity {
        node_ip: "192.0.2.10".into(),
        pod_ip: "10.244.1.7".into(),
        pod_name: "gw-bench-0".into(),
    }
}

async fn memory_sidecars() -> Result<Sidecars, BenchError> {
    let router_backend = Arc::new(MemoryRouter::default());
    let router = start(RouterSidecar::new(router_backend).into_server()).await?;
    let gw_backend = Arc::new(MemoryGw::new(MemoryGwStatus {
        nsm_ip: "10.1.1.1".into(),
        tunnel: Some(MemoryTunnel {
            net_interface: "tun0".into(),
            local_ip: "10.8.0.1".into(),
            peer_ip: "10.8.0.2".into(),
            ..MemoryTunnel::default()
        }),
    }));
    let gw = start(GwSidecar::new(gw_backend, gw_identity(), PeerConfig::default()).into_server())
        .await?;
    Ok(Sidecars {
        router,
        gw,
        _netns: None,
    })
}

/// Kernel sidecars in a fresh namespace, or why that is impossible here.
async fn kernel_sidecars() -> Result<Sidecars, String> {
    let netns = BenchNetns::create()?;
    let path = netns.path();
    let router_backend =
        KernelRouter::connect(Some(&path)).map_err(|e: BackendError| e.to_string())?;
    let gw_backend = KernelGw::connect(Some(&path), Duration::from_secs(1))
        .map_err(|e: BackendError| e.to_string())?;
    let router = start(RouterSidecar::new(Arc::new(router_backend)).into_server())
        .await
        .map_err(|e| e.to_string())?;
    let gw = start(
        GwSidecar::new(Arc::new(gw_backend), gw_identity(), PeerConfig::default()).into_server(),
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(Sidecars {
        router,
        gw,
        _netns: Some(netns),
    })
}

/// Runs every method at every concurrency in `options`, for each backend in it.
///
/// A kernel backend that cannot run (not root, no iproute2) is listed in
/// [`Report::skipped`] with the reason instead of failing the whole run.
pub async fn run(options: BenchOptions) -> Result<Report, BenchError> {
    let empty_router = start(capstan_proto::router::slice_router_sidecar_service_server::SliceRouterSidecarServiceServer::new(EmptyHandler)).await?;
    let empty_gw = start(
        capstan_proto::sidecar::gw_sidecar_service_server::GwSidecarServiceServer::new(
            EmptyHandler,
        ),
    )
    .await?;

    let mut cases = Vec::new();
    let mut skipped = Vec::new();
    for &backend in &options.backends {
        let sidecars = match backend {
            Backend::Memory => memory_sidecars().await?,
            Backend::Kernel => match kernel_sidecars().await {
                Ok(sidecars) => sidecars,
                Err(reason) => {
                    tracing::warn!(%reason, "kernel cases skipped");
                    skipped.push((backend, reason));
                    continue;
                }
            },
        };

        // GetRouteInKernel asks about a route that exists.
        let mut setup = SliceRouterSidecarServiceClient::new(sidecars.router.channel.clone());
        if let Err(status) = setup.update_slice_gw_connection_context(context(0)).await {
            tracing::warn!(%status, backend = backend.name(), "bench setup failed");
        }

        for method in Method::ALL {
            for &concurrency in &options.concurrency {
                let (real, empty) = match method {
                    Method::GetStatus => (&sidecars.gw, &empty_gw),
                    Method::GetRouteInKernel | Method::UpdateSliceGwConnectionContext => {
                        (&sidecars.router, &empty_router)
                    }
                };
                let sidecar = measure(method, concurrency, real.channel.clone(), &options).await;
                let empty = measure(method, concurrency, empty.channel.clone(), &options).await;
                cases.push(CaseResult {
                    backend,
                    method,
                    concurrency,
                    sidecar,
                    empty,
                });
            }
        }
    }
    Ok(Report {
        options_duration: options.duration,
        cases,
        skipped,
    })
}

/// A network namespace for the kernel cases, deleted on drop (also when the run fails).
#[derive(Debug)]
pub struct BenchNetns {
    name: String,
}

static NETNS_COUNTER: AtomicUsize = AtomicUsize::new(0);

impl BenchNetns {
    /// Creates the namespace with `lo`, `nsm0` (10.1.1.1/24, holding the next hops
    /// 10.1.1.2 and 10.1.1.3) and `tun0` (10.8.0.1 -> 10.8.0.2), all up.
    pub fn create() -> Result<Self, String> {
        if !is_root() {
            return Err("network namespaces need root".into());
        }
        let name = format!(
            "capstan-bench{}-{}",
            std::process::id(),
            NETNS_COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        run_ip(&["netns", "add", &name])?;
        // From here on, drop deletes the namespace whatever fails next.
        let netns = Self { name };
        netns.ip(&["link", "set", "lo", "up"])?;
        netns.ip(&[
            "link",
            "add",
            "nsm0",
            "type",
            "veth",
            "peer",
            "name",
            "nsm0-peer",
        ])?;
        netns.ip(&["addr", "add", "10.1.1.1/24", "dev", "nsm0"])?;
        netns.ip(&["link", "set", "nsm0", "up"])?;
        netns.ip(&["link", "set", "nsm0-peer", "up"])?;
        netns.ip(&["tuntap", "add", "dev", "tun0", "mode", "tun"])?;
        netns.ip(&["addr", "add", "10.8.0.1", "peer", "10.8.0.2", "dev", "tun0"])?;
        netns.ip(&["link", "set", "tun0", "up"])?;
        Ok(netns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    fn ip(&self, args: &[&str]) -> Result<(), String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run_ip(&full)
    }
}

impl Drop for BenchNetns {
    fn drop(&mut self) {
        if let Err(error) = run_ip(&["netns", "del", &self.name]) {
            tracing::warn!(%error, netns = %self.name, "deleting the bench namespace failed");
        }
    }
}

fn run_ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|error| format!("cannot run `ip` (iproute2): {error}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Effective uid 0, read from procfs (no libc call needed).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("Uid:"))
                .and_then(|line| line.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Alternating next-hop sets, so that every update really replaces the route.
fn context(i: usize) -> SliceGwConContext {
    let hops = if i.is_multiple_of(2) {
        vec!["10.1.1.2".to_owned(), "10.1.1.3".to_owned()]
    } else {
        vec!["10.1.1.2".to_owned()]
    };
    SliceGwConContext {
        remote_slice_gw_nsm_subnet: "10.2.0.0/16".into(),
        local_nsm_gw_peer_ip_list: hops,
        ..Default::default()
    }
}

async fn one_call(method: Method, channel: &Channel, i: usize) -> Result<(), Status> {
    match method {
        Method::GetStatus => {
            GwSidecarServiceClient::new(channel.clone())
                .get_status(())
                .await?;
        }
        Method::GetRouteInKernel => {
            let request = VerifyRouteAddRequest {
                dst_ip: "10.2.0.0/16".into(),
                nsm_ip: "10.1.1.2".into(),
            };
            SliceRouterSidecarServiceClient::new(channel.clone())
                .get_route_in_kernel(request)
                .await?;
        }
        Method::UpdateSliceGwConnectionContext => {
            SliceRouterSidecarServiceClient::new(channel.clone())
                .update_slice_gw_connection_context(context(i))
                .await?;
        }
    }
    Ok(())
}

async fn measure(
    method: Method,
    concurrency: usize,
    channel: Channel,
    options: &BenchOptions,
) -> Measurement {
    let concurrency = concurrency.max(1);
    // Warm-up: connections, allocator, caches.
    let warmup_end = Instant::now() + options.warmup;
    let mut i = 0;
    while Instant::now() < warmup_end && i < options.max_requests {
        let _ = one_call(method, &channel, i).await;
        i += 1;
    }

    let per_worker = options.max_requests.div_ceil(concurrency);
    let start = Instant::now();
    let end = start + options.duration;
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..concurrency {
        let channel = channel.clone();
        workers.spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0;
            let mut n = 0;
            while n < per_worker && Instant::now() < end {
                let started = Instant::now();
                if one_call(method, &channel, worker + n).await.is_err() {
                    errors += 1;
                }
                latencies.push(started.elapsed());
                n += 1;
            }
            (latencies, errors)
        });
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    while let Some(joined) = workers.join_next().await {
        if let Ok((mut worker_latencies, worker_errors)) = joined {
            latencies.append(&mut worker_latencies);
            errors += worker_errors;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let requests = latencies.len();
    Measurement {
        requests,
        errors,
        requests_per_sec: if elapsed > 0.0 {
            requests as f64 / elapsed
        } else {
            0.0
        },
        p50: percentile(&latencies, 50),
        p99: percentile(&latencies, 99),
    }
}

/// The `pct`-th percentile of sorted samples (nearest rank).
fn percentile(sorted: &[Duration], pct: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (pct * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50), Duration::from_millis(50));
        assert_eq!(percentile(&samples, 99), Duration::from_millis(99));
        assert_eq!(percentile(&samples[..1], 99), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }

    #[test]
    fn backends_parse_from_their_names() {
        for backend in Backend::ALL {
            assert_eq!(backend.name().parse::<Backend>(), Ok(backend));
        }
        assert!("tc".parse::<Backend>().is_err());
    }

    /// Memory cases always; kernel cases when this process may create a namespace
    /// (root), otherwise the report must say why they were skipped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_run_reports_every_case() {
        let options = BenchOptions {
            duration: Duration::from_millis(100),
            warmup: Duration::from_millis(10),
            concurrency: vec![1, 4],
            max_requests: 500,
            backends: Backend::ALL.to_vec(),
        };
        let kernel_ran =
            capstan_testkit::require("root, for the kernel cases", capstan_testkit::root());
        let report = run(options).await.expect("bench runs");
        let text = report.to_string();
        println!("{text}");
        let kernel_ran = if kernel_ran {
            assert!(report.skipped.is_empty(), "{text}");
            true
        } else {
            assert_eq!(report.skipped.len(), 1, "{text}");
            assert_eq!(report.skipped[0].0, Backend::Kernel);
            assert!(text.contains("kernel cases skipped: "), "{text}");
            false
        };
        for backend in Backend::ALL {
            let count = report
                .cases
                .iter()
                .filter(|case| case.backend == backend)
                .count();
            let expected = if backend == Backend::Kernel && !kernel_ran {
                0
            } else {
                6
            };
            assert_eq!(count, expected, "{backend:?}: {text}");
        }
        for case in &report.cases {
            assert!(
                case.sidecar.requests > 0 && case.empty.requests > 0,
                "{case:?}"
            );
            assert!(case.sidecar.requests <= 500, "bounded by max_requests");
            assert_eq!(case.sidecar.errors + case.empty.errors, 0, "{case:?}");
            assert!(case.sidecar.p50 <= case.sidecar.p99);
            assert!(case.throughput_ratio() > 0.0, "{case:?}");
            assert!(case.p50_ratio() > 0.0, "{case:?}");
        }
        for method in Method::ALL {
            assert!(text.contains(method.name()), "{text}");
        }
    }

    /// The kernel cases leave nothing behind: the namespace is gone after drop.
    #[test]
    fn the_bench_namespace_is_deleted_on_drop() {
        let need = "root, to create a network namespace";
        if !capstan_testkit::require(need, capstan_testkit::root()) {
            return;
        }
        let netns = match BenchNetns::create() {
            Ok(netns) => netns,
            Err(reason) => return capstan_testkit::skip_or_fail("network namespaces", reason),
        };
        let path = netns.path();
        assert!(path.exists(), "{} exists while in use", path.display());
        let links = Command::new("ip")
            .args(["-n", netns.name(), "-br", "addr"])
            .output()
            .expect("run ip");
        let links = String::from_utf8_lossy(&links.stdout);
        assert!(
            links.contains("nsm0") && links.contains("10.1.1.1/24"),
            "{links}"
        );
        assert!(links.contains("tun0"), "{links}");
        drop(netns);
        assert!(!path.exists(), "{} deleted on drop", path.display());
    }
}
