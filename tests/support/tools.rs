//! Where things are (workspace root, built binaries) and what a scenario does when an external tool
//! it needs (buildah, Helm's library) cannot run here: fail under `CAPSTAN_REQUIRE_ALL_TESTS=1`
//! (CI sets it, so nothing is silently skipped there), else print a clear SKIPPED line.

use std::path::PathBuf;

/// The workspace root (this crate lives in `<root>/tests`).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// `charts/capstan` as an absolute path.
pub fn chart_dir() -> PathBuf {
    workspace_root().join("charts").join("capstan")
}

/// A workspace binary of the profile this test was built with, built first if it is missing
/// (`cargo test -p capstan-scenarios` alone does not build other packages' binaries).
pub fn binary(package: &str, name: &str) -> PathBuf {
    // The test executable is target/<profile>/deps/<test>-<hash>.
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps layout")
        .to_path_buf();
    let path = profile_dir.join(name);
    if !path.is_file() {
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", package, "--bin", name])
            .current_dir(workspace_root())
            .status()
            .expect("cargo runs");
        assert!(
            status.success(),
            "cargo build -p {package} --bin {name} failed"
        );
    }
    assert!(path.is_file(), "{} is not built", path.display());
    path
}

/// True when every test must run (CI): a missing tool is then a failure, not a skip.
pub fn all_tests_required() -> bool {
    std::env::var("CAPSTAN_REQUIRE_ALL_TESTS").is_ok_and(|v| v == "1")
}

/// Call when `tool` cannot run here; panics under CAPSTAN_REQUIRE_ALL_TESTS=1, else prints
/// `SKIPPED <test>: ...` and the caller returns.
pub fn skip_or_fail(test: &str, tool: &str, why: &str) {
    assert!(
        !all_tests_required(),
        "{test}: {tool} is required (CAPSTAN_REQUIRE_ALL_TESTS=1) but cannot run: {why}"
    );
    eprintln!("SKIPPED {test}: {tool} cannot run here ({why}); .ci/run installs it");
}

/// The kit's polling with context: `eventually(what, timeout, context, probe)`.
pub use capstan_testkit::eventually_with as eventually;
