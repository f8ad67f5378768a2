//! The state one server instance shares between its request handlers, the testbed and the
//! workload simulation: the cluster behind its lock, and the single switch that ends open watches.

use crate::cluster::Cluster;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How every open watch stream is ended at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// The stream ends cleanly; clients resume from their last resourceVersion.
    Cut,
    /// The stream ends with a `410 Gone` ERROR event; clients must re-list.
    Expire,
}

/// State shared by all requests of one server instance.
pub struct Shared {
    pub cluster: Mutex<Cluster>,
    /// The cluster's registry, read without its lock.
    registry: crate::registry::PublishedRegistry,
    /// The cluster's source of names and uids, used without its lock.
    random: std::sync::Arc<crate::util::Random>,
    pub shutdown: CancellationToken,
    pub server_address: String,
    pub bookmark_interval: Duration,
    /// With a data directory: what a write's response waits for (its records on disk).
    pub group_commit: std::sync::OnceLock<std::sync::Arc<crate::commit_log::GroupCommit>>,
    /// The last way watches were ended; every change ends every open watch (see `end_watches`).
    watch_ends: tokio::sync::watch::Sender<Option<WatchEnd>>,
}

impl Shared {
    pub fn new(cluster: Cluster, server_address: String, bookmark_interval: Duration) -> Self {
        Self {
            registry: cluster.published_registry(),
            random: cluster.random.clone(),
            cluster: Mutex::new(cluster),
            shutdown: CancellationToken::new(),
            server_address,
            bookmark_interval,
            group_commit: std::sync::OnceLock::new(),
            watch_ends: tokio::sync::watch::Sender::new(None),
        }
    }

    /// The cluster, for one verb. std's lock, not parking_lot's: parking_lot's spinning took
    /// the CPU a controller process beside kube-sim needed (the nodeslo bench went from 1.2x to
    /// 1.5x its floor).
    pub fn lock(&self) -> MutexGuard<'_, Cluster> {
        // A panic while holding the lock leaves consistent data (every write is a single put).
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registry as last rebuilt, without taking the cluster's lock.
    pub fn registry(&self) -> std::sync::Arc<crate::registry::Registry> {
        self.registry.get()
    }

    /// The cluster's source of generated names and uids, without taking its lock.
    pub fn random(&self) -> &crate::util::Random {
        &self.random
    }

    /// Ends every watch open now, the way `how` says.
    pub fn end_watches(&self, how: WatchEnd) {
        self.watch_ends.send_replace(Some(how));
    }

    /// What a new watch stream listens to: it ends at the next `end_watches`.
    pub fn watch_ends(&self) -> tokio::sync::watch::Receiver<Option<WatchEnd>> {
        self.watch_ends.subscribe()
    }
}
