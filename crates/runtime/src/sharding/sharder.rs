//! The sharder: one per ring, on the replica holding the ordinary leader Lease. It keeps a
//! metadata-only cache of the ring's objects and the ring's membership, and writes the
//! [`super::assign()`] decision into each object's labels: on every object event for that object,
//! on every membership change (and every `resync`) for all objects in its cache.
//!
//! It also drives the Lease state machine's sharder half: an `Uncertain` Lease is acquired
//! (confirming the shard dead), an `Orphaned` one deleted.
//!
//! Every label write is a JSON merge patch of `metadata.labels` carrying the `resourceVersion`
//! the decision was made from (the anchor's optimistic lock): from a stale cache it conflicts
//! instead of, say, assigning an object a second time that the watch has not yet shown assigned.
//! The next watch event brings the object back with its current labels.
//!
//! **Decision**: a watch, not the anchor's webhook (`docs/design.md`, "Don't Watch Sharded
//! Objects"): the cache holds only names, namespaces, resourceVersions and labels (annotations,
//! managedFields, owners and finalizers are dropped on arrival), so 50,000 objects cost a few
//! tens of MiB on one replica, and a membership change walks that cache, not the API.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Future, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{PartialObjectMeta, Request};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::assign::{AssignDecision, ObjectLabels, assign};
use super::lease::{Membership, classify, confirmed_dead, sleep_until_some, watch_membership};
use super::metrics::ShardingMetrics;
use super::ring::object_key;
use super::{DRAIN_VALUE, RingName, ShardState, ShardingError};
use crate::kube_errors::{is_conflict, is_not_found};
use crate::leader::LeaderHandle;
use crate::shutdown::Shutdown;

/// How soon a failed Lease acquisition or deletion is tried again.
const LEASE_RETRY: Duration = Duration::from_secs(1);

/// Settings of one ring's sharder.
#[derive(Clone, Debug)]
pub struct SharderConfig {
    pub ring: RingName,
    /// Where the ring's shard Leases live.
    pub lease_namespace: String,
    /// The watch of the ring's objects, in every namespace ([`Sharder::new_in`]: one, so that
    /// namespaced RBAC suffices): a label selector narrows the ring.
    pub objects: watcher::Config,
    /// Label writes in flight at once.
    pub concurrency: usize,
    /// A pass over every cached object this often, beyond those membership changes cause
    /// (a write that failed for another reason than a conflict is retried by it).
    pub resync: Duration,
}

impl SharderConfig {
    /// Every object of the kind, 64 writes in flight (a dead shard's share moves within about a second), a pass every 5 minutes.
    pub fn new(ring: RingName, lease_namespace: impl Into<String>) -> Self {
        Self {
            ring,
            lease_namespace: lease_namespace.into(),
            objects: watcher::Config::default(),
            concurrency: 64,
            resync: Duration::from_secs(300),
        }
    }
}

/// One ring's sharder over objects of kind `K`.
pub struct Sharder<K> {
    client: kube::Client,
    objects: Api<PartialObjectMeta<K>>,
    config: SharderConfig,
    metrics: ShardingMetrics,
}

/// One label write in flight; it yields its object's key and whether the write landed.
type WriteFuture<'a> = std::pin::Pin<Box<dyn Future<Output = (String, bool)> + Send + 'a>>;

/// The writes in flight (at most `concurrency`) and those sent but not yet seen back from the
/// watch, by object key with the resourceVersion they were decided from: a decision on that
/// same version is not sent again (a pass while the watch lags would repeat every write).
struct Writes<'a> {
    inflight: FuturesUnordered<WriteFuture<'a>>,
    sent: HashMap<String, Option<String>>,
    concurrency: usize,
}

impl<'a> Writes<'a> {
    fn new(concurrency: usize) -> Self {
        Self {
            inflight: FuturesUnordered::new(),
            sent: HashMap::new(),
            concurrency: concurrency.max(1),
        }
    }

    /// A watch event: a newer version than a write was decided from settles that write.
    fn observe<K>(&mut self, object: &PartialObjectMeta<K>) {
        let meta = &object.metadata;
        let key = object_key(
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        );
        if self
            .sent
            .get(&key)
            .is_some_and(|sent| *sent != meta.resource_version)
        {
            self.sent.remove(&key);
        }
    }

    /// Sends `write` unless the same decision on the same version is already out; waits for a
    /// slot first. Returns whether it was sent.
    async fn submit(&mut self, write: (Write, WriteFuture<'a>)) -> bool {
        let (write, future) = write;
        if self.sent.get(&write.key) == Some(&write.resource_version) {
            return false;
        }
        while self.inflight.len() >= self.concurrency {
            if let Some(done) = self.inflight.next().await {
                self.done(done);
            }
        }
        self.sent.insert(write.key, write.resource_version);
        self.inflight.push(future);
        true
    }

    /// A failed write may be decided again on the same version (the next pass retries it).
    fn done(&mut self, (key, landed): (String, bool)) {
        if !landed {
            self.sent.remove(&key);
        }
    }
}

/// A label write the sharder decided.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Write {
    key: String,
    namespace: Option<String>,
    name: String,
    resource_version: Option<String>,
    kind: WriteKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum WriteKind {
    /// `to` into the shard label, the drain label removed; `from` the dead owner, if any.
    Assign {
        to: String,
        from: Option<String>,
    },
    Drain,
}

impl Write {
    fn patch(&self, ring: &RingName) -> serde_json::Value {
        let labels = match &self.kind {
            WriteKind::Assign { to, .. } => serde_json::json!({
                ring.shard_label(): to,
                ring.drain_label(): null,
            }),
            WriteKind::Drain => serde_json::json!({ ring.drain_label(): DRAIN_VALUE }),
        };
        serde_json::json!({
            "metadata": {
                "resourceVersion": self.resource_version,
                "labels": labels,
            }
        })
    }
}

/// The write for one cached object, if its labels must change.
fn decide<K>(
    object: &PartialObjectMeta<K>,
    ring: &RingName,
    membership: &Membership,
) -> Option<Write> {
    let meta = &object.metadata;
    let name = meta.name.clone()?;
    let key = object_key(meta.namespace.as_deref(), &name);
    let labels = ObjectLabels::read(meta.labels.as_ref(), ring);
    let kind = match assign(labels, membership, membership.choose(&key)) {
        AssignDecision::Nothing => return None,
        AssignDecision::Assign(to) => WriteKind::Assign {
            to,
            from: labels.shard.map(str::to_owned),
        },
        AssignDecision::Drain => WriteKind::Drain,
    };
    Some(Write {
        key,
        namespace: meta.namespace.clone(),
        name,
        resource_version: meta.resource_version.clone(),
        kind,
    })
}

/// Drops what the sharder never reads, so its cache is names and labels.
fn trim<K>(object: &mut PartialObjectMeta<K>) {
    let meta = &mut object.metadata;
    meta.annotations = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    object.types = None;
}

impl<K> Sharder<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// A sharder of the objects of kind `K` that `config.objects` selects.
    pub fn new(client: kube::Client, config: SharderConfig) -> Self {
        Self {
            // An `Api` of `PartialObjectMeta` lists and watches metadata only.
            objects: Api::all(client.clone()),
            client,
            config,
            metrics: ShardingMetrics::default(),
        }
    }

    /// A sharder of the objects of kind `K` in `namespace` only (its list and watch need only
    /// namespaced RBAC).
    pub fn new_in(client: kube::Client, config: SharderConfig, namespace: &str) -> Self
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope>,
    {
        Self {
            objects: Api::namespaced(client.clone(), namespace),
            ..Self::new(client, config)
        }
    }

    /// Counts into `metrics` (registered by the caller) instead of unregistered families.
    pub fn with_metrics(mut self, metrics: ShardingMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Runs while this replica leads: waits for leadership, then shards until shutdown or
    /// the loss of leadership (which triggers shutdown too: [`crate::leader`] is fail-stop).
    pub async fn run_while_leader(
        self,
        leader: &LeaderHandle,
        shutdown: &Shutdown,
    ) -> Result<(), ShardingError> {
        if !leader.acquired().await || shutdown.is_triggered() {
            return Ok(());
        }
        let stop = shutdown.token().child_token();
        let mut leading = leader.subscribe();
        let on_loss = stop.clone();
        let watcher = tokio::spawn(async move {
            let _ = leading.wait_for(|leader| !*leader).await;
            on_loss.cancel();
        });
        let result = self.run(stop).await;
        watcher.abort();
        result
    }

    /// Shards until `stop` is cancelled. Decisions start once both the object cache and the
    /// membership have synced.
    pub async fn run(self, stop: CancellationToken) -> Result<(), ShardingError> {
        let ring = self.config.ring.clone();
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.config.lease_namespace);
        let members_stop = stop.child_token();
        let (mut members, members_task) =
            watch_membership(leases.clone(), ring.clone(), members_stop.clone());
        let result = self.shard(&ring, &leases, &mut members, &stop).await;
        members_stop.cancel();
        let _ = members_task.await;
        result
    }

    async fn shard(
        &self,
        ring: &RingName,
        leases: &Api<Lease>,
        members: &mut tokio::sync::watch::Receiver<Membership>,
        stop: &CancellationToken,
    ) -> Result<(), ShardingError> {
        let (store, writer) = reflector::store::<PartialObjectMeta<K>>();
        let stream = reflector::reflector(
            writer,
            watcher(self.objects.clone(), self.config.objects.clone())
                .default_backoff()
                .modify(trim::<K>),
        )
        .touched_objects();
        let mut stream = std::pin::pin!(stream);
        let ready = store.wait_until_ready();
        let mut ready = std::pin::pin!(ready);
        let mut objects_synced = false;
        let mut membership = members.borrow_and_update().clone();
        let mut resync = tokio::time::interval(self.config.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut writes = Writes::new(self.config.concurrency);
        let mut lease_retry: Option<tokio::time::Instant> = None;
        tracing::info!(ring = %ring, "sharder started");

        loop {
            let synced = objects_synced && membership.is_synced();
            let mut walk = false;
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                // The watch first: the cache must catch up with the writes, or every pass would
                // decide from the versions they replaced (and conflict).
                item = stream.next() => match item {
                    None => return Err(ShardingError::NotSynced { what: "object" }),
                    Some(Err(error)) => {
                        tracing::warn!(ring = %ring, %error, "sharder watch failed");
                    }
                    Some(Ok(object)) => {
                        writes.observe(&object);
                        if synced && let Some(write) = decide(&object, ring, &membership) {
                            writes.submit(self.write(ring, write)).await;
                        }
                    }
                },
                Some(done) = writes.inflight.next(), if !writes.inflight.is_empty() => {
                    writes.done(done);
                }
                result = &mut ready, if !objects_synced => {
                    if result.is_err() {
                        return Err(ShardingError::NotSynced { what: "object" });
                    }
                    objects_synced = true;
                    walk = membership.is_synced();
                }
                changed = members.changed() => {
                    if changed.is_err() {
                        return Err(ShardingError::NotSynced { what: "shard lease" });
                    }
                    membership = members.borrow_and_update().clone();
                    self.metrics.set_shards(ring, &membership);
                    lease_retry = self.lease_retry(ring, leases, &membership).await;
                    walk = objects_synced && membership.is_synced();
                }
                () = sleep_until_some(lease_retry) => {
                    lease_retry = self.lease_retry(ring, leases, &membership).await;
                }
                _ = resync.tick() => walk = synced,
            }
            if walk {
                self.walk(ring, &store, &membership, &mut writes, stop)
                    .await;
            }
        }
        // Let the writes already sent finish: each is a guarded, self-contained patch.
        while let Some(done) = writes.inflight.next().await {
            writes.done(done);
        }
        tracing::info!(ring = %ring, "sharder stopped");
        Ok(())
    }

    /// One pass over the cache: every object's decision, writes bounded by `concurrency`.
    async fn walk<'a>(
        &'a self,
        ring: &'a RingName,
        store: &reflector::Store<PartialObjectMeta<K>>,
        membership: &Membership,
        writes: &mut Writes<'a>,
        stop: &CancellationToken,
    ) {
        let objects = store.state();
        let mut counts = BTreeMap::<&str, usize>::new();
        for object in &objects {
            if let Some(shard) = ObjectLabels::read(object.metadata.labels.as_ref(), ring).shard {
                *counts.entry(shard).or_default() += 1;
            }
        }
        self.metrics.set_objects(ring, counts);
        let mut decided = 0usize;
        for object in &objects {
            if stop.is_cancelled() {
                return;
            }
            let Some(write) = decide(object, ring, membership) else {
                continue;
            };
            if writes.submit(self.write(ring, write)).await {
                decided += 1;
            }
        }
        tracing::debug!(ring = %ring, objects = objects.len(), writes = decided, "sharder pass");
    }

    /// [`drive_leases`](Self::drive_leases), and when to try again if a call failed.
    async fn lease_retry(
        &self,
        ring: &RingName,
        leases: &Api<Lease>,
        membership: &Membership,
    ) -> Option<tokio::time::Instant> {
        let settled = self.drive_leases(ring, leases, membership).await;
        (!settled).then(|| tokio::time::Instant::now() + LEASE_RETRY)
    }

    /// Acquires `Uncertain` Leases (confirming their shards dead) and deletes `Orphaned` ones,
    /// each after a fresh read, guarded by its resourceVersion. Returns whether every call
    /// answered (a conflict does: the Lease event that caused it republishes the membership);
    /// if not, the caller retries, as no state change will.
    async fn drive_leases(
        &self,
        ring: &RingName,
        leases: &Api<Lease>,
        membership: &Membership,
    ) -> bool {
        let mut settled = true;
        for (shard, state) in membership.shards() {
            if !matches!(state, ShardState::Uncertain | ShardState::Orphaned) {
                continue;
            }
            let name = format!("{ring}-{shard}");
            let lease = match leases.get_opt(&name).await {
                Ok(Some(lease)) => lease,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(lease = %name, %error, "cannot read a shard lease");
                    settled = false;
                    continue;
                }
            };
            let now = Timestamp::now();
            match classify(&lease, shard, now).state {
                ShardState::Uncertain => {
                    match leases
                        .replace(&name, &PostParams::default(), &confirmed_dead(&lease, now))
                        .await
                    {
                        Ok(_) => {
                            self.metrics.death_confirmed(ring);
                            tracing::info!(lease = %name, shard,
                                "shard lease expired long ago; acquired it, the shard is dead");
                        }
                        Err(error) if is_conflict(&error) => {
                            tracing::info!(lease = %name, "shard lease renewed meanwhile");
                        }
                        Err(error) => {
                            tracing::warn!(lease = %name, %error, "cannot acquire a shard lease");
                            settled = false;
                        }
                    }
                }
                ShardState::Orphaned => {
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            resource_version: lease.metadata.resource_version.clone(),
                            uid: lease.metadata.uid.clone(),
                        }),
                        ..DeleteParams::default()
                    };
                    match leases.delete(&name, &params).await {
                        Ok(_) => tracing::info!(lease = %name, "orphaned shard lease deleted"),
                        Err(error) if is_conflict(&error) || is_not_found(&error) => {}
                        Err(error) => {
                            tracing::warn!(lease = %name, %error, "cannot delete a shard lease");
                            settled = false;
                        }
                    }
                }
                _ => {}
            }
        }
        settled
    }
}

impl<K> Sharder<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn write<'a>(&'a self, ring: &'a RingName, write: Write) -> (Write, WriteFuture<'a>) {
        (write.clone(), Box::pin(self.perform(ring, write)))
    }

    async fn perform(&self, ring: &RingName, write: Write) -> (String, bool) {
        let body = write.patch(ring);
        let request = Request::new(K::url_path(&(), write.namespace.as_deref())).patch_metadata(
            &write.name,
            &PatchParams::default(),
            &Patch::Merge(&body),
        );
        let result = match request {
            Ok(request) => self.client.request::<PartialObjectMeta<K>>(request).await,
            Err(error) => Err(kube::Error::BuildRequest(error)),
        };
        let object = write.key.as_str();
        let landed = result.is_ok();
        match result {
            Ok(_) => match &write.kind {
                WriteKind::Assign { to, from: None } => {
                    self.metrics.assigned(ring);
                    tracing::debug!(object, shard = %to, "assigned");
                }
                WriteKind::Assign {
                    to,
                    from: Some(from),
                } => {
                    self.metrics.dead_reassigned(ring);
                    tracing::debug!(object, shard = %to, dead = %from, "reassigned from dead");
                }
                WriteKind::Drain => {
                    self.metrics.drain_started(ring);
                    tracing::debug!(object, "drain requested");
                }
            },
            // A stale cache or a deleted object: the watch brings the current state.
            Err(error) if is_conflict(&error) || is_not_found(&error) => {
                tracing::debug!(object, %error, "label write skipped");
            }
            Err(error) => tracing::warn!(object, %error, "label write failed"),
        }
        (write.key, landed)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::super::assign::labels_for;
    use super::*;

    fn ring() -> RingName {
        RingName::new("ring").expect("valid")
    }

    fn object(
        name: &str,
        labels: Option<BTreeMap<String, String>>,
    ) -> PartialObjectMeta<ConfigMap> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                resource_version: Some("7".into()),
                labels,
                annotations: Some(BTreeMap::from([("big".into(), "x".repeat(100))])),
                ..ObjectMeta::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    #[test]
    fn writes_carry_the_resource_version_and_touch_only_the_rings_labels() {
        let ring = ring();
        let membership = Membership::from_states([
            ("a".to_owned(), ShardState::Ready),
            ("dead".to_owned(), ShardState::Dead),
        ]);
        let write = decide(&object("x", None), &ring, &membership).expect("assigns");
        assert_eq!(
            write.kind,
            WriteKind::Assign {
                to: "a".into(),
                from: None
            }
        );
        assert_eq!(
            write.patch(&ring),
            serde_json::json!({"metadata": {"resourceVersion": "7", "labels": {
                "shard.sharding.capstan.dev/ring": "a",
                "drain.sharding.capstan.dev/ring": null,
            }}})
        );
        let moved = decide(
            &object("x", Some(labels_for(&ring, "dead", false))),
            &ring,
            &membership,
        )
        .expect("reassigns");
        assert_eq!(
            moved.kind,
            WriteKind::Assign {
                to: "a".into(),
                from: Some("dead".into())
            }
        );
        assert_eq!(
            decide(
                &object("x", Some(labels_for(&ring, "a", false))),
                &ring,
                &membership
            ),
            None
        );
    }

    #[test]
    fn a_drain_adds_only_the_drain_label() {
        let ring = ring();
        let membership = Membership::from_states([
            ("a".to_owned(), ShardState::Ready),
            ("b".to_owned(), ShardState::Ready),
        ]);
        let key = object_key(Some("default"), "x");
        let chosen = membership.choose(&key).expect("ready shards");
        let other = if chosen == "a" { "b" } else { "a" };
        let write = decide(
            &object("x", Some(labels_for(&ring, other, false))),
            &ring,
            &membership,
        )
        .expect("drains");
        assert_eq!(write.kind, WriteKind::Drain);
        assert_eq!(
            write.patch(&ring),
            serde_json::json!({"metadata": {"resourceVersion": "7", "labels": {
                "drain.sharding.capstan.dev/ring": "true",
            }}})
        );
    }

    fn sent(write: &Write, landed: bool) -> (Write, WriteFuture<'static>) {
        let key = write.key.clone();
        (write.clone(), Box::pin(async move { (key, landed) }))
    }

    #[tokio::test]
    async fn a_pass_while_the_watch_lags_does_not_repeat_a_write_until_a_new_version_or_a_failure()
    {
        let ring = ring();
        let membership = Membership::from_states([("a".to_owned(), ShardState::Ready)]);
        let cached = object("x", None);
        let write = decide(&cached, &ring, &membership).expect("assigns");
        let mut writes = Writes::new(4);
        assert!(writes.submit(sent(&write, true)).await);
        assert!(
            !writes.submit(sent(&write, true)).await,
            "same decision on the same version"
        );
        let done = writes.inflight.next().await.expect("in flight");
        writes.done(done);
        assert!(
            !writes.submit(sent(&write, true)).await,
            "landed, but the watch has not shown it yet"
        );
        // The watch brings the written version: decisions on it are new.
        let mut newer = cached.clone();
        newer.metadata.resource_version = Some("8".into());
        writes.observe(&newer);
        assert!(writes.sent.is_empty());
        // A failed write is retried by the next decision on the same version.
        assert!(writes.submit(sent(&write, false)).await);
        let done = writes.inflight.next().await.expect("in flight");
        writes.done(done);
        assert!(writes.submit(sent(&write, true)).await);
    }

    #[test]
    fn the_cache_keeps_names_and_labels_only() {
        let ring = ring();
        let mut cached = object("x", Some(labels_for(&ring, "a", false)));
        trim(&mut cached);
        assert_eq!(cached.metadata.annotations, None);
        assert!(cached.metadata.labels.is_some());
        assert_eq!(cached.metadata.resource_version.as_deref(), Some("7"));
    }
}
