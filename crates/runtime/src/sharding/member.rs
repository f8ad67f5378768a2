//! One replica's part in a ring, as a controller uses it: its shard Lease, the ring's membership
//! as this replica sees it, and the three questions asked per object — may I reconcile it, must
//! I hand it back, may I create it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::assign::{ShardAction, shard_action};
use super::lease::{Membership, ShardHandle, ShardLease, ShardLeaseConfig, watch_membership};
use super::metrics::ShardingMetrics;
use super::shard::{ReleaseOutcome, release_object, shard_watcher_config};
use super::{RingName, ShardId, ShardingError};
use crate::cli::LeaderElectionArgs;
use crate::shutdown::Shutdown;

/// A running shard of one ring: created by [`ShardMember::start`], shared by a controller's
/// watches and reconciles.
pub struct ShardMember {
    client: kube::Client,
    config: ShardLeaseConfig,
    handle: ShardHandle,
    membership: watch::Receiver<Membership>,
    metrics: Option<ShardingMetrics>,
    stop_membership: CancellationToken,
}

impl ShardMember {
    /// Takes this replica's Lease of `ring` (named from the leader election flags: identity =
    /// shard id, same namespace and timings) and watches the ring's membership. The Lease is
    /// fail-stop: losing it triggers `shutdown`.
    pub fn start(
        client: kube::Client,
        ring: RingName,
        leader: &LeaderElectionArgs,
        shutdown: Shutdown,
        metrics: Option<ShardingMetrics>,
    ) -> Result<Arc<Self>, ShardingError> {
        let config = ShardLeaseConfig::from_leader_args(ring, leader)?;
        let handle = ShardLease::start(client.clone(), config.clone(), shutdown.clone())?;
        let stop_membership = shutdown.token().child_token();
        let leases: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
        let (membership, _task) =
            watch_membership(leases, config.ring.clone(), stop_membership.clone());
        Ok(Arc::new(Self {
            client,
            config,
            handle,
            membership,
            metrics,
            stop_membership,
        }))
    }

    pub fn ring(&self) -> &RingName {
        &self.config.ring
    }

    pub fn shard(&self) -> &ShardId {
        &self.config.shard
    }

    /// The shard Lease: wait for [`ShardHandle::active`] before reconciling, call
    /// [`ShardHandle::release`] after the last reconcile finished.
    pub fn lease(&self) -> &ShardHandle {
        &self.handle
    }

    /// The watcher config of every watch of the ring's objects: this shard's label only.
    pub fn watcher_config(&self) -> kube::runtime::watcher::Config {
        shard_watcher_config(&self.config.ring, &self.config.shard)
    }

    /// `{shard label: this shard}`: the labels of an object this shard creates, so that it is
    /// its own from the first write and lands in its watch.
    pub fn own_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(
            self.config.ring.shard_label(),
            self.config.shard.as_str().to_owned(),
        )])
    }

    /// What to do with an object of the ring at the top of a reconcile: [`ShardAction::Ignore`]
    /// while the Lease is not held (fail-stop), else by its labels. A refusal is counted.
    pub fn action(&self, labels: Option<&BTreeMap<String, String>>) -> ShardAction {
        let action = if self.handle.is_active() {
            shard_action(labels, &self.config.ring, &self.config.shard)
        } else {
            ShardAction::Ignore
        };
        if action == ShardAction::Ignore {
            self.refused();
        }
        action
    }

    /// Whether this shard should create the ring's object `key` that does not exist yet (so that
    /// no label can say whose it is): the Lease is held and, among the ready shards this replica
    /// sees, the ring chooses it. Replicas with different views may both say yes; the create is
    /// atomic, the loser gets 409 and leaves the object to its label.
    pub fn chooses_me(&self, key: &str) -> bool {
        if !self.handle.is_active() {
            return false;
        }
        let membership = self.membership.borrow();
        membership.is_synced() && membership.choose(key) == Some(self.config.shard.as_str())
    }

    /// Counts a reconcile refused because the object is not this shard's.
    pub fn refused(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.reconcile_refused(&self.config.ring, self.config.shard.as_str());
        }
    }

    /// A receiver of the membership this replica sees (for tests and status pages).
    pub fn membership(&self) -> watch::Receiver<Membership> {
        self.membership.clone()
    }

    /// Acknowledges the drain of `object` ([`release_object`]); call it once no reconcile of it
    /// runs any more.
    pub async fn release<K>(&self, object: &K) -> Result<ReleaseOutcome, ShardingError>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        release_object(
            &self.client,
            &self.config.ring,
            &self.config.shard,
            object,
            self.metrics.as_ref(),
        )
        .await
    }
}

impl Drop for ShardMember {
    fn drop(&mut self) {
        self.stop_membership.cancel();
    }
}
