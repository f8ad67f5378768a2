//! The chart with `sharding.enabled` and three replicas of nodeslo-controller and
//! machineclass-controller: each replica runs as its chart ServiceAccount with the rendered
//! flags and its own pod name, every replica gets a share, and the grants the switch adds (the
//! shard Leases: list, watch, update) are used with zero 403s.
//!
//! Not minimal by construction for one verb: `delete` on Leases is the sharder's clean-up of a
//! Lease released for a minute (`ORPHANED_AFTER`), longer than this scenario runs; the other
//! grants are checked both ways by the unsharded scenarios.

use std::collections::{BTreeMap, BTreeSet};

use capstan_apis::slo::NodeSlo;

use super::*;

const REPLICAS: usize = 3;

/// `component`'s replicas, `pod-0` .. `pod-2`, as its chart ServiceAccount with the chart's flags.
async fn replicas_as_service_account(
    cluster: &SimCluster,
    release: &Value,
    package: &str,
    component: &str,
    extra: &[&str],
) -> (Vec<BinaryUnderTest>, tempfile::NamedTempFile) {
    let name = format!("capstan-{component}");
    let kubeconfig = cluster.kubeconfig_as(NS, &name);
    let path = kubeconfig.path().display().to_string();
    let mut args = local_args(release, &name, &path);
    assert!(
        args.iter().any(|a| a == "--shards=auto")
            && args.iter().any(|a| a == "--leader-elect=true"),
        "the chart renders sharding for {component}: {args:?}"
    );
    args.extend(extra.iter().map(|s| s.to_string()));
    // Short Leases, so that the scenario does not wait for the defaults' 15 s.
    args.extend([
        "--lease-duration-seconds=4".to_owned(),
        "--lease-grace-seconds=2".to_owned(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut bins = Vec::new();
    for i in 0..REPLICAS {
        let pod = format!("{component}-pod-{i}");
        let bin = BinaryUnderTest::spawn_with_env(
            binary(package, component),
            &args,
            &[("POD_NAMESPACE", NS), ("POD_NAME", pod.as_str())],
        )
        .await
        .expect("controller starts");
        bins.push(bin);
    }
    (bins, kubeconfig)
}

/// The chart installed with only `component` of the sharded pair, `settings` merged into its
/// values with three sharded replicas, its CRDs served; `None` without Helm's library.
async fn installed_sharded(component: &str, settings: Value) -> Option<(SimCluster, Value)> {
    if !helm::available().await {
        return None;
    }
    let cluster = helm::cluster().await;
    cluster.create_namespaces(&[CONFIG_NS, MACHINES]).await;
    let mut values = settings;
    values["replicas"] = json!(REPLICAS);
    values["sharding"] = json!({"enabled": true});
    let mut controllers = json!({
        "machineclass-controller": {"enabled": false},
        "machineset-controller": {"enabled": false},
        "nodeslo-controller": {"enabled": false},
    });
    controllers[component] = values;
    let release = helm::install(
        &cluster,
        "capstan",
        NS,
        &json!({"controllers": controllers}),
    )
    .await
    .unwrap_or_else(|e| panic!("install failed: {e:?}"));
    let slos: Api<NodeSlo> = Api::all(cluster.client.clone());
    eventually("CRDs served", WAIT, || async {
        slos.list(&ListParams::default()).await.ok().map(drop)
    })
    .await;
    Some((cluster, release))
}

/// Every replica's output, one after the other.
fn joined_output(bins: &[BinaryUnderTest]) -> String {
    bins.iter()
        .map(|b| b.output().join("\n"))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// Objects per value of `label` among `labels`.
fn per_shard<'a>(
    labels: impl Iterator<Item = Option<&'a BTreeMap<String, String>>>,
    label: &str,
) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for labels in labels {
        if let Some(shard) = labels.and_then(|l| l.get(label)) {
            *counts.entry(shard.clone()).or_default() += 1;
        }
    }
    counts
}

/// The Lease verbs `users` used successfully so far.
fn lease_verbs_used(cluster: &SimCluster, users: &[String]) -> BTreeSet<String> {
    cluster
        .sim
        .requests()
        .counts
        .keys()
        .filter(|k| {
            users.contains(&k.user)
                && k.code < 400
                && k.group == "coordination.k8s.io"
                && k.resource == "leases"
        })
        .map(|k| k.verb.clone())
        .collect()
}

/// The Lease grants `sharding.enabled` adds, each used by a successful request of `users` (a
/// renewal is an `update` a moment after the start), and no request of theirs refused.
async fn assert_sharded_grants_used(
    cluster: &SimCluster,
    users: &[String],
    what: &str,
    output: impl Fn() -> String,
) {
    let wanted = ["list", "watch", "update", "create", "get", "patch"];
    eventually_with("every sharding grant used", WAIT, &output, || async {
        let used = lease_verbs_used(cluster, users);
        wanted.iter().all(|verb| used.contains(*verb)).then_some(())
    })
    .await;
    let stats = cluster.sim.requests();
    let forbidden: Vec<_> = stats
        .counts
        .iter()
        .filter(|(k, _)| users.contains(&k.user) && k.code == 403)
        .collect();
    assert!(
        forbidden.is_empty(),
        "{what} was refused: {forbidden:#?}\n{}",
        output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sharded_replicas_of_nodeslo_share_the_nodes_on_the_chart_rbac() {
    let settings = json!({"configNamespace": CONFIG_NS});
    let Some((cluster, release)) = installed_sharded("nodeslo-controller", settings).await else {
        return;
    };
    let admin = cluster.client.clone();
    let slos: Api<NodeSlo> = Api::all(admin.clone());
    let nodes: Api<Node> = Api::all(admin.clone());
    for i in 0..90 {
        nodes
            .create(
                &PostParams::default(),
                &from_json(json!({"metadata": {"name": format!("n{i:02}")}})),
            )
            .await
            .expect("node");
    }
    let (bins, _kubeconfig) = replicas_as_service_account(
        &cluster,
        &release,
        "nodeslo-controller",
        "nodeslo-controller",
        &[],
    )
    .await;
    let output = || joined_output(&bins);
    let counts = eventually_with("90 NodeSLOs over three replicas", WAIT, output, || async {
        let list = slos.list(&ListParams::default()).await.ok()?;
        let counts = per_shard(
            list.items.iter().map(|s| s.metadata.labels.as_ref()),
            "shard.sharding.capstan.dev/nodeslo",
        );
        (list.items.len() == 90 && counts.values().sum::<usize>() == 90 && counts.len() == REPLICAS)
            .then_some(counts)
    })
    .await;
    assert!(
        counts.values().all(|n| *n >= 15),
        "each replica owns a share: {counts:?}"
    );
    let user = format!("system:serviceaccount:{NS}:capstan-nodeslo-controller");
    assert_sharded_grants_used(&cluster, &[user], "sharded nodeslo-controller", output).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sharded_replicas_of_machineclass_share_the_machines_on_the_chart_rbac() {
    use capstan_apis::machine::Machine;
    let settings = json!({"namespace": MACHINES});
    let Some((cluster, release)) = installed_sharded("machineclass-controller", settings).await
    else {
        return;
    };
    let admin = cluster.client.clone();
    let machines: Api<Machine> = Api::namespaced(admin.clone(), MACHINES);
    eventually("Machines served", WAIT, || async {
        machines.list(&ListParams::default()).await.ok().map(drop)
    })
    .await;
    let pp = PostParams::default();
    create_sim_class(&admin).await;
    for i in 0..30 {
        machines
            .create(&pp, &from_json(machine(&format!("m{i:02}"), json!({}))))
            .await
            .expect("machine");
    }
    let (bins, _kubeconfig) = replicas_as_service_account(
        &cluster,
        &release,
        "machineclass-controller",
        "machineclass-controller",
        &["--short-retry=500ms", "--sim-ready-delay=1s"],
    )
    .await;
    let output = || joined_output(&bins);
    let counts = eventually_with(
        "30 Machines Running over three replicas",
        WAIT,
        output,
        || async {
            let list = machines.list(&ListParams::default()).await.ok()?;
            let running = list
                .items
                .iter()
                .all(|m| m.phase().map(|p| p.as_str().to_owned()).as_deref() == Some("Running"));
            let counts = per_shard(
                list.items.iter().map(|m| m.metadata.labels.as_ref()),
                "shard.sharding.capstan.dev/machineclass",
            );
            (list.items.len() == 30 && running && counts.len() == REPLICAS).then_some(counts)
        },
    )
    .await;
    assert_eq!(
        counts.values().sum::<usize>(),
        30,
        "every Machine owned: {counts:?}"
    );
    let user = format!("system:serviceaccount:{NS}:capstan-machineclass-controller");
    assert_sharded_grants_used(&cluster, &[user], "sharded machineclass-controller", output).await;
}
