//! The throw-away network namespace the kernel cases run in: `nsm0` holds the next hops, `tun0`
//! is the tunnel. Deleted on drop, so a failed run leaves nothing behind.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, bail};

/// A network namespace for the kernel cases, deleted on drop (also when the run fails).
#[derive(Debug)]
pub struct BenchNetns {
    name: String,
}

static NETNS_COUNTER: AtomicUsize = AtomicUsize::new(0);

impl BenchNetns {
    /// Creates the namespace with `lo`, `nsm0` (10.1.1.1/24, holding the next hops 10.1.1.2 and
    /// 10.1.1.3) and `tun0` (10.8.0.1 -> 10.8.0.2), all up. Needs root and `ip` (iproute2).
    pub fn create() -> Result<Self> {
        let name = format!(
            "capstan-bench{}-{}",
            std::process::id(),
            NETNS_COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        run_ip(&["netns", "add", &name])?;
        // From here on, drop deletes the namespace whatever fails next.
        let netns = Self { name };
        netns.ip(&["link", "set", "lo", "up"])?;
        netns.ip(&[
            "link",
            "add",
            "nsm0",
            "type",
            "veth",
            "peer",
            "name",
            "nsm0-peer",
        ])?;
        netns.ip(&["addr", "add", "10.1.1.1/24", "dev", "nsm0"])?;
        netns.ip(&["link", "set", "nsm0", "up"])?;
        netns.ip(&["link", "set", "nsm0-peer", "up"])?;
        netns.ip(&["tuntap", "add", "dev", "tun0", "mode", "tun"])?;
        netns.ip(&["addr", "add", "10.8.0.1", "peer", "10.8.0.2", "dev", "tun0"])?;
        netns.ip(&["link", "set", "tun0", "up"])?;
        Ok(netns)
    }

    #[cfg(test)]
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    fn ip(&self, args: &[&str]) -> Result<()> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run_ip(&full)
    }
}

impl Drop for BenchNetns {
    fn drop(&mut self) {
        if let Err(error) = run_ip(&["netns", "del", &self.name]) {
            tracing::warn!(%error, netns = %self.name, "deleting the bench namespace failed");
        }
    }
}

fn run_ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel cases leave nothing behind: the namespace is gone after drop.
    #[test]
    fn the_bench_namespace_is_deleted_on_drop() {
        if !capstan_testkit::require(
            "root, to create a network namespace",
            capstan_testkit::root(),
        ) {
            return;
        }
        let netns = BenchNetns::create().expect("network namespace (root and iproute2)");
        let path = netns.path();
        assert!(path.exists(), "{} exists while in use", path.display());
        let links = Command::new("ip")
            .args(["-n", netns.name(), "-br", "addr"])
            .output()
            .expect("run ip");
        let links = String::from_utf8_lossy(&links.stdout);
        assert!(
            links.contains("nsm0") && links.contains("10.1.1.1/24"),
            "{links}"
        );
        assert!(links.contains("tun0"), "{links}");
        drop(netns);
        assert!(!path.exists(), "{} deleted on drop", path.display());
    }
}
