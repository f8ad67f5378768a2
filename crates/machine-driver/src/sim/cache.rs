//! The simulated provider's memory of its VMs and of the Nodes: two kube-runtime reflectors (the
//! VM ConfigMaps, every Node), each object cut down to what the simulator reads, so status calls
//! and the Ready task read memory instead of GETting. The API stays the truth (a restarted
//! process re-lists it); the driver's own creates and deletes are recorded here before they are
//! sent, so a VM it just created never looks missing while the watch catches up.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use capstan_runtime::controller::watch_events;
use capstan_runtime::sync::lock;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeCondition, NodeStatus};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use super::VM_LABEL;

/// What a cache knows about one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cached<T> {
    Found(T),
    /// The synced cache holds no such object (or the driver just deleted it).
    Missing,
    /// The first list has not completed: ask the API.
    Unsynced,
}

/// The VM record fields the simulator reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VmRecord {
    pub provider_id: String,
    pub node_name: String,
}

impl VmRecord {
    pub fn of(vm: &ConfigMap) -> Self {
        let field = |key: &str| {
            vm.data
                .as_ref()
                .and_then(|d| d.get(key))
                .cloned()
                .unwrap_or_default()
        };
        Self {
            provider_id: field("providerID"),
            node_name: field("nodeName"),
        }
    }
}

/// The driver's own writes not yet confirmed by its watches: `Some` created, `None` deleted. An
/// entry is recorded before the write is sent and dropped by the next watch event for its name
/// (which is at least as new as the write) or when a re-list completes.
#[derive(Default)]
struct OwnWrites {
    vms: HashMap<String, Option<VmRecord>>,
    /// Nodes the driver created.
    nodes: HashSet<String>,
}

/// Aborts the watch tasks when the last driver clone goes.
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// VM ConfigMaps and Nodes, as the simulator reads them.
#[derive(Clone)]
pub(crate) struct SimCache {
    namespace: String,
    vms: Store<ConfigMap>,
    nodes: Store<Node>,
    own: Arc<Mutex<OwnWrites>>,
    _tasks: Arc<Tasks>,
}

/// Keeps of a VM ConfigMap only its name and data.
fn project_vm(vm: &mut ConfigMap) {
    vm.metadata.labels = None;
    vm.metadata.annotations = None;
    vm.metadata.owner_references = None;
    vm.binary_data = None;
}

/// Keeps of a Node only its name and its Ready condition's status.
fn project_node(node: &mut Node) {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| NodeCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            ..NodeCondition::default()
        });
    let meta = &mut node.metadata;
    (meta.labels, meta.annotations, meta.owner_references) = (None, None, None);
    (meta.finalizers, meta.generate_name) = (None, None);
    node.spec = None;
    node.status = ready.map(|ready| NodeStatus {
        conditions: Some(vec![ready]),
        ..NodeStatus::default()
    });
}

/// Drives a reflector of `api`, projected by `project`; each applied event drops the own writes
/// it supersedes (through `forget`), and a completed re-list drops them all.
fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    project: fn(&mut K),
    own: Arc<Mutex<OwnWrites>>,
    forget: fn(&mut OwnWrites, &str),
) -> (Store<K>, JoinHandle<()>)
where
    K: capstan_runtime::controller::Watched,
{
    let (store, writer) = reflector::store();
    let events = reflector::reflector(writer, watch_events(api, config).modify(project));
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events.map_ok(move |event| {
            let mut own = lock(&own);
            match &event {
                watcher::Event::Apply(obj)
                | watcher::Event::Delete(obj)
                | watcher::Event::InitApply(obj) => forget(&mut own, &obj.name_any()),
                watcher::Event::InitDone => *own = OwnWrites::default(),
                watcher::Event::Init => {}
            }
        }));
        while let Some(event) = events.next().await {
            if let Err(err) = event {
                // The watcher backs off and retries; the cache serves the last good state.
                tracing::debug!(%err, kind = %K::kind(&()), "simulated provider's watch failed");
            }
        }
    });
    (store, task)
}

impl SimCache {
    /// Starts the two watches (within a tokio runtime); they stop when the last clone is dropped.
    pub fn start(client: &Client, namespace: &str) -> Self {
        let own = Arc::new(Mutex::new(OwnWrites::default()));
        let (vms, vm_task) = spawn_reflector(
            Api::<ConfigMap>::namespaced(client.clone(), namespace),
            watcher::Config::default().labels(VM_LABEL),
            project_vm,
            own.clone(),
            |own, name| {
                own.vms.remove(name);
            },
        );
        let (nodes, node_task) = spawn_reflector(
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            project_node,
            own.clone(),
            |own, name| {
                own.nodes.remove(name);
            },
        );
        Self {
            namespace: namespace.to_owned(),
            vms,
            nodes,
            own,
            _tasks: Arc::new(Tasks(vec![vm_task, node_task])),
        }
    }

    /// Resolves once both caches hold a full list.
    pub async fn synced(&self) {
        let _ =
            futures::future::join(self.vms.wait_until_ready(), self.nodes.wait_until_ready()).await;
    }

    fn vms_synced(&self) -> bool {
        self.vms.wait_until_ready().now_or_never().is_some()
    }

    fn nodes_synced(&self) -> bool {
        self.nodes.wait_until_ready().now_or_never().is_some()
    }

    /// The VM record `name`.
    pub fn vm(&self, name: &str) -> Cached<VmRecord> {
        if let Some(own) = lock(&self.own).vms.get(name) {
            return own.clone().map_or(Cached::Missing, Cached::Found);
        }
        if !self.vms_synced() {
            return Cached::Unsynced;
        }
        match self.vms.get(&ObjectRef::new(name).within(&self.namespace)) {
            Some(vm) => Cached::Found(VmRecord::of(&vm)),
            None => Cached::Missing,
        }
    }

    /// Whether Node `name` exists: `Found(ready)`, `ready` as last seen by the watch (`false` for
    /// a Node the driver just registered and has not seen yet).
    pub fn node(&self, name: &str) -> Cached<bool> {
        if lock(&self.own).nodes.contains(name) {
            return Cached::Found(false);
        }
        if !self.nodes_synced() {
            return Cached::Unsynced;
        }
        match self.nodes.get(&ObjectRef::new(name)) {
            Some(node) => Cached::Found(super::is_ready(&node)),
            None => Cached::Missing,
        }
    }

    /// Records a VM this driver is about to create (or found existing).
    pub fn record_vm(&self, name: &str, record: VmRecord) {
        lock(&self.own).vms.insert(name.to_owned(), Some(record));
    }

    /// Records a VM this driver is about to delete (or found gone).
    pub fn record_vm_deleted(&self, name: &str) {
        lock(&self.own).vms.insert(name.to_owned(), None);
    }

    /// Drops the record of a VM write that failed: the API and the watch decide again.
    pub fn forget_vm(&self, name: &str) {
        lock(&self.own).vms.remove(name);
    }

    /// Records a Node this driver is about to register (or found registered).
    pub fn record_node(&self, name: &str) {
        lock(&self.own).nodes.insert(name.to_owned());
    }

    /// Drops the record of a Node registration that failed.
    pub fn forget_node(&self, name: &str) {
        lock(&self.own).nodes.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    #[test]
    fn a_projected_node_keeps_its_name_and_ready_status_only() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {"a": "b"}, "finalizers": ["f"]},
            "spec": {"providerID": "sim:///default/n"},
            "status": {"conditions": [
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"}
            ], "capacity": {"cpu": "2"}}
        }))
        .expect("node");
        project_node(&mut node);
        assert_eq!(
            serde_json::to_value(&node).expect("json"),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        );
        assert!(super::super::is_ready(&node));
    }

    #[test]
    fn a_vm_record_reads_the_provider_id_and_node_name() {
        let mut vm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("sim-vm-m".into()),
                labels: Some([(VM_LABEL.to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            data: Some(
                [
                    ("providerID".to_owned(), "sim:///default/m".to_owned()),
                    ("nodeName".to_owned(), "m".to_owned()),
                ]
                .into(),
            ),
            ..ConfigMap::default()
        };
        project_vm(&mut vm);
        assert_eq!(vm.metadata.labels, None);
        assert_eq!(
            VmRecord::of(&vm),
            VmRecord {
                provider_id: "sim:///default/m".into(),
                node_name: "m".into()
            }
        );
    }
}
