//! Sidecar gRPC throughput and latency: each method at several stream counts against the real
//! router and gw sidecars (memory or kernel backend) and, in the same run, against an empty
//! handler on the same tonic stack, so the table shows the sidecar's own cost as a ratio.
//!
//! Only successful calls count as throughput; failed calls get their own row per backend (target
//! 0). The kernel cases run in a throw-away network namespace (`netns`) and need root: without
//! it they are skipped with the reason in the table; with it, a setup that fails fails the bench.

mod load;
mod netns;
mod servers;

use std::fmt;
use std::time::Duration;

use anyhow::{Context, Result};
use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;

use crate::report::{Report, Row};
use load::{Bounds, Measurement, Method, measure};
use servers::{EmptyServers, Sidecars};

#[derive(clap::Args)]
pub struct Args {
    /// Measured seconds per case and side (fractions allowed), split over `--rounds`.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Rounds per case, the sidecar and the empty handler taking turns (each side's median
    /// counts): one 3 s run of each, back to back, saw the empty handler's own rate move by
    /// half from case to case, so a single run's ratio said as much about the host as the
    /// sidecar.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Concurrent streams, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
    /// Backends to measure, comma-separated (`memory`, `kernel`). The kernel cases need
    /// root: they run in a throw-away network namespace, and are skipped (with the
    /// reason in the table) without it.
    #[arg(long, value_delimiter = ',', default_value = "memory,kernel")]
    backends: Vec<Backend>,
    /// Upper bound of calls per case, whatever the duration.
    #[arg(long, default_value_t = 2_000_000)]
    max_requests: usize,
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

/// One method at one concurrency, against the sidecar and the empty handler.
#[derive(Debug, Clone, PartialEq)]
struct CaseResult {
    backend: Backend,
    method: Method,
    concurrency: usize,
    sidecar: Measurement,
    empty: Measurement,
}

impl CaseResult {
    /// Sidecar throughput (successful calls) as a fraction of the empty handler's.
    fn throughput_ratio(&self) -> f64 {
        ratio(self.sidecar.requests_per_sec, self.empty.requests_per_sec)
    }

    fn p50_ratio(&self) -> f64 {
        ratio(self.sidecar.p50.as_secs_f64(), self.empty.p50.as_secs_f64())
    }

    fn p99_ratio(&self) -> f64 {
        ratio(self.sidecar.p99.as_secs_f64(), self.empty.p99.as_secs_f64())
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

/// Everything one run measured.
struct Measured {
    /// Measured time per case and side, over `rounds` turns.
    duration: Duration,
    rounds: u32,
    cases: Vec<CaseResult>,
    /// Backends that were asked for but cannot run on this machine, with the reason.
    skipped: Vec<(Backend, String)>,
}

/// Runs every method at every concurrency for each backend asked for.
async fn measure_all(args: &Args) -> Result<Measured> {
    let round = args.seconds / f64::from(args.rounds);
    let bounds = Bounds {
        duration: Duration::from_secs_f64(round),
        warmup: Duration::from_millis(300).min(Duration::from_secs_f64(round / 4.0)),
        max_requests: args.max_requests / args.rounds as usize,
    };
    let empty = EmptyServers::start().await?;
    let mut cases = Vec::new();
    let mut skipped = Vec::new();
    for &backend in &args.backends {
        let sidecars = match backend {
            Backend::Memory => Sidecars::memory().await?,
            Backend::Kernel => {
                // Missing root is this machine's limit (a loud skip, a failure where every
                // test is required); anything failing past it is the bench's failure.
                if let Err(reason) = capstan_testkit::root() {
                    if capstan_testkit::require::require_all() {
                        anyhow::bail!("the kernel cases need root: {reason}");
                    }
                    tracing::warn!(%reason, "kernel cases skipped");
                    skipped.push((backend, reason));
                    continue;
                }
                Sidecars::kernel().await.context("kernel backend setup")?
            }
        };
        // GetRouteInKernel asks about a route that exists: the first context installs it.
        SliceRouterSidecarServiceClient::new(sidecars.router.channel.clone())
            .update_slice_gw_connection_context(load::context(0))
            .await
            .with_context(|| format!("{} backend setup: installing the route", backend.name()))?;

        for method in Method::ALL {
            let (real, floor) = match method {
                Method::GetStatus => (&sidecars.gw, &empty.gw),
                Method::GetRouteInKernel | Method::UpdateSliceGwConnectionContext => {
                    (&sidecars.router, &empty.router)
                }
            };
            for &concurrency in &args.concurrency {
                eprintln!(
                    "sidecars: {} {} x{concurrency}",
                    backend.name(),
                    method.name()
                );
                let (mut sidecar, mut empty) = (Vec::new(), Vec::new());
                for round in 0..args.rounds {
                    // Who goes first alternates, so neither side always follows the other.
                    let mut sides = [(real, &mut sidecar), (floor, &mut empty)];
                    if round % 2 == 1 {
                        sides.reverse();
                    }
                    for (server, rounds) in sides {
                        rounds.push(
                            measure(method, concurrency, server.channel.clone(), bounds).await,
                        );
                    }
                }
                cases.push(CaseResult {
                    backend,
                    method,
                    concurrency,
                    sidecar: Measurement::median_of(&sidecar),
                    empty: Measurement::median_of(&empty),
                });
            }
        }
    }
    Ok(Measured {
        duration: Duration::from_secs_f64(args.seconds),
        rounds: args.rounds,
        cases,
        skipped,
    })
}

pub async fn run(args: &Args) -> Result<Report> {
    let measured = measure_all(args).await?;
    eprintln!("{measured}");
    let mut report = Report::new("sidecars");
    for (backend, reason) in &measured.skipped {
        report.rows.push(Row {
            figure: format!("{} cases run", backend.name()),
            value: 0.0,
            unit: "cases".to_string(),
            floor: None,
            ratio: None,
            target: None,
            met: None,
            note: format!("skipped: {reason}"),
        });
    }
    for case in &measured.cases {
        // The targets: kernel >= 0.5x and memory >= 0.8x the empty handler's rate at 16
        // and more streams.
        let bound = match case.backend {
            Backend::Memory => 0.8,
            Backend::Kernel => 0.5,
        };
        let target = (case.concurrency >= 16).then_some(bound);
        let ratio = case.throughput_ratio();
        report.rows.push(Row {
            figure: format!(
                "{} {} x{} req/s",
                case.backend.name(),
                case.method.name(),
                case.concurrency
            ),
            value: case.sidecar.requests_per_sec,
            unit: "req/s".to_string(),
            floor: Some(case.empty.requests_per_sec),
            ratio: Some(ratio),
            target: target.map(|t| format!(">= {t}x")),
            met: target.map(|t| ratio >= t),
            note: format!(
                "successful calls only; p50 {:.2?} ({:.2}x), p99 {:.2?} ({:.2}x), {} failed",
                case.sidecar.p50,
                case.p50_ratio(),
                case.sidecar.p99,
                case.p99_ratio(),
                case.sidecar.failed
            ),
        });
    }
    report.rows.extend(failed_rows(&measured.cases));
    Ok(report)
}

/// One row per backend: calls that failed over all its cases (target 0), the empty handler's as
/// the floor, and the first error seen.
fn failed_rows(cases: &[CaseResult]) -> Vec<Row> {
    let mut backends: Vec<Backend> = cases.iter().map(|c| c.backend).collect();
    backends.dedup();
    backends
        .into_iter()
        .map(|backend| {
            let of_backend = || cases.iter().filter(move |c| c.backend == backend);
            let failed: usize = of_backend().map(|c| c.sidecar.failed).sum();
            let empty_failed: usize = of_backend().map(|c| c.empty.failed).sum();
            let first_error = of_backend()
                .find_map(|c| {
                    let error = c
                        .sidecar
                        .first_error
                        .as_ref()
                        .or(c.empty.first_error.as_ref());
                    error.map(|e| format!("{} x{}: {e}", c.method.name(), c.concurrency))
                })
                .unwrap_or_default();
            Row {
                figure: format!("{} failed calls", backend.name()),
                value: failed as f64,
                unit: "calls".to_string(),
                floor: Some(empty_failed as f64),
                ratio: None,
                target: Some("= 0".to_string()),
                met: Some(failed == 0 && empty_failed == 0),
                note: first_error,
            }
        })
        .collect()
}

impl fmt::Display for Measured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "sidecar gRPC benchmark (127.0.0.1, {:?} per case and side in {} alternating rounds, \
             medians; ratios are sidecar / empty handler; req/s and latencies of successful calls \
             only)",
            self.duration, self.rounds
        )?;
        for (backend, reason) in &self.skipped {
            writeln!(f, "{} cases skipped: {reason}", backend.name())?;
        }
        writeln!(
            f,
            "{:<7} {:<32} {:>7} {:>11} {:>9} {:>9} {:>11} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7}",
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
            "x p99",
            "failed"
        )?;
        for case in &self.cases {
            writeln!(
                f,
                "{:<7} {:<32} {:>7} {:>11.0} {:>9} {:>9} {:>11.0} {:>9} {:>9} {:>7.2} {:>7.2} {:>7.2} {:>7}",
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
                case.sidecar.failed + case.empty.failed,
            )?;
        }
        Ok(())
    }
}

fn micros(d: Duration) -> String {
    format!("{}us", d.as_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_from_their_names() {
        for backend in [Backend::Memory, Backend::Kernel] {
            assert_eq!(backend.name().parse::<Backend>(), Ok(backend));
        }
        assert!("tc".parse::<Backend>().is_err());
    }

    fn args(backends: &[Backend]) -> Args {
        Args {
            seconds: 0.1,
            rounds: 2,
            concurrency: vec![1, 4],
            backends: backends.to_vec(),
            max_requests: 500,
        }
    }

    /// Every case of every backend, with both sides answering; the kernel cases when this
    /// process may create a namespace (root), otherwise the report says why they were skipped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_run_reports_every_case_and_no_failed_calls() {
        let kernel =
            capstan_testkit::require("root, for the kernel cases", capstan_testkit::root());
        let measured = measure_all(&args(&[Backend::Memory, Backend::Kernel]))
            .await
            .expect("bench runs");
        let text = measured.to_string();
        assert_eq!(measured.skipped.len(), usize::from(!kernel), "{text}");
        assert_eq!(measured.cases.len(), if kernel { 12 } else { 6 }, "{text}");
        for case in &measured.cases {
            assert!(case.sidecar.ok > 0 && case.empty.ok > 0, "{case:?}");
            assert!(
                case.sidecar.ok <= 500,
                "bounded by max_requests over all rounds"
            );
            assert_eq!(case.sidecar.failed + case.empty.failed, 0, "{case:?}");
            assert!(case.sidecar.p50 <= case.sidecar.p99);
            assert!(case.throughput_ratio() > 0.0, "{case:?}");
        }
        let rows = failed_rows(&measured.cases);
        assert_eq!(rows.len(), if kernel { 2 } else { 1 });
        assert!(rows.iter().all(|r| r.value == 0.0 && r.met == Some(true)));
    }

    /// A call the server cannot answer (a gw method on the router's server: Unimplemented)
    /// is counted as failed and adds nothing to throughput or latency.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_calls_are_counted_apart_from_throughput() {
        let empty = EmptyServers::start().await.expect("servers");
        let bounds = Bounds {
            duration: Duration::from_millis(100),
            warmup: Duration::ZERO,
            max_requests: 200,
        };
        let m = measure(Method::GetStatus, 2, empty.router.channel.clone(), bounds).await;
        assert_eq!(m.ok, 0, "{m:?}");
        assert!(m.failed > 0, "{m:?}");
        assert_eq!(m.requests_per_sec, 0.0);
        assert_eq!(m.p99, Duration::ZERO);
        let error = m.first_error.clone().expect("first error");
        assert!(error.contains("Unimplemented"), "{error}");

        let case = CaseResult {
            backend: Backend::Memory,
            method: Method::GetStatus,
            concurrency: 2,
            sidecar: m,
            empty: measure(Method::GetStatus, 2, empty.gw.channel.clone(), bounds).await,
        };
        let rows = failed_rows(std::slice::from_ref(&case));
        assert_eq!(rows[0].figure, "memory failed calls");
        assert_eq!(rows[0].value, case.sidecar.failed as f64);
        assert_eq!(rows[0].met, Some(false));
        assert!(rows[0].note.contains("Unimplemented"), "{}", rows[0].note);
    }
}
