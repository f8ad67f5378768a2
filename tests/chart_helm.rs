//! The Helm chart checked as a user meets it, with Helm's own Go library (helm-sdkpy) against
//! kube-sim with RBAC on: lint, install with every component, upgrade, uninstall and reinstall, two
//! releases side by side, the values schema rejecting bad values by field, and the optional
//! ServiceMonitors against a Prometheus Operator CRD.

use capstan_scenarios::helm::{self, HelmError};
use capstan_testkit::skip_or_fail;
use capstan_testkit_sim::SimCluster;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde_json::{Value, json};

const NS: &str = "capstan-system";
const RECOMMENDED_LABELS: [&str; 7] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
];

/// Every component on: the gw-recycler (with its hub Secret), the sidecar Deployment, two
/// machineclass replicas (leader election and a PodDisruptionBudget), and nodeslo reading
/// Koordinator's config namespace. Install it on [`cluster_for_everything`].
fn everything() -> Value {
    json!({
        "controllers": {
            "machineclass-controller": {"replicas": 2},
            "nodeslo-controller": {"configNamespace": "koordinator-system"},
            "gw-recycler": {"enabled": true}
        },
        "hub": {"kubeconfigSecret": "hub-kubeconfig", "namespace": "kubeslice-demo"},
        "sidecars": {"standalone": {"enabled": true}}
    })
}

/// A bare kube-sim (only the namespaces a new cluster has), or `None` when Helm's library cannot
/// run here (then the test has printed SKIPPED).
async fn cluster() -> Option<SimCluster> {
    if !helm::available().await {
        return None;
    }
    Some(helm::cluster().await)
}

/// A bare kube-sim plus the namespaces [`everything`] names and does not own: Koordinator's
/// (nodeslo's config Role) and KubeSlice's (the gw-recycler's Role).
async fn cluster_for_everything() -> Option<SimCluster> {
    let cluster = cluster().await?;
    cluster
        .create_namespaces(&["koordinator-system", "kubeslice-system"])
        .await;
    Some(cluster)
}

fn ok(result: Result<Value, HelmError>, what: &str) -> Value {
    match result {
        Ok(v) => v,
        Err(e) => panic!("{what} failed: {e:?}"),
    }
}

fn objects(release: &Value) -> Vec<Value> {
    release["objects"]
        .as_array()
        .cloned()
        .expect("rendered objects")
}

fn names_of<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a str> {
    objects
        .iter()
        .filter(|o| o["kind"] == kind)
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect()
}

async fn deployment_replicas(cluster: &SimCluster, namespace: &str, name: &str) -> Option<i32> {
    let api: Api<Deployment> = Api::namespaced(cluster.client.clone(), namespace);
    api.get_opt(name)
        .await
        .expect("get deployment")
        .and_then(|d| d.spec)
        .and_then(|s| s.replicas)
}

async fn count_labelled(cluster: &SimCluster, release: &str) -> Vec<String> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={release}"));
    let c = &cluster.client;
    let mut left = Vec::new();
    macro_rules! collect {
        ($k:ty, $api:expr) => {
            let api: Api<$k> = $api;
            for o in api.list(&lp).await.expect("list") {
                left.push(format!(
                    "{} {}",
                    stringify!($k),
                    o.metadata.name.unwrap_or_default()
                ));
            }
        };
    }
    collect!(Deployment, Api::all(c.clone()));
    collect!(PodDisruptionBudget, Api::all(c.clone()));
    collect!(Role, Api::all(c.clone()));
    collect!(RoleBinding, Api::all(c.clone()));
    collect!(ClusterRole, Api::all(c.clone()));
    collect!(ClusterRoleBinding, Api::all(c.clone()));
    collect!(
        k8s_openapi::api::core::v1::ServiceAccount,
        Api::all(c.clone())
    );
    collect!(k8s_openapi::api::core::v1::Service, Api::all(c.clone()));
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lint_is_clean() {
    let result = match helm::lint().await {
        Err(HelmError::Unavailable(why)) => {
            return skip_or_fail("Helm's library (pip install helm-sdkpy)", why);
        }
        other => ok(other, "helm lint"),
    };
    assert_eq!(result["TotalChartsLinted"], 1, "{result}");
    assert!(result["Errors"].is_null(), "lint errors: {result}");
    // Helm's severities: 1 info (the missing icon), 2 warning, 3 error.
    let serious: Vec<&Value> = result["Messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["Severity"].as_i64().unwrap_or(3) > 1)
        .collect();
    assert!(serious.is_empty(), "lint warnings or errors: {serious:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_install_works_on_a_bare_cluster_and_says_where_the_config_goes() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let release = ok(
        helm::install(&cluster, "capstan", NS, &json!({})).await,
        "install with default values",
    );
    assert_eq!(release["info"]["status"], "deployed", "{release}");
    // nodeslo reads slo-controller-config in the release namespace, where its Role is.
    let rendered = objects(&release);
    let nodeslo = rendered
        .iter()
        .find(|o| {
            o["kind"] == "Deployment" && o["metadata"]["name"] == "capstan-nodeslo-controller"
        })
        .expect("nodeslo Deployment");
    let args = nodeslo["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains(&format!("--config-namespace={NS}")), "{args}");
    let roles: Api<Role> = Api::namespaced(cluster.client.clone(), NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=nodeslo-controller");
    assert_eq!(roles.list(&lp).await.expect("list").items.len(), 1);
    let notes = release["info"]["notes"].as_str().unwrap_or_default();
    assert!(
        notes.contains(&format!(
            "reads ConfigMap {NS}/slo-controller-config (the release"
        )),
        "{notes}"
    );
    assert!(
        notes.contains("configNamespace=koordinator-system"),
        "{notes}"
    );
    // Naming a namespace that does not exist fails with Helm's message naming it.
    let err = helm::upgrade(
        &cluster,
        "capstan",
        NS,
        &json!({"controllers": {"nodeslo-controller": {"configNamespace": "koordinator-system"}}}),
    )
    .await
    .expect_err("koordinator-system does not exist here");
    assert!(format!("{err:?}").contains("koordinator-system"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_component_installs_then_upgrades() {
    let Some(cluster) = cluster_for_everything().await else {
        return;
    };
    let release = ok(
        helm::install(&cluster, "capstan", NS, &everything()).await,
        "install",
    );
    assert_eq!(release["info"]["status"], "deployed", "{release}");
    let rendered = objects(&release);
    for object in &rendered {
        let labels = &object["metadata"]["labels"];
        for label in RECOMMENDED_LABELS {
            assert!(
                labels[label].is_string(),
                "{} {} lacks {label}",
                object["kind"],
                object["metadata"]["name"]
            );
        }
        assert_eq!(labels["app.kubernetes.io/instance"], "capstan");
        assert_eq!(labels["app.kubernetes.io/version"], "0.1.0");
    }
    for component in [
        "machineclass-controller",
        "machineset-controller",
        "nodeslo-controller",
        "gw-recycler",
        "sidecars",
    ] {
        assert!(
            deployment_replicas(&cluster, NS, &format!("capstan-{component}"))
                .await
                .is_some(),
            "no Deployment for {component}"
        );
    }
    assert_eq!(
        names_of(&rendered, "PodDisruptionBudget"),
        vec!["capstan-machineclass-controller"],
        "a PDB exactly for the component with replicas > 1"
    );
    let hook = rendered
        .iter()
        .find(|o| o["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .expect("a helm test hook");
    let script = hook["spec"]["containers"][0]["args"][0]
        .as_str()
        .unwrap_or_default();
    for service in [
        "capstan-machineclass-controller-metrics:8080/readyz",
        "capstan-machineset-controller-metrics:8080/readyz",
        "capstan-nodeslo-controller-metrics:8080/readyz",
        "capstan-gw-recycler-metrics:8080/readyz",
    ] {
        assert!(
            script.contains(service),
            "test hook misses {service}: {script}"
        );
    }
    let gw = rendered
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "capstan-gw-recycler")
        .expect("gw-recycler Deployment");
    let args = gw["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("--hub-kubeconfig=/etc/capstan/hub/kubeconfig"),
        "{args}"
    );
    assert!(args.contains("--hub-namespace=kubeslice-demo"), "{args}");
    assert!(args.contains("--role=auto"), "{args}");
    assert!(args.contains("--namespace=kubeslice-system"), "{args}");
    assert!(
        args.contains("--gateway-image=ghcr.io/capstan/capstan:0.1.0"),
        "{args}"
    );
    // Its worker rules are a Role in the gateway namespace, nothing cluster-wide.
    let gw_role = rendered
        .iter()
        .find(|o| o["kind"] == "Role" && o["metadata"]["namespace"] == "kubeslice-system")
        .expect("gw-recycler Role in the gateway namespace");
    assert_eq!(
        gw_role["metadata"]["name"],
        "capstan-system-capstan-gw-recycler"
    );
    assert!(
        !names_of(&rendered, "ClusterRole")
            .iter()
            .any(|n| n.contains("gw-recycler")),
        "no ClusterRole for the gw-recycler"
    );
    assert_eq!(
        gw["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        "hub-kubeconfig"
    );
    let mc = rendered
        .iter()
        .find(|o| {
            o["kind"] == "Deployment" && o["metadata"]["name"] == "capstan-machineclass-controller"
        })
        .expect("machineclass Deployment");
    let pod = &mc["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &pod["containers"][0];
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    let args = container["args"].to_string();
    assert!(args.contains("--leader-elect=true"), "{args}");
    assert!(args.contains("--namespace=capstan-system"), "{args}");
    assert!(
        pod["affinity"]["podAntiAffinity"].is_object(),
        "anti-affinity by default"
    );

    // Upgrade: nodeslo scales out (leader election, PDB, Lease Role), the gw-recycler goes.
    let mut values = everything();
    values["controllers"]["nodeslo-controller"] = json!({"replicas": 3});
    values["controllers"]["gw-recycler"] = json!({"enabled": false});
    let upgraded = ok(
        helm::upgrade(&cluster, "capstan", NS, &values).await,
        "upgrade",
    );
    assert_eq!(upgraded["info"]["status"], "deployed", "{upgraded}");
    assert_eq!(upgraded["version"], 2);
    assert_eq!(
        deployment_replicas(&cluster, NS, "capstan-nodeslo-controller").await,
        Some(3)
    );
    assert_eq!(
        deployment_replicas(&cluster, NS, "capstan-gw-recycler").await,
        None,
        "the disabled component's Deployment is removed"
    );
    let gw_roles: Api<Role> = Api::namespaced(cluster.client.clone(), "kubeslice-system");
    assert!(
        gw_roles
            .get_opt("capstan-system-capstan-gw-recycler")
            .await
            .expect("get")
            .is_none(),
        "and its Role in the gateway namespace"
    );
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client.clone(), NS);
    assert!(
        pdbs.get_opt("capstan-nodeslo-controller")
            .await
            .expect("get")
            .is_some()
    );
    let leases: Api<Role> = Api::namespaced(cluster.client.clone(), NS);
    assert!(
        leases
            .get_opt("capstan-nodeslo-controller-lease")
            .await
            .expect("get")
            .is_some()
    );
}

/// The `--namespace` of the rendered Deployment `name`.
fn namespace_flag(release: &Value, name: &str) -> String {
    let deployment = objects(release)
        .into_iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no Deployment {name}"));
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix("--namespace="))
        .unwrap_or_else(|| panic!("{name} has no --namespace"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machineset_controller_follows_the_machine_namespace_unless_told() {
    let Some(cluster) = cluster().await else {
        return;
    };
    cluster.create_namespaces(&["machines", "pools"]).await;
    let roles_in = |namespace: &str| {
        let roles: Api<Role> = Api::namespaced(cluster.client.clone(), namespace);
        async move {
            let lp =
                ListParams::default().labels("app.kubernetes.io/component=machineset-controller");
            let list = roles.list(&lp).await.expect("list");
            list.items
                .into_iter()
                .filter_map(|r| r.metadata.name)
                .collect::<Vec<_>>()
        }
    };
    // By default both machine controllers act on the release namespace.
    let release = ok(
        helm::install(&cluster, "capstan", NS, &json!({})).await,
        "install with default values",
    );
    assert_eq!(
        namespace_flag(&release, "capstan-machineset-controller"),
        NS
    );
    assert_eq!(roles_in(NS).await, ["capstan-machineset-controller"]);
    // machineclass-controller's namespace is machineset-controller's too, Role and all.
    let machines = json!({"controllers": {"machineclass-controller": {"namespace": "machines"}}});
    let upgraded = ok(
        helm::upgrade(&cluster, "capstan", NS, &machines).await,
        "upgrade",
    );
    assert_eq!(
        namespace_flag(&upgraded, "capstan-machineclass-controller"),
        "machines"
    );
    assert_eq!(
        namespace_flag(&upgraded, "capstan-machineset-controller"),
        "machines"
    );
    assert_eq!(
        roles_in("machines").await,
        ["capstan-system-capstan-machineset-controller"]
    );
    assert!(roles_in(NS).await.is_empty(), "the old Role is gone");
    let notes = upgraded["info"]["notes"].as_str().unwrap_or_default();
    assert!(
        notes.contains("rolls MachineDeployments in namespace\n\"machines\""),
        "{notes}"
    );
    assert!(
        !notes.contains("Note: machineclass-controller watches"),
        "{notes}"
    );
    // Its own namespace wins, and the notes say the Machines there need a machineclass-controller.
    let pools = json!({"controllers": {
        "machineclass-controller": {"namespace": "machines"},
        "machineset-controller": {"namespace": "pools"}
    }});
    let upgraded = ok(
        helm::upgrade(&cluster, "capstan", NS, &pools).await,
        "upgrade",
    );
    assert_eq!(
        namespace_flag(&upgraded, "capstan-machineset-controller"),
        "pools"
    );
    assert_eq!(
        roles_in("pools").await,
        ["capstan-system-capstan-machineset-controller"]
    );
    assert!(roles_in("machines").await.is_empty());
    let notes = upgraded["info"]["notes"].as_str().unwrap_or_default();
    assert!(
        notes.contains("Note: machineclass-controller watches \"machines\""),
        "{notes}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_release_in_another_namespace_coexists() {
    let Some(cluster) = cluster().await else {
        return;
    };
    // The same release name in two namespaces, and a third release: cluster-scoped names differ.
    ok(
        helm::install(&cluster, "capstan", NS, &json!({})).await,
        "first",
    );
    ok(
        helm::install(&cluster, "capstan", "team-b", &json!({})).await,
        "second",
    );
    ok(
        helm::install(&cluster, "edge", "team-c", &json!({})).await,
        "third",
    );
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    for name in [
        "capstan-system-capstan-machineclass-controller",
        "team-b-capstan-machineclass-controller",
        "team-c-edge-capstan-nodeslo-controller",
    ] {
        assert!(roles.get_opt(name).await.expect("get").is_some(), "{name}");
    }
    // Each release reads its NodeSLO config in its own namespace; Node Events go to `default`,
    // shared by the releases.
    let lp = ListParams::default().labels("app.kubernetes.io/component=nodeslo-controller");
    for namespace in [NS, "team-b", "team-c"] {
        let config_roles: Api<Role> = Api::namespaced(cluster.client.clone(), namespace);
        assert_eq!(
            config_roles.list(&lp).await.expect("list").items.len(),
            1,
            "{namespace}"
        );
    }
    let event_roles: Api<Role> = Api::namespaced(cluster.client.clone(), "default");
    assert_eq!(event_roles.list(&lp).await.expect("list").items.len(), 3);
    let bindings: Api<ClusterRoleBinding> = Api::all(cluster.client.clone());
    let binding = bindings
        .get("team-b-capstan-nodeslo-controller")
        .await
        .expect("binding");
    let subject = &binding.subjects.expect("subjects")[0];
    assert_eq!(subject.namespace.as_deref(), Some("team-b"));
    assert_eq!(subject.name, "capstan-nodeslo-controller");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_values_are_rejected_naming_the_field() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let cases = [
        (
            json!({"controllers": {"nodeslo-controller": {"replicas": "two"}}}),
            "/controllers/nodeslo-controller/replicas",
        ),
        (
            json!({"image": {"pullPolicy": "Sometimes"}}),
            "/image/pullPolicy",
        ),
        (
            json!({"common": {"metricsPort": "http"}}),
            "/common/metricsPort",
        ),
        (
            json!({"controllers": {"nodeslo-controler": {"enabled": true}}}),
            "nodeslo-controler",
        ),
        (
            json!({"controllers": {"gw-recycler": {"enabled": true}}}),
            "hub.kubeconfigSecret",
        ),
        (
            json!({"controllers": {"gw-recycler": {"role": "primary"}}}),
            "role",
        ),
        (
            json!({"controllers": {"gw-recycler": {"rebalance": "yes"}}}),
            "/controllers/gw-recycler/rebalance",
        ),
        (
            json!({"controllers": {"machineset-controller": {"namespace": 7}}}),
            "/controllers/machineset-controller/namespace",
        ),
        (
            json!({"controllers": {"machineset-controller": {"driver": "sim"}}}),
            "driver",
        ),
    ];
    for (i, (values, field)) in cases.iter().enumerate() {
        match helm::install(&cluster, &format!("bad-{i}"), NS, values).await {
            Err(HelmError::Failed(message)) => {
                assert!(message.contains(field), "{values}: {message}");
            }
            other => panic!("{values} was not rejected: {other:?}"),
        }
    }
    // Nothing was installed by the rejected attempts.
    for i in 0..cases.len() {
        assert!(
            count_labelled(&cluster, &format!("bad-{i}"))
                .await
                .is_empty(),
            "bad-{i} left objects"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_leaves_nothing_and_the_same_name_installs_again() {
    let Some(cluster) = cluster_for_everything().await else {
        return;
    };
    ok(
        helm::install(&cluster, "capstan", NS, &everything()).await,
        "install",
    );
    assert!(!count_labelled(&cluster, "capstan").await.is_empty());
    ok(helm::uninstall(&cluster, "capstan", NS).await, "uninstall");
    let left = count_labelled(&cluster, "capstan").await;
    assert!(left.is_empty(), "left after uninstall: {left:?}");
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), NS);
    let release_records = secrets
        .list(&ListParams::default().labels("owner=helm,name=capstan"))
        .await
        .expect("list");
    assert!(
        release_records.items.is_empty(),
        "Helm's release record is left"
    );
    let again = ok(
        helm::install(&cluster, "capstan", NS, &everything()).await,
        "reinstall",
    );
    assert_eq!(again["info"]["status"], "deployed");
    assert_eq!(again["version"], 1);
}

fn service_monitors(cluster: &SimCluster) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor");
    Api::namespaced_with(cluster.client.clone(), NS, &ApiResource::from_gvk(&gvk))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_monitors_select_exactly_each_metrics_service() {
    let Some(cluster) = cluster_for_everything().await else {
        return;
    };
    let mut values = everything();
    values["serviceMonitor"] = json!({"enabled": true, "labels": {"release": "prometheus"}});

    // Without the CRD, Helm refuses the release naming the missing kind, and installs nothing
    // (the template does not skip them quietly: the user asked for ServiceMonitors).
    match helm::install(&cluster, "capstan", NS, &values).await {
        Err(HelmError::Failed(message)) => assert!(
            message.contains(
                r#"no matches for kind "ServiceMonitor" in version "monitoring.coreos.com/v1""#
            ) && message.contains("ensure CRDs are installed first"),
            "{message}"
        ),
        other => panic!("installed a ServiceMonitor without its CRD: {other:?}"),
    }
    let left = count_labelled(&cluster, "capstan").await;
    assert!(left.is_empty(), "the refused install left {left:?}");

    capstan_testkit::install_crds(&cluster.client, [helm::monitoring_crd("ServiceMonitor")])
        .await
        .expect("ServiceMonitor CRD established");
    ok(
        helm::install(&cluster, "capstan", NS, &values).await,
        "install",
    );
    let monitors = service_monitors(&cluster);
    let services: Api<Service> = Api::namespaced(cluster.client.clone(), NS);
    let found = monitors.list(&ListParams::default()).await.expect("list");
    let mut names: Vec<String> = found
        .items
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    names.sort();
    // One per enabled controller; the standalone sidecars have no metrics Service.
    assert_eq!(
        names,
        [
            "capstan-gw-recycler",
            "capstan-machineclass-controller",
            "capstan-machineset-controller",
            "capstan-nodeslo-controller"
        ]
    );
    for monitor in &found.items {
        let name = monitor.metadata.name.clone().unwrap_or_default();
        let labels = monitor.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("release").map(String::as_str),
            Some("prometheus"),
            "{name}: serviceMonitor.labels"
        );
        let spec = &monitor.data["spec"];
        let selector: Vec<String> = spec["selector"]["matchLabels"]
            .as_object()
            .unwrap_or_else(|| panic!("{name}: no selector.matchLabels"))
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().expect("label value")))
            .collect();
        assert!(
            spec["selector"]["matchExpressions"].is_null() && spec["namespaceSelector"].is_null(),
            "{name}: {spec}"
        );
        let selected = services
            .list(&ListParams::default().labels(&selector.join(",")))
            .await
            .expect("list services");
        let selected_names: Vec<String> = selected
            .items
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        assert_eq!(
            selected_names,
            [format!("{name}-metrics")],
            "{name} selects exactly its metrics Service"
        );
        let ports: Vec<String> = selected.items[0]
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| p.name)
            .collect();
        let endpoints = spec["endpoints"].as_array().expect("endpoints");
        assert!(!endpoints.is_empty(), "{name}: no endpoint");
        for endpoint in endpoints {
            let port = endpoint["port"].as_str().unwrap_or_default();
            assert!(
                ports.iter().any(|p| p == port),
                "{name}: endpoint port {port:?} is not a port of its Service: {ports:?}"
            );
            assert_eq!(endpoint["interval"], "30s", "{name}");
        }
    }

    ok(helm::uninstall(&cluster, "capstan", NS).await, "uninstall");
    let after = monitors.list(&ListParams::default()).await.expect("list");
    assert!(
        after.items.is_empty(),
        "ServiceMonitors left after uninstall: {:?}",
        after
            .items
            .iter()
            .map(|m| &m.metadata.name)
            .collect::<Vec<_>>()
    );
}
