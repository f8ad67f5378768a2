//! Sidecar gRPC throughput and latency: `sidecar_shim::bench` measures each method at several
//! stream counts as a ratio to an empty handler served by the same tonic stack in the same run.

use std::time::Duration;

use anyhow::Result;
use sidecar_shim::bench::{Backend, BenchOptions, run as run_bench};

use crate::report::{Report, Row};

#[derive(clap::Args)]
pub struct Args {
    /// Measured seconds per case (fractions allowed).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Concurrent streams, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
    /// Backends to measure, comma-separated (`memory`, `kernel`). The kernel cases need
    /// root: they run in a throw-away network namespace, and are skipped (with the
    /// reason printed) when it cannot be created.
    #[arg(long, value_delimiter = ',', default_value = "memory,kernel")]
    backends: Vec<Backend>,
}

pub async fn run(args: &Args) -> Result<Report> {
    let options = BenchOptions {
        duration: Duration::from_secs_f64(args.seconds),
        concurrency: args.concurrency.clone(),
        backends: args.backends.clone(),
        ..BenchOptions::default()
    };
    let measured = run_bench(options).await?;
    for (backend, reason) in &measured.skipped {
        eprintln!("{} cases skipped: {reason}", backend.name());
    }
    eprintln!("{measured}");
    let mut report = Report::new("sidecars");
    for case in &measured.cases {
        // The targets: kernel >= 0.5x and memory >= 0.8x the empty handler's rate at 16
        // and more streams.
        let bound = match case.backend {
            Backend::Memory => 0.8,
            _ => 0.5,
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
                "p50 {:.2?} ({:.2}x), p99 {:.2?} ({:.2}x), {} errors",
                case.sidecar.p50,
                case.p50_ratio(),
                case.sidecar.p99,
                case.p99_ratio(),
                case.sidecar.errors
            ),
        });
    }
    Ok(report)
}
