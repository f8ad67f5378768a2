//! Helpers shared by the integration tests: in-process servers on port 0 and
//! throw-away network namespaces for the kernel backends.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use capstan_testkit::{on_path, require};

use tokio::net::TcpListener;
use tonic::server::NamedService;

/// A server running in this process; stops (and drains) when dropped.
pub type ServerGuard = sidecar_shim::server::SpawnedServer;

pub async fn bind_local() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0")
}

/// Serves `service` with the production stack (health, metrics layer) on `listener`.
pub fn serve_on<S>(listener: TcpListener, service: S) -> ServerGuard
where
    S: tonic::codegen::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    sidecar_shim::server::spawn(listener, service).expect("local address of the test listener")
}

pub async fn serve<S>(service: S) -> ServerGuard
where
    S: tonic::codegen::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    serve_on(bind_local().await, service)
}

pub async fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to test server")
}

/// A network namespace created for one test, deleted on drop.
pub struct Netns {
    pub name: String,
}

static NETNS_COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Netns {
    /// Creates a namespace with `lo` up; `None` when the machine cannot (the test then returns:
    /// a loud skip, or a failure under `CAPSTAN_REQUIRE_ALL_TESTS=1`).
    pub fn create() -> Option<Self> {
        const NEED: &str = "root, to create network namespaces";
        if !require(NEED, capstan_testkit::root()) || !require("iproute2", on_path("ip")) {
            return None;
        }
        let name = format!(
            "capstan-t{}-{}",
            std::process::id(),
            NETNS_COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let added = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .map_err(|error| format!("cannot run `ip`: {error}"))
            .and_then(|out| {
                out.status.success().then_some(()).ok_or_else(|| {
                    format!(
                        "`ip netns add` failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    )
                })
            });
        if !require("network namespaces (`ip netns add`)", added) {
            return None;
        }
        let netns = Self { name };
        netns.ip(&["link", "set", "lo", "up"]);
        // No IPv6 chatter (router solicitations) on test links.
        netns.exec(&["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"]);
        netns.exec(&["sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"]);
        Some(netns)
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip -n NAME ARGS`, which must succeed.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// `ip netns exec NAME ARGS`, which must succeed.
    pub fn exec(&self, args: &[&str]) -> String {
        let mut full = vec!["netns", "exec", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// `tc -n NAME ARGS`, which must succeed.
    pub fn tc(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run("tc", &full)
    }

    /// The root qdisc of `dev` as `tc -j` shows it.
    pub fn tc_root_qdisc(&self, dev: &str) -> serde_json::Value {
        let json = self.tc(&["-j", "qdisc", "show", "dev", dev]);
        let qdiscs: Vec<serde_json::Value> = serde_json::from_str(&json).expect("tc -j is JSON");
        qdiscs
            .into_iter()
            .find(|q| q["root"] == true)
            .unwrap_or(serde_json::Value::Null)
    }

    /// A veth pair with `local` addressed and both ends up.
    pub fn veth(&self, name: &str, peer: &str, address: Option<&str>) {
        self.ip(&["link", "add", name, "type", "veth", "peer", "name", peer]);
        if let Some(address) = address {
            self.ip(&["addr", "add", address, "dev", name]);
        }
        self.ip(&["link", "set", name, "up"]);
        self.ip(&["link", "set", peer, "up"]);
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
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .expect("run command");
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// `["a", "b"]` as an owned set, for comparing route views.
pub fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}
