//! Where the workspace and its build output are. Every command finds build output through
//! [`target_dir`], so `CARGO_TARGET_DIR`, `build.target-dir` in a cargo config and `--target-dir`
//! in `CARGO_BUILD_TARGET_DIR` are honoured the way cargo itself honours them: cargo is asked.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}

/// Cargo's target directory for this workspace, as `cargo metadata` reports it (asked once).
pub fn target_dir() -> Result<PathBuf> {
    static TARGET: OnceLock<PathBuf> = OnceLock::new();
    if let Some(dir) = TARGET.get() {
        return Ok(dir.clone());
    }
    let dir = metadata_target_dir(&mut crate::ci::cargo_command(), &workspace_root())?;
    Ok(TARGET.get_or_init(|| dir).clone())
}

/// The `target_directory` that `cargo metadata`, run as `cargo` is configured, reports.
fn metadata_target_dir(cargo: &mut Command, root: &Path) -> Result<PathBuf> {
    let out = cargo
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    target_directory_of(&out.stdout)
}

fn target_directory_of(metadata: &[u8]) -> Result<PathBuf> {
    let metadata: serde_json::Value =
        serde_json::from_slice(metadata).context("cargo metadata output")?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("cargo metadata names no target_directory")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_dir_is_cargo_target_dir_when_set_and_the_workspace_target_otherwise() {
        let root = workspace_root();
        let custom = tempfile::tempdir().expect("temp dir");
        let mut cargo = crate::ci::cargo_command();
        cargo.env("CARGO_TARGET_DIR", custom.path());
        assert_eq!(
            metadata_target_dir(&mut cargo, &root).expect("cargo metadata"),
            custom.path()
        );

        let mut cargo = crate::ci::cargo_command();
        cargo.env_remove("CARGO_TARGET_DIR");
        cargo.env_remove("CARGO_BUILD_TARGET_DIR");
        assert_eq!(
            metadata_target_dir(&mut cargo, &root).expect("cargo metadata"),
            root.join("target")
        );
    }

    #[test]
    fn a_cargo_config_target_dir_is_honoured() {
        // A workspace of its own whose .cargo/config.toml moves the target directory.
        let ws = tempfile::tempdir().expect("temp dir");
        std::fs::write(
            ws.path().join("Cargo.toml"),
            "[package]\nname = \"probe\"\nversion = \"0.0.0\"\nedition = \"2021\"\n[lib]\npath = \"lib.rs\"\n",
        )
        .expect("write probe file");
        std::fs::write(ws.path().join("lib.rs"), "").expect("write lib.rs");
        std::fs::create_dir(ws.path().join(".cargo")).expect("mkdir .cargo");
        std::fs::write(
            ws.path().join(".cargo/config.toml"),
            "[build]\ntarget-dir = \"elsewhere\"\n",
        )
        .expect("write probe file");
        let mut cargo = crate::ci::cargo_command();
        cargo.env_remove("CARGO_TARGET_DIR");
        cargo.env_remove("CARGO_BUILD_TARGET_DIR");
        let dir = metadata_target_dir(&mut cargo, ws.path()).expect("cargo metadata");
        assert_eq!(
            dir.canonicalize().unwrap_or(dir.clone()),
            ws.path()
                .canonicalize()
                .expect("canonical temp dir")
                .join("elsewhere")
        );
    }
}
