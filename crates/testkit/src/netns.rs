//! Throw-away network namespaces for the kernel (netlink) backends: the sidecar tests and the
//! sidecar bench create one per run with `ip netns`, shape it with `ip`/`tc`, and it is deleted
//! on drop, so a failed run leaves nothing behind. Needs root and iproute2.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::require::{on_path, require, root};

/// Why a namespace command failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot run `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Failed { command: String, stderr: String },
}

impl NetnsError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            NetnsError::Spawn { .. } => "spawn",
            NetnsError::Failed { .. } => "failed",
        }
    }
}

static NETNS_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A network namespace `<prefix><pid>-<n>`, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace with `lo` up.
    pub fn create(prefix: &str) -> Result<Self, NetnsError> {
        let netns = Self::add(prefix)?;
        netns.try_ip(&["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    /// [`create`](Self::create) for a test, with IPv6 off (no router solicitations on test
    /// links); `None` when the machine cannot (no root, no iproute2, `ip netns add` refused): a
    /// loud skip, or a failure under `CAPSTAN_REQUIRE_ALL_TESTS=1`. Any later step must succeed.
    pub fn create_or_skip(prefix: &str) -> Option<Self> {
        if !require("root, to create network namespaces", root())
            || !require("iproute2", on_path("ip"))
        {
            return None;
        }
        let added = Self::add(prefix);
        let available = added.as_ref().map(drop).map_err(ToString::to_string);
        if !require("network namespaces (`ip netns add`)", available) {
            return None;
        }
        let netns = added.ok()?;
        netns.ip(&["link", "set", "lo", "up"]);
        netns.exec(&["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"]);
        netns.exec(&["sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"]);
        Some(netns)
    }

    /// `ip netns add <prefix><pid>-<n>`; from then on, drop deletes it whatever fails next.
    fn add(prefix: &str) -> Result<Self, NetnsError> {
        let name = format!(
            "{prefix}{}-{}",
            std::process::id(),
            NETNS_COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        run("ip", &["netns", "add", &name])?;
        Ok(Self { name })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`, what a netlink backend opens.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip -n NAME ARGS`; its stdout.
    pub fn try_ip(&self, args: &[&str]) -> Result<String, NetnsError> {
        run("ip", &self.within("-n", args))
    }

    /// `ip netns exec NAME ARGS`; its stdout.
    pub fn try_exec(&self, args: &[&str]) -> Result<String, NetnsError> {
        let mut full = vec!["netns", "exec", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// A veth pair `name`/`peer`, `name` given `address` if any, both ends up.
    pub fn try_veth(
        &self,
        name: &str,
        peer: &str,
        address: Option<&str>,
    ) -> Result<(), NetnsError> {
        self.try_ip(&["link", "add", name, "type", "veth", "peer", "name", peer])?;
        if let Some(address) = address {
            self.try_ip(&["addr", "add", address, "dev", name])?;
        }
        self.try_ip(&["link", "set", name, "up"])?;
        self.try_ip(&["link", "set", peer, "up"])?;
        Ok(())
    }

    /// [`try_ip`](Self::try_ip), which must succeed (tests).
    pub fn ip(&self, args: &[&str]) -> String {
        self.try_ip(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`try_exec`](Self::try_exec), which must succeed (tests).
    pub fn exec(&self, args: &[&str]) -> String {
        self.try_exec(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `tc -n NAME ARGS`, which must succeed (tests).
    pub fn tc(&self, args: &[&str]) -> String {
        run("tc", &self.within("-n", args)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`try_veth`](Self::try_veth), which must succeed (tests).
    pub fn veth(&self, name: &str, peer: &str, address: Option<&str>) {
        self.try_veth(name, peer, address)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// The root qdisc of `dev` as `tc -j` shows it (`Null` when there is none).
    pub fn tc_root_qdisc(&self, dev: &str) -> serde_json::Value {
        let json = self.tc(&["-j", "qdisc", "show", "dev", dev]);
        let qdiscs: Vec<serde_json::Value> = serde_json::from_str(&json).expect("tc -j is JSON");
        qdiscs
            .into_iter()
            .find(|q| q["root"] == true)
            .unwrap_or(serde_json::Value::Null)
    }

    /// Routes with gateways in the main table, read independently with `ip -j route`:
    /// destination -> gateways.
    pub fn gateway_routes(&self) -> BTreeMap<String, BTreeSet<String>> {
        let json = self.ip(&["-j", "route", "show", "table", "main"]);
        let routes: Vec<serde_json::Value> =
            serde_json::from_str(&json).expect("ip -j route is JSON");
        let mut table = BTreeMap::new();
        for route in routes {
            let dst = route["dst"].as_str().unwrap_or_default().to_owned();
            let mut gateways = BTreeSet::new();
            if let Some(gateway) = route["gateway"].as_str() {
                gateways.insert(gateway.to_owned());
            }
            if let Some(hops) = route["nexthops"].as_array() {
                for hop in hops {
                    if let Some(gateway) = hop["gateway"].as_str() {
                        gateways.insert(gateway.to_owned());
                    }
                }
            }
            if !gateways.is_empty() {
                let dst = if dst == "default" {
                    "0.0.0.0/0".to_owned()
                } else {
                    dst
                };
                table.insert(dst, gateways);
            }
        }
        table
    }

    fn within<'a>(&'a self, flag: &'a str, args: &[&'a str]) -> Vec<&'a str> {
        let mut full = vec![flag, self.name.as_str()];
        full.extend_from_slice(args);
        full
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(error) = run("ip", &["netns", "del", &self.name]) {
            eprintln!("deleting network namespace {}: {error}", self.name);
        }
    }
}

fn run(program: &str, args: &[&str]) -> Result<String, NetnsError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| NetnsError::Spawn {
            program: program.to_owned(),
            source,
        })?;
    if !out.status.success() {
        return Err(NetnsError::Failed {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace is there while held and gone after drop, with `lo` up.
    #[test]
    fn a_namespace_is_deleted_on_drop() {
        let Some(netns) = Netns::create_or_skip("capstan-kit") else {
            return;
        };
        let path = netns.path();
        assert!(path.exists(), "{} exists while in use", path.display());
        let lo = netns.ip(&["-br", "link", "show", "lo"]);
        assert!(lo.contains("UP") || lo.contains("UNKNOWN"), "{lo}");
        drop(netns);
        assert!(!path.exists(), "{} deleted on drop", path.display());
    }
}
