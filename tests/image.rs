//! The container image `cargo xtask image` builds: an OCI archive tagged with the chart's
//! appVersion, configured to run as UID 65532, in which every Capstan binary starts (`--help`) as
//! that user, with nothing but its own files, the libraries it links and the `tc` the gw-sidecar's
//! kernel QoS runs.

use std::path::Path;
use std::process::{Command, Output};

use capstan_scenarios::tools::{binary, workspace_root};
use capstan_testkit::skip_or_fail;

/// (cargo package, binary) of everything the image carries.
const BINARIES: [(&str, &str); 8] = [
    ("machineclass-controller", "machineclass-controller"),
    ("machineset-controller", "machineset-controller"),
    ("nodeslo-controller", "nodeslo-controller"),
    ("gw-recycler", "gw-recycler"),
    ("sidecar-shim", "router-sidecar"),
    ("sidecar-shim", "gw-sidecar"),
    ("kube-sim", "kube-sim"),
    ("machine-driver", "machine-driver-sim"),
];
/// The dev-profile image's local name (`cargo xtask image --profile dev`).
const LOCAL_NAME: &str = "ghcr.io/capstan/capstan:0.1.0-dev";
/// The image's user (distroless "nonroot"), as the chart runs it.
const NON_ROOT: &str = "65532:65532";

fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Removes the working container even when an assertion fails.
struct WorkingContainer(String);

impl WorkingContainer {
    /// `buildah run` of `argv` in the container, as `user` (the image's own, root, when `None`).
    fn command(&self, user: Option<&str>, argv: &[&str]) -> Command {
        let mut cmd = Command::new("buildah");
        cmd.args(["run", "--isolation=chroot"]);
        if let Some(user) = user {
            cmd.args(["--user", user]);
        }
        cmd.arg(&self.0).arg("--").args(argv);
        cmd
    }
}

impl Drop for WorkingContainer {
    fn drop(&mut self) {
        let _ = Command::new("buildah").args(["rm", &self.0]).output();
    }
}

#[test]
fn every_binary_answers_help_inside_the_image_as_the_non_root_user() {
    match Command::new("buildah").args(["info"]).output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return skip_or_fail(
                "buildah",
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            );
        }
        Err(e) => return skip_or_fail("buildah", e.to_string()),
    }
    let root = workspace_root();
    // The dev-profile binaries this test run was built with (a release build takes ~10 min).
    let mut profile_dir = None;
    for (package, name) in BINARIES {
        profile_dir = binary(package, name).parent().map(Path::to_path_buf);
    }
    // Built as `CARGO_TARGET_DIR=<elsewhere> cargo xtask image` would: the binaries are read from,
    // and the archive written under, that directory (its `debug` is this run's profile dir).
    let target_dir = tempfile::tempdir().expect("temporary target dir");
    std::os::unix::fs::symlink(
        profile_dir.expect("a profile dir"),
        target_dir.path().join("debug"),
    )
    .expect("linking the profile dir");
    run(Command::new(binary("xtask", "xtask"))
        .args(["image", "--profile", "dev", "--no-build"])
        .env("CARGO_TARGET_DIR", target_dir.path())
        .current_dir(&root));
    let archive = target_dir.path().join("image/capstan-0.1.0-dev.oci.tar");
    assert!(
        archive.is_file(),
        "cargo xtask image did not write its archive under CARGO_TARGET_DIR ({})",
        archive.display()
    );

    let index = run(Command::new("tar")
        .arg("-xOf")
        .arg(&archive)
        .arg("index.json"));
    let index = String::from_utf8_lossy(&index.stdout);
    assert!(
        index.contains("\"org.opencontainers.image.ref.name\":\"ghcr.io/capstan/capstan:0.1.0\""),
        "the archive is not tagged with the chart's appVersion: {index}"
    );

    let user = run(Command::new("buildah").args([
        "inspect",
        "--type",
        "image",
        "--format",
        "{{.OCIv1.Config.User}}",
        LOCAL_NAME,
    ]));
    assert_eq!(String::from_utf8_lossy(&user.stdout).trim(), NON_ROOT);

    let container = run(Command::new("buildah").args(["from", "--pull-never", LOCAL_NAME]));
    let container = WorkingContainer(String::from_utf8_lossy(&container.stdout).trim().to_owned());
    for (_, binary) in BINARIES {
        let path = format!("/usr/local/bin/{binary}");
        let out = run(&mut container.command(Some(NON_ROOT), &[&path, "--help"]));
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains("Usage:") && help.contains(binary),
            "{binary} --help in the image printed: {help}"
        );
    }
    // The gw-sidecar's kernel backend runs `tc` by name for QoS (crates/sidecar-shim/src/gw/kernel.rs):
    // it must be on the image's PATH, start with the libraries the image carries, and read the
    // kernel's qdiscs as the backend does (`tc -j qdisc show dev IF`, JSON).
    let version = run(&mut container.command(Some(NON_ROOT), &["tc", "-V"]));
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.contains("tc utility, iproute2-"),
        "tc -V in the image printed: {version}"
    );
    let qdiscs = run(&mut container.command(None, &["tc", "-j", "qdisc", "show", "dev", "lo"]));
    let qdiscs: serde_json::Value = serde_json::from_slice(&qdiscs.stdout)
        .unwrap_or_else(|e| panic!("tc -j qdisc show in the image: {e}: {qdiscs:?}"));
    assert!(qdiscs.is_array(), "tc -j qdisc show printed {qdiscs}");
    // The image is the binaries, their libraries and /etc: no shell to exec into.
    let shell = container
        .command(None, &["/bin/sh", "-c", "true"])
        .output()
        .expect("buildah runs");
    assert!(
        !shell.status.success(),
        "the image unexpectedly has /bin/sh"
    );
    let _ = std::fs::remove_file(&archive);
}
