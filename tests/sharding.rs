//! capstan-runtime's sharding against kube-sim: three shard Leases and a sharder over 300
//! ConfigMaps, a shard killed (its objects move without a drain once its Lease is confirmed
//! dead), a shard joining (moved objects are drained first and assigned only once the old owner
//! released them), a clean release (a handover at once) and fail-stop on a stolen Lease. It
//! lives here, not in the runtime's tests, because kube-sim depends on the runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::sharding::ring::{choose, object_key};
use capstan_runtime::sharding::{
    ReleaseOutcome, RingName, SHARDER_IDENTITY, ShardEnd, ShardHandle, ShardId, ShardLease,
    ShardLeaseConfig, Sharder, SharderConfig, release_object,
};
use capstan_runtime::shutdown::Shutdown;
use capstan_testkit::eventually;
use capstan_testkit::lease::{holder, take_over};
use capstan_testkit_sim::SimCluster;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, PostParams};

const WAIT: Duration = Duration::from_secs(30);
const OBJECTS: usize = 300;
const NAMESPACE: &str = "default";
const SELECTOR: &str = "app=sharded";

fn ring() -> RingName {
    RingName::new("demo").expect("valid ring")
}

fn shard(id: &str) -> ShardId {
    ShardId::new(id).expect("valid shard id")
}

/// Short Leases so that expiry and confirmation happen within the test.
fn lease_config(id: &str, duration_seconds: u64) -> ShardLeaseConfig {
    ShardLeaseConfig {
        duration: Duration::from_secs(duration_seconds),
        renew_every: Duration::from_millis(250),
        tolerated: Duration::from_secs(duration_seconds) / 2,
        ..ShardLeaseConfig::new(ring(), shard(id), NAMESPACE)
    }
}

async fn start_shard(cluster: &SimCluster, id: &str, duration_seconds: u64) -> ShardHandle {
    let handle = ShardLease::start(
        cluster.client.clone(),
        lease_config(id, duration_seconds),
        Shutdown::new(),
    )
    .expect("valid lease settings");
    assert!(
        tokio::time::timeout(WAIT, handle.active())
            .await
            .expect("lease held in time"),
        "{id} holds its lease"
    );
    handle
}

/// The sharder, run as the leader runs it, until the returned shutdown is triggered.
fn start_sharder(cluster: &SimCluster) -> (Shutdown, tokio::task::JoinHandle<()>) {
    let shutdown = Shutdown::new();
    let leader = LeaderHandle::always_leader(shutdown.clone());
    let config = SharderConfig {
        objects: kube::runtime::watcher::Config::default().labels(SELECTOR),
        ..SharderConfig::new(ring(), NAMESPACE)
    };
    let sharder = Sharder::<ConfigMap>::new(cluster.client.clone(), config);
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        sharder
            .run_while_leader(&leader, &stop)
            .await
            .expect("the sharder stops cleanly");
    });
    (shutdown, task)
}

async fn create_objects(cluster: &SimCluster) {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    futures::stream::iter(0..OBJECTS)
        .map(|i| {
            let api = api.clone();
            async move {
                let object = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("object-{i}")),
                        labels: Some(BTreeMap::from([("app".into(), "sharded".into())])),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                };
                api.create(&PostParams::default(), &object)
                    .await
                    .expect("ConfigMap created");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

/// Each object's shard label and whether it carries the drain label, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Owner {
    shard: Option<String>,
    draining: bool,
}

async fn owners(cluster: &SimCluster) -> BTreeMap<String, Owner> {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let ring = ring();
    api.list_metadata(&ListParams::default().labels(SELECTOR))
        .await
        .expect("ConfigMaps listed")
        .items
        .into_iter()
        .map(|object| {
            let labels = object.metadata.labels.unwrap_or_default();
            let owner = Owner {
                shard: labels.get(&ring.shard_label()).cloned(),
                draining: labels.contains_key(&ring.drain_label()),
            };
            (object.metadata.name.unwrap_or_default(), owner)
        })
        .collect()
}

fn count_by_shard(owners: &BTreeMap<String, Owner>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for owner in owners.values() {
        if let Some(shard) = &owner.shard {
            *counts.entry(shard.clone()).or_default() += 1;
        }
    }
    counts
}

/// Waits until every object is labelled, none draining, each with the ring's choice among
/// `shards`; returns the assignment.
async fn wait_assigned(cluster: &SimCluster, shards: &[&str]) -> BTreeMap<String, Owner> {
    eventually(
        &format!("all {OBJECTS} objects assigned over {shards:?}"),
        WAIT,
        || async {
            let owners = owners(cluster).await;
            let settled = owners.len() == OBJECTS
                && owners.iter().all(|(name, owner)| {
                    let key = object_key(Some(NAMESPACE), name);
                    !owner.draining
                        && owner.shard.as_deref() == choose(&key, shards.iter().copied())
                });
            settled.then_some(owners)
        },
    )
    .await
}

fn leases(cluster: &SimCluster) -> Api<Lease> {
    Api::namespaced(cluster.client.clone(), NAMESPACE)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_gets_one_of_three_shards_about_evenly() {
    let cluster = SimCluster::start().await;
    let _a = start_shard(&cluster, "shard-0", 2).await;
    let _b = start_shard(&cluster, "shard-1", 2).await;
    let _c = start_shard(&cluster, "shard-2", 2).await;
    create_objects(&cluster).await;
    let (stop, sharder) = start_sharder(&cluster);

    let owners = wait_assigned(&cluster, &["shard-0", "shard-1", "shard-2"]).await;
    let counts = count_by_shard(&owners);
    assert_eq!(counts.len(), 3, "{counts:?}");
    for (shard, count) in &counts {
        assert!(
            (85..=115).contains(count),
            "{shard} owns {count} of {OBJECTS}: {counts:?}"
        );
    }
    let lease = leases(&cluster)
        .get("demo-shard-0")
        .await
        .expect("the shard's Lease");
    assert_eq!(
        lease
            .metadata
            .labels
            .unwrap_or_default()
            .get("sharding.capstan.dev/ring")
            .map(String::as_str),
        Some("demo")
    );
    assert_eq!(
        holder(&leases(&cluster), "demo-shard-0").await.as_deref(),
        Some("shard-0")
    );

    // An object created while the sharder runs is assigned from its watch event.
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let late = ConfigMap {
        metadata: ObjectMeta {
            name: Some("late".into()),
            labels: Some(BTreeMap::from([("app".into(), "sharded".into())])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &late)
        .await
        .expect("created");
    eventually("the late object assigned", WAIT, || async {
        let labels = api.get_metadata("late").await.ok()?.metadata.labels?;
        labels.get(&ring().shard_label()).cloned()
    })
    .await;

    stop.trigger();
    sharder.await.expect("sharder task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shards_objects_move_to_the_others_without_a_drain_once_its_lease_is_dead() {
    let cluster = SimCluster::start().await;
    let _a = start_shard(&cluster, "shard-0", 2).await;
    let killed = start_shard(&cluster, "shard-1", 2).await;
    let _c = start_shard(&cluster, "shard-2", 2).await;
    create_objects(&cluster).await;
    let (stop, sharder) = start_sharder(&cluster);
    let before = wait_assigned(&cluster, &["shard-0", "shard-1", "shard-2"]).await;

    killed.abandon();
    let killed_at = Instant::now();
    assert!(!killed.is_active());
    assert_eq!(killed.release().await.expect("ends"), ShardEnd::Abandoned);
    let after = eventually("the killed shard's objects reassigned", WAIT, || async {
        let owners = owners(&cluster).await;
        assert!(
            owners.values().all(|owner| !owner.draining),
            "a dead shard's objects are never drained"
        );
        let settled = owners.len() == OBJECTS
            && owners
                .values()
                .all(|owner| owner.shard.is_some() && owner.shard.as_deref() != Some("shard-1"));
        settled.then_some(owners)
    })
    .await;
    assert!(
        killed_at.elapsed() >= Duration::from_secs(2),
        "objects moved {:?} after the kill, before the 2 s Lease expired",
        killed_at.elapsed()
    );
    for (name, owner) in &before {
        if owner.shard.as_deref() != Some("shard-1") {
            assert_eq!(after.get(name), Some(owner), "{name} of a live shard moved");
        }
    }
    assert_eq!(
        holder(&leases(&cluster), "demo-shard-1").await.as_deref(),
        Some(SHARDER_IDENTITY),
        "the sharder acquired the expired Lease to confirm the death"
    );

    stop.trigger();
    sharder.await.expect("sharder task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_shard_gets_its_objects_only_after_their_old_owners_release_them() {
    let cluster = SimCluster::start().await;
    let _a = start_shard(&cluster, "shard-0", 2).await;
    let _b = start_shard(&cluster, "shard-1", 2).await;
    create_objects(&cluster).await;
    let (stop, sharder) = start_sharder(&cluster);
    let before = wait_assigned(&cluster, &["shard-0", "shard-1"]).await;

    let _new = start_shard(&cluster, "shard-2", 2).await;
    let moving: BTreeSet<String> = before
        .keys()
        .filter(|name| {
            let key = object_key(Some(NAMESPACE), name);
            choose(&key, ["shard-0", "shard-1", "shard-2"]) == Some("shard-2")
        })
        .cloned()
        .collect();
    assert!(
        (70..=130).contains(&moving.len()),
        "{} of {OBJECTS} objects move to the new shard",
        moving.len()
    );

    let drained = eventually("the moving objects drained", WAIT, || async {
        let owners = owners(&cluster).await;
        let drained = moving
            .iter()
            .all(|name| owners.get(name).is_some_and(|owner| owner.draining));
        drained.then_some(owners)
    })
    .await;
    for (name, owner) in &drained {
        assert_eq!(
            owner.shard, before[name].shard,
            "{name}: a drained object keeps its old owner until it is released"
        );
        assert_eq!(owner.draining, moving.contains(name), "{name}");
    }
    // Longer than a few sharder reactions: nothing moves without the owners' release.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count_by_shard(&owners(&cluster).await).get("shard-2"),
        None,
        "no object reaches the new shard before its old owner let go"
    );

    // The test acts as the old owners: they stopped, and release.
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    for name in &moving {
        let object = api.get(name).await.expect("object");
        let owner = shard(before[name].shard.as_deref().expect("assigned"));
        let outcome = release_object(&cluster.client, &ring(), &owner, &object, None)
            .await
            .expect("released");
        assert_eq!(outcome, ReleaseOutcome::Released, "{name}");
        // A second release, or another shard's, finds nothing of its own.
        let again = release_object(&cluster.client, &ring(), &owner, &object, None)
            .await
            .expect("answers");
        assert_eq!(again, ReleaseOutcome::NotOurs, "{name}");
    }

    let after = wait_assigned(&cluster, &["shard-0", "shard-1", "shard-2"]).await;
    for (name, owner) in &after {
        if moving.contains(name) {
            assert_eq!(owner.shard.as_deref(), Some("shard-2"), "{name}");
        } else {
            assert_eq!(owner, &before[name], "{name} should have stayed");
        }
    }

    stop.trigger();
    sharder.await.expect("sharder task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanly_released_shard_hands_its_objects_over_at_once() {
    let cluster = SimCluster::start().await;
    // Long Leases: the expiry path would take at least 5 s + the grace.
    let _a = start_shard(&cluster, "shard-0", 5).await;
    let _b = start_shard(&cluster, "shard-1", 5).await;
    let leaving = start_shard(&cluster, "shard-2", 5).await;
    create_objects(&cluster).await;
    let (stop, sharder) = start_sharder(&cluster);
    wait_assigned(&cluster, &["shard-0", "shard-1", "shard-2"]).await;

    let released_at = Instant::now();
    assert_eq!(
        leaving.release().await.expect("released"),
        ShardEnd::Released
    );
    assert!(!leaving.is_active());
    assert_eq!(holder(&leases(&cluster), "demo-shard-2").await, None);
    wait_assigned(&cluster, &["shard-0", "shard-1"]).await;
    assert!(
        released_at.elapsed() < Duration::from_secs(5),
        "the handover took {:?}, as long as a Lease expiry",
        released_at.elapsed()
    );

    stop.trigger();
    sharder.await.expect("sharder task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_lease_is_taken_stops_and_triggers_shutdown() {
    let cluster = SimCluster::start().await;
    let shutdown = Shutdown::new();
    let handle = ShardLease::start(
        cluster.client.clone(),
        lease_config("shard-0", 2),
        shutdown.clone(),
    )
    .expect("valid settings");
    assert!(handle.active().await);
    take_over(&leases(&cluster), "demo-shard-0", "intruder").await;
    eventually("the shard notices the stolen lease", WAIT, || async {
        (handle.was_lost() && shutdown.is_triggered()).then_some(())
    })
    .await;
    assert!(!handle.is_active());
    assert!(handle.release().await.is_err(), "a lost lease is an error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_write_that_conflicts_or_fails_is_decided_again_on_the_object_as_it_is_now() {
    use kube_sim::faults::{ErrorRule, FaultConfig};
    let cluster = SimCluster::start().await;
    let _a = start_shard(&cluster, "shard-0", 2).await;
    let _b = start_shard(&cluster, "shard-1", 2).await;
    create_objects(&cluster).await;
    // A third of the sharder's label writes conflict, a tenth fail: the sharder keeps no cache
    // and its next pass is minutes away, so only reading each such object again (by a list of
    // its name: the chart grants no get) and deciding again assigns it.
    let rule = |rate, code| ErrorRule {
        verbs: vec!["patch".into()],
        resources: vec!["configmaps".into()],
        rate,
        code,
        retry_after_seconds: 1,
    };
    cluster.sim.set_faults(FaultConfig {
        seed: 7,
        errors: vec![rule(0.3, 409), rule(0.1, 500)],
        ..FaultConfig::default()
    });
    let (stop, sharder) = start_sharder(&cluster);
    let owners = wait_assigned(&cluster, &["shard-0", "shard-1"]).await;
    assert_eq!(owners.len(), OBJECTS);
    cluster.sim.set_faults(FaultConfig::default());
    stop.trigger();
    sharder.await.expect("sharder task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_label_write_waits_for_the_next_resync_instead_of_being_sent_every_second() {
    use kube_sim::faults::{ErrorRule, FaultConfig};
    let cluster = SimCluster::start().await;
    let _a = start_shard(&cluster, "shard-0", 2).await;
    create_objects(&cluster).await;
    // An admission policy, say, refuses every label write: the same write gets the same 403.
    cluster.sim.set_faults(FaultConfig {
        errors: vec![ErrorRule {
            verbs: vec!["patch".into()],
            resources: vec!["configmaps".into()],
            rate: 1.0,
            code: 403,
            retry_after_seconds: 1,
        }],
        ..FaultConfig::default()
    });
    let patches = || cluster.sim.requests().count("patch", "configmaps");
    let (stop, sharder) = start_sharder(&cluster);
    eventually("every object's write tried once", WAIT, || async {
        (patches() >= OBJECTS as u64).then_some(())
    })
    .await;
    // A transient failure is tried again after a second; three seconds later, a refusal is not.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(patches(), OBJECTS as u64, "one refused write per object");
    cluster.sim.set_faults(FaultConfig::default());
    stop.trigger();
    sharder.await.expect("sharder task");
}
