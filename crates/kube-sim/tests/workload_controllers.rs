//! The controller-manager behaviours clients rely on, through the Python client and kubectl:
//! DaemonSets (a pod per eligible Node, rolling update, `kubectl drain --ignore-daemonsets`).
//! kubectl and Python are called unconditionally.

mod common;

use common::kubectl::Kubectl;
use kube_sim::{Config, KubeSim};
use serde_json::Value;
use std::time::Duration;

async fn start(pod_cidr: &str) -> KubeSim {
    common::start_with(Config {
        simulate_workloads: true,
        workloads: kube_sim::workloads::WorkloadOptions {
            pod_cidr: pod_cidr.into(),
            ..Default::default()
        },
        ..Default::default()
    })
    .await
}

/// Polls `kubectl get <args> -o json` until `check` holds (panics with the last answer after 30s).
async fn wait_json(
    k: &Kubectl,
    args: &[&str],
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    for _ in 0..150 {
        last = k.json(args).await;
        if check(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("never {what}: {last:#}");
}

fn items(list: &Value) -> Vec<Value> {
    list["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_daemonset_runs_a_pod_per_eligible_node_and_rolls_updates() {
    let sim = start("127.12.1.0/24").await;
    common::run_python(&sim, "daemonset.py").await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drain_ignores_daemonset_pods_and_evicts_the_rest() {
    let sim = start("127.12.2.0/24").await;
    let k = Kubectl::new(&sim);
    let manifest = k.file(
        "cluster.yaml",
        r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: a, image: agent:1}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: w, image: nginx}]}
"#,
    );
    k.ok(&["apply", "-f", &manifest]).await;
    let on = |list: &Value, app: &str, node: &str| {
        items(list)
            .iter()
            .filter(|p| p["metadata"]["labels"]["app"] == app && p["spec"]["nodeName"] == node)
            .count()
    };
    wait_json(
        &k,
        &["get", "pods"],
        "a daemon on each node and web on n1",
        |l| on(l, "agent", "n1") == 1 && on(l, "agent", "n2") == 1 && on(l, "web", "n1") == 1,
    )
    .await;
    let ds = wait_json(&k, &["get", "ds", "agent"], "the DaemonSet ready", |d| {
        d["status"]["numberReady"] == 2
    })
    .await;
    assert_eq!(ds["status"]["desiredNumberScheduled"], 2);

    // Without --ignore-daemonsets kubectl refuses, naming the daemon pod.
    let refused = k.run(&["drain", "n1"]).await;
    assert!(!refused.ok);
    assert!(
        refused
            .stderr
            .contains("cannot delete DaemonSet-managed Pods"),
        "{}",
        refused.stderr
    );
    let out = k
        .ok(&["drain", "n1", "--ignore-daemonsets", "--timeout=60s"])
        .await;
    assert!(out.contains("node/n1 drained"), "{out}");
    let n1 = k.json(&["get", "node", "n1"]).await;
    assert_eq!(n1["spec"]["unschedulable"], true);
    // The daemon stays on the cordoned node; web moved to n2.
    wait_json(&k, &["get", "pods"], "web off n1, the daemon kept", |l| {
        on(l, "agent", "n1") == 1 && on(l, "web", "n1") == 0 && on(l, "web", "n2") == 2
    })
    .await;
    sim.shutdown().await;
}
