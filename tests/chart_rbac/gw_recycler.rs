//! gw-recycler on exactly its RBAC: on each worker cluster (server side and client side) the chart
//! is installed and the recycler runs as its chart ServiceAccount; on the hub, the Roles of
//! deploy/gw-recycler-hub-rbac.yaml are bound to the recyclers' hub identities and to the one that
//! runs `gw-recycler trigger`. Three recycles (the third re-uses a finished recycle's name, as a
//! trigger does), then a restart with a short retention deletes the finished CRs. With the chart's
//! `rebalance` switch, a rebalancing recycle runs on the Node grants the switch adds.

use std::collections::BTreeMap;
use std::path::Path;

use capstan_apis::networking::SliceGateway;
use capstan_apis::worker::WorkerSliceGwRecycler;
use capstan_gw_recycler::trigger::TriggerArgs;
use capstan_scenarios::slice::{
    add_gateway_node, configure_remote, gateway_pod_nodes, label_gateway_node, pair_gateways,
};
use capstan_testkit::kubeslice;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube_sim::kubelet::KubeletConfig;
use kube_sim::workloads::WorkloadOptions;

use super::*;

const HUB_NS: &str = "kubeslice-red";
const GW_NS: &str = "kubeslice-system";
const SLICE: &str = "red";
const SERVER_GW: &str = "red-a-b";
const CLIENT_GW: &str = "red-b-a";
/// Image of the router and gateway pods here: the kubelet runs its commands from the sidecars'
/// build folder.
const SIDECAR_IMAGE: &str = "capstan-test/sidecars";
/// The hub identities: one per worker's recycler, one for whoever triggers recycles.
const HUB_SERVER: &str = "recycler-server-worker";
const HUB_CLIENT: &str = "recycler-client-worker";
const HUB_TRIGGER: &str = "trigger";

/// A worker cluster: kube-sim with RBAC, workloads and the sidecars running as containers, the
/// chart installed with only the gw-recycler, a SliceGateway and the slice router pod.
struct Worker {
    cluster: SimCluster,
    release: Value,
    gateway: &'static str,
}

impl Worker {
    /// `rebalance`: the chart's `controllers.gw-recycler.rebalance`.
    async fn start(
        pod_cidr: &str,
        gateway: &'static str,
        host_type: &str,
        subnet: &str,
        rebalance: bool,
    ) -> Self {
        let sidecars = binary("sidecar-shim", "gw-sidecar");
        binary("sidecar-shim", "router-sidecar");
        let sidecar_dir = sidecars.parent().expect("binaries folder").to_path_buf();
        let cluster = helm::cluster_with(kube_sim::Config {
            simulate_workloads: true,
            workloads: WorkloadOptions {
                pod_cidr: pod_cidr.into(),
                ..WorkloadOptions::default()
            },
            kubelet: KubeletConfig {
                exec_images: vec![(SIDECAR_IMAGE.into(), sidecar_dir)],
                ..KubeletConfig::default()
            },
            ..kube_sim::Config::default()
        })
        .await;
        cluster.create_namespaces(&[GW_NS]).await;
        let values = json!({
            "controllers": {
                "nodeslo-controller": {"enabled": false},
                "machineclass-controller": {"enabled": false},
                "machineset-controller": {"enabled": false},
                "gw-recycler": {"enabled": true, "rebalance": rebalance}
            },
            "hub": {"kubeconfigSecret": "hub-kubeconfig", "namespace": HUB_NS}
        });
        let release = match helm::install(&cluster, "capstan", NS, &values).await {
            Ok(r) => r,
            Err(e) => panic!("install failed: {e:?}"),
        };
        let gateways: Api<SliceGateway> = Api::namespaced(cluster.client.clone(), GW_NS);
        eventually("CRDs served", WAIT, || async {
            gateways.list(&ListParams::default()).await.ok().map(drop)
        })
        .await;
        kubeslice::create_slice_gateway(&cluster.client, GW_NS, SLICE, gateway, host_type, subnet)
            .await
            .expect("SliceGateway");
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), GW_NS);
        let router = kubeslice::slice_router_pod(GW_NS, SLICE, SIDECAR_IMAGE, &[]);
        pods.create(&PostParams::default(), &router)
            .await
            .expect("router pod");
        Self {
            cluster,
            release,
            gateway,
        }
    }

    /// The recycler as the chart runs it (its flags, its ServiceAccount), with the hub identity
    /// `hub_kubeconfig`, gateway pods of the sidecar image, and `extra` flags.
    async fn spawn_recycler(
        &self,
        hub_kubeconfig: &Path,
        extra: &[&str],
    ) -> (BinaryUnderTest, tempfile::NamedTempFile) {
        let name = "capstan-gw-recycler";
        let kubeconfig = self.cluster.kubeconfig_as(NS, name);
        let path = kubeconfig.path().display().to_string();
        let mut args: Vec<String> = local_args(&self.release, name, &path)
            .into_iter()
            .map(|a| {
                if a.starts_with("--hub-kubeconfig=") {
                    format!("--hub-kubeconfig={}", hub_kubeconfig.display())
                } else if a.starts_with("--gateway-image=") {
                    format!("--gateway-image={SIDECAR_IMAGE}")
                } else {
                    a
                }
            })
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let bin = BinaryUnderTest::spawn_with_env(
            binary("gw-recycler", "gw-recycler"),
            &args,
            &[("POD_NAMESPACE", NS), ("POD_NAME", "pod-0")],
        )
        .await
        .expect("gw-recycler starts");
        (bin, kubeconfig)
    }

    /// Waits until deployment `name` has a Running pod.
    async fn wait_running(&self, name: &str, output: impl Fn() -> String) {
        let pods: Api<Pod> = Api::namespaced(self.cluster.client.clone(), GW_NS);
        let what = format!("{} runs {name}", self.gateway);
        eventually_with(&what, WAIT, output, || async {
            let lp = ListParams::default().labels(&format!("kubeslice.io/slice-gw-dep={name}"));
            let list = pods.list(&lp).await.ok()?;
            list.items
                .iter()
                .any(|p| {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        && p.metadata.deletion_timestamp.is_none()
                })
                .then_some(())
        })
        .await;
    }
}

/// The hub: Capstan's CRDs, the project namespace, and deploy/gw-recycler-hub-rbac.yaml's Roles
/// bound as the file says; the `-rebalance` Role (to the server side's identity) only with
/// `rebalance`. Returns each bound Role's grants by name.
async fn hub(rebalance: bool) -> (SimCluster, BTreeMap<String, BTreeSet<Grant>>) {
    let hub = SimCluster::start_with(kube_sim::Config {
        auth: kube_sim::auth::AuthConfig {
            rbac: true,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    hub.create_namespaces(&[HUB_NS]).await;
    let file = capstan_scenarios::tools::workspace_root().join("deploy/gw-recycler-hub-rbac.yaml");
    let parsed = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(&file)
        .output()
        .expect("python3 runs");
    assert!(
        parsed.status.success(),
        "{}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let docs: Vec<Value> = serde_json::from_slice(&parsed.stdout).expect("YAML as JSON");
    let roles: Api<Role> = Api::namespaced(hub.client.clone(), HUB_NS);
    let bindings: Api<RoleBinding> = Api::namespaced(hub.client.clone(), HUB_NS);
    let mut grants = BTreeMap::new();
    for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
        assert_eq!(
            doc["kind"], "Role",
            "the hub file holds namespaced Roles only"
        );
        doc["metadata"]["namespace"] = json!(HUB_NS);
        let role: Role = from_json(doc);
        let name = role.metadata.name.clone().expect("role name");
        if name.ends_with("-rebalance") && !rebalance {
            continue;
        }
        roles
            .create(&PostParams::default(), &role)
            .await
            .expect("hub role");
        let subjects: &[&str] = if name.ends_with("-trigger") {
            &[HUB_TRIGGER]
        } else if name.ends_with("-rebalance") {
            &[HUB_SERVER]
        } else {
            &[HUB_SERVER, HUB_CLIENT]
        };
        let binding = json!({"metadata": {"name": name, "namespace": HUB_NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subjects.iter().map(|sa| json!(
                {"kind": "ServiceAccount", "name": sa, "namespace": HUB_NS})).collect::<Vec<_>>()});
        bindings
            .create(&PostParams::default(), &from_json(binding))
            .await
            .expect("hub role binding");
        grants.insert(name, grants_of(role.rules.unwrap_or_default()));
    }
    (hub, grants)
}

fn hub_user(name: &str) -> String {
    format!("system:serviceaccount:{HUB_NS}:{name}")
}

/// `gw-recycler trigger --wait` as the trigger identity; panics unless the recycle reached `end`.
async fn trigger(kubeconfig: &Path, extra: &[&str], output: impl Fn() -> String) {
    let args = TriggerArgs {
        wait: true,
        ..TriggerArgs::new(kubeconfig, HUB_NS, SLICE, SERVER_GW, CLIENT_GW)
    }
    .to_args();
    let run = tokio::process::Command::new(binary("gw-recycler", "gw-recycler"))
        .args(&args)
        .args(extra)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .unwrap_or_else(|_| panic!("trigger {extra:?} did not finish\n{}", output()))
        .expect("trigger runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout.lines().rfind(|l| l.starts_with("state: ")) == Some("state: end"),
        "trigger {extra:?}: {stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gw_recycler_runs_on_exactly_the_chart_and_hub_rbac() {
    if !helm::available().await {
        return;
    }
    let (hub, hub_grants) = hub(false).await;
    let server = Worker::start("127.60.0.0/16", SERVER_GW, "Server", "10.2.0.0/16", false).await;
    let client = Worker::start("127.61.0.0/16", CLIENT_GW, "Client", "10.1.0.0/16", false).await;
    // The hub identities' ServiceAccounts (bound in `hub`) and their kubeconfigs.
    let hub_server = hub.service_account_kubeconfig(HUB_NS, HUB_SERVER).await;
    let hub_client = hub.service_account_kubeconfig(HUB_NS, HUB_CLIENT).await;
    let hub_trigger = hub.service_account_kubeconfig(HUB_NS, HUB_TRIGGER).await;
    let fast = ["--drain-delay=0s", "--step-timeout=30s"];
    let (mut server_bin, _k1) = server.spawn_recycler(hub_server.path(), &fast).await;
    let (mut client_bin, _k2) = client.spawn_recycler(hub_client.path(), &fast).await;
    let first_output = |server_bin: &BinaryUnderTest, client_bin: &BinaryUnderTest| {
        format!(
            "--- server worker ---\n{}\n--- client worker ---\n{}",
            server_bin.output().join("\n"),
            client_bin.output().join("\n")
        )
    };
    let output = || first_output(&server_bin, &client_bin);
    for (worker, gw) in [(&server, SERVER_GW), (&client, CLIENT_GW)] {
        for instance in 0..2 {
            worker
                .wait_running(&format!("{gw}-{instance}-0"), output)
                .await;
        }
    }

    // Instance 0 to generation 1, back to 0 (the second recycle names its deployments), then
    // to 1 again under the first recycle's name: the trigger deletes the finished CR first.
    trigger(hub_trigger.path(), &[], output).await;
    trigger(
        hub_trigger.path(),
        &[
            "--server-deployment",
            "red-a-b-0-1",
            "--client-deployment",
            "red-b-a-0-1",
        ],
        output,
    )
    .await;
    trigger(hub_trigger.path(), &[], output).await;
    for (worker, gw) in [(&server, SERVER_GW), (&client, CLIENT_GW)] {
        let deployments: Api<Deployment> = Api::namespaced(worker.cluster.client.clone(), GW_NS);
        let what = format!("{gw} serves via generation 1 of instance 0 only");
        eventually_with(&what, WAIT, output, || async {
            let names: BTreeSet<String> = deployments
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|d| d.metadata.deletion_timestamp.is_none())
                .filter_map(|d| d.metadata.name)
                .collect();
            let want: BTreeSet<String> = [format!("{gw}-0-1"), format!("{gw}-1-0")].into();
            (names == want).then_some(())
        })
        .await;
    }

    // Restarted with a short retention, the recycler deletes the finished CRs.
    let first_run = output();
    for bin in [&mut server_bin, &mut client_bin] {
        bin.sigterm().expect("SIGTERM");
        let exited = bin.wait_exit(Duration::from_secs(20)).await.expect("exits");
        assert!(exited.success(), "gw-recycler drained badly:\n{first_run}");
    }
    let short = ["--drain-delay=0s", "--step-timeout=30s", "--retention=1s"];
    let (server_bin, _k3) = server.spawn_recycler(hub_server.path(), &short).await;
    let (client_bin, _k4) = client.spawn_recycler(hub_client.path(), &short).await;
    let output = || {
        format!(
            "{first_run}\n--- restarted ---\n{}",
            first_output(&server_bin, &client_bin)
        )
    };
    let recyclers: Api<WorkerSliceGwRecycler> = Api::namespaced(hub.client.clone(), HUB_NS);
    eventually_with("finished recycles deleted", WAIT, output, || async {
        let list = recyclers.list(&ListParams::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;

    for worker in [&server, &client] {
        assert_rbac_sufficient_and_minimal(&worker.cluster, "gw-recycler", &output()).await;
    }
    for (role, grants) in &hub_grants {
        let users: Vec<String> = if role.ends_with("-trigger") {
            vec![hub_user(HUB_TRIGGER)]
        } else {
            vec![hub_user(HUB_SERVER), hub_user(HUB_CLIENT)]
        };
        assert_users_need_exactly(&hub, &users, grants, &format!("hub Role {role}"), &output());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gw_recycler_rebalances_on_the_charts_node_grants() {
    if !helm::available().await {
        return;
    }
    let (hub, hub_grants) = hub(true).await;
    let server = Worker::start("127.62.0.0/16", SERVER_GW, "Server", "10.2.0.0/16", true).await;
    let client = Worker::start("127.63.0.0/16", CLIENT_GW, "Client", "10.1.0.0/16", false).await;
    let args = local_args(&server.release, "capstan-gw-recycler", "-");
    assert!(args.iter().any(|a| a == "--rebalance"), "{args:?}");
    let node_grants: BTreeSet<Grant> = {
        let lp = ListParams::default()
            .labels("app.kubernetes.io/instance=capstan,app.kubernetes.io/component=gw-recycler");
        let roles: Api<ClusterRole> = Api::all(server.cluster.client.clone());
        let list = roles.list(&lp).await.expect("list");
        assert_eq!(list.items.len(), 1, "one ClusterRole for --rebalance");
        grants_of(
            list.items
                .into_iter()
                .flat_map(|r| r.rules.unwrap_or_default()),
        )
    };
    let client_roles: Api<ClusterRole> = Api::all(client.cluster.client.clone());
    assert!(
        client_roles
            .list(&ListParams::default().labels("app.kubernetes.io/component=gw-recycler"))
            .await
            .expect("list")
            .items
            .is_empty(),
        "without rebalance the gw-recycler gets no ClusterRole"
    );

    // The server knows its peer gateway and VPN address (a rebalancing recycle names both
    // gateways, and the pair its sidecar names).
    configure_remote(&server.cluster.client).await;
    let hub_server = hub.service_account_kubeconfig(HUB_NS, HUB_SERVER).await;
    let hub_client = hub.service_account_kubeconfig(HUB_NS, HUB_CLIENT).await;
    let fast = ["--drain-delay=0s", "--step-timeout=30s"];
    let (server_bin, _k1) = server.spawn_recycler(hub_server.path(), &fast).await;
    let (client_bin, _k2) = client.spawn_recycler(hub_client.path(), &fast).await;
    let output = || {
        format!(
            "--- server worker ---\n{}\n--- client worker ---\n{}",
            server_bin.output().join("\n"),
            client_bin.output().join("\n")
        )
    };

    // Each server pod's tunnel reaches the client pod of its instance.
    pair_gateways(
        &server.cluster.client,
        &client.cluster.client,
        &[
            ("red-a-b-0-0", "red-b-a-0-0"),
            ("red-a-b-1-0", "red-b-a-1-0"),
        ],
    )
    .await;

    // Both gateway pods run on kube-sim's one node; it and a second node become gateway nodes,
    // so the first holds 2 > ceil(2/2) pods.
    let crowded = eventually_with("two gateway pods on one node", WAIT, output, || async {
        let nodes = gateway_pod_nodes(&server.cluster.client, GW_NS, SERVER_GW).await;
        (nodes.len() == 2 && nodes[0] == nodes[1]).then(|| nodes[0].clone())
    })
    .await;
    label_gateway_node(&server.cluster.client, &crowded).await;
    add_gateway_node(&server.cluster.client, "gateway-2").await;

    let recyclers: Api<WorkerSliceGwRecycler> = Api::namespaced(hub.client.clone(), HUB_NS);
    let done = eventually_with("the rebalancing recycle at end", WAIT, output, || async {
        let list = recyclers.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|cr| cr.spec.state.as_ref().map(|s| s.as_str()) == Some("end"))
    })
    .await;
    assert_eq!(done.metadata.name.as_deref(), Some("red-a-b-0-0"));

    // Zero 403s for either worker's ServiceAccount, the Node grants both used on the server's;
    // on the hub, zero 403s for both recyclers and the rebalance Role's create used.
    let user = format!("system:serviceaccount:{NS}:capstan-gw-recycler");
    assert_users_need_exactly(
        &server.cluster,
        std::slice::from_ref(&user),
        &node_grants,
        "gw-recycler --rebalance",
        &output(),
    );
    assert_users_need_exactly(
        &client.cluster,
        &[user],
        &BTreeSet::new(),
        "gw-recycler (client side)",
        &output(),
    );
    let rebalance_grants = hub_grants
        .get("capstan-gw-recycler-rebalance")
        .expect("the hub file's rebalance Role");
    assert_users_need_exactly(
        &hub,
        &[hub_user(HUB_SERVER), hub_user(HUB_CLIENT)],
        rebalance_grants,
        "hub Role capstan-gw-recycler-rebalance",
        &output(),
    );
}
