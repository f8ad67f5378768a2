//! The sharder: one per ring, on the replica holding the ordinary leader Lease. It follows the
//! ring's membership and writes the [`super::assign()`] decision into objects' labels: for an
//! object without a shard label, on its watch event; for the objects a membership change may
//! move ([`PassScope`]), and for every object every `resync`, in a pass that lists them page by
//! page.
//!
//! It also drives the Lease state machine's sharder half: an `Uncertain` Lease is acquired
//! (confirming the shard dead), an `Orphaned` one deleted.
//!
//! Every label write is a JSON merge patch of `metadata.labels` carrying the `resourceVersion`
//! the decision was made from (the anchor's optimistic lock): decided from a version that has
//! moved on (a page listed before another write landed, a late watch event) it conflicts instead
//! of, say, assigning an object a second time. The watch or the next pass brings it back.
//!
//! **Decision**: no cache, and a watch instead of the anchor's webhook (`docs/design.md`,
//! "Don't Watch Sharded Objects"). The watch selects only objects *without* a shard label (new
//! ones, and those an owner released after a drain); an assigned object leaves that selection,
//! so at rest the watch delivers nothing and holds nothing. Moves (a dead owner's objects, drains
//! towards a joining shard) are decided from a paginated metadata list ([`PAGE`] objects at a
//! time), so the leader's memory does not grow with the ring: a metadata cache of 50,000 Nodes
//! and 50,000 NodeSLOs cost the leader about 150 MiB (`cargo xtask bench sharding`). The price
//! is a list per membership change, narrowed to a stopped owner's objects where that is all that
//! can move, and of every object every `resync`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Future, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectList, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::{PartialObjectMeta, Request};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::assign::{AssignDecision, ObjectLabels, assign};
use super::lease::{Membership, classify, confirmed_dead, sleep_until_some, watch_membership};
use super::metrics::ShardingMetrics;
use super::ring::object_key;
use super::{DRAIN_VALUE, RingName, ShardState, ShardingError};
use crate::kube_errors::{is_conflict, is_not_found, is_transient};
use crate::leader::LeaderHandle;
use crate::shutdown::Shutdown;

/// How soon a failed Lease acquisition or deletion, or a failed pass, is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// Objects per page of a pass's list: what the sharder holds at once (two pages: the one whose
/// writes go out, and the next).
pub const PAGE: u32 = 500;

/// Objects in a pass's first page, whose list the first writes wait for.
const FIRST_PAGE: u32 = 100;

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

/// One label write in flight.
type WriteFuture<'a, K> = std::pin::Pin<Box<dyn Future<Output = Answer<K>> + Send + 'a>>;

/// What a label write came to.
struct Answer<K> {
    key: String,
    /// The version the write was decided from.
    resource_version: Option<String>,
    /// The object read again after the write did not land (a conflict: it changed since the
    /// decision; or another failure, after [`RETRY`]), to be decided again. `None` once it
    /// landed or the object is gone.
    fresh: Option<PartialObjectMeta<K>>,
}

/// The writes in flight, at most `concurrency`: a decision on a version whose write is still
/// out is not sent again, one on a newer version is (the older write then conflicts, or lands
/// and makes the newer one conflict: every write carries its resourceVersion, so neither can
/// land on a version it was not decided from). Nothing is kept once a write answered, since a
/// pass lists fresh from the API server; a write that did not land hands back its object read
/// again ([`Answer::fresh`]), since no watch event may bring it (an assigned object is not
/// watched).
struct Writes<'a, K> {
    inflight: FuturesUnordered<WriteFuture<'a, K>>,
    /// The version each object's latest write in flight was decided from.
    sent: HashMap<String, Option<String>>,
    /// Objects whose write did not land, read again, to decide again.
    recheck: Vec<PartialObjectMeta<K>>,
    concurrency: usize,
}

impl<'a, K> Writes<'a, K> {
    fn new(concurrency: usize) -> Self {
        Self {
            inflight: FuturesUnordered::new(),
            sent: HashMap::new(),
            recheck: Vec::new(),
            concurrency: concurrency.max(1),
        }
    }

    /// Sends `write` unless a write decided from the same version of its object is still out;
    /// waits for a slot first. Returns whether it was sent.
    async fn submit(&mut self, write: (Write, WriteFuture<'a, K>)) -> bool {
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

    fn done(&mut self, answer: Answer<K>) {
        if self.sent.get(&answer.key) == Some(&answer.resource_version) {
            self.sent.remove(&answer.key);
        }
        self.recheck.extend(answer.fresh);
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

/// The watch of the objects in `objects` that carry no shard label of `ring`.
fn unassigned(objects: &watcher::Config, ring: &RingName) -> watcher::Config {
    let unlabelled = format!("!{}", ring.shard_label());
    let mut config = objects.clone();
    config.label_selector = Some(match objects.label_selector.as_deref() {
        Some(selector) if !selector.trim().is_empty() => format!("{selector},{unlabelled}"),
        _ => unlabelled,
    });
    config
}

/// The objects a pass lists.
#[derive(Clone, Debug, PartialEq, Eq)]
enum PassScope {
    None,
    /// Those labelled with one of these owners.
    Owners(BTreeSet<String>),
    All,
}

impl PassScope {
    /// What both passes would list.
    fn and(self, other: Self) -> Self {
        match (self, other) {
            (Self::All, _) | (_, Self::All) => Self::All,
            (Self::None, scope) | (scope, Self::None) => scope,
            (Self::Owners(mut a), Self::Owners(b)) => {
                a.extend(b);
                Self::Owners(a)
            }
        }
    }
}

/// The objects whose decision the change from `before` to `after` may change. A shard that
/// became ready may be any object's new choice (drains everywhere); an owner that may no longer
/// be working loses its objects, and nobody else's decision changes: an owner that is merely
/// not ready keeps its objects, and unlabelled objects come through the watch.
fn pass_scope(before: &Membership, after: &Membership) -> PassScope {
    if !after.is_synced() {
        return PassScope::None;
    }
    let joined = after
        .ready()
        .any(|shard| !before.state(shard).is_some_and(ShardState::is_ready));
    if !before.is_synced() || joined {
        return PassScope::All;
    }
    let stopped: BTreeSet<String> = before
        .shards()
        .filter(|(shard, state)| {
            state.may_be_working() && !after.state(shard).is_some_and(ShardState::may_be_working)
        })
        .map(|(shard, _)| shard.to_owned())
        .collect();
    if stopped.is_empty() {
        PassScope::None
    } else {
        PassScope::Owners(stopped)
    }
}

/// The list a pass over `scope` pages through (`None` for [`PassScope::None`]).
fn pass_list(objects: &watcher::Config, ring: &RingName, scope: &PassScope) -> Option<ListParams> {
    let narrowed = match scope {
        PassScope::None => return None,
        PassScope::All => None,
        PassScope::Owners(owners) => Some(format!(
            "{} in ({})",
            ring.shard_label(),
            owners
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(",")
        )),
    };
    let label_selector = match (objects.label_selector.as_deref(), narrowed) {
        (Some(selector), Some(owners)) if !selector.trim().is_empty() => {
            Some(format!("{selector},{owners}"))
        }
        (_, Some(owners)) => Some(owners),
        (selector, None) => selector.map(str::to_owned),
    };
    Some(ListParams {
        label_selector,
        field_selector: objects.field_selector.clone(),
        limit: Some(PAGE),
        ..ListParams::default()
    })
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
        let stream =
            watcher(self.objects.clone(), unassigned(&self.config.objects, ring)).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut objects_synced = false;
        let mut membership = members.borrow_and_update().clone();
        let mut resync = tokio::time::interval(self.config.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut writes = Writes::new(self.config.concurrency);
        let mut lease_retry: Option<tokio::time::Instant> = None;
        let mut pass_retry: Option<(tokio::time::Instant, PassScope)> = None;
        tracing::info!(ring = %ring, "sharder started");

        loop {
            let synced = objects_synced && membership.is_synced();
            // Writes that did not land, decided again on their objects as they are now (before
            // the sync, the first pass decides everything).
            for object in std::mem::take(&mut writes.recheck) {
                if synced {
                    self.settle(ring, &object, &membership, &mut writes).await;
                }
            }
            let mut pass = PassScope::None;
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                item = stream.next() => match item {
                    None => return Err(ShardingError::NotSynced { what: "object" }),
                    Some(Err(error)) => {
                        tracing::warn!(ring = %ring, %error, "sharder watch failed");
                    }
                    Some(Ok(watcher::Event::InitApply(object) | watcher::Event::Apply(object))) => {
                        if synced {
                            self.settle(ring, &object, &membership, &mut writes).await;
                        }
                    }
                    // Assigned (it left the selection) or deleted.
                    Some(Ok(watcher::Event::Delete(_) | watcher::Event::Init)) => {}
                    Some(Ok(watcher::Event::InitDone)) => {
                        // The first pass assigns what the initial list delivered before it.
                        if !objects_synced && membership.is_synced() {
                            pass = PassScope::All;
                        }
                        objects_synced = true;
                    }
                },
                Some(done) = writes.inflight.next(), if !writes.inflight.is_empty() => {
                    writes.done(done);
                }
                changed = members.changed() => {
                    if changed.is_err() {
                        return Err(ShardingError::NotSynced { what: "shard lease" });
                    }
                    let before = std::mem::replace(
                        &mut membership,
                        members.borrow_and_update().clone(),
                    );
                    self.metrics.set_shards(ring, &membership);
                    lease_retry = self.lease_retry(ring, leases, &membership).await;
                    if objects_synced {
                        pass = pass_scope(&before, &membership);
                    }
                }
                () = sleep_until_some(lease_retry) => {
                    lease_retry = self.lease_retry(ring, leases, &membership).await;
                }
                () = sleep_until_some(pass_retry.as_ref().map(|(at, _)| *at)) => {
                    if let Some((_, scope)) = pass_retry.take() {
                        pass = scope;
                    }
                }
                _ = resync.tick() => {
                    if synced {
                        pass = PassScope::All;
                    }
                }
            }
            // A failed pass is tried again with what came since.
            if let Some((at, failed)) = pass_retry.take() {
                pass_retry = Some((at, failed.and(pass)));
                continue;
            }
            if let Some(list) = pass_list(&self.config.objects, ring, &pass) {
                let all = pass == PassScope::All;
                if let Err(error) = self
                    .pass(ring, list, all, &membership, &mut writes, stop)
                    .await
                {
                    tracing::warn!(ring = %ring, %error, "sharder pass failed; trying again");
                    pass_retry = Some((tokio::time::Instant::now() + RETRY, pass));
                }
            }
        }
        // Let the writes already sent finish: each is a guarded, self-contained patch.
        while let Some(done) = writes.inflight.next().await {
            writes.done(done);
        }
        tracing::info!(ring = %ring, "sharder stopped");
        Ok(())
    }

    /// One pass over the objects `params` lists, [`PAGE`] at a time: each one's decision, writes
    /// bounded by `concurrency`; the objects-per-shard gauge from what it listed if it was `all`.
    /// The next page is listed while the writes of this one go out, so that a takeover's writes
    /// never wait for a list.
    async fn pass<'a>(
        &'a self,
        ring: &'a RingName,
        params: ListParams,
        all: bool,
        membership: &Membership,
        writes: &mut Writes<'a, K>,
        stop: &CancellationToken,
    ) -> Result<(), kube::Error> {
        let started = tokio::time::Instant::now();
        let mut counts = BTreeMap::<String, usize>::new();
        let (mut listed, mut decided) = (0usize, 0usize);
        // A short first page: the first writes go out after a list of 100, not of 500.
        let mut first = params.clone();
        first.limit = Some(FIRST_PAGE.min(params.limit.unwrap_or(PAGE)));
        let mut page = self.objects.list(&first).await?;
        let first_page = started.elapsed();
        loop {
            let next = async {
                match page.metadata.continue_.as_deref() {
                    Some(token) if !token.is_empty() => {
                        let mut params = params.clone();
                        params.continue_token = Some(token.to_owned());
                        self.objects.list(&params).await.map(Some)
                    }
                    _ => Ok(None),
                }
            };
            let submit = async {
                for object in &page.items {
                    if stop.is_cancelled() {
                        return;
                    }
                    listed += 1;
                    let labels = ObjectLabels::read(object.metadata.labels.as_ref(), ring);
                    if let Some(shard) = labels.shard {
                        *counts.entry(shard.to_owned()).or_default() += 1;
                    }
                    if self.settle(ring, object, membership, writes).await {
                        decided += 1;
                    }
                }
            };
            let (next, ()) = futures::join!(next, submit);
            if stop.is_cancelled() {
                return Ok(());
            }
            match next? {
                Some(following) => page = following,
                None => break,
            }
        }
        if all {
            self.metrics
                .set_objects(ring, counts.iter().map(|(shard, n)| (shard.as_str(), *n)));
        }
        // Rare (a membership change, or every `resync`) and what a slow takeover is made of.
        tracing::info!(
            ring = %ring,
            selector = params.label_selector.as_deref().unwrap_or_default(),
            objects = listed,
            writes = decided,
            first_page_ms = first_page.as_millis() as u64,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "sharder pass"
        );
        Ok(())
    }

    /// [`drive_leases`](Self::drive_leases), and when to try again if a call failed.
    async fn lease_retry(
        &self,
        ring: &RingName,
        leases: &Api<Lease>,
        membership: &Membership,
    ) -> Option<tokio::time::Instant> {
        let settled = self.drive_leases(ring, leases, membership).await;
        (!settled).then(|| tokio::time::Instant::now() + RETRY)
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
    /// Sends the write `object` needs under `membership`, if any; returns whether one went out.
    async fn settle<'a>(
        &'a self,
        ring: &'a RingName,
        object: &PartialObjectMeta<K>,
        membership: &Membership,
        writes: &mut Writes<'a, K>,
    ) -> bool {
        match decide(object, ring, membership) {
            Some(write) => writes.submit(self.write(ring, write)).await,
            None => false,
        }
    }

    fn write<'a>(&'a self, ring: &'a RingName, write: Write) -> (Write, WriteFuture<'a, K>) {
        (write.clone(), Box::pin(self.perform(ring, write)))
    }

    async fn perform(&self, ring: &RingName, write: Write) -> Answer<K> {
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
        let read_again = match result {
            Ok(_) => {
                match &write.kind {
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
                }
                false
            }
            Err(error) if is_not_found(&error) => false,
            Err(error) if is_conflict(&error) => {
                tracing::debug!(object, "changed since the decision; reading it again");
                true
            }
            Err(error) if is_transient(&error) => {
                tracing::warn!(object, %error, "label write failed; trying again");
                tokio::time::sleep(RETRY).await;
                true
            }
            // A refusal (403, 422, an admission webhook): the same write gets the same answer,
            // so it waits for the next `resync` pass instead of being sent every second.
            Err(error) => {
                tracing::warn!(object, %error, "label write refused; the next resync tries again");
                false
            }
        };
        let fresh = if read_again {
            self.read(&write).await
        } else {
            None
        };
        Answer {
            key: write.key,
            resource_version: write.resource_version,
            fresh,
        }
    }

    /// The object's metadata now, or `None` if it is gone or cannot be read (the next pass
    /// decides it then). Read by a list of its name, not a get: the sharder's RBAC is list,
    /// watch and patch (the chart grants no more).
    async fn read(&self, write: &Write) -> Option<PartialObjectMeta<K>> {
        let params = ListParams::default().fields(&format!("metadata.name={}", write.name));
        let request =
            Request::new(K::url_path(&(), write.namespace.as_deref())).list_metadata(&params);
        let result = match request {
            Ok(request) => {
                self.client
                    .request::<ObjectList<PartialObjectMeta<K>>>(request)
                    .await
            }
            Err(error) => Err(kube::Error::BuildRequest(error)),
        };
        match result {
            Ok(list) => list.items.into_iter().next(),
            Err(error) => {
                tracing::warn!(object = %write.key, %error, "cannot read an object again");
                None
            }
        }
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

    /// A write that answers at once, with `fresh` as the object read again.
    fn sent(
        write: &Write,
        fresh: Option<PartialObjectMeta<ConfigMap>>,
    ) -> (Write, WriteFuture<'static, ConfigMap>) {
        let answer = Answer {
            key: write.key.clone(),
            resource_version: write.resource_version.clone(),
            fresh,
        };
        (write.clone(), Box::pin(async move { answer }))
    }

    #[tokio::test]
    async fn a_version_still_out_is_not_sent_twice_a_newer_one_is_and_nothing_is_kept_once_answered()
     {
        let ring = ring();
        let membership = Membership::from_states([("a".to_owned(), ShardState::Ready)]);
        let write = decide(&object("x", None), &ring, &membership).expect("assigns");
        let mut newer_object = object("x", None);
        newer_object.metadata.resource_version = Some("8".into());
        let newer = decide(&newer_object, &ring, &membership).expect("assigns");
        let mut writes = Writes::new(4);
        assert!(writes.submit(sent(&write, None)).await);
        assert!(
            !writes.submit(sent(&write, None)).await,
            "the same version while its write is out"
        );
        // The owner released the object while the first write was out (its answer not yet
        // collected): the newer version's decision must go out, or nothing would bring it back.
        assert!(writes.submit(sent(&newer, None)).await, "a newer version");
        let first = writes.inflight.next().await.expect("answered");
        writes.done(first);
        assert!(
            !writes.submit(sent(&newer, None)).await,
            "the older write's answer leaves the newer one out"
        );
        while let Some(done) = writes.inflight.next().await {
            writes.done(done);
        }
        assert!(writes.sent.is_empty(), "nothing is kept once answered");
        assert!(writes.recheck.is_empty());
        assert!(writes.submit(sent(&write, Some(newer_object))).await);
        while let Some(done) = writes.inflight.next().await {
            writes.done(done);
        }
        assert_eq!(
            writes
                .recheck
                .iter()
                .map(|object| object.metadata.resource_version.as_deref())
                .collect::<Vec<_>>(),
            [Some("8")],
            "a write that did not land hands its object back, read again"
        );
    }

    #[test]
    fn the_watch_selects_only_unlabelled_objects_and_a_pass_lists_all_in_pages() {
        let ring = ring();
        let unlabelled = "!shard.sharding.capstan.dev/ring";
        let everything = watcher::Config::default();
        assert_eq!(
            unassigned(&everything, &ring).label_selector.as_deref(),
            Some(unlabelled)
        );
        let narrowed = watcher::Config::default().labels("app=sharded");
        assert_eq!(
            unassigned(&narrowed, &ring).label_selector,
            Some(format!("app=sharded,{unlabelled}"))
        );
        let list = pass_list(&narrowed, &ring, &PassScope::All).expect("a list");
        assert_eq!(list.label_selector.as_deref(), Some("app=sharded"));
        assert_eq!(list.limit, Some(PAGE));
        let owners = PassScope::Owners(BTreeSet::from(["a".to_owned(), "b".to_owned()]));
        let list = pass_list(&narrowed, &ring, &owners).expect("a list");
        assert_eq!(
            list.label_selector.as_deref(),
            Some("app=sharded,shard.sharding.capstan.dev/ring in (a,b)")
        );
        assert_eq!(
            pass_list(&everything, &ring, &owners)
                .expect("a list")
                .label_selector
                .as_deref(),
            Some("shard.sharding.capstan.dev/ring in (a,b)")
        );
        assert!(pass_list(&everything, &ring, &PassScope::None).is_none());
    }

    fn states(states: &[(&str, ShardState)]) -> Membership {
        Membership::from_states(states.iter().map(|(s, st)| ((*s).to_owned(), *st)))
    }

    #[test]
    fn a_joining_shard_moves_anything_a_stopped_owner_only_its_own_and_an_expiry_nothing() {
        use ShardState::*;
        let three = states(&[("a", Ready), ("b", Ready), ("c", Ready)]);
        let owners =
            |names: &[&str]| PassScope::Owners(names.iter().map(|n| (*n).to_owned()).collect());
        assert_eq!(pass_scope(&Membership::unsynced(), &three), PassScope::All);
        assert_eq!(pass_scope(&three, &Membership::unsynced()), PassScope::None);
        assert_eq!(pass_scope(&three, &three), PassScope::None);
        let joined = states(&[("a", Ready), ("b", Ready), ("c", Ready), ("d", Ready)]);
        assert_eq!(pass_scope(&three, &joined), PassScope::All);
        // Expired, not yet confirmed dead: it may still work, so its objects stay.
        let expired = states(&[("a", Ready), ("b", Ready), ("c", Expired)]);
        assert_eq!(pass_scope(&three, &expired), PassScope::None);
        let dead = states(&[("a", Ready), ("b", Ready), ("c", Dead)]);
        assert_eq!(pass_scope(&expired, &dead), owners(&["c"]));
        // A Lease deleted outright: its owner's objects move too.
        let gone = states(&[("a", Ready), ("b", Ready)]);
        assert_eq!(pass_scope(&three, &gone), owners(&["c"]));
        assert_eq!(pass_scope(&dead, &gone), PassScope::None);
        // Coming back: a pass over everything (drains towards it).
        assert_eq!(pass_scope(&dead, &three), PassScope::All);
        assert_eq!(owners(&["a"]).and(owners(&["b"])), owners(&["a", "b"]));
        assert_eq!(PassScope::None.and(owners(&["a"])), owners(&["a"]));
        assert_eq!(owners(&["a"]).and(PassScope::All), PassScope::All);
    }
}
