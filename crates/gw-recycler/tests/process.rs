//! The built `gw-recycler` binary keeps the process contract of every Capstan binary.

use capstan_testkit::process::contract;
use kube_sim::{Config, KubeSim};
use tempfile::NamedTempFile;

const BIN: &str = env!("CARGO_BIN_EXE_gw-recycler");
const HUB_NS: &str = "kubeslice-red";

/// A kube-sim with Capstan's CRDs (serving as hub and worker at once) and its kubeconfig file.
struct Cluster {
    _sim: KubeSim,
    kubeconfig: NamedTempFile,
}

impl Cluster {
    async fn start() -> Self {
        let sim = KubeSim::start(Config::default())
            .await
            .expect("kube-sim starts");
        let client = sim.client().expect("client");
        capstan_testkit::install_capstan_crds(&client)
            .await
            .expect("Capstan's CRDs installed and Established");
        let kubeconfig = NamedTempFile::new().expect("temp file");
        sim.write_kubeconfig(kubeconfig.path())
            .expect("kubeconfig written");
        Self {
            _sim: sim,
            kubeconfig,
        }
    }

    fn kubeconfig_path(&self) -> &str {
        self.kubeconfig.path().to_str().expect("utf-8 temp path")
    }
}

#[tokio::test]
async fn serves_admin_endpoints_and_exits_zero_on_sigterm() {
    let cluster = Cluster::start().await;
    let path = cluster.kubeconfig_path();
    let args = [
        "--kubeconfig",
        path,
        "--hub-kubeconfig",
        path,
        "--hub-namespace",
        HUB_NS,
    ];
    contract::serves_admin_endpoints_and_exits_zero_on_sigterm(BIN, &args, "gw-recycler").await;
}

#[tokio::test]
async fn reads_flags_from_the_environment_and_logs_json() {
    let cluster = Cluster::start().await;
    let path = cluster.kubeconfig_path();
    let envs = [
        ("KUBECONFIG", path),
        ("HUB_KUBECONFIG", path),
        ("HUB_NAMESPACE", HUB_NS),
        ("GW_RECYCLER_ROLE", "client"),
    ];
    contract::reads_flags_from_the_environment_and_logs_json(BIN, &[], &envs, "gw-recycler").await;
}

#[tokio::test]
async fn bad_configuration_exits_non_zero_without_serving() {
    contract::bad_configuration_exits_non_zero_without_serving(BIN, &["--role", "server"]).await;
}
