//! The throw-away network namespace the kernel cases run in (the test kit's [`Netns`], deleted on
//! drop): `nsm0` holds the next hops, `tun0` is the tunnel.

use anyhow::{Context, Result};
use capstan_testkit::netns::Netns;

/// Creates the namespace with `lo`, `nsm0` (10.1.1.1/24, holding the next hops 10.1.1.2 and
/// 10.1.1.3) and `tun0` (10.8.0.1 -> 10.8.0.2), all up. Needs root and `ip` (iproute2).
pub fn create() -> Result<Netns> {
    let netns = Netns::create("capstan-bench").context("network namespace (root and iproute2)")?;
    netns.try_veth("nsm0", "nsm0-peer", Some("10.1.1.1/24"))?;
    netns.try_ip(&["tuntap", "add", "dev", "tun0", "mode", "tun"])?;
    netns.try_ip(&["addr", "add", "10.8.0.1", "peer", "10.8.0.2", "dev", "tun0"])?;
    netns.try_ip(&["link", "set", "tun0", "up"])?;
    Ok(netns)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

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
        let netns = create().expect("network namespace (root and iproute2)");
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
