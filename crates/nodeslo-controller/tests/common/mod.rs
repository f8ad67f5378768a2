//! A kube-sim with Capstan's CRDs and the real `nodeslo-controller` binary pointed at it.
#![allow(dead_code)]

use capstan_testkit::process::BinaryUnderTest;
use capstan_testkit::process::contract::wait_ready;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube_sim::{Config, KubeSim};

use tempfile::NamedTempFile;

pub const BIN: &str = env!("CARGO_BIN_EXE_nodeslo-controller");

pub struct Cluster {
    pub sim: KubeSim,
    pub client: kube::Client,
    pub kubeconfig: NamedTempFile,
}

impl Cluster {
    /// kube-sim with every Capstan CRD established and the SLO config namespace created.
    pub async fn start() -> Self {
        let sim = KubeSim::start(Config::default())
            .await
            .expect("kube-sim starts");
        let client = sim.client().expect("client");
        capstan_testkit::install_capstan_crds(&client)
            .await
            .expect("Capstan's CRDs installed and Established");
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "koordinator-system"}}))
                .expect("namespace");
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace created");
        let kubeconfig = NamedTempFile::new().expect("temp file");
        sim.write_kubeconfig(kubeconfig.path())
            .expect("kubeconfig written");
        Self {
            sim,
            client,
            kubeconfig,
        }
    }

    pub fn kubeconfig_path(&self) -> &str {
        self.kubeconfig.path().to_str().expect("utf-8 temp path")
    }

    /// Spawns the controller against this cluster and waits until it is ready (caches synced).
    pub async fn spawn_controller(&self, extra: &[&str]) -> BinaryUnderTest {
        let mut args = vec![
            "--kubeconfig",
            self.kubeconfig_path(),
            "--metrics-addr",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        let bin = BinaryUnderTest::spawn(BIN, &args)
            .await
            .expect("controller starts");
        wait_ready(&bin).await;
        bin
    }
}
