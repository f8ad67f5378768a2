//! Sidecar gRPC throughput and latency: `sidecar_shim::bench` measures each method at several
//! stream counts as a ratio to an empty handler served by the same tonic stack in the same run.

use std::time::Duration;

use anyhow::Result;
use sidecar_shim::bench::{Backend, BenchOptions, run as run_bench};

#[derive(clap::Args)]
pub struct Args {
    /// Measured seconds per case.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Concurrent streams, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
    /// Backends to measure, comma-separated (`memory`, `kernel`). The kernel cases need
    /// root: they run in a throw-away network namespace, and are skipped (with the
    /// reason printed) when it cannot be created.
    #[arg(long, value_delimiter = ',', default_value = "memory,kernel")]
    backends: Vec<Backend>,
}

pub async fn run(args: &Args) -> Result<()> {
    let options = BenchOptions {
        duration: Duration::from_secs(args.seconds),
        concurrency: args.concurrency.clone(),
        backends: args.backends.clone(),
        ..BenchOptions::default()
    };
    let report = run_bench(options).await?;
    for (backend, reason) in &report.skipped {
        eprintln!("{} cases skipped: {reason}", backend.name());
    }
    println!("{report}");
    Ok(())
}
