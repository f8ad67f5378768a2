//! `capstan-bench`: benchmarks run by `cargo xtask bench <target>` in release mode.
//!
//! Every figure that depends on the machine is reported as a ratio against a baseline measured in
//! the same process on the same kube-sim (the "floor"), so results compare across machines and
//! nothing here asserts a wall-clock time.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod cluster;
mod kube_sim;
mod machineclass;
mod nodeslo;
mod report;
mod sidecars;

#[derive(Parser)]
#[command(
    name = "capstan-bench",
    about = "Capstan benchmarks (ratios against an in-run baseline)"
)]
struct Cli {
    /// Folder holding the release binaries under test.
    #[arg(long, global = true, default_value = "target/release")]
    bin_dir: PathBuf,
    #[command(subcommand)]
    target: Target,
}

#[derive(Subcommand)]
enum Target {
    /// machineclass-controller: classes finalized and machines Running against a bare client, writes per machine, peak RSS.
    Machineclass(machineclass::Args),
    /// NodeSLO controller: convergence and config fan-out against a bare client, writes per node, peak RSS.
    Nodeslo(nodeslo::Args),
    /// kube-sim: creates/s, a list of 10,000 objects, watch fan-out under load, memory per object.
    KubeSim(kube_sim::Args),
    /// router-sidecar and gw-sidecar: requests/s and p50/p99 per method and stream count, as a ratio to an empty handler.
    Sidecars(sidecars::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.target {
            Target::Machineclass(args) => machineclass::run(&cli.bin_dir, &args).await,
            Target::Nodeslo(args) => nodeslo::run(&cli.bin_dir, &args).await,
            Target::Sidecars(args) => sidecars::run(&args).await,
            Target::KubeSim(args) => kube_sim::run(&args).await,
        }
    })
}
