//! The workload simulation seen by a client: Deployments get running Pods that follow scaling, eviction
//! and deletion.

use super::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::EvictParams;
use std::collections::HashSet;

async fn running_pods(pods: &Api<Pod>, want: usize) -> Vec<Pod> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let list = pods.list(&ListParams::default()).await.expect("list pods");
        let live: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let running = live
            .iter()
            .filter(|p| {
                let s = p.status.as_ref();
                s.and_then(|s| s.phase.as_deref()) == Some("Running")
                    && s.and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if live.len() == want && running == want {
            return live;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "wanted {want} running pods, have {} ({running} running)",
            live.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn deployment_ready(deploys: &Api<Deployment>, want: i32) -> Deployment {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = deploys.get("web").await.expect("get");
        let s = d.status.clone().unwrap_or_default();
        if s.ready_replicas.unwrap_or(0) == want
            && s.available_replicas.unwrap_or(0) == want
            && s.updated_replicas.unwrap_or(0) == want
            && s.replicas.unwrap_or(0) == want
            && s.observed_generation == d.metadata.generation
        {
            return d;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "deployment status did not follow: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ips(pods: &[Pod]) -> HashSet<String> {
    pods.iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect()
}

#[tokio::test]
async fn deployments_get_running_pods_that_follow_scaling_eviction_and_deletion() {
    let sim = common::start_with(kube_sim::Config {
        simulate_workloads: true,
        ..Default::default()
    })
    .await;
    sim.add_node("node-a", &BTreeMap::from([("zone".into(), "z1".into())]))
        .expect("node");
    let client = sim.client().expect("client");
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
    }))
    .expect("valid Deployment");
    deploys
        .create(&PostParams::default(), &d)
        .await
        .expect("create");

    let three = running_pods(&pods, 3).await;
    assert_eq!(ips(&three).len(), 3, "distinct pod IPs");
    for p in &three {
        let ip: std::net::Ipv4Addr = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .expect("pod IP")
            .parse()
            .expect("IPv4");
        assert!(ip.is_loopback(), "{ip}");
        assert_eq!(
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some("node-a")
        );
        let owner = &p.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!(owner.kind, "ReplicaSet");
        let hash = &p.labels()["pod-template-hash"];
        assert_eq!(owner.name, format!("web-{hash}"));
    }
    deployment_ready(&deploys, 3).await;

    deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .expect("scale up");
    let five = running_pods(&pods, 5).await;
    assert_eq!(ips(&five).len(), 5);
    deployment_ready(&deploys, 5).await;

    // Eviction deletes the pod; the ReplicaSet replaces it.
    let victim = five[0].name_any();
    pods.evict(&victim, &EvictParams::default())
        .await
        .expect("evict");
    let replaced = running_pods(&pods, 5).await;
    assert!(replaced.iter().all(|p| p.name_any() != victim));

    deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("scale down");
    running_pods(&pods, 1).await;
    deployment_ready(&deploys, 1).await;

    // A new pod template rolls out: a new ReplicaSet, the old one scaled to zero.
    let old_hash = running_pods(&pods, 1).await[0].labels()["pod-template-hash"].clone();
    deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx:2"}]}}}})),
        )
        .await
        .expect("new template");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = running_pods(&pods, 1).await;
        if now[0].labels()["pod-template-hash"] != old_hash {
            let image = now[0].spec.as_ref().map(|s| s.containers[0].image.clone());
            assert_eq!(image, Some(Some("nginx:2".into())));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no rollout");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    deployment_ready(&deploys, 1).await;
    let replicasets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
        Api::namespaced(client.clone(), "default");
    let old = replicasets
        .get(&format!("web-{old_hash}"))
        .await
        .expect("old ReplicaSet kept");
    assert_eq!(old.spec.and_then(|s| s.replicas), Some(0));

    deploys
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    running_pods(&pods, 0).await;

    // A node that stops heartbeating goes NotReady (here through the admin endpoint).
    let (code, body) = common::raw(
        &sim,
        "PUT",
        "/_sim/nodes/node-a",
        "application/json",
        r#"{"ready": false}"#,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = common::raw(
        &sim,
        "POST",
        "/_sim/nodes",
        "application/json",
        r#"{"name": "node-b", "labels": {"zone": "z2"}}"#,
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = nodes.get("node-a").await.expect("node");
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .expect("Ready condition");
    assert_eq!(ready.status, "Unknown");
    assert_eq!(node.metadata.labels.expect("labels")["zone"], "z1");
    let b = nodes.get("node-b").await.expect("node-b");
    assert!(
        b.status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    );
    sim.shutdown().await;
}
