//! The simulation driven pass by pass on a bare `Cluster`: what each kind's loop writes.

use super::*;
use crate::cluster::Sub;
use std::collections::BTreeMap;

fn deploy(cluster: &mut Cluster, replicas: i64) {
    let info = cluster
        .registry
        .lookup("apps", "v1", "deployments")
        .cloned()
        .expect("built in");
    let body = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
    cluster
        .create(&info, "default", body, &WriteOptions::default())
        .expect("created");
}

fn simulation() -> Simulation {
    Simulation {
        options: WorkloadOptions::default(),
        nodes: Arc::new(Nodes::default()),
        kubelet: Arc::new(
            crate::kubelet::Kubelet::new(crate::kubelet::KubeletConfig::default())
                .expect("log directory"),
        ),
        template_hashes: Default::default(),
    }
}

fn settle(cluster: &mut Cluster, sim: &Simulation) -> usize {
    let mut passes = 0;
    while reconcile(cluster, sim).expect("pass").writes > 0 {
        passes += 1;
        assert!(passes < 10, "does not settle");
    }
    passes
}

fn pods(c: &Cluster) -> Vec<Arc<Value>> {
    all(
        c,
        &c.registry.lookup("", "v1", "pods").cloned().expect("pods"),
    )
}

fn node(c: &Cluster, name: &str) -> Option<Arc<Value>> {
    c.store.get(
        &(String::new(), "nodes".into()),
        &(String::new(), name.into()),
    )
}

fn create_node(c: &mut Cluster, body: Value) {
    let info = c
        .registry
        .lookup("", "v1", "nodes")
        .cloned()
        .expect("nodes");
    c.create(&info, "", body, &WriteOptions::default())
        .expect("node created");
}

/// The rule the server's loop rests on: what others write while the last pass runs is news,
/// even when that pass has already gone by the step that would act on it.
#[tokio::test(flavor = "current_thread")]
async fn a_write_between_the_steps_of_the_settling_pass_wakes_another_pass() {
    let shared = Shared::new(Cluster::new(1000), String::new(), Duration::from_secs(60));
    let sim = simulation();
    let mut changes = Some(shared.lock().store.subscribe().0);
    run_passes(&shared, &sim).await;
    news_since(&mut changes, u64::MAX);

    // A Namespace gets its `kube-root-ca.crt` from the `namespaces` step alone. The pass
    // yields after each step, and `futures::join!` polls the pass first, then the writer, once
    // per wake-up: the writer's k-th resumption comes after step k, so the Namespace lands
    // once that step has run, in a pass that then writes nothing.
    let after_namespaces = 1 + STEPS
        .iter()
        .position(|(name, _)| *name == "namespaces")
        .expect("a namespaces step");
    let (settled, ()) = futures::join!(run_passes(&shared, &sim), async {
        for _ in 0..after_namespaces {
            tokio::task::yield_now().await;
        }
        let mut c = shared.lock();
        let info = c.registry.lookup("", "v1", "namespaces").cloned();
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}});
        c.create(
            &info.expect("namespaces"),
            "",
            body,
            &WriteOptions::default(),
        )
        .expect("namespace created");
    });
    let root_ca = |shared: &Shared| {
        let key = (String::new(), "configmaps".to_string());
        let name = ("late".to_string(), "kube-root-ca.crt".to_string());
        shared.lock().store.get(&key, &name).is_some()
    };
    assert!(
        !root_ca(&shared),
        "the Namespace came after the step that acts on it, in a pass that wrote nothing"
    );
    assert!(
        news_since(&mut changes, settled.rv),
        "a write during the settling pass is news"
    );
    run_passes(&shared, &sim).await;
    assert!(root_ca(&shared), "the next pass acts on it");
}

#[test]
fn a_deployment_gets_running_pods_on_a_registered_default_node_and_settles() {
    let mut c = Cluster::new(1000);
    let sim = simulation();
    deploy(&mut c, 2);
    assert!(settle(&mut c, &sim) > 0);
    let pods = pods(&c);
    assert_eq!(pods.len(), 2);
    for p in &pods {
        assert_eq!(p["status"]["phase"], "Running");
        assert_eq!(p["spec"]["nodeName"], "kube-sim-node");
        assert!(pod_ready(p));
        assert_eq!(p["metadata"]["labels"]["app"], "web");
        assert_eq!(
            p["metadata"]["labels"]["pod-template-hash"]
                .as_str()
                .map(str::len),
            Some(10)
        );
    }
    let default = node(&c, "kube-sim-node").expect("the pods' node exists as a Node");
    assert!(node_ready(&default));
    let d = c
        .store
        .get(
            &("apps".into(), "deployments".into()),
            &("default".into(), "web".into()),
        )
        .expect("deployment");
    assert_eq!(d["status"]["readyReplicas"], 2);
    assert_eq!(d["status"]["updatedReplicas"], 2);
    // Quiet: nothing more to write.
    assert_eq!(reconcile(&mut c, &sim).expect("pass").writes, 0);
}

#[test]
fn pods_go_to_ready_nodes_only() {
    let mut c = Cluster::new(1000);
    let sim = simulation();
    sim.nodes
        .add(&mut c, "a", &BTreeMap::new())
        .expect("node a");
    sim.nodes
        .add(&mut c, "b", &BTreeMap::new())
        .expect("node b");
    sim.nodes.set_ready(&mut c, "b", false).expect("b down");
    deploy(&mut c, 3);
    settle(&mut c, &sim);
    let pods_now = pods(&c);
    assert!(
        pods_now.iter().all(|p| p["spec"]["nodeName"] == "a"),
        "{pods_now:?}"
    );
    assert!(
        pods_now
            .iter()
            .all(|p| p["status"]["hostIP"] == "127.0.1.1")
    );
    // Node a goes NotReady: its pods stop being Ready.
    sim.nodes.set_ready(&mut c, "a", false).expect("a down");
    settle(&mut c, &sim);
    assert!(pods(&c).iter().all(|p| !pod_ready(p)));
    assert!(!node_ready(&node(&c, "a").expect("node")));
    assert!(
        node(&c, "kube-sim-node").is_none(),
        "nodes exist: no default"
    );
}

#[test]
fn user_created_nodes_get_a_kubelet_and_cordoned_or_tainted_ones_no_pods() {
    let mut c = Cluster::new(1000);
    let sim = simulation();
    create_node(
        &mut c,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-1"}}),
    );
    create_node(
        &mut c,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cordoned"},
        "spec": {"unschedulable": true}}),
    );
    create_node(
        &mut c,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "tainted"},
        "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}),
    );
    deploy(&mut c, 2);
    settle(&mut c, &sim);
    for name in ["worker-1", "cordoned", "tainted"] {
        let n = node(&c, name).expect("node");
        assert!(node_ready(&n), "{name} is Ready: {n}");
        assert_eq!(n["status"]["capacity"]["pods"], "110");
        let ready = n["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned())
            .expect("Ready condition");
        assert_eq!(ready["reason"], "KubeletReady");
    }
    assert!(pods(&c).iter().all(|p| p["spec"]["nodeName"] == "worker-1"));
    assert!(node(&c, "kube-sim-node").is_none());
    // Heartbeats reach adopted nodes.
    assert!(sim.nodes.knows("worker-1"));
}

#[test]
fn every_namespace_gets_the_default_service_account_and_the_root_ca_config_map() {
    let mut c = Cluster::new(1000);
    let sim = Simulation {
        options: WorkloadOptions {
            root_ca: "-----BEGIN CERTIFICATE-----\n".into(),
            ..Default::default()
        },
        ..simulation()
    };
    let ns_info = c
        .registry
        .lookup("", "v1", "namespaces")
        .cloned()
        .expect("ns");
    c.create(
        &ns_info,
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
        &WriteOptions::default(),
    )
    .expect("namespace");
    settle(&mut c, &sim);
    for ns in [
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "team-a",
    ] {
        let sa = c.store.get(
            &(String::new(), "serviceaccounts".into()),
            &(ns.into(), "default".into()),
        );
        assert!(sa.is_some(), "default ServiceAccount in {ns}");
        let cm = c
            .store
            .get(
                &(String::new(), "configmaps".into()),
                &(ns.into(), "kube-root-ca.crt".into()),
            )
            .expect("kube-root-ca.crt");
        assert_eq!(cm["data"]["ca.crt"], "-----BEGIN CERTIFICATE-----\n");
    }
    // A deleted ServiceAccount comes back, as the controller recreates it.
    let sa_info = c
        .registry
        .lookup("", "v1", "serviceaccounts")
        .cloned()
        .expect("sa");
    c.delete(
        &sa_info,
        "team-a",
        "default",
        &crate::cluster::DeleteOptions::default(),
    )
    .expect("deleted");
    assert!(settle(&mut c, &sim) > 0);
    assert!(
        c.store
            .get(
                &(String::new(), "serviceaccounts".into()),
                &("team-a".into(), "default".into())
            )
            .is_some()
    );
}

#[test]
fn tolerations_match_taints_by_key_value_and_effect() {
    let ready = json!({"type": "Ready", "status": "True"});
    let n = json!({"spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"},
                                       {"key": "soft", "effect": "PreferNoSchedule"}]},
                   "status": {"conditions": [ready]}});
    assert!(!schedulable(&n, &json!({})));
    assert!(schedulable(
        &n,
        &json!({"tolerations": [{"key": "k", "value": "v", "effect": "NoSchedule"}]})
    ));
    assert!(schedulable(
        &n,
        &json!({"tolerations": [{"key": "k", "operator": "Exists"}]})
    ));
    assert!(schedulable(
        &n,
        &json!({"tolerations": [{"operator": "Exists"}]})
    ));
    assert!(!schedulable(
        &n,
        &json!({"tolerations": [{"key": "k", "value": "w"}]})
    ));
    assert!(!schedulable(
        &n,
        &json!({"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute"}]})
    ));
}

#[test]
fn a_simulated_job_pod_succeeds_one_pass_after_it_runs() {
    let mut c = Cluster::new(1000);
    let sim = simulation();
    let jobs = c
        .registry
        .lookup("batch", "v1", "jobs")
        .cloned()
        .expect("built in");
    let body = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "once", "namespace": "default"},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}}});
    c.create(&jobs, "default", body, &WriteOptions::default())
        .expect("created");
    // The pod's phase after each pass, until it has one.
    let mut phases = Vec::new();
    for _ in 0..6 {
        reconcile(&mut c, &sim).expect("pass");
        let pods = pods(&c);
        assert!(pods.len() <= 1, "completions 1, parallelism 1: {pods:?}");
        if let Some(p) = pods.first() {
            phases.push(p["status"]["phase"].as_str().unwrap_or("").to_string());
        }
    }
    let running = phases.iter().position(|p| p == "Running");
    let succeeded = phases.iter().position(|p| p == "Succeeded");
    assert!(
        matches!((running, succeeded), (Some(r), Some(s)) if s == r + 1),
        "Running, then Succeeded the next pass: {phases:?}"
    );
    let job = c
        .store
        .get(
            &("batch".into(), "jobs".into()),
            &("default".into(), "once".into()),
        )
        .expect("job");
    assert_eq!(job["status"]["succeeded"], 1, "{job}");
    assert!(has_condition(&job, "Complete"), "{job}");
}

#[test]
fn replicasets_are_numbered_in_rollout_order_and_a_rollback_renumbers_the_old_one() {
    let mut c = Cluster::new(1000);
    let sim = simulation();
    deploy(&mut c, 1);
    settle(&mut c, &sim);
    let info = c
        .registry
        .lookup("apps", "v1", "deployments")
        .cloned()
        .expect("built in");
    let key = (String::from("default"), String::from("web"));
    let deployments = ("apps".to_string(), "deployments".to_string());
    let get = |c: &Cluster| c.store.get(&deployments, &key).expect("deployment");
    let original = get(&c)["spec"]["template"].clone();
    let set_template = |c: &mut Cluster, template: Value| {
        let mut d = (*c.store.get(&deployments, &key).expect("deployment")).clone();
        d["spec"]["template"] = template;
        c.update(
            &info,
            "default",
            "web",
            d,
            Sub::Main,
            &WriteOptions::default(),
        )
        .expect("updated");
    };
    // What `kubectl rollout restart` does.
    let mut restarted = original.clone();
    restarted["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = json!("now");
    set_template(&mut c, restarted);
    settle(&mut c, &sim);
    let revisions = |c: &Cluster| -> BTreeMap<String, (String, i64)> {
        let rs_info = c
            .registry
            .lookup("apps", "v1", "replicasets")
            .cloned()
            .expect("rs");
        all(c, &rs_info)
            .iter()
            .map(|rs| {
                (
                    name(rs).to_string(),
                    (
                        rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        rs["spec"]["replicas"].as_i64().unwrap_or(-1),
                    ),
                )
            })
            .collect()
    };
    let first = format!("web-{}", pod_template_hash(&original));
    let after_restart = revisions(&c);
    assert_eq!(after_restart.len(), 2, "{after_restart:?}");
    assert_eq!(after_restart[&first], ("1".to_string(), 0));
    assert!(
        after_restart.values().any(|r| *r == ("2".to_string(), 1)),
        "{after_restart:?}"
    );
    assert_eq!(
        get(&c)["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "2"
    );
    // What `kubectl rollout undo` sends back: the old template, with a null creationTimestamp.
    let mut undone = original.clone();
    undone["metadata"]["creationTimestamp"] = Value::Null;
    set_template(&mut c, undone);
    settle(&mut c, &sim);
    let after_undo = revisions(&c);
    assert_eq!(
        after_undo.len(),
        2,
        "the old ReplicaSet is reused: {after_undo:?}"
    );
    assert_eq!(after_undo[&first], ("3".to_string(), 1));
    assert_eq!(
        get(&c)["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "3"
    );
}
