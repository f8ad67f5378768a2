//! nodeslo-controller sharded (`--shards auto`): three and then five and two replicas of the
//! real binary against kube-sim. Every NodeSLO ends correct, each replica owns about its share,
//! and kube-sim's write journal proves that no replica ever wrote a NodeSLO that was not its
//! own at that moment (the writer's identity is in its User-Agent), through a kill -9, a
//! restart and scaling while the config changes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use capstan_apis::slo::NodeSlo;
use capstan_runtime::cli::identity_of_user_agent;
use capstan_scenarios::tools::binary;
use capstan_testkit::objects;
use capstan_testkit::process::BinaryUnderTest;
use capstan_testkit_sim::SimCluster;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_sim::ObjectWrite;

const RING_LABEL: &str = "shard.sharding.capstan.dev/nodeslo";
const DRAIN_LABEL: &str = "drain.sharding.capstan.dev/nodeslo";
const LEASE_SECONDS: u64 = 4;
const CONFIG_NS: &str = "koordinator-system";
const CONFIG_NAME: &str = "slo-controller-config";
const CONVERGE: Duration = Duration::from_secs(90);

/// kube-sim with the NodeSLO journal on and the config namespace, the config at 40%.
async fn journaled_cluster() -> SimCluster {
    let cluster = SimCluster::start().await;
    cluster.sim.journal_writes("slo.koordinator.sh", "nodeslos");
    cluster.create_namespaces(&[CONFIG_NS]).await;
    set_threshold(&cluster, 40).await;
    cluster
}

/// Creates Nodes `node-00000` .. for `n`, 16 at a time.
async fn create_nodes(cluster: &SimCluster, n: usize) {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    futures::stream::iter(0..n)
        .for_each_concurrent(16, |i| {
            let nodes = nodes.clone();
            async move {
                let node = objects::node(&format!("node-{i:05}"), &[("pool", "p")]);
                nodes
                    .create(&PostParams::default(), &node)
                    .await
                    .expect("node created");
            }
        })
        .await;
}

/// Deletes Nodes `node-<i>` for `range`.
async fn delete_nodes(cluster: &SimCluster, range: std::ops::Range<usize>) {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    for i in range {
        nodes
            .delete(&format!("node-{i:05}"), &DeleteParams::default())
            .await
            .expect("node deleted");
    }
}

/// Creates or changes the cluster's `cpuSuppressThresholdPercent`.
async fn set_threshold(cluster: &SimCluster, percent: i64) {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), CONFIG_NS);
    let text = format!(r#"{{"clusterStrategy":{{"cpuSuppressThresholdPercent":{percent}}}}}"#);
    let cm = objects::config_map(
        CONFIG_NS,
        CONFIG_NAME,
        &[("resource-threshold-config", text.as_str())],
    );
    api.patch(
        CONFIG_NAME,
        &PatchParams::apply("sharding-test").force(),
        &Patch::Apply(&cm),
    )
    .await
    .expect("config applied");
}

/// A replica of the real binary with shard id `id`.
async fn replica(cluster: &SimCluster, id: &str) -> BinaryUnderTest {
    replica_with(cluster, id, &[]).await
}

/// [`replica`] with `extra` flags.
async fn replica_with(cluster: &SimCluster, id: &str, extra: &[&str]) -> BinaryUnderTest {
    let path = binary("nodeslo-controller", "nodeslo-controller");
    let duration = LEASE_SECONDS.to_string();
    let mut args = vec![
        "--shards",
        "auto",
        "--leader-elect",
        "--lease-identity",
        id,
        "--lease-duration-seconds",
        &duration,
        "--lease-grace-seconds",
        "2",
        "--log-level",
        "info,kube=warn",
    ];
    args.extend_from_slice(extra);
    cluster.spawn(path.to_str().expect("path"), &args).await
}

/// Waits until each of `ids` holds its shard Lease.
async fn wait_for_shards(cluster: &SimCluster, ids: &[&str]) {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), "default");
    for id in ids {
        capstan_testkit::lease::wait_for_holder(
            &leases,
            &format!("nodeslo-{id}"),
            id,
            Duration::from_secs(30),
        )
        .await;
    }
}

/// The NodeSLOs by name: (threshold, shard label, draining).
async fn slos(cluster: &SimCluster) -> BTreeMap<String, (Option<i64>, Option<String>, bool)> {
    let api: Api<NodeSlo> = Api::all(cluster.client.clone());
    let list = api.list(&ListParams::default()).await.expect("list");
    list.items
        .into_iter()
        .map(|slo| {
            let labels = slo.metadata.labels.clone().unwrap_or_default();
            let threshold = slo
                .spec
                .resource_used_threshold_with_be
                .and_then(|t| t.cpu_suppress_threshold_percent);
            (
                slo.metadata.name.unwrap_or_default(),
                (
                    threshold,
                    labels.get(RING_LABEL).cloned(),
                    labels.contains_key(DRAIN_LABEL),
                ),
            )
        })
        .collect()
}

/// Waits until there are `n` NodeSLOs, all at `percent`, none draining, each owned by one of
/// `shards`; returns the count per shard.
async fn converged(
    cluster: &SimCluster,
    n: usize,
    percent: i64,
    shards: &[&str],
) -> BTreeMap<String, usize> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let slos = slos(cluster).await;
        let done = |(value, shard, draining): &(Option<i64>, Option<String>, bool)| {
            *value == Some(percent)
                && !draining
                && shard.as_deref().is_some_and(|s| shards.contains(&s))
        };
        let wrong: Vec<_> = slos.iter().filter(|(_, slo)| !done(slo)).collect();
        if slos.len() == n && wrong.is_empty() {
            let mut per_shard = BTreeMap::new();
            for (_, shard, _) in slos.values() {
                *per_shard
                    .entry(shard.clone().unwrap_or_default())
                    .or_default() += 1;
            }
            return per_shard;
        }
        let wrong = &wrong[..wrong.len().min(3)];
        assert!(
            Instant::now() < deadline,
            "not converged to {percent}% over {shards:?} within {CONVERGE:?}: {} NodeSLOs, e.g. {wrong:?}",
            slos.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How long after `since` no NodeSLO carries `shard`'s label any more, followed on a watch (a
/// list poll would add its own period to the figure).
async fn owned_by_none_of(cluster: &SimCluster, shard: &str, since: Instant) -> Duration {
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<NodeSlo> = Api::all(cluster.client.clone());
    let mut owners: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut listed = false;
    let events = watcher(api, watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    let deadline = tokio::time::Instant::now() + CONVERGE;
    loop {
        if listed && !owners.values().any(|owner| owner.as_deref() == Some(shard)) {
            return since.elapsed();
        }
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("{shard} still owns NodeSLOs after {CONVERGE:?}"))
            .expect("watch goes on")
            .expect("watch event");
        let owner = |slo: &NodeSlo| {
            let labels = slo.metadata.labels.as_ref();
            shard_of(labels).map(str::to_owned)
        };
        match event {
            watcher::Event::Apply(slo) | watcher::Event::InitApply(slo) => {
                owners.insert(slo.metadata.name.clone().unwrap_or_default(), owner(&slo));
            }
            watcher::Event::Delete(slo) => {
                owners.remove(&slo.metadata.name.unwrap_or_default());
            }
            watcher::Event::Init => owners.clear(),
            watcher::Event::InitDone => listed = true,
        }
    }
}

fn shard_of(labels: Option<&BTreeMap<String, String>>) -> Option<&str> {
    labels?.get(RING_LABEL).map(String::as_str)
}

/// Whether a write changed nothing but the ring's labels: the sharder's assignments and drains.
fn is_label_move(write: &ObjectWrite) -> bool {
    capstan_scenarios::journal::ring_labels_only(write, RING_LABEL, DRAIN_LABEL)
}

/// Every NodeSLO write the journal holds was made by the shard that owned the NodeSLO at that
/// moment (the shard label before the write; a create carries its creator's label), except the
/// sharder's label moves; returns the writes per replica identity.
fn assert_no_foreign_writes(cluster: &SimCluster) -> BTreeMap<String, usize> {
    let writes = cluster.sim.object_writes();
    assert!(
        !writes.is_empty(),
        "the journal recorded the NodeSLO writes"
    );
    let mut per_writer = BTreeMap::new();
    let mut foreign = Vec::new();
    for write in &writes {
        let writer = identity_of_user_agent(&write.user_agent).unwrap_or("");
        if write.user_agent.starts_with("sharding-test") {
            continue;
        }
        let owner = if write.verb == "create" {
            shard_of(write.labels_after.as_ref())
        } else {
            shard_of(write.labels_before.as_ref())
        };
        if owner == Some(writer) {
            *per_writer.entry(writer.to_owned()).or_default() += 1;
        } else if !is_label_move(write) {
            foreign.push(write);
        }
    }
    assert!(
        foreign.is_empty(),
        "{} NodeSLO writes by a replica that did not own the NodeSLO, e.g. {:?}",
        foreign.len(),
        &foreign[..foreign.len().min(3)]
    );
    per_writer
}

/// `None` when each of `shards` owns `n / shards` ± 15%, else what is wrong.
fn share_problem(per_shard: &BTreeMap<String, usize>, n: usize, shards: &[&str]) -> Option<String> {
    let fair = n / shards.len();
    let tolerance = fair * 15 / 100;
    shards.iter().find_map(|shard| {
        let got = per_shard.get(*shard).copied().unwrap_or(0);
        (got.abs_diff(fair) > tolerance).then(|| {
            format!("shard {shard} owns {got} of {n}, expected {fair} ± {tolerance}: {per_shard:?}")
        })
    })
}

fn assert_share(per_shard: &BTreeMap<String, usize>, n: usize, shards: &[&str]) {
    if let Some(problem) = share_problem(per_shard, n, shards) {
        panic!("{problem}");
    }
}

/// [`converged`], and then also until each shard owns its share (a shard that just joined gets
/// its objects through drains, a moment after its Lease is held).
async fn converged_with_shares(
    cluster: &SimCluster,
    n: usize,
    percent: i64,
    shards: &[&str],
) -> BTreeMap<String, usize> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let per_shard = converged(cluster, n, percent, shards).await;
        match share_problem(&per_shard, n, shards) {
            None => return per_shard,
            Some(problem) => assert!(Instant::now() < deadline, "{problem} after {CONVERGE:?}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_3000_nodes_and_take_over_a_killed_one_without_overlap() {
    const NODES: usize = 3000;
    let ids = ["nodeslo-0", "nodeslo-1", "nodeslo-2"];
    let cluster = journaled_cluster().await;
    let mut replicas = Vec::new();
    for id in ids {
        replicas.push(replica(&cluster, id).await);
    }
    // All three hold their Leases before the Nodes come, so the creates already split.
    wait_for_shards(&cluster, &ids).await;
    create_nodes(&cluster, NODES).await;

    let per_shard = converged(&cluster, NODES, 40, &ids).await;
    if per_shard.len() != ids.len() {
        for (id, replica) in ids.iter().zip(&replicas) {
            let lines = replica.output();
            eprintln!(
                "--- {id}\n{}",
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
    }
    assert_share(&per_shard, NODES, &ids);
    let creates_by = |writes: &[ObjectWrite]| {
        let mut creates: BTreeMap<String, usize> = BTreeMap::new();
        for write in writes.iter().filter(|w| w.verb == "create") {
            let writer = identity_of_user_agent(&write.user_agent).unwrap_or("");
            *creates.entry(writer.to_owned()).or_default() += 1;
        }
        creates
    };
    let creates = creates_by(&cluster.sim.object_writes());
    assert_eq!(
        creates.values().sum::<usize>(),
        NODES,
        "one create per Node: {creates:?}"
    );
    assert_share(&creates, NODES, &ids);
    assert_no_foreign_writes(&cluster);

    // The config changes: every replica applies it to its own share.
    set_threshold(&cluster, 55).await;
    converged(&cluster, NODES, 55, &ids).await;
    let updates: usize = cluster
        .sim
        .object_writes()
        .iter()
        .filter(|w| w.verb == "patch" && !is_label_move(w))
        .count();
    assert_eq!(
        updates, NODES,
        "one update per NodeSLO for one config change"
    );

    // kill -9: the shard's Lease expires, the sharder confirms the death and moves its share.
    let victim = replicas.remove(2);
    let owned_by_victim = per_shard["nodeslo-2"];
    let killed = Instant::now();
    let confirmed = tokio::spawn({
        let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), "default");
        async move {
            loop {
                let holder = capstan_testkit::lease::holder(&leases, "nodeslo-nodeslo-2").await;
                if holder.as_deref() == Some("capstan-sharder") {
                    return killed.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    victim
        .signal(nix::sys::signal::Signal::SIGKILL)
        .expect("SIGKILL sent");
    let live = &ids[..2];
    let taken_over = owned_by_none_of(&cluster, "nodeslo-2", killed).await;
    let confirmed = confirmed.await.expect("lease watch");
    eprintln!(
        "the killed replica's {owned_by_victim} NodeSLOs were taken over in {taken_over:?} \
         (its death confirmed after {confirmed:?})"
    );
    // Where a slow takeover went: the leader's passes (list and writes sent).
    for line in replicas.iter().flat_map(BinaryUnderTest::output) {
        if line.contains("sharder pass") {
            eprintln!("{line}");
        }
    }
    converged(&cluster, NODES, 55, live).await;
    let bound = Duration::from_secs(LEASE_SECONDS + 2);
    assert!(
        taken_over <= bound,
        "the {owned_by_victim} NodeSLOs of the killed replica were owned by live shards after \
         {taken_over:?}, more than lease duration + 2 s ({bound:?})"
    );
    // ... and they are reconciled by their new owners.
    set_threshold(&cluster, 60).await;
    converged(&cluster, NODES, 60, live).await;

    // Restarted under the same id, it gets a share back.
    replicas.push(replica(&cluster, "nodeslo-2").await);
    wait_for_shards(&cluster, &ids).await;
    converged_with_shares(&cluster, NODES, 60, &ids).await;
    set_threshold(&cluster, 65).await;
    converged(&cluster, NODES, 65, &ids).await;
    assert_no_foreign_writes(&cluster);
    drop(replicas);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_three_to_five_to_two_while_the_config_changes_loses_no_update() {
    const NODES: usize = 600;
    let cluster = journaled_cluster().await;
    create_nodes(&cluster, NODES).await;
    let all = [
        "nodeslo-0",
        "nodeslo-1",
        "nodeslo-2",
        "nodeslo-3",
        "nodeslo-4",
    ];
    let mut replicas = BTreeMap::new();
    for id in &all[..3] {
        replicas.insert(*id, replica(&cluster, id).await);
    }
    converged(&cluster, NODES, 40, &all[..3]).await;

    // 3 -> 5 with a config change in the middle of the handover.
    for id in &all[3..] {
        replicas.insert(*id, replica(&cluster, id).await);
    }
    set_threshold(&cluster, 45).await;
    wait_for_shards(&cluster, &all).await;
    set_threshold(&cluster, 50).await;
    converged_with_shares(&cluster, NODES, 50, &all).await;

    // 5 -> 2 (SIGTERM: each releases its Lease), the config changing again meanwhile.
    let leaving = ["nodeslo-0", "nodeslo-2", "nodeslo-3"];
    for id in leaving {
        replicas[id].sigterm().expect("SIGTERM sent");
    }
    set_threshold(&cluster, 70).await;
    for id in leaving {
        let mut replica = replicas.remove(id).expect("running");
        let status = replica
            .wait_exit(Duration::from_secs(30))
            .await
            .expect("exits after draining");
        assert!(
            status.success(),
            "{id} drained cleanly: {:?}",
            replica.output()
        );
    }
    let staying = ["nodeslo-1", "nodeslo-4"];
    converged_with_shares(&cluster, NODES, 70, &staying).await;
    // A deleted Node's NodeSLO goes too, deleted by the replica that owns it.
    delete_nodes(&cluster, 0..20).await;
    converged(&cluster, NODES - 20, 70, &staying).await;
    let per_writer = assert_no_foreign_writes(&cluster);
    assert!(
        all.iter().all(|id| per_writer.contains_key(*id)),
        "every replica wrote its share at some point: {per_writer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_node_labels_a_node_and_its_nodeslo_share_a_replica_and_a_deleted_node_loses_it() {
    const NODES: usize = 300;
    let ids = ["nodeslo-0", "nodeslo-1", "nodeslo-2"];
    let cluster = journaled_cluster().await;
    let mut replicas = Vec::new();
    for id in ids {
        replicas.push(replica_with(&cluster, id, &["--shard-node-labels"]).await);
    }
    wait_for_shards(&cluster, &ids).await;
    create_nodes(&cluster, NODES).await;
    converged_with_shares(&cluster, NODES, 40, &ids).await;
    // The sharder labelled every Node, with the replica its NodeSLO has (same ring, same key).
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let slo_owners = slos(&cluster).await;
    for node in nodes
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
    {
        let name = node.metadata.name.clone().unwrap_or_default();
        let node_owner = shard_of(node.metadata.labels.as_ref());
        assert!(node_owner.is_some(), "Node {name} has a shard label");
        assert_eq!(
            node_owner,
            slo_owners[&name].1.as_deref(),
            "Node {name} and its NodeSLO are on one replica"
        );
    }
    // A replica sees only its own Nodes, so a deleted Node's NodeSLO is deleted only after its
    // owner read the Node is gone.
    delete_nodes(&cluster, 0..15).await;
    converged(&cluster, NODES - 15, 40, &ids).await;
    set_threshold(&cluster, 75).await;
    converged(&cluster, NODES - 15, 75, &ids).await;
    assert_no_foreign_writes(&cluster);
    a_typo_is_one_warning_from_the_leader_not_one_per_replica(&cluster, &replicas).await;

    // The leader stops: the replica that takes the lead over publishes the Warning once more
    // (its predecessor's may have been lost with it), and the typo still changes nothing.
    let leader = replicas
        .iter()
        .position(|replica| {
            replica
                .output()
                .iter()
                .any(|line| line.contains("became leader"))
        })
        .expect("one replica leads");
    let mut leaving = replicas.remove(leader);
    leaving.sigterm().expect("SIGTERM sent");
    let status = leaving
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("exits after draining");
    assert!(status.success(), "the leader drained cleanly");
    let deadline = Instant::now() + Duration::from_secs(30);
    while config_warnings(&cluster).await.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the new leader publishes the Warning again: {:?}",
            config_warnings(&cluster).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let staying: Vec<&str> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, id)| *id)
        .collect();
    converged(&cluster, NODES - 15, 75, &staying).await;
    drop(replicas);
}

/// The Warning Events about the SLO ConfigMap, by reporting instance.
async fn config_warnings(cluster: &SimCluster) -> Vec<String> {
    use k8s_openapi::api::events::v1::Event;
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), CONFIG_NS);
    events
        .list(&ListParams::default())
        .await
        .expect("events listed")
        .items
        .into_iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(CONFIG_NAME)
        })
        .map(|e| e.reporting_instance.unwrap_or_default())
        .collect()
}

/// A typo in the config, seen by every replica (each logs it), is one Warning Event, published by
/// the replica holding the leader Lease, not one per replica.
async fn a_typo_is_one_warning_from_the_leader_not_one_per_replica(
    cluster: &SimCluster,
    replicas: &[BinaryUnderTest],
) {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), CONFIG_NS);
    let typo = objects::config_map(
        CONFIG_NS,
        CONFIG_NAME,
        &[(
            "resource-threshold-config",
            r#"{"clusterStrategy":{"cpuSuppressThresholdPercent":"high"}}"#,
        )],
    );
    api.patch(
        CONFIG_NAME,
        &PatchParams::apply("sharding-test").force(),
        &Patch::Apply(&typo),
    )
    .await
    .expect("typo applied");
    let deadline = Instant::now() + Duration::from_secs(30);
    let every_replica_logged = || {
        replicas.iter().all(|replica| {
            replica
                .output()
                .iter()
                .any(|line| line.contains("invalid SLO config"))
        })
    };
    while !every_replica_logged() || config_warnings(cluster).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "every replica logs the typo and one publishes a Warning"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Any Event a second replica was about to publish would have been sent with its log line.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let warnings = config_warnings(cluster).await;
    assert_eq!(
        warnings.len(),
        1,
        "one Warning for one problem, not one per replica: {warnings:?}"
    );
}
