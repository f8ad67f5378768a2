//! machineclass-controller sharded (`--shards auto`): three replicas of the real binary with the
//! simulated provider against kube-sim, 600 Machines of one class. Every Machine runs, each
//! replica owns about a third (the ring's choice), and kube-sim's write journal proves that no
//! replica ever wrote a Machine its shard label did not give it at that moment (the writer's
//! identity is in its User-Agent), through a kill -9, the takeover of the dead replica's share,
//! its restart and the handover back. Then a MachineClass whose one Machine lives on a shard other
//! than the leader's: its deletion is blocked (finalizer kept, `MachineClassInUse` Warning) and
//! completes once that Machine is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use capstan_apis::machine::{FINALIZER_MCM, LABEL_NODE, Machine, MachineClass, MachinePhase};
use capstan_runtime::cli::identity_of_user_agent;
use capstan_runtime::sharding::ring::{choose, object_key};
use capstan_scenarios::tools::binary;
use capstan_testkit::objects;
use capstan_testkit::process::BinaryUnderTest;
use capstan_testkit_sim::SimCluster;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_sim::ObjectWrite;
use serde_json::json;

const NS: &str = "default";
const RING_LABEL: &str = "shard.sharding.capstan.dev/machineclass";
const DRAIN_LABEL: &str = "drain.sharding.capstan.dev/machineclass";
const LEADER_LEASE: &str = "machineclass-controller";
const LEASE_SECONDS: u64 = 4;
const MACHINES: usize = 600;
const IDS: [&str; 3] = ["mc-0", "mc-1", "mc-2"];
const CONVERGE: Duration = Duration::from_secs(60);
/// A Node condition no health rule reads: the Machine reconcile copies the Node's conditions
/// into the Machine's status, so a new one shows which Machines a live shard reconciled.
const PROBE: &str = "CapstanShardProbe";

/// A replica of the real binary, `POD_NAME=id`, with 4 s Leases (renewed every 2/3 s, held up
/// to 2 s after the last renewal sent).
async fn replica(cluster: &SimCluster, id: &str) -> BinaryUnderTest {
    let path = binary("machineclass-controller", "machineclass-controller");
    let duration = LEASE_SECONDS.to_string();
    let args = [
        "--kubeconfig",
        cluster.kubeconfig_path(),
        "--metrics-addr",
        "127.0.0.1:0",
        "--namespace",
        NS,
        "--driver",
        "sim",
        "--shards",
        "auto",
        "--leader-elect",
        "--lease-duration-seconds",
        &duration,
        "--lease-grace-seconds",
        "2",
        "--short-retry",
        "500ms",
        "--sim-ready-delay",
        "1s",
        "--log-level",
        "info,kube=warn",
    ];
    BinaryUnderTest::spawn_with_env(path, &args, &[("POD_NAME", id)])
        .await
        .unwrap_or_else(|e| panic!("replica {id} starts: {e}"))
}

fn leases(cluster: &SimCluster) -> Api<Lease> {
    Api::namespaced(cluster.client.clone(), NS)
}

fn machines(cluster: &SimCluster) -> Api<Machine> {
    Api::namespaced(cluster.client.clone(), NS)
}

fn classes(cluster: &SimCluster) -> Api<MachineClass> {
    Api::namespaced(cluster.client.clone(), NS)
}

async fn wait_for_shards(cluster: &SimCluster, ids: &[&str]) {
    for id in ids {
        capstan_testkit::lease::wait_for_holder(
            &leases(cluster),
            &format!("machineclass-{id}"),
            id,
            Duration::from_secs(30),
        )
        .await;
    }
}

async fn leader(cluster: &SimCluster) -> String {
    capstan_testkit::eventually("a leader elected", Duration::from_secs(30), || async {
        let lease = leases(cluster).get_opt(LEADER_LEASE).await.ok()??;
        lease.spec?.holder_identity
    })
    .await
}

fn shard_of(labels: Option<&BTreeMap<String, String>>) -> Option<&str> {
    labels?.get(RING_LABEL).map(String::as_str)
}

fn running(machine: &Machine) -> bool {
    machine.metadata.deletion_timestamp.is_none() && machine.phase() == Some(&MachinePhase::Running)
}

fn has_condition(machine: &Machine, type_: &str) -> bool {
    machine
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == type_))
}

/// The ring's choice for Machine `name` among `shards`.
fn chosen<'a>(name: &str, shards: &[&'a str]) -> &'a str {
    choose(&object_key(Some(NS), name), shards.iter().copied()).expect("a shard")
}

/// Waits until the `m-*` Machines are `MACHINES`, all Running, none draining, each labelled with
/// the ring's choice among `shards`, and `extra` holds for each; returns them by name.
async fn converged(
    cluster: &SimCluster,
    shards: &[&str],
    what: &str,
    extra: impl Fn(&Machine) -> bool,
) -> BTreeMap<String, Machine> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let all: BTreeMap<String, Machine> = machines(cluster)
            .list(&ListParams::default())
            .await
            .expect("machines listed")
            .items
            .into_iter()
            .filter(|m| m.name_any().starts_with("m-"))
            .map(|m| (m.name_any(), m))
            .collect();
        let wrong: Vec<String> = all
            .iter()
            .filter(|(name, m)| {
                !running(m)
                    || m.labels().contains_key(DRAIN_LABEL)
                    || shard_of(m.metadata.labels.as_ref()) != Some(chosen(name, shards))
                    || !extra(m)
            })
            .map(|(name, m)| format!("{name}: {:?} {:?}", m.phase(), m.labels().get(RING_LABEL)))
            .collect();
        if all.len() == MACHINES && wrong.is_empty() {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "{MACHINES} machines not {what} over {shards:?} within {CONVERGE:?}: {} machines, {} \
             not yet, e.g. {:?}",
            all.len(),
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn per_shard(all: &BTreeMap<String, Machine>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for machine in all.values() {
        let shard = shard_of(machine.metadata.labels.as_ref()).unwrap_or_default();
        *counts.entry(shard.to_owned()).or_default() += 1;
    }
    counts
}

fn assert_share(counts: &BTreeMap<String, usize>, shards: &[&str]) {
    let fair = MACHINES / shards.len();
    let tolerance = fair * 15 / 100;
    for shard in shards {
        let got = counts.get(*shard).copied().unwrap_or(0);
        assert!(
            got.abs_diff(fair) <= tolerance,
            "shard {shard} owns {got} of {MACHINES}, expected {fair} ± {tolerance}: {counts:?}"
        );
    }
}

/// Adds the probe condition `type_` to the Node of each Machine (as a kubelet would report a new
/// condition), so that whichever shard reconciles the Machine next writes its status.
async fn probe_nodes(cluster: &SimCluster, machines: &[&Machine], type_: &str) {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    futures::stream::iter(machines)
        .for_each_concurrent(16, |machine| {
            let nodes = nodes.clone();
            let node = machine
                .labels()
                .get(LABEL_NODE)
                .cloned()
                .expect("node label");
            async move {
                let patch = json!([{
                    "op": "add", "path": "/status/conditions/-",
                    "value": {"type": type_, "status": "True", "reason": "Probe",
                              "message": "sharding test"}
                }]);
                let patch = Patch::Json::<()>(serde_json::from_value(patch).expect("a JSON patch"));
                nodes
                    .patch_status(&node, &PatchParams::default(), &patch)
                    .await
                    .unwrap_or_else(|e| panic!("node {node} probed: {e}"));
            }
        })
        .await;
}

/// Whether a write changed the ring's labels and nothing else among the labels.
fn ring_labels_only(write: &ObjectWrite) -> bool {
    capstan_scenarios::journal::ring_labels_only(write, RING_LABEL, DRAIN_LABEL)
}

/// What the journal says about the Machine writes of the replicas.
#[derive(Debug, Default)]
struct Audit {
    /// Writes by the shard the shard label named before the write, per shard.
    owner_writes: BTreeMap<String, usize>,
    /// Drain acknowledgements: an owner removing both ring labels.
    releases: usize,
    /// The sharder's label writes.
    assignments: usize,
    drains: usize,
    /// Assignments away from the killed shard, after it was killed.
    dead_reassignments: usize,
}

/// Every Machine write of a replica was made by the shard the Machine's shard label named just
/// before the write, the release included, or is the leader's sharder moving ring labels: an
/// assignment of an unowned Machine (or one of `dead`, the shard killed at journal seq `after`,
/// once it was killed) or a drain label added. Panics on any other.
fn audit(cluster: &SimCluster, leader: &str, dead: Option<(&str, u64)>) -> Audit {
    let writes = cluster.sim.object_writes();
    let mut audit = Audit::default();
    let mut foreign = Vec::new();
    // Machines only (the MachineClass journal of part (c) shares the list).
    let machine = |name: &str| name.starts_with("m-") || name.starts_with("solo-");
    for write in writes
        .iter()
        .filter(|w| w.user_agent.starts_with("machineclass-controller/") && machine(&w.name))
    {
        let writer = identity_of_user_agent(&write.user_agent)
            .unwrap_or_else(|| panic!("no replica identity in {:?}", write.user_agent));
        let before = shard_of(write.labels_before.as_ref());
        let after = shard_of(write.labels_after.as_ref());
        let drained = |labels: &Option<BTreeMap<String, String>>| {
            labels
                .as_ref()
                .is_some_and(|labels| labels.contains_key(DRAIN_LABEL))
        };
        // A drain only adds the drain label; only the sharder does that (on the leader's own
        // Machines too).
        if ring_labels_only(write)
            && before.is_some()
            && before == after
            && !drained(&write.labels_before)
            && drained(&write.labels_after)
        {
            if writer == leader {
                audit.drains += 1;
            } else {
                foreign.push(write);
            }
            continue;
        }
        if before == Some(writer) {
            *audit.owner_writes.entry(writer.to_owned()).or_default() += 1;
            if drained(&write.labels_before) && after.is_none() && ring_labels_only(write) {
                audit.releases += 1;
            }
            continue;
        }
        if writer == leader && ring_labels_only(write) {
            let assigned = after.is_some() && !drained(&write.labels_after);
            match (before, after) {
                (None, Some(_)) if assigned => {
                    audit.assignments += 1;
                    continue;
                }
                (Some(owner), Some(to))
                    if assigned
                        && owner != to
                        && dead.is_some_and(|(id, at)| owner == id && write.seq > at) =>
                {
                    audit.dead_reassignments += 1;
                    continue;
                }
                _ => {}
            }
        }
        foreign.push(write);
    }
    assert!(
        foreign.is_empty(),
        "{} machine writes by a replica the machine's shard label did not name, e.g. {:#?}",
        foreign.len(),
        &foreign[..foreign.len().min(3)]
    );
    audit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_600_machines_take_over_a_killed_one_and_guard_a_class_across_shards()
{
    let started = Instant::now();
    let cluster = SimCluster::start().await;
    cluster
        .sim
        .journal_writes("machine.sapcloud.io", "machines");
    let secret = objects::secret(NS, "cloud", &[("userData", "Y2xvdWQtaW5pdA==")]);
    Api::<Secret>::namespaced(cluster.client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let class = objects::machine_class(NS, "sim", "cloud", json!({}));
    classes(&cluster)
        .create(&PostParams::default(), &objects::from_json(class))
        .await
        .expect("class");
    let mut replicas = BTreeMap::new();
    for id in IDS {
        replicas.insert(id, replica(&cluster, id).await);
    }
    // All three hold their shard Leases before the Machines come, so they split at once.
    wait_for_shards(&cluster, &IDS).await;
    let leader = leader(&cluster).await;

    // (a) 600 Machines: all Running, a third each, no write by a replica that did not own it.
    let api = machines(&cluster);
    futures::stream::iter(0..MACHINES)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            async move {
                let machine = objects::machine(NS, &format!("m-{i:03}"), "md-1", "sim", json!({}));
                api.create(&PostParams::default(), &objects::from_json(machine))
                    .await
                    .expect("machine created");
            }
        })
        .await;
    let created = Instant::now();
    let all = converged(&cluster, &IDS, "Running", |_| true).await;
    let all_running = created.elapsed();
    let shares = per_shard(&all);
    assert_share(&shares, &IDS);
    let first = audit(&cluster, &leader, None);
    assert_eq!(
        first.assignments, MACHINES,
        "one assignment per machine: {first:?}"
    );
    for id in IDS {
        assert!(
            first.owner_writes.get(id).copied().unwrap_or(0) >= shares[id],
            "{id} wrote its own machines: {first:?}"
        );
    }
    eprintln!(
        "(a) {MACHINES} machines Running {all_running:?} after their creation; shares {shares:?}; \
         leader {leader}; {first:?}"
    );

    // (b) kill -9 a replica that does not lead: its share moves to the live shards, which
    // reconcile it (the probe condition its Nodes gain appears in the Machines' status).
    let victim = *IDS.iter().find(|id| **id != leader).expect("a follower");
    let live: Vec<&str> = IDS.iter().copied().filter(|id| *id != victim).collect();
    let victims: Vec<&Machine> = all
        .values()
        .filter(|m| shard_of(m.metadata.labels.as_ref()) == Some(victim))
        .collect();
    let victim_names: BTreeSet<String> = victims.iter().map(|m| m.name_any()).collect();
    // A watch timestamps the takeover (polling 600 Machines would load the API server).
    let watch = kube::runtime::watcher(api.clone(), kube::runtime::watcher::Config::default());
    let mut watch = std::pin::pin!(watch);
    while let Some(event) = watch.next().await {
        if matches!(event, Ok(kube::runtime::watcher::Event::InitDone)) {
            break;
        }
    }
    let mut killed_bin = replicas.remove(victim).expect("running");
    let kill_seq = cluster
        .sim
        .object_writes()
        .last()
        .map_or(0, |write| write.seq);
    let killed = Instant::now();
    killed_bin
        .signal(nix::sys::signal::Signal::SIGKILL)
        .expect("SIGKILL sent");
    killed_bin
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("killed");
    probe_nodes(&cluster, &victims, PROBE).await;
    let on_live = |m: &Machine| {
        shard_of(m.metadata.labels.as_ref()).is_some_and(|s| live.contains(&s))
            && !m.labels().contains_key(DRAIN_LABEL)
    };
    // Per victim Machine: when it was first seen on a live shard, and reconciled there.
    let mut moved = BTreeMap::new();
    let mut done = BTreeMap::new();
    let reconciled = tokio::time::timeout(CONVERGE, async {
        while let Some(event) = watch.next().await {
            let Ok(kube::runtime::watcher::Event::Apply(m)) = event else {
                continue;
            };
            let name = m.name_any();
            if !victim_names.contains(&name) || !on_live(&m) {
                continue;
            }
            moved
                .entry(name.clone())
                .or_insert_with(|| killed.elapsed());
            if has_condition(&m, PROBE) && running(&m) {
                done.entry(name).or_insert_with(|| killed.elapsed());
            }
            if done.len() == victim_names.len() {
                return killed.elapsed();
            }
        }
        panic!("the watch of the machines ended");
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the killed replica's {} machines were not all reconciled by live shards within \
             {CONVERGE:?}: {} moved, {} reconciled",
            victim_names.len(),
            moved.len(),
            done.len()
        )
    });
    let labels_moved = moved.values().max().copied();
    let labels_moved = labels_moved.expect("set once all moved");
    let first_moved = moved.values().min().copied().expect("some moved");
    let taken_over = audit(&cluster, &leader, Some((victim, kill_seq)));
    assert_eq!(
        taken_over.dead_reassignments,
        victims.len(),
        "every machine of {victim} moved once, directly: {taken_over:?}"
    );
    let bound = Duration::from_secs(LEASE_SECONDS + 2);
    eprintln!(
        "(b) kill -9 {victim} ({} machines): first relabelled to {live:?} after {first_moved:?}, \
         all after {labels_moved:?}, all reconciled there after {reconciled:?} (bound {bound:?})",
        victims.len()
    );
    assert!(
        reconciled <= bound,
        "the {} machines of the killed replica were reconciled by live shards {reconciled:?} \
         after the kill (labels moved after {labels_moved:?}), more than lease duration + 2 s",
        victims.len()
    );

    // Restarted under the same id: it gets its share back by drains, and reconciles it.
    replicas.insert(victim, replica(&cluster, victim).await);
    wait_for_shards(&cluster, &IDS).await;
    let back = converged(&cluster, &IDS, "handed back", |_| true).await;
    let shares_back = per_shard(&back);
    assert_share(&shares_back, &IDS);
    let returned: Vec<&Machine> = back
        .values()
        .filter(|m| shard_of(m.metadata.labels.as_ref()) == Some(victim))
        .collect();
    probe_nodes(&cluster, &returned, "CapstanShardProbeBack").await;
    converged(&cluster, &IDS, "reconciled after the restart", |m| {
        shard_of(m.metadata.labels.as_ref()) != Some(victim)
            || has_condition(m, "CapstanShardProbeBack")
    })
    .await;
    let handed_back = audit(&cluster, &leader, Some((victim, kill_seq)));
    assert!(
        handed_back.drains >= returned.len() && handed_back.releases >= returned.len(),
        "the {} machines went back to {victim} by drain and release: {handed_back:?}",
        returned.len()
    );
    eprintln!("(b) restarted {victim}: shares {shares_back:?}; {handed_back:?}");

    // (c) A class used by one Machine on a shard other than the leader's: its deletion waits.
    cluster
        .sim
        .journal_writes("machine.sapcloud.io", "machineclasses");
    let solo_class = objects::machine_class(NS, "solo", "cloud", json!({}));
    classes(&cluster)
        .create(&PostParams::default(), &objects::from_json(solo_class))
        .await
        .expect("class solo");
    // The leader reconciles the new class first (no Machine uses it: nothing to do), so the
    // finalizer can only come from the shard of the Machine created next.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let solo = (0..)
        .map(|i| format!("solo-{i}"))
        .find(|name| chosen(name, &IDS) != leader)
        .expect("a name off the leader's shard");
    let owner = chosen(&solo, &IDS);
    let machine = objects::machine(NS, &solo, "md-solo", "solo", json!({}));
    api.create(&PostParams::default(), &objects::from_json(machine))
        .await
        .expect("machine solo");
    capstan_testkit::eventually(&format!("{solo} Running on {owner}"), CONVERGE, || async {
        let m = api.get(&solo).await.ok()?;
        (running(&m) && shard_of(m.metadata.labels.as_ref()) == Some(owner)).then_some(())
    })
    .await;
    let guarded = classes(&cluster).get("solo").await.expect("class solo");
    assert!(
        guarded.finalizers().iter().any(|f| f == FINALIZER_MCM),
        "the class of a running machine has the finalizer"
    );
    let class_writes = |name: &str| -> Vec<ObjectWrite> {
        cluster
            .sim
            .object_writes()
            .into_iter()
            .filter(|w| w.name == name && w.user_agent.starts_with("machineclass-controller/"))
            .collect()
    };
    let finalized_by: Vec<String> = class_writes("solo")
        .iter()
        .filter_map(|w| identity_of_user_agent(&w.user_agent).map(str::to_owned))
        .collect();
    assert_eq!(
        finalized_by,
        [owner],
        "the shard of the class's one machine added the finalizer (the leader does not see it)"
    );

    let blocked_at = Instant::now();
    classes(&cluster)
        .delete("solo", &DeleteParams::default())
        .await
        .expect("class delete accepted");
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), NS);
    let warning =
        capstan_testkit::eventually("the MachineClassInUse Warning", CONVERGE, || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.into_iter().find(|e| {
                e.reason.as_deref() == Some("MachineClassInUse")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("solo")
            })
        })
        .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let note = warning.note.clone().unwrap_or_default();
    assert!(note.contains("(1 machine(s))"), "{note}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = classes(&cluster).get("solo").await.expect("still there");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(
        held.finalizers().iter().any(|f| f == FINALIZER_MCM),
        "a class in use keeps its finalizer"
    );
    api.delete(&solo, &DeleteParams::default())
        .await
        .expect("machine delete accepted");
    let machine_deleted = Instant::now();
    capstan_testkit::eventually("machine and class solo gone", CONVERGE, || async {
        let machine_gone = api.get_opt(&solo).await.ok()?.is_none();
        let class_gone = classes(&cluster).get_opt("solo").await.ok()?.is_none();
        (machine_gone && class_gone).then_some(())
    })
    .await;
    let unblocked = machine_deleted.elapsed();
    let removed_by: Vec<String> = class_writes("solo")
        .iter()
        .filter(|w| w.labels_after.is_none())
        .filter_map(|w| identity_of_user_agent(&w.user_agent).map(str::to_owned))
        .collect();
    assert_eq!(
        removed_by,
        [leader.as_str()],
        "the leader removed the finalizer, ending the deletion"
    );
    eprintln!(
        "(c) class solo, its machine {solo} on {owner} (leader {leader}): blocked {:?}, gone \
         {unblocked:?} after its machine's deletion",
        machine_deleted - blocked_at
    );

    let last = audit(&cluster, &leader, Some((victim, kill_seq)));
    eprintln!("final {last:?}; whole test {:?}", started.elapsed());
    assert_eq!(
        capstan_testkit::lease::holder(&leases(&cluster), LEADER_LEASE).await,
        Some(leader),
        "one leader throughout, so its label writes are the sharder's"
    );
    drop(replicas);
}
