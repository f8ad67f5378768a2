//! `cargo xtask ci`: the test command of README.md, run by `.ci/run`.
//!
//! Gates run cheapest first, so a formatting slip fails in seconds rather than after a build. The
//! main test run comes last, so that its summary closes the output (what CI reads).

use std::process::Command;

use anyhow::{Context, Result, bail};

pub fn run() -> Result<()> {
    step("rustfmt", || cargo(&["fmt", "--all", "--", "--check"]))?;
    step("CRDs in the chart match the Rust types", || {
        crate::crdgen::run(&crate::crdgen::Args::check_chart())
    })?;
    step("Helm chart lint (Helm's library)", || {
        crate::chart::run(&crate::chart::Args::ci())
    })?;
    step("clippy, warnings denied", || {
        cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ])
    })?;
    // nextest runs no doctests, so they have their own step.
    step("doctests", || {
        cargo(&["test", "--workspace", "--locked", "--doc"])
    })?;
    step("demo smoke run (the README's first command)", || {
        crate::demo::run(&crate::demo::Args::smoke())
    })?;
    step("test suite", test_suite)?;
    eprintln!("==> ci passed");
    Ok(())
}

/// nextest runs every test in its own process, in parallel, and prints the summary CI reads;
/// plain `cargo test` is the fallback on a machine without it.
fn test_suite() -> Result<()> {
    let has_nextest = Command::new(env!("CARGO"))
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if has_nextest {
        cargo(&[
            "nextest",
            "run",
            "--workspace",
            "--locked",
            "--no-fail-fast",
        ])
    } else {
        cargo(&["test", "--workspace", "--locked", "--no-fail-fast"])
    }
}

fn step(name: &str, gate: impl FnOnce() -> Result<()>) -> Result<()> {
    eprintln!("==> {name}");
    gate().with_context(|| format!("ci step failed: {name}"))
}

/// Runs cargo (the same toolchain that runs xtask) from the workspace root.
pub fn cargo(args: &[&str]) -> Result<()> {
    let status = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(crate::workspace_root())
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo {} exited with {status}", args.join(" "));
    }
    Ok(())
}
