//! The Node cache as the controller builds it (the kit's trimmed reflector with
//! `node_cache::keep_what_decisions_read`), against kube-sim through the real kube client: a
//! kubelet-shaped Node is cached with what the decisions read and without the rest, and the
//! Node on the server keeps everything.

use std::time::Duration;

use capstan_machineclass_controller::node_cache::keep_what_decisions_read;
use capstan_runtime::controller::reflect_own_writes_trimmed;
use capstan_testkit_sim::SimCluster;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_node_is_cached_with_what_decisions_read_only() {
    let cluster = SimCluster::start().await;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"node.machine.sapcloud.io/machine-name": "m1"}},
        "spec": {"providerID": "sim:///n1", "taints": [{"key": "k", "effect": "NoSchedule"}]}
    }))
    .expect("a valid Node");
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("Node created");
    let status = json!({"status": {
        "capacity": {"cpu": "4"},
        "allocatable": {"cpu": "3800m"},
        "conditions": [{"type": "Ready", "status": "True"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        "images": [{"names": ["registry.example/app:1"], "sizeBytes": 1}],
        "nodeInfo": {
            "architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "c",
            "kernelVersion": "k", "kubeProxyVersion": "", "kubeletVersion": "v1.33.0",
            "machineID": "m", "operatingSystem": "linux", "osImage": "o", "systemUUID": "s"
        }
    }});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("kubelet status written");

    let (cache, stream) = reflect_own_writes_trimmed(
        nodes.clone(),
        watcher::Config::default(),
        Duration::from_secs(60),
        keep_what_decisions_read,
    );
    // The store shows a listed object once its list is complete: drive the stream, then wait.
    let watch = tokio::spawn(stream.for_each(|_| async {}));
    let deadline = tokio::time::Instant::now() + WAIT;
    let cached = loop {
        if let Some(node) = cache.get(&ObjectRef::new("n1")) {
            break node;
        }
        assert!(tokio::time::Instant::now() < deadline, "n1 never cached");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    watch.abort();

    let spec = cached.spec.as_ref().expect("spec kept");
    assert_eq!(spec.taints.as_ref().map(Vec::len), Some(1));
    assert_eq!(spec.provider_id, None, "not read by any decision");
    let kept = cached.status.as_ref().expect("status kept");
    assert!(
        kept.capacity
            .as_ref()
            .is_some_and(|c| c.contains_key("cpu"))
    );
    assert_eq!(kept.conditions.as_ref().map(Vec::len), Some(1));
    assert_eq!(
        (
            &kept.images,
            &kept.node_info,
            &kept.addresses,
            &kept.allocatable
        ),
        (&None, &None, &None, &None)
    );
    assert!(
        cached
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key("node.machine.sapcloud.io/machine-name"))
    );

    // Only the cache is trimmed.
    let live = nodes.get("n1").await.expect("Node read");
    let live = live.status.expect("status");
    assert!(live.images.is_some() && live.node_info.is_some());
    cluster.sim.shutdown().await;
}
