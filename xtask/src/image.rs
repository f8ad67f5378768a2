//! `cargo xtask image`: the container image the chart names, built without any registry.
//!
//! Compiles every Capstan binary, stages them with the shared libraries `ldd` reports, iproute2's
//! `tc` (the gw-sidecar's kernel backend shapes tunnels with it) and a passwd entry for the fixed
//! non-root user, builds `deploy/Containerfile` with buildah (`FROM scratch`)
//! and writes an OCI archive tagged `ghcr.io/capstan/capstan:<chart appVersion>` under target/.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The repository the chart's `image.repository` names.
pub const REPOSITORY: &str = "ghcr.io/capstan/capstan";
/// The UID/GID the image runs as (also the chart's `runAsUser`).
pub const UID: u32 = 65532;
/// Every binary the image carries: (cargo package, binary).
pub const BINARIES: &[(&str, &str)] = &[
    ("machineclass-controller", "machineclass-controller"),
    ("machineset-controller", "machineset-controller"),
    ("nodeslo-controller", "nodeslo-controller"),
    ("gw-recycler", "gw-recycler"),
    ("sidecar-shim", "router-sidecar"),
    ("sidecar-shim", "gw-sidecar"),
    ("kube-sim", "kube-sim"),
    ("machine-driver", "machine-driver-sim"),
];

/// A host program the image carries, with the licence file its package ships (its licence,
/// GPL-2.0, asks that the notice travel with the binary).
pub struct HostTool {
    pub name: &'static str,
    /// Where it lives in the image (and where Debian installs it).
    pub path: &'static str,
    pub copyright: &'static str,
}

/// `tc`: the gw-sidecar applies QoS by running it. netlink-packet-route has no TBF or HTB
/// options, and hand-encoding them would mean re-implementing tc's rate and burst arithmetic;
/// iproute2's own tool is what KubeSlice runs too. It and its libraries add about 3 MB.
pub const HOST_TOOLS: &[HostTool] = &[HostTool {
    name: "tc",
    path: "/usr/sbin/tc",
    copyright: "/usr/share/doc/iproute2/copyright",
}];

#[derive(clap::Args)]
pub struct Args {
    /// Cargo profile of the binaries. `release` is what ships; `dev` reuses the test build (a
    /// release build of every binary takes about ten minutes on a 2-core machine), which is what
    /// the image test uses: it checks the image's layout, not the compiler's optimisations.
    #[arg(long, default_value = "release")]
    pub profile: String,
    /// Where to write the OCI archive (default: target/image/capstan-<appVersion>[-<profile>].oci.tar).
    #[arg(long)]
    pub archive: Option<PathBuf>,
    /// Use the binaries already in target/<profile> instead of running cargo build (the image
    /// test: its harness built them with the workspace's features, which a `cargo build -p ...`
    /// of only these packages would not reuse).
    #[arg(long)]
    pub no_build: bool,
}

/// What one build produced.
pub struct Built {
    /// The image's name in buildah's local storage.
    pub local_name: String,
    pub archive: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    let built = build(args)?;
    eprintln!("==> image {} (local buildah storage)", built.local_name);
    eprintln!(
        "==> archive {} (tagged {REPOSITORY}:{})",
        built.archive.display(),
        app_version()?
    );
    Ok(())
}

pub fn build(args: &Args) -> Result<Built> {
    let root = crate::workspace_root();
    let version = app_version()?;
    let suffix = if args.profile == "release" {
        String::new()
    } else {
        format!("-{}", args.profile)
    };
    // A dev build gets its own local name so it never shadows the release image.
    let local_name = format!("{REPOSITORY}:{version}{suffix}");
    let target = crate::target_dir()?;
    let image_dir = target.join("image");
    let archive = args
        .archive
        .clone()
        .unwrap_or_else(|| image_dir.join(format!("capstan-{version}{suffix}.oci.tar")));

    if !args.no_build {
        compile(&args.profile)?;
    }
    let context = image_dir.join(format!("context{suffix}"));
    let bin_dir = target.join(profile_dir(&args.profile));
    stage(&context, &bin_dir)?;

    run_tool(
        Command::new("buildah")
            .args(["bud", "--quiet", "--layers=false", "--build-arg"])
            .arg(format!("VERSION={version}"))
            .arg("-f")
            .arg(root.join("deploy").join("Containerfile"))
            .args(["-t", &local_name])
            .arg(&context),
    )?;
    // The staged copy is only the build context: do not keep a second copy of every binary.
    fs::remove_dir_all(&context).with_context(|| format!("removing {}", context.display()))?;
    if let Some(parent) = archive.parent() {
        fs::create_dir_all(parent)?;
    }
    // buildah refuses to overwrite an archive.
    let _ = fs::remove_file(&archive);
    run_tool(
        Command::new("buildah")
            .args(["push", "--quiet", &local_name])
            .arg(format!(
                "oci-archive:{}:{REPOSITORY}:{version}",
                archive.display()
            )),
    )?;
    Ok(Built {
        local_name,
        archive,
    })
}

/// The chart's appVersion: the image tag the chart pulls by default.
pub fn app_version() -> Result<String> {
    let path = crate::workspace_root().join("charts/capstan/Chart.yaml");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
        .with_context(|| format!("{}: no appVersion", path.display()))
}

fn profile_dir(profile: &str) -> &str {
    match profile {
        "dev" | "test" => "debug",
        "bench" => "release",
        other => other,
    }
}

fn compile(profile: &str) -> Result<()> {
    let mut args = vec!["build", "--locked", "--profile", profile];
    for (package, binary) in BINARIES {
        args.extend(["-p", package, "--bin", binary]);
    }
    crate::ci::cargo(&args)
}

/// Lays out `<context>/rootfs`: binaries (debug info stripped: the image needs symbols for
/// backtraces, not DWARF), the [`HOST_TOOLS`] with their licence files, every library any of them
/// links at the path ldd resolved, /etc/passwd and group.
fn stage(context: &Path, bin_dir: &Path) -> Result<()> {
    let rootfs = context.join("rootfs");
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs).with_context(|| format!("clearing {}", rootfs.display()))?;
    }
    let target_bin = rootfs.join("usr/local/bin");
    fs::create_dir_all(&target_bin)?;
    let mut libraries = BTreeSet::new();
    for (_, binary) in BINARIES {
        let source = bin_dir.join(binary);
        if !source.is_file() {
            bail!("{} was not built", source.display());
        }
        let dest = target_bin.join(binary);
        fs::copy(&source, &dest).with_context(|| format!("copying {}", source.display()))?;
        run_tool(Command::new("strip").arg("--strip-debug").arg(&dest))?;
        libraries.extend(linked_libraries(&source)?);
    }
    for tool in HOST_TOOLS {
        let source = Path::new(tool.path);
        if !source.is_file() {
            bail!(
                "{} ({}) is not installed: the image needs it (apt-get install iproute2)",
                tool.path,
                tool.name
            );
        }
        for file in [tool.path, tool.copyright] {
            let dest = rootfs.join(file.trim_start_matches('/'));
            if let Some(parent) = dest.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::copy(file, &dest).with_context(|| format!("copying {file}"))?;
        }
        libraries.extend(linked_libraries(source)?);
    }
    for library in &libraries {
        let relative = library.strip_prefix("/").unwrap_or(library);
        let dest = rootfs.join(relative);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        // fs::copy follows symlinks: the image gets the file under the name the loader asks for.
        fs::copy(library, &dest).with_context(|| format!("copying {}", library.display()))?;
    }
    let etc = rootfs.join("etc");
    fs::create_dir_all(&etc)?;
    fs::write(
        etc.join("passwd"),
        format!("nonroot:x:{UID}:{UID}:nonroot:/nonexistent:/sbin/nologin\n"),
    )?;
    fs::write(etc.join("group"), format!("nonroot:x:{UID}:\n"))?;
    Ok(())
}

/// The absolute paths of the shared objects (the loader included) `ldd` resolves for `binary`.
fn linked_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    if !out.status.success() {
        bail!(
            "ldd {}: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&out.stdout)))
}

/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and `/lib64/ld-linux-x86-64.so.2 (0x...)`
/// name files; `linux-vdso.so.1 (0x...)` is provided by the kernel and has no path.
fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn run_tool(cmd: &mut Command) -> Result<()> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let status = cmd
        .status()
        .with_context(|| format!("running {program} (is it installed? .ci/run installs it)"))?;
    if !status.success() {
        bail!("{program} exited with {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_names_libraries_and_the_loader_but_not_the_vdso() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f09)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f09)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f09)\n";
        assert_eq!(
            parse_ldd(text),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn profiles_map_to_cargo_output_directories() {
        assert_eq!(profile_dir("dev"), "debug");
        assert_eq!(profile_dir("release"), "release");
        assert_eq!(profile_dir("bench"), "release");
    }
}
