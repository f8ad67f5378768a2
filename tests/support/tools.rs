//! Where things are for the scenarios: the workspace root, the chart, built binaries. (A tool a
//! scenario needs that cannot run here is the kit's loud skip: `capstan_testkit::skip_or_fail`.)

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
