//! `cargo xtask chart`: the Helm chart's checks, with Helm's own library (helm-sdkpy, driven by
//! tests/helm/driver.py). `--lint-only` is the quick gate CI runs before the build; the full run adds
//! the chart scenarios of the `capstan-scenarios` crate (install, upgrade, schema, RBAC, the
//! sidecars' kernel credentials), which CI's test suite also runs.

use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

#[derive(clap::Args)]
pub struct Args {
    /// Only lint the chart (seconds); skip the install and RBAC scenarios against kube-sim.
    #[arg(long)]
    pub lint_only: bool,
}

impl Args {
    /// What CI runs as its own step (the scenarios run in the test suite).
    pub fn ci() -> Self {
        Self { lint_only: true }
    }
}

pub fn run(args: &Args) -> Result<()> {
    lint()?;
    if args.lint_only {
        return Ok(());
    }
    crate::ci::cargo(&[
        "test",
        "--locked",
        "-p",
        "capstan-scenarios",
        "--test",
        "chart_helm",
        "--test",
        "chart_rbac",
        "--test",
        "chart_sidecar_kernel",
        "--",
        "--test-threads=2",
    ])
}

/// `helm lint charts/capstan`: fails on any warning or error (an info, such as the missing icon,
/// is printed but passes).
fn lint() -> Result<()> {
    let root = crate::workspace_root();
    let out = Command::new("python3")
        .arg(root.join("tests/helm/driver.py"))
        .arg("lint")
        .arg(root.join("charts/capstan"))
        .output()
        .context("running python3 (is it installed? .ci/run installs helm-sdkpy)")?;
    if !out.status.success() {
        bail!(
            "helm lint could not run: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let result: Value = serde_json::from_slice(&out.stdout).context("helm lint output")?;
    let messages = result["Messages"].as_array().cloned().unwrap_or_default();
    for m in &messages {
        eprintln!(
            "helm lint: severity {} at {}: {}",
            m["Severity"], m["Path"], m["Err"]
        );
    }
    let serious = messages
        .iter()
        .filter(|m| m["Severity"].as_i64().unwrap_or(3) > 1)
        .count();
    if serious > 0 || !result["Errors"].is_null() {
        bail!("helm lint: {serious} warning(s) or error(s): {result}");
    }
    eprintln!("==> helm lint: clean");
    Ok(())
}
