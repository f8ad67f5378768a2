//! `cargo xtask bench <target> [ARGS]`: builds the benchmark harness and the binaries under test in
//! release mode, then runs `capstan-bench <target>`, which prints ratios against a baseline
//! measured in the same run.

use std::process::Command;

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
pub struct Args {
    /// What to measure: `nodeslo`, `kube-sim` or `sidecars` (see `capstan-bench --help`).
    target: String,
    /// Passed on to the benchmark, e.g. `-- --nodes 2000`.
    #[arg(last = true)]
    rest: Vec<String>,
}

/// The release binaries each benchmark spawns, besides the harness itself.
fn binaries_for(target: &str) -> &'static [&'static str] {
    match target {
        "nodeslo" => &["nodeslo-controller"],
        "machineclass" => &["machineclass-controller"],
        _ => &[],
    }
}

pub fn run(args: &Args) -> Result<()> {
    // `--bin` names binaries across the whole workspace.
    let mut build = vec!["build", "--release", "--bin", "capstan-bench"];
    for bin in binaries_for(&args.target) {
        build.extend(["--bin", bin]);
    }
    crate::ci::cargo(&build)?;
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"));
    let release = target_dir.join("release");
    let status = Command::new(release.join("capstan-bench"))
        .arg("--bin-dir")
        .arg(&release)
        .arg(&args.target)
        .args(&args.rest)
        .status()
        .context("running capstan-bench")?;
    if !status.success() {
        bail!("capstan-bench {} exited with {status}", args.target);
    }
    Ok(())
}
