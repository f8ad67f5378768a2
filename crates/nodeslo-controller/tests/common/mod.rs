//! A kube-sim with Capstan's CRDs and the SLO config namespace, and the real `nodeslo-controller`
//! binary pointed at it.
#![allow(dead_code)]

use capstan_testkit::process::BinaryUnderTest;
use capstan_testkit_sim::{SimCluster, wait_ready};

pub const BIN: &str = env!("CARGO_BIN_EXE_nodeslo-controller");

pub struct Cluster(SimCluster);

impl std::ops::Deref for Cluster {
    type Target = SimCluster;
    fn deref(&self) -> &SimCluster {
        &self.0
    }
}

impl Cluster {
    /// kube-sim with every Capstan CRD established and the SLO config namespace created.
    pub async fn start() -> Self {
        let cluster = SimCluster::start().await;
        cluster.create_namespaces(&["koordinator-system"]).await;
        Self(cluster)
    }

    /// Spawns the controller against this cluster and waits until it is ready (caches synced).
    pub async fn spawn_controller(&self, extra: &[&str]) -> BinaryUnderTest {
        let bin = self.spawn(BIN, extra).await;
        wait_ready(&bin).await;
        bin
    }
}
