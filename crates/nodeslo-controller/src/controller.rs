//! The NodeSLO controller: three watches (Nodes, NodeSLOs, the one ConfigMap, see [`crate::watch`])
//! feed small projections and a work queue of node names; workers decide with `nodeslo-core`
//! (pure) and make at most one write per node ([`crate::reconcile`]); bad input is reported as
//! Events ([`crate::events`]).
//!
//! Why not kube-runtime's `Controller`: it only reconciles objects present in its cache, and this
//! loop must act on a name whose Node is gone (delete its NodeSLO) or whose NodeSLO does not exist
//! yet (create it). The key is the node name; NodeSLO and Node share it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use capstan_runtime::admin::Readiness;
use capstan_runtime::backoff::BackoffConfig;
use capstan_runtime::controller::{Reconciler, RetryPolicy};
use capstan_runtime::events::EventPublisher;
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::sharding::ShardMember;
use capstan_runtime::shutdown::Shutdown;
use capstan_runtime::sync::read;
use capstan_runtime::workqueue::WorkQueue;
use kube::Client;
use nodeslo_core::{MergedConfig, NodeFacts};
use tokio::sync::watch;

use crate::metrics::SloMetrics;
use crate::projection::Projection;
use crate::watch::SloEntry;

/// What the controller needs to know that is not in the cluster.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config_namespace: String,
    pub config_name: String,
    pub workers: usize,
    /// How soon to retry after a conflict (stale cache): the watch brings the news shortly.
    pub conflict_retry: Duration,
    /// Field manager and Event reporter name.
    pub manager: String,
}

/// This replica's shard of the `nodeslo` ring (`--shards auto`, see [`crate::ownership`]).
pub struct Sharded {
    pub member: Arc<ShardMember>,
    /// `--shard-node-labels`: Nodes carry the shard label too and each replica watches its own.
    pub node_labels: bool,
}

/// The merged config in force and the ConfigMap version it was last computed from.
#[derive(Debug, Default)]
pub(crate) struct ConfigState {
    pub(crate) current: Arc<MergedConfig>,
    /// `resourceVersion` of the ConfigMap whose problems were last logged (`""`: absent).
    pub(crate) reported_version: Option<String>,
    /// `resourceVersion` of the ConfigMap whose problems were last published as Events and
    /// whose texts were stored as last good: by the leading replica only.
    pub(crate) published_version: Option<String>,
    pub(crate) synced: bool,
}

/// The controller's state, shared by its watches and workers.
pub struct NodeSloController {
    pub(crate) client: Client,
    pub(crate) settings: Settings,
    pub(crate) nodes: RwLock<Projection<NodeFacts>>,
    pub(crate) slos: RwLock<Projection<SloEntry>>,
    pub(crate) config: RwLock<ConfigState>,
    pub(crate) queue: WorkQueue<String>,
    pub(crate) reconciler: Reconciler,
    pub(crate) metrics: SloMetrics,
    pub(crate) events: EventPublisher,
    /// Invalid bandwidth annotations already reported, so a value gets one Event, not one per reconcile.
    pub(crate) reported_bandwidth: Mutex<HashMap<String, String>>,
    pub(crate) synced: watch::Sender<bool>,
    /// The key texts in force, kept across restarts in a ConfigMap of our own.
    pub(crate) last_good: crate::last_good::LastGoodStore,
    /// `None` unsharded: this replica reconciles every name while it leads.
    pub(crate) sharded: Option<Sharded>,
}

impl NodeSloController {
    pub fn new(
        client: Client,
        settings: Settings,
        metrics: SloMetrics,
        controller_metrics: ControllerMetrics,
        backoff: BackoffConfig,
        sharded: Option<Sharded>,
    ) -> Arc<Self> {
        let retry = RetryPolicy {
            conflict: settings.conflict_retry,
            backoff,
        };
        let last_good = crate::last_good::LastGoodStore::new(
            client.clone(),
            &settings.config_namespace,
            &settings.config_name,
            &settings.manager,
        );
        Arc::new(Self {
            events: EventPublisher::new(client.clone(), &settings.manager),
            client,
            settings,
            nodes: RwLock::default(),
            slos: RwLock::default(),
            config: RwLock::default(),
            queue: WorkQueue::new(),
            reconciler: Reconciler::new(controller_metrics, retry),
            metrics,
            reported_bandwidth: Mutex::default(),
            synced: watch::Sender::new(false),
            last_good,
            sharded,
        })
    }

    /// Runs until `shutdown`: watches at once (a standby keeps warm caches), marks ready when all
    /// three caches are synced, reconciles only while `leader` holds the lease (sharded: while
    /// the shard Lease is held, its own share). Returns after the in-flight reconciles finish.
    pub async fn run(
        self: Arc<Self>,
        readiness: Readiness,
        leader: LeaderHandle,
        shutdown: Shutdown,
    ) {
        let watches = futures::future::join3(
            self.clone().watch_nodes(),
            self.clone().watch_nodeslos(),
            self.clone().watch_config(leader.clone()),
        );
        let work = async {
            let mut synced = self.synced.subscribe();
            tokio::select! {
                result = synced.wait_for(|s| *s) => if result.is_err() { return },
                // Asked to stop before the caches ever synced: nothing to drain.
                () = shutdown.cancelled() => return,
            }
            readiness.set_ready(true);
            tracing::info!(nodes = read(&self.nodes).len(), "caches synced");
            let allowed = match &self.sharded {
                Some(sharded) => sharded.member.lease().active().await,
                None => leader.acquired().await,
            };
            if !allowed {
                return;
            }
            let workers = self
                .queue
                .run(self.settings.workers, |name| self.clone().reconcile(name));
            match &self.sharded {
                Some(sharded) => {
                    let shard = sharded.member.shard();
                    tracing::info!(%shard, "shard Lease held: reconciling this shard's nodes");
                    // Workers end at shutdown; the membership trigger is dropped with them.
                    tokio::select! {
                        () = workers => {}
                        () = self.reconcile_all_on_membership_changes(sharded) => {}
                    }
                }
                None => {
                    tracing::info!("leading: reconciling");
                    workers.await;
                }
            }
        };
        let mut work = std::pin::pin!(work);
        let work_done = tokio::select! {
            _ = watches => {
                tracing::error!("watches ended unexpectedly");
                false
            }
            () = shutdown.cancelled() => false,
            // Only when stopped before the caches synced or before leading: nothing to drain.
            () = &mut work => true,
        };
        // Drain: no new reconcile starts, the running ones finish.
        self.queue.shutdown();
        if !work_done {
            work.await;
        }
    }

    /// Sharded: another view of the ring may give this shard nodes whose NodeSLO nobody created
    /// yet (the ring's choice decides those), so every change of the membership queues every
    /// name again. Never returns.
    async fn reconcile_all_on_membership_changes(&self, sharded: &Sharded) {
        let mut membership = sharded.member.membership();
        while membership.changed().await.is_ok() {
            self.enqueue_all();
        }
        std::future::pending::<()>().await;
    }

    pub(crate) fn enqueue(&self, names: impl IntoIterator<Item = String>) {
        for name in names {
            self.queue.add(name);
        }
    }

    pub(crate) fn enqueue_all(&self) {
        let mut names: Vec<String> = read(&self.nodes).names().cloned().collect();
        names.extend(read(&self.slos).names().cloned());
        self.enqueue(names);
    }

    pub(crate) fn update_synced(&self) {
        let all = read(&self.nodes).is_synced()
            && read(&self.slos).is_synced()
            && read(&self.config).synced;
        self.synced
            .send_if_modified(|s| std::mem::replace(s, all) != all);
    }
}
