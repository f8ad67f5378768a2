//! The chart's RBAC, proven on the real binaries: the chart is installed with Helm's library into
//! kube-sim with RBAC on, and each controller runs as a process with the flags of its rendered
//! Deployment, authenticated as its chart ServiceAccount, through its end-to-end scenario.
//!
//! Sufficient: kube-sim's request accounting shows zero 403s for that ServiceAccount. Minimal:
//! every (group, resource, verb) the chart grants was used by a successful request in the scenario,
//! so removing any grant turns a request of the scenario into a 403 (which the first check forbids).

use std::collections::BTreeSet;
use std::time::Duration;

use capstan_scenarios::helm;
use capstan_scenarios::tools::binary;
use capstan_testkit::process::BinaryUnderTest;
use capstan_testkit::{eventually, eventually_with};
use capstan_testkit_sim::SimCluster;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "capstan-system";
/// machineclass-controller's namespace (`controllers.machineclass-controller.namespace`).
const MACHINES: &str = "machines";
const CONFIG_NS: &str = "koordinator-system";
const WAIT: Duration = Duration::from_secs(60);

// gw-recycler on a hub and two worker clusters.
#[path = "chart_rbac/gw_recycler.rs"]
mod gw_recycler;

// nodeslo-controller and machineclass-controller with sharding.enabled and three replicas.
#[path = "chart_rbac/sharded.rs"]
mod sharded;

/// The chart installed as `capstan` in capstan-system, Machines in their own namespace and the
/// NodeSLO config in Koordinator's.
async fn installed() -> Option<(SimCluster, Value)> {
    if !helm::available().await {
        return None;
    }
    let cluster = helm::cluster().await;
    cluster.create_namespaces(&[CONFIG_NS, MACHINES]).await;
    let values = json!({"controllers": {
        "machineclass-controller": {"namespace": MACHINES},
        "nodeslo-controller": {"configNamespace": CONFIG_NS}
    }});
    let release = match helm::install(&cluster, "capstan", NS, &values).await {
        Ok(r) => r,
        Err(e) => panic!("install failed: {e:?}"),
    };
    // Helm installed the CRDs from crds/; wait until they are served.
    let machines: Api<capstan_apis::machine::Machine> =
        Api::namespaced(cluster.client.clone(), MACHINES);
    eventually("CRDs served", WAIT, || async {
        machines.list(&ListParams::default()).await.ok().map(drop)
    })
    .await;
    Some((cluster, release))
}

/// The container args of the rendered Deployment `name`, made local: metrics on a free loopback
/// port, and the ServiceAccount's kubeconfig.
fn local_args(release: &Value, name: &str, kubeconfig: &str) -> Vec<String> {
    let deployment = release["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no Deployment {name} rendered"));
    let mut args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_owned())
        .map(|a| {
            if a.starts_with("--metrics-addr=") {
                "--metrics-addr=127.0.0.1:0".to_owned()
            } else {
                a
            }
        })
        .collect();
    args.extend(["--kubeconfig".to_owned(), kubeconfig.to_owned()]);
    args
}

/// Starts `component`'s binary as its chart ServiceAccount with the chart's flags plus `extra`.
async fn run_as_service_account(
    cluster: &SimCluster,
    release: &Value,
    package: &str,
    component: &str,
    extra: &[&str],
) -> (BinaryUnderTest, tempfile::NamedTempFile) {
    let name = format!("capstan-{component}");
    let kubeconfig = cluster.kubeconfig_as(NS, &name);
    let path = kubeconfig.path().display().to_string();
    let mut args = local_args(release, &name, &path);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let bin = BinaryUnderTest::spawn_with_env(
        binary(package, component),
        &args,
        &[("POD_NAMESPACE", NS), ("POD_NAME", "pod-0")],
    )
    .await
    .expect("controller starts");
    (bin, kubeconfig)
}

/// A (group, resource, verb) a rule grants; `resource` may name a subresource (`pods/status`).
type Grant = (String, String, String);

/// Every (group, resource, verb) `rules` grant.
fn grants_of(rules: impl IntoIterator<Item = PolicyRule>) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    out.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    out
}

/// Every (group, resource, verb) granted to `component` by the installed Roles and ClusterRoles.
async fn granted(cluster: &SimCluster, component: &str) -> BTreeSet<Grant> {
    let lp = ListParams::default().labels(&format!(
        "app.kubernetes.io/instance=capstan,app.kubernetes.io/component={component}"
    ));
    let mut rules: Vec<PolicyRule> = Vec::new();
    let cluster_roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    for role in cluster_roles.list(&lp).await.expect("list") {
        rules.extend(role.rules.unwrap_or_default());
    }
    let roles: Api<Role> = Api::all(cluster.client.clone());
    for role in roles.list(&lp).await.expect("list") {
        rules.extend(role.rules.unwrap_or_default());
    }
    grants_of(rules)
}

/// Zero 403s for the component's chart ServiceAccount, and every grant used by a successful request.
async fn assert_rbac_sufficient_and_minimal(cluster: &SimCluster, component: &str, output: &str) {
    let user = format!("system:serviceaccount:{NS}:capstan-{component}");
    let grants = granted(cluster, component).await;
    assert_users_need_exactly(cluster, &[user], &grants, component, output);
}

/// Zero 403s for any of `users`, and every grant of `grants` used by a successful request of one
/// of them (so removing it would turn a request of the scenario into a 403).
fn assert_users_need_exactly(
    cluster: &SimCluster,
    users: &[String],
    grants: &BTreeSet<Grant>,
    what: &str,
    output: &str,
) {
    let stats = cluster.sim.requests();
    let mine: Vec<_> = stats
        .counts
        .iter()
        .filter(|(k, _)| users.contains(&k.user))
        .collect();
    assert!(!mine.is_empty(), "no request was made as {users:?}");
    let forbidden: Vec<String> = mine
        .iter()
        .filter(|(k, _)| k.code == 403)
        .map(|(k, n)| {
            format!(
                "{n} x {} {}/{} {} as {}",
                k.verb, k.group, k.resource, k.subresource, k.user
            )
        })
        .collect();
    assert!(
        forbidden.is_empty(),
        "{what} was refused (the RBAC is not sufficient): {forbidden:#?}\n{output}"
    );
    let unused: Vec<String> = grants
        .iter()
        .filter(|(group, resource, verb)| {
            let (res, sub) = resource.split_once('/').unwrap_or((resource, ""));
            !mine.iter().any(|(k, _)| {
                k.code < 400
                    && k.group == *group
                    && k.resource == res
                    && k.subresource == sub
                    && k.verb == *verb
            })
        })
        .map(|(g, r, v)| format!("{v} {g}/{r}"))
        .collect();
    assert!(
        unused.is_empty(),
        "{what}: granted but never used by the scenario (not minimal): {unused:#?}"
    );
}

fn from_json<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("valid object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodeslo_controller_runs_on_exactly_the_chart_rbac() {
    let Some((cluster, release)) = installed().await else {
        return;
    };
    let admin = cluster.client.clone();
    let nodes: Api<Node> = Api::all(admin.clone());
    let slos: Api<capstan_apis::slo::NodeSlo> = Api::all(admin.clone());
    let config: Api<ConfigMap> = Api::namespaced(admin.clone(), CONFIG_NS);
    let pp = PostParams::default();
    nodes
        .create(&pp, &from_json(json!({"metadata": {"name": "n1"}})))
        .await
        .expect("node");
    // An invalid bandwidth annotation: a Warning Event about the Node, in `default`.
    nodes
        .create(
            &pp,
            &from_json(json!({"metadata": {"name": "n2",
                "annotations": {"node.koordinator.sh/network-bandwidth": "lots"}}})),
        )
        .await
        .expect("node");
    let (mut bin, _kubeconfig) = run_as_service_account(
        &cluster,
        &release,
        "nodeslo-controller",
        "nodeslo-controller",
        &[],
    )
    .await;
    let output = || bin.output().join("\n");

    eventually_with("NodeSLOs for both nodes", WAIT, output, || async {
        let n = slos.list(&ListParams::default()).await.ok()?.items.len();
        (n == 2).then_some(())
    })
    .await;

    // A config change reaches the NodeSLOs (a JSON patch each).
    config
        .create(
            &pp,
            &from_json(
                json!({"metadata": {"name": "slo-controller-config", "namespace": CONFIG_NS},
                "data": {"resource-threshold-config":
                    r#"{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60}}"#}}),
            ),
        )
        .await
        .expect("configmap");
    eventually_with("the new threshold on n1", WAIT, output, || async {
        let slo = slos.get("n1").await.ok()?;
        let spec = serde_json::to_value(&slo.spec).ok()?;
        (spec.pointer("/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent")
            == Some(&json!(60)))
        .then_some(())
    })
    .await;

    // An invalid key, twice: a Warning Event on the ConfigMap, then the same Event patched (series).
    for attempt in ["invalid_content", "still_invalid"] {
        config
            .patch(
                "slo-controller-config",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"resource-threshold-config": attempt}})),
            )
            .await
            .expect("configmap patched");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let config_events: Api<Event> = Api::namespaced(admin.clone(), CONFIG_NS);
    eventually_with("the config Warning counted twice", WAIT, output, || async {
        let list = config_events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.series.as_ref().is_some_and(|s| s.count >= 2))
            .map(drop)
    })
    .await;
    // A different invalid value is a new Event (its message differs); the first value again is
    // the first Event once more, patched into a series.
    let node_events: Api<Event> = Api::namespaced(admin.clone(), "default");
    eventually_with("the Node Warning", WAIT, output, || async {
        let list = node_events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("InvalidNetworkBandwidth"))
            .map(drop)
    })
    .await;
    nodes
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations":
                {"node.koordinator.sh/network-bandwidth": "plenty"}}})),
        )
        .await
        .expect("node patched");
    eventually_with("the second Node Warning", WAIT, output, || async {
        let list = node_events.list(&ListParams::default()).await.ok()?;
        (list
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("InvalidNetworkBandwidth"))
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    nodes
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations":
                {"node.koordinator.sh/network-bandwidth": "lots"}}})),
        )
        .await
        .expect("node patched back");
    eventually_with("the Node Warning counted twice", WAIT, output, || async {
        let list = node_events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("InvalidNetworkBandwidth")
                    && e.series.as_ref().is_some_and(|s| s.count >= 2)
            })
            .map(drop)
    })
    .await;

    // A deleted Node takes its NodeSLO.
    nodes
        .delete("n1", &DeleteParams::default())
        .await
        .expect("node deleted");
    eventually_with("n1's NodeSLO deleted", WAIT, output, || async {
        slos.get_opt("n1").await.ok()?.is_none().then_some(())
    })
    .await;

    // A restart reads the last-good copy back (get); the next good change updates it (patch).
    let first_run = output();
    bin.sigterm().expect("SIGTERM");
    let exited = bin.wait_exit(Duration::from_secs(20)).await.expect("exits");
    assert!(
        exited.success(),
        "nodeslo-controller drained badly:\n{first_run}"
    );
    let (restarted, _kubeconfig) = run_as_service_account(
        &cluster,
        &release,
        "nodeslo-controller",
        "nodeslo-controller",
        &[],
    )
    .await;
    let output = || {
        format!(
            "{first_run}\n--- restarted ---\n{}",
            restarted.output().join("\n")
        )
    };
    config
        .patch(
            "slo-controller-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"resource-threshold-config":
                r#"{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":65}}"#}})),
        )
        .await
        .expect("configmap patched");
    eventually_with(
        "the new threshold on n2 after a restart",
        WAIT,
        output,
        || async {
            let slo = slos.get("n2").await.ok()?;
            let spec = serde_json::to_value(&slo.spec).ok()?;
            (spec.pointer("/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent")
                == Some(&json!(65)))
            .then_some(())
        },
    )
    .await;
    let stored: Api<ConfigMap> = Api::namespaced(admin.clone(), CONFIG_NS);
    eventually_with("the last-good copy updated", WAIT, output, || async {
        let cm = stored.get("slo-controller-config-last-good").await.ok()?;
        cm.data?
            .get("resource-threshold-config")?
            .contains("65")
            .then_some(())
    })
    .await;

    assert_rbac_sufficient_and_minimal(&cluster, "nodeslo-controller", &output()).await;
}

/// A Machine of class `sim` in the machines namespace (the sim driver makes it Running).
fn machine(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "namespace": MACHINES, "labels": labels},
        "spec": {"class": {"kind": "MachineClass", "name": "sim"}}})
}

/// The Secret `cloud` and the MachineClass `sim` (simulated provider) the machine scenarios use.
async fn create_sim_class(admin: &kube::Client) {
    use capstan_apis::machine::MachineClass;
    let pp = PostParams::default();
    let classes: Api<MachineClass> = Api::namespaced(admin.clone(), MACHINES);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), MACHINES);
    secrets
        .create(
            &pp,
            &from_json(json!({"metadata": {"name": "cloud", "namespace": MACHINES},
                "data": {"userData": "Y2xvdWQtaW5pdA=="}})),
        )
        .await
        .expect("secret");
    classes
        .create(
            &pp,
            &from_json(
                json!({"apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
                "metadata": {"name": "sim", "namespace": MACHINES},
                "provider": "simulated", "providerSpec": {},
                "secretRef": {"name": "cloud", "namespace": MACHINES},
                "nodeTemplate": {"capacity": {"cpu": "2", "gpu": "0", "memory": "8Gi"},
                    "virtualCapacity": {"hc.hana.com/memory": "1234567"},
                    "instanceType": "sim.large", "region": "sim-1", "zone": "sim-1a"}}),
            ),
        )
        .await
        .expect("class");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machineclass_controller_runs_on_exactly_the_chart_rbac() {
    use capstan_apis::machine::{Machine, MachineClass};
    let Some((cluster, release)) = installed().await else {
        return;
    };
    let admin = cluster.client.clone();
    let machines: Api<Machine> = Api::namespaced(admin.clone(), MACHINES);
    let classes: Api<MachineClass> = Api::namespaced(admin.clone(), MACHINES);
    let nodes: Api<Node> = Api::all(admin.clone());
    let pp = PostParams::default();
    create_sim_class(&admin).await;
    for (name, labels) in [
        ("drained", json!({})),
        ("forced", json!({"force-deletion": "true"})),
        ("orphaned", json!({})),
    ] {
        machines
            .create(&pp, &from_json(machine(name, labels)))
            .await
            .expect("machine");
    }
    let (bin, _kubeconfig) = run_as_service_account(
        &cluster,
        &release,
        "machineclass-controller",
        "machineclass-controller",
        &["--short-retry=500ms", "--sim-ready-delay=1s"],
    )
    .await;
    let output = || bin.output().join("\n");
    let phase = |m: &Machine| m.phase().map(|p| p.as_str().to_owned());

    eventually_with("every Machine Running", WAIT, output, || async {
        let list = machines.list(&ListParams::default()).await.ok()?;
        (list.items.len() == 3
            && list
                .items
                .iter()
                .all(|m| phase(m).as_deref() == Some("Running")))
        .then_some(())
    })
    .await;

    // A Machine naming a missing class is reported; the same report again (after another one in
    // between) is the same Event, patched into a series.
    machines
        .create(
            &pp,
            &from_json(
                json!({"apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
                "metadata": {"name": "typo", "namespace": MACHINES},
                "spec": {"class": {"kind": "MachineClass", "name": "nope"}}}),
            ),
        )
        .await
        .expect("machine");
    let events: Api<Event> = Api::namespaced(admin.clone(), MACHINES);
    let validation_events = |min_count: i32| {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            let reported: Vec<_> = list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("ValidationFailed"))
                .collect();
            reported
                .iter()
                .any(|e| e.series.as_ref().map_or(1, |s| s.count) >= min_count)
                .then_some(reported.len())
        }
    };
    eventually_with("the missing class reported", WAIT, output, || {
        validation_events(1)
    })
    .await;
    for class in ["nope2", "nope"] {
        machines
            .patch(
                "typo",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"class": {"name": class}}})),
            )
            .await
            .expect("machine patched");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eventually_with("the first report counted twice", WAIT, output, || {
        validation_events(2)
    })
    .await;

    // A class in use: deletion is blocked with a Warning Event on the class.
    classes
        .delete("sim", &DeleteParams::default())
        .await
        .expect("class delete accepted");
    eventually_with("MachineClassInUse Warning", WAIT, output, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("MachineClassInUse"))
            .map(drop)
    })
    .await;

    // Drain with eviction and a volume attachment to remove, then the forced deletion.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let attachments: Api<VolumeAttachment> = Api::all(admin.clone());
    for node in ["drained", "forced"] {
        pods.create(
            &pp,
            &from_json(
                json!({"metadata": {"name": format!("app-on-{node}"), "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}),
            ),
        )
        .await
        .expect("pod");
        attachments
            .create(
                &pp,
                &from_json(json!({"metadata": {"name": format!("va-{node}")},
                    "spec": {"attacher": "csi.sim", "nodeName": node,
                        "source": {"persistentVolumeName": format!("pv-{node}")}}})),
            )
            .await
            .expect("volume attachment");
    }
    for name in ["drained", "forced"] {
        machines
            .delete(name, &DeleteParams::default())
            .await
            .expect("machine delete accepted");
    }
    eventually_with(
        "drained and forced Machines, their Nodes, Pods and attachments gone",
        WAIT,
        output,
        || async {
            for name in ["drained", "forced"] {
                let gone = machines.get_opt(name).await.ok()?.is_none()
                    && nodes.get_opt(name).await.ok()?.is_none()
                    && pods
                        .get_opt(&format!("app-on-{name}"))
                        .await
                        .ok()?
                        .is_none()
                    && attachments
                        .get_opt(&format!("va-{name}"))
                        .await
                        .ok()?
                        .is_none();
                if !gone {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;

    // A Node deleted under a Machine takes the Machine, and with no Machine left the class goes.
    nodes
        .delete("orphaned", &DeleteParams::default())
        .await
        .expect("node delete accepted");
    eventually_with(
        "orphaned Machine, Node and the class gone",
        WAIT,
        output,
        || async {
            let gone = machines.get_opt("orphaned").await.ok()?.is_none()
                && nodes.get_opt("orphaned").await.ok()?.is_none()
                && classes.get_opt("sim").await.ok()?.is_none();
            gone.then_some(())
        },
    )
    .await;
    let vms: Api<ConfigMap> = Api::namespaced(admin.clone(), MACHINES);
    let left = vms.list(&ListParams::default()).await.expect("list VMs");
    assert!(
        left.items.is_empty(),
        "simulated VMs left: {:?}",
        left.items.len()
    );

    assert_rbac_sufficient_and_minimal(&cluster, "machineclass-controller", &output()).await;
}

/// MachineDeployment `pool-a` in the machines namespace: `replicas` Machines of class `class`.
fn machine_deployment(class: &str, replicas: i32) -> Value {
    json!({"apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
    "metadata": {"name": "pool-a", "namespace": MACHINES},
    "spec": {
        "replicas": replicas,
        "selector": {"matchLabels": {"name": "pool-a"}},
        "template": {
            "metadata": {"labels": {"name": "pool-a"}},
            "spec": {"class": {"kind": "MachineClass", "name": class}}
        }
    }})
}

/// The uid of the object's controller (its ownerReference with `controller: true`).
fn controller_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
}

/// machineset-controller alone (no machineclass-controller: its Machines stay Pending, which is
/// all the set and deployment controllers need): a MachineDeployment makes its MachineSet and
/// Machines, a stray Machine is adopted, the scale subresource scales down and up again (the
/// repeated Event is patched into a series), a template change makes a second set, and the
/// deletion takes the sets and Machines with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machineset_controller_runs_on_exactly_the_chart_rbac() {
    use capstan_apis::machine::{ANNOTATION_REVISION, Machine, MachineDeployment, MachineSet};
    let Some((cluster, release)) = installed().await else {
        return;
    };
    let admin = cluster.client.clone();
    let deployments: Api<MachineDeployment> = Api::namespaced(admin.clone(), MACHINES);
    let sets: Api<MachineSet> = Api::namespaced(admin.clone(), MACHINES);
    let machines: Api<Machine> = Api::namespaced(admin.clone(), MACHINES);
    let events: Api<Event> = Api::namespaced(admin.clone(), MACHINES);
    let pp = PostParams::default();
    let (bin, _kubeconfig) = run_as_service_account(
        &cluster,
        &release,
        "machineset-controller",
        "machineset-controller",
        &["--short-retry=500ms"],
    )
    .await;
    let output = || bin.output().join("\n");
    let revision = |meta: &ObjectMeta| -> Option<u32> {
        meta.annotations
            .as_ref()?
            .get(ANNOTATION_REVISION)?
            .parse()
            .ok()
    };
    // The deployment's sets, oldest revision first, and the Machines each controls.
    let owned = || async {
        let deployment = deployments.get_opt("pool-a").await.ok()??;
        let uid = deployment.metadata.uid.clone()?;
        let mut mine: Vec<MachineSet> = sets
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|s| controller_uid(&s.metadata) == Some(uid.as_str()))
            .collect();
        mine.sort_by_key(|s| revision(&s.metadata));
        let all = machines.list(&ListParams::default()).await.ok()?.items;
        let with_machines: Vec<(MachineSet, Vec<Machine>)> = mine
            .into_iter()
            .map(|set| {
                let uid = set.metadata.uid.clone().unwrap_or_default();
                let of_set = all
                    .iter()
                    .filter(|m| controller_uid(&m.metadata) == Some(uid.as_str()))
                    .cloned()
                    .collect();
                (set, of_set)
            })
            .collect();
        Some((deployment, with_machines))
    };

    // A deployment of 2: its set (created, finalizer, status) and 2 Machines; the deployment's
    // finalizer, revision annotation and status.
    deployments
        .create(&pp, &from_json(machine_deployment("c1", 2)))
        .await
        .expect("deployment");
    let first = eventually_with("one MachineSet of 2 Machines", WAIT, output, || async {
        let (deployment, sets) = owned().await?;
        let [(set, of_set)] = sets.as_slice() else {
            return None;
        };
        let done = of_set.len() == 2
            && set.status.as_ref().is_some_and(|s| s.replicas == 2)
            && set
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
            && deployment
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
            && revision(&deployment.metadata) == Some(1)
            && deployment.status.as_ref().is_some_and(|s| s.replicas == 2);
        done.then(|| set.clone())
    })
    .await;
    let first_name = first.metadata.name.clone().expect("set name");

    // A Machine matching the set's selector and owned by nobody is adopted (an ownerReferences
    // patch), and the set, one Machine over, deletes one.
    let selector_labels = first
        .spec
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .expect("the set's matchLabels");
    machines
        .create(
            &pp,
            &from_json(
                json!({"apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
                "metadata": {"name": "stray", "namespace": MACHINES, "labels": selector_labels},
                "spec": {"class": {"kind": "MachineClass", "name": "c1"}}}),
            ),
        )
        .await
        .expect("stray machine");
    eventually_with("the stray Machine adopted", WAIT, output, || async {
        let (_, sets) = owned().await?;
        let [(_, of_set)] = sets.as_slice() else {
            return None;
        };
        let stray = machines.get_opt("stray").await.ok()?;
        let adopted = stray.is_none_or(|m| controller_uid(&m.metadata).is_some());
        (adopted && of_set.len() == 2).then_some(())
    })
    .await;

    // The scale subresource (kubectl scale): down to 1, then up to 2 again, whose Event repeats
    // the first one's note ("Scaled up machine set ... to 2") and is counted into it.
    for replicas in [1, 2] {
        deployments
            .patch_scale(
                "pool-a",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .expect("scaled");
        eventually_with(
            &format!("the MachineSet scaled to {replicas}"),
            WAIT,
            output,
            || async {
                let (_, sets) = owned().await?;
                let [(set, of_set)] = sets.as_slice() else {
                    return None;
                };
                let live = of_set
                    .iter()
                    .filter(|m| m.metadata.deletion_timestamp.is_none())
                    .count();
                (set.spec.replicas == replicas && live == usize::try_from(replicas).ok()?)
                    .then_some(())
            },
        )
        .await;
    }
    eventually_with("the scale-up Event counted twice", WAIT, output, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("ScalingMachineSet")
                    && e.series.as_ref().is_some_and(|s| s.count >= 2)
            })
            .map(drop)
    })
    .await;

    // A template change: a second MachineSet, revision 2, the first rolled down from.
    deployments
        .patch(
            "pool-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"class": {"name": "c2"}}}}})),
        )
        .await
        .expect("template changed");
    eventually_with("a second MachineSet, revision 2", WAIT, output, || async {
        let (deployment, sets) = owned().await?;
        let [(old, _), (new, of_new)] = sets.as_slice() else {
            return None;
        };
        let rolled = old.metadata.name.as_deref() == Some(first_name.as_str())
            && revision(&new.metadata) == Some(2)
            && revision(&deployment.metadata) == Some(2)
            && !of_new.is_empty();
        rolled.then_some(())
    })
    .await;

    // Deleting the deployment deletes its sets, their Machines, then lets go of both finalizers.
    deployments
        .delete("pool-a", &DeleteParams::default())
        .await
        .expect("deployment delete accepted");
    eventually_with(
        "the deployment, its sets and Machines gone",
        WAIT,
        output,
        || async {
            let gone = deployments.get_opt("pool-a").await.ok()?.is_none()
                && sets
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .is_empty()
                && machines
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .is_empty();
            gone.then_some(())
        },
    )
    .await;

    assert_rbac_sufficient_and_minimal(&cluster, "machineset-controller", &output()).await;
}
