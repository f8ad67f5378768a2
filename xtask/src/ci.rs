//! `cargo xtask ci`: the test command of README.md, run by `.ci/run`.
//!
//! Gates run cheapest first, so a formatting slip fails in seconds rather than after a build. The
//! main test run comes last, so that its summary closes the output (what CI reads). The demo smoke
//! run (`cargo xtask demo --smoke`, the README's first command) is a scenario of that run
//! (`tests/demo.rs`), so it is not a step of its own: it runs once.

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
    let ledger = skip_ledger()?;
    // A ledger left by an earlier run would report skips this run did not make.
    let _ = std::fs::remove_file(&ledger);
    let tests = step("test suite", test_suite);
    report_skips(&ledger);
    tests?;
    eprintln!("==> ci passed");
    Ok(())
}

/// Where the test binaries of this run record their skips (see `capstan_testkit::require`).
fn skip_ledger() -> Result<std::path::PathBuf> {
    Ok(capstan_testkit::require::ledger_in(
        &crate::target_dir()?.join("debug"),
    ))
}

/// Prints every skipped test after the test summary, where CI and a developer read. Under
/// `CAPSTAN_REQUIRE_ALL_TESTS=1` there are none: those tests failed instead.
fn report_skips(ledger: &std::path::Path) {
    let skips = std::fs::read_to_string(ledger).unwrap_or_default();
    let count = skips.lines().count();
    if count == 0 {
        eprintln!("==> no test skipped");
        return;
    }
    eprintln!(
        "==> {count} test(s) SKIPPED for a missing tool, privilege or service \
         (`{}=1` makes each a failure):",
        capstan_testkit::REQUIRE_ALL_ENV
    );
    eprint!("{skips}");
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

/// Runs cargo (the same toolchain that runs xtask) from the workspace root, in the environment
/// of the shell that ran `cargo xtask` (see [`set_by_cargo_run`]).
pub fn cargo(args: &[&str]) -> Result<()> {
    let status = cargo_command()
        .args(args)
        .current_dir(crate::workspace_root())
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo {} exited with {status}", args.join(" "));
    }
    Ok(())
}

/// A cargo command (the toolchain that runs xtask) without the variables `cargo run` set for
/// xtask itself.
pub fn cargo_command() -> Command {
    let mut command = Command::new(env!("CARGO"));
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            command.env_remove(name);
        }
    }
    command
}

/// The variables `cargo run` sets for the program it runs (xtask's package name, version,
/// manifest). A cargo started with them sees another environment than the one that built xtask,
/// and build scripts that watch them run again: ring's watches `CARGO_PKG_NAME`, so a fresh
/// clone's `cargo xtask demo` compiled ring, rustls, kube, tonic and our crates twice.
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || matches!(
            name,
            "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE"
        )
}

#[cfg(test)]
mod tests {
    use super::set_by_cargo_run;

    #[test]
    fn only_what_cargo_run_sets_for_xtask_is_dropped() {
        for name in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
        ] {
            assert!(set_by_cargo_run(name), "{name}");
        }
        // The user's own settings reach the inner cargo.
        for name in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "RUSTFLAGS",
        ] {
            assert!(!set_by_cargo_run(name), "{name}");
        }
    }
}
