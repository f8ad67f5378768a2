//! Leader election with kube-lease-manager: two contenders, server-side apply conflicts decide.

mod common;

use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_handover_on_release() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let a = LeaseManagerBuilder::new(client.clone(), "capstan-test")
        .with_parameters(LeaseParams::new("a", 5, 2))
        .build()
        .await
        .expect("manager a");
    let b = LeaseManagerBuilder::new(client.clone(), "capstan-test")
        .with_parameters(LeaseParams::new("b", 5, 2))
        .build()
        .await
        .expect("manager b");
    let a_leads = tokio::time::timeout(Duration::from_secs(5), a.changed())
        .await
        .expect("a decides")
        .expect("a");
    assert!(a_leads, "a takes the free lease");
    let b_early = tokio::time::timeout(Duration::from_secs(1), b.changed()).await;
    assert!(
        b_early.is_err(),
        "b must not lead while a holds the lease: {b_early:?}"
    );
    a.release().await.expect("release");
    let b_leads = tokio::time::timeout(Duration::from_secs(10), b.changed())
        .await
        .expect("b decides")
        .expect("b");
    assert!(b_leads, "b takes the released lease");
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::default_namespaced(client);
    let lease = leases.get("capstan-test").await.expect("lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("b")
    );
    sim.shutdown().await;
}
