//! Sidecar gRPC throughput and latency: `sidecar_shim::bench` measures each method at several
//! stream counts as a ratio to an empty handler served by the same tonic stack in the same run.

use std::time::Duration;

use anyhow::Result;
use sidecar_shim::bench::{BenchOptions, run as run_bench};

#[derive(clap::Args)]
pub struct Args {
    /// Measured seconds per case.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Concurrent streams, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
}

pub async fn run(args: &Args) -> Result<()> {
    let options = BenchOptions {
        duration: Duration::from_secs(args.seconds),
        concurrency: args.concurrency.clone(),
        ..BenchOptions::default()
    };
    let report = run_bench(options).await?;
    println!("{report}");
    Ok(())
}
