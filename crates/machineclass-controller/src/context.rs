//! What every reconcile is handed: client, caches, indexes, triggers, driver, settings.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use capstan_apis::machine::{Machine, MachineClass};
use capstan_runtime::controller::Reconciler;
use capstan_runtime::events::{Event, EventPublisher};
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::own_writes::OwnWrites;
use capstan_runtime::runner::Next;
use capstan_runtime::sharding::{ShardAction, ShardMember};
use capstan_runtime::sync::lock;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Secret};
use kube::api::ListParams;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource};
use machine_driver::Driver;
use machineclass_core::driver_error::RetryPeriods;
use machineclass_core::index::RefIndex;
use machineclass_core::validate::MachineTimeouts;
use tokio::sync::mpsc::UnboundedSender;

use crate::error::Error;

/// Page size of the fresh Machine LISTs sharded replicas make (see [`Context::each_machine`]).
pub const LIST_PAGE: u32 = 500;

/// Shared state of the controllers.
pub struct Context {
    pub client: Client,
    /// The controller namespace (MachineClasses, Machines, Secrets).
    pub namespace: String,
    pub driver: Arc<dyn Driver>,
    /// The Machine cache, with this process's last writes standing in until the watch brings them.
    pub own_machines: Arc<OwnWrites<Machine>>,
    pub classes: Store<MachineClass>,
    /// The Node cache, with this process's last writes standing in until the watch brings them.
    pub own_nodes: Arc<OwnWrites<Node>>,
    pub secrets: Store<Secret>,
    /// Machine -> its MachineClass (`namespace/name` keys).
    pub machine_index: Arc<Mutex<RefIndex>>,
    /// MachineClass -> the Secrets it references.
    pub secret_index: Arc<Mutex<RefIndex>>,
    pub machine_triggers: UnboundedSender<ObjectRef<Machine>>,
    pub class_triggers: UnboundedSender<ObjectRef<MachineClass>>,
    /// Last resourceVersion of each class whose machines were enqueued.
    pub class_versions: Mutex<HashMap<String, String>>,
    /// Machine count last announced for each class whose deletion is blocked (one Event per change).
    pub blocked_classes: Mutex<HashMap<String, usize>>,
    pub events: EventPublisher,
    pub retry: RetryPeriods,
    /// Machine timeouts for Machines that do not set their own.
    pub timeouts: MachineTimeouts,
    /// Spans, metrics and retries of every reconcile.
    pub reconciler: Reconciler,
    pub leader: LeaderHandle,
    /// `--shards auto`: this replica's shard of the ring `machineclass` (its Machine cache holds
    /// its share only). `None`: unsharded, the leader reconciles every Machine.
    pub shard: Option<Arc<ShardMember>>,
    pub caches_ready: Arc<AtomicBool>,
}

/// What a Machine reconcile does before anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineGate {
    /// Reconcile it.
    Proceed,
    /// Write nothing; this is what comes next.
    Hold(Next),
    /// Sharded: the sharder moves it to another shard. Acknowledge (remove both ring labels)
    /// and do nothing else with it.
    Release,
}

/// `namespace/name`.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Splits a `namespace/name` key.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// The standard error policy of the three controllers (see
/// [`Reconciler::next_after_error`]): a conflict retries soon, anything else backs off.
pub fn error_policy<K: Resource<DynamicType = ()>>(
    object: Arc<K>,
    error: &crate::error::Error,
    ctx: Arc<Context>,
) -> Next {
    ctx.reconciler.next_after_error(&*object, error)
}

impl Context {
    pub fn machines_api(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn classes_api(&self) -> Api<MachineClass> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn secrets_api(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn nodes_api(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// `Some(requeue)` while this replica must not write: caches not yet synced, or not the leader.
    pub fn hold_writes(&self) -> Option<Next> {
        // Parked until the caches sync (or the lease is gained): both reconcile everything again.
        if !self.caches_ready.load(Ordering::Acquire) {
            return Some(Next::AwaitChange);
        }
        // A standby replica parks every object; gaining the lease reconciles them all again.
        (!self.leader.is_leader()).then_some(Next::AwaitChange)
    }

    /// Whether `--shards auto` is on.
    pub fn sharded(&self) -> bool {
        self.shard.is_some()
    }

    /// The gate of a Machine reconcile: caches synced, then unsharded the leadership (as
    /// [`hold_writes`](Self::hold_writes)), sharded the shard's verdict on the Machine's ring
    /// labels (an object not labelled for this shard, or any object while the shard Lease is
    /// not held, is ignored; a drained one is released).
    pub fn machine_gate(&self, machine: &Machine) -> MachineGate {
        if !self.caches_ready.load(Ordering::Acquire) {
            return MachineGate::Hold(Next::AwaitChange);
        }
        let Some(member) = &self.shard else {
            return match self.hold_writes() {
                Some(hold) => MachineGate::Hold(hold),
                None => MachineGate::Proceed,
            };
        };
        // Reconciles park until the Lease is held again or the object comes back: both
        // reconcile it again (the gate, the watch).
        match member.action(machine.metadata.labels.as_ref()) {
            ShardAction::Reconcile => MachineGate::Proceed,
            ShardAction::Release => MachineGate::Release,
            ShardAction::Ignore => MachineGate::Hold(Next::AwaitChange),
        }
    }

    /// Calls `each` with every Machine of the namespace the API server holds now (a fresh LIST
    /// in pages of [`LIST_PAGE`], `selector` narrowing it), not the cache: sharded, no replica
    /// caches every Machine. Pages are dropped as they are read.
    pub async fn each_machine(
        &self,
        what: &str,
        selector: Option<&str>,
        mut each: impl FnMut(&Machine),
    ) -> Result<(), Error> {
        let api = self.machines_api();
        let mut params = ListParams::default().limit(LIST_PAGE);
        if let Some(selector) = selector {
            params = params.labels(selector);
        }
        loop {
            let page = api
                .list(&params)
                .await
                .map_err(|source| Error::ListMachines {
                    what: what.to_owned(),
                    source,
                })?;
            page.items.iter().for_each(&mut each);
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(()),
            }
        }
    }

    /// Publishes an Event on `reference`; failures are logged, never fatal.
    pub async fn event(&self, reference: &ObjectReference, event: Event) {
        self.events.publish_or_log(&event, reference).await;
    }

    /// Enqueues every Machine that uses the class `class_key`.
    pub fn enqueue_machines_of(&self, class_key: &str) -> usize {
        let index = lock(&self.machine_index);
        let mut sent = 0;
        for machine in index.referrers(class_key) {
            let (ns, name) = split_key(machine);
            let reference = ObjectRef::new(name).within(ns);
            // Deleting machines do not re-validate against the class.
            let deleting = self
                .own_machines
                .get(&reference)
                .is_some_and(|m| m.metadata.deletion_timestamp.is_some());
            if !deleting && self.machine_triggers.send(reference).is_ok() {
                sent += 1;
            }
        }
        sent
    }
}
