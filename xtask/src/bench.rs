//! `cargo xtask bench [target] [--compare OLD.json [--against NEW.json]] [-- ARGS]`: builds the
//! benchmark harness and the binaries under test in release mode, then runs `capstan-bench`, which
//! prints one table of ratios against baselines measured in the same run and writes the results
//! (JSON, SVG) under `target/bench/`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
pub struct Args {
    /// What to measure: `nodeslo`, `sharding`, `machineclass`, `machineset`, `kube-sim`, `sidecars` or `recycler`; every suite when
    /// left out (see `capstan-bench --help`).
    target: Option<String>,
    /// A previous results file (target/bench/*.json): print the change per figure.
    #[arg(long)]
    compare: Option<PathBuf>,
    /// With `--compare`: compare against this results file instead of running anything.
    #[arg(long, requires = "compare")]
    against: Option<PathBuf>,
    /// Passed on to the benchmark, e.g. `-- --sizes 1000,10000,50000` or `all -- --tiny`.
    #[arg(last = true)]
    rest: Vec<String>,
}

/// The release binaries each benchmark spawns, besides the harness itself.
fn binaries_for(target: &str) -> &'static [&'static str] {
    match target {
        "nodeslo" | "sharding" => &["nodeslo-controller"],
        "machineclass" => &["machineclass-controller"],
        "machineset" => &["machineclass-controller", "machineset-controller"],
        // The sidecars are the containers the recycler suite's kube-sims run.
        "recycler" => &["gw-recycler", "gw-sidecar", "router-sidecar"],
        "all" => &[
            "nodeslo-controller",
            "machineclass-controller",
            "gw-recycler",
            "gw-sidecar",
            "router-sidecar",
        ],
        _ => &[],
    }
}

pub fn run(args: &Args) -> Result<()> {
    let target = args.target.as_deref().unwrap_or("all");
    // `--bin` names binaries across the whole workspace.
    let mut build = vec!["build", "--release", "--bin", "capstan-bench"];
    if args.against.is_none() {
        for bin in binaries_for(target) {
            build.extend(["--bin", bin]);
        }
    }
    crate::ci::cargo(&build)?;
    let target_dir = crate::target_dir()?;
    let release = target_dir.join("release");
    let mut bench = Command::new(release.join("capstan-bench"));
    bench
        .arg("--bin-dir")
        .arg(&release)
        .arg("--out-dir")
        .arg(target_dir.join("bench"));
    match (&args.compare, &args.against) {
        (Some(old), Some(new)) => {
            bench.arg("compare").arg(old).arg(new);
        }
        (old, _) => {
            if let Some(old) = old {
                bench.arg("--compare").arg(old);
            }
            bench.arg(target).args(&args.rest);
        }
    }
    let status = bench.status().context("running capstan-bench")?;
    if !status.success() {
        bail!("capstan-bench {target} exited with {status}");
    }
    Ok(())
}
