//! What every reconcile is handed: client, caches, triggers, settings.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use capstan_apis::machine::{Machine, MachineDeployment, MachineSet};
use capstan_runtime::controller::Reconciler;
use capstan_runtime::events::{Event, EventPublisher};
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::own_writes::OwnWrites;
use capstan_runtime::runner::Next;
use capstan_runtime::status_batch::StatusBatches;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource};
use machineset_core::ownership::controller_of;
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::SetMetrics;

/// Shared state of the two controllers.
pub struct Context {
    pub client: Client,
    /// The namespace of the deployments, sets and Machines.
    pub namespace: String,
    /// Every cache is read through this process's own writes (see `OwnWrites`), so a pass woken
    /// by another object never writes from a copy older than our last write.
    pub machines: Arc<OwnWrites<Machine>>,
    pub sets: Arc<OwnWrites<MachineSet>>,
    pub deployments: Arc<OwnWrites<MachineDeployment>>,
    /// Wakes a deployment when one of its sets or their Machines changed.
    pub deployment_triggers: UnboundedSender<ObjectRef<MachineDeployment>>,
    pub events: EventPublisher,
    pub reconciler: Reconciler,
    pub metrics: SetMetrics,
    pub leader: LeaderHandle,
    pub caches_ready: Arc<AtomicBool>,
    /// Periodic resync of every object.
    pub resync: Duration,
    /// Status writes of sets and deployments held back while their Machines are changing.
    pub status_batches: StatusBatches,
    names: (RandomState, AtomicU64),
}

impl Context {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        namespace: String,
        machines: Arc<OwnWrites<Machine>>,
        sets: Arc<OwnWrites<MachineSet>>,
        deployments: Arc<OwnWrites<MachineDeployment>>,
        deployment_triggers: UnboundedSender<ObjectRef<MachineDeployment>>,
        reconciler: Reconciler,
        metrics: SetMetrics,
        leader: LeaderHandle,
        caches_ready: Arc<AtomicBool>,
        resync: Duration,
        status_batch_window: Duration,
    ) -> Self {
        Self {
            events: EventPublisher::new(client.clone(), crate::SERVICE_NAME),
            client,
            namespace,
            machines,
            sets,
            deployments,
            deployment_triggers,
            reconciler,
            metrics,
            leader,
            caches_ready,
            resync,
            status_batches: StatusBatches::new(status_batch_window),
            names: (RandomState::new(), AtomicU64::new(0)),
        }
    }

    pub fn machines_api(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn sets_api(&self) -> Api<MachineSet> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn deployments_api(&self) -> Api<MachineDeployment> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// `Some(park)` while this replica must not write: caches not yet synced, or not the leader.
    pub fn hold_writes(&self) -> Option<Next> {
        if !self.caches_ready.load(Ordering::Acquire) {
            return Some(Next::AwaitChange);
        }
        (!self.leader.is_leader()).then_some(Next::AwaitChange)
    }

    /// Fresh entropy for a Machine name: a per-process random hash of a counter.
    pub fn entropy(&self) -> u64 {
        let n = self.names.1.fetch_add(1, Ordering::Relaxed);
        self.names.0.hash_one(n)
    }

    /// Publishes an Event on `object`; failures are logged, never fatal.
    pub async fn event<K: Resource<DynamicType = ()>>(&self, object: &K, event: Event) {
        let reference: ObjectReference = object.object_ref(&());
        self.events.publish_or_log(&event, &reference).await;
    }

    /// Wakes the deployment that controls `set`, if any.
    pub fn wake_owner_of(&self, set: &MachineSet) {
        if let Some(owner) = controller_of(&set.metadata).filter(|r| r.kind == "MachineDeployment")
        {
            let ns = set.metadata.namespace.as_deref().unwrap_or_default();
            let _ = self
                .deployment_triggers
                .send(ObjectRef::new(&owner.name).within(ns));
        }
    }
}
