//! A simulated provider. Each "VM" is a ConfigMap `sim-vm-<machine>` in the driver's namespace
//! (labelled [`VM_LABEL`]), so VMs survive a restart of whatever process runs the driver. Creating
//! a VM registers a Node named after the Machine, NotReady at first and Ready after a delay (the
//! class's `providerSpec.simulate.readyDelaySeconds`, else the driver's default).
//!
//! Status calls and the Ready task read [`cache`] (the VM ConfigMaps and the Nodes from watches)
//! instead of GETting; creates and deletes still write the API, recorded in the cache first so
//! the driver reads its own writes.
//!
//! Failure injection, in the class's `providerSpec`:
//! `{"simulate": {"createError": "ResourceExhausted", "deleteError": "...", "getError": "...",
//! "initializeError": "...", "readyDelaySeconds": 3, "neverReady": true}}`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capstan_apis::machine::{Code, NODE_LABEL_MACHINE_NAME};
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeAddress, PersistentVolumeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

mod cache;

use self::cache::{Cached, SimCache, VmRecord};
use crate::retry::{RetryPolicy, with_retries};
use crate::simulate::{MAX_READY_DELAY, Simulate};
use crate::{
    Driver, DriverError, DriverFuture, ListMachinesRequest, MachineInfo, MachineRequest,
    MachineStatusInfo,
};

/// Label on the ConfigMaps that record simulated VMs (and on the Nodes they register).
pub const VM_LABEL: &str = "sim.machine.capstan.dev/vm";
/// Label on VM ConfigMaps naming the MachineClass.
pub const CLASS_LABEL: &str = "sim.machine.capstan.dev/class";
/// CSI driver name whose volumes this provider owns.
pub const CSI_DRIVER: &str = "sim.machine.capstan.dev";

/// Simulator settings.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Namespace of the VM ConfigMaps.
    pub namespace: String,
    /// Delay before a new VM's Node turns Ready.
    pub ready_delay: Duration,
}

/// The class's checked `providerSpec.simulate`; a bad block fails the call as `InvalidArgument`
/// naming the field (never a panic, and never silently ignored).
fn simulate_of(request: &MachineRequest) -> Result<Simulate, DriverError> {
    Simulate::from_provider_spec(&request.class.spec.provider_spec)
        .map_err(|e| DriverError::new(Code::InvalidArgument, e.to_string()))
}

/// An injected error for `call` when the class asks for one.
fn injected(code: Option<&String>, call: &str) -> Result<(), DriverError> {
    match code {
        None => Ok(()),
        Some(name) => {
            let code = name.parse::<Code>().unwrap_or(Code::Internal);
            Err(DriverError::new(
                code,
                format!("simulated {code} error in {call}"),
            ))
        }
    }
}

/// The simulated provider.
#[derive(Clone)]
pub struct SimDriver {
    client: Client,
    config: SimConfig,
    cache: SimCache,
    /// Nodes with a running "turn Ready" task, so a re-driven create does not start a second one.
    turning_ready: Arc<Mutex<HashSet<String>>>,
}

fn kube_err(call: &str, err: kube::Error) -> DriverError {
    DriverError::new(Code::Unavailable, format!("{call}: {err}"))
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

fn vm_name(machine: &str) -> String {
    format!("sim-vm-{machine}")
}

fn addresses(node_name: &str) -> Vec<NodeAddress> {
    // A stable fake address derived from the name.
    let sum = node_name.bytes().fold(0u32, |acc, b| {
        acc.wrapping_mul(31).wrapping_add(u32::from(b))
    });
    vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: format!(
                "10.{}.{}.{}",
                (sum >> 16) & 0xff,
                (sum >> 8) & 0xff,
                sum & 0xff
            ),
        },
        NodeAddress {
            type_: "Hostname".into(),
            address: node_name.to_owned(),
        },
    ]
}

impl SimDriver {
    /// The driver, and its cache's watches (so it must be called within a tokio runtime; they
    /// stop when the last clone is dropped).
    pub fn new(client: Client, config: SimConfig) -> Self {
        Self {
            cache: SimCache::start(&client, &config.namespace),
            client,
            config,
            turning_ready: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    fn vms(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn provider_id(&self, machine: &str) -> String {
        format!("sim:///{}/{machine}", self.config.namespace)
    }

    /// Resolves once the cache holds a full list of the VMs and the Nodes (until then, status
    /// calls GET).
    pub async fn cache_synced(&self) {
        self.cache.synced().await;
    }

    /// Schedules Ready for every recorded VM whose Node is not Ready yet (after a restart).
    pub async fn resume(&self) -> Result<usize, DriverError> {
        let (vms, params) = (self.vms(), ListParams::default().labels(VM_LABEL));
        let list = with_retries(RetryPolicy::STEP, "list VMs", || vms.list(&params))
            .await
            .map_err(|e| kube_err("list VMs", e))?;
        let mut scheduled = 0;
        for vm in list {
            let data = vm.data.unwrap_or_default();
            if data.get("neverReady").is_some_and(|v| v == "true") {
                continue;
            }
            let Some(node) = data.get("nodeName") else {
                continue;
            };
            let due: Option<Timestamp> = data.get("readyAt").and_then(|t| t.parse().ok());
            let wait = due
                .map(|due| due.duration_since(Timestamp::now()))
                .and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default()
                .min(MAX_READY_DELAY);
            self.schedule_ready(node.clone(), wait, false);
            scheduled += 1;
        }
        Ok(scheduled)
    }

    /// Turns the Node Ready after `after`, retrying until it is Ready or gone (one task per Node).
    /// `registered_not_ready`: this driver just registered the Node NotReady, so it needs the
    /// write whatever a lagging cache says; else the cache tells whether it is Ready already.
    fn schedule_ready(&self, node_name: String, after: Duration, registered_not_ready: bool) {
        let fresh = self
            .turning_ready
            .lock()
            .is_ok_and(|mut set| set.insert(node_name.clone()));
        if !fresh {
            return;
        }
        let (nodes, cache) = (self.nodes(), self.cache.clone());
        let turning_ready = Arc::clone(&self.turning_ready);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if !registered_not_ready {
                cache.synced().await;
            }
            let outcome = with_retries(RetryPolicy::BACKGROUND, "turn node Ready", || async {
                if !registered_not_ready && cache.node(&node_name) == Cached::Found(true) {
                    return Ok(true);
                }
                let patch = Patch::Merge(node_status("True"));
                match nodes
                    .patch_status(&node_name, &PatchParams::default(), &patch)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(e) if is_status(&e, 404) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await;
            match outcome {
                Ok(true) => tracing::debug!(node = %node_name, "simulated node is Ready"),
                Ok(false) => tracing::debug!(node = %node_name, "simulated node is gone"),
                Err(err) => {
                    tracing::warn!(node = %node_name, %err, "simulated node could not turn Ready");
                }
            }
            if let Ok(mut set) = turning_ready.lock() {
                set.remove(&node_name);
            }
        });
    }

    async fn create(&self, request: &MachineRequest) -> Result<MachineInfo, DriverError> {
        let sim = simulate_of(request)?;
        injected(sim.create_error.as_ref(), "CreateMachine")?;
        let machine = request
            .machine
            .metadata
            .name
            .clone()
            .ok_or_else(|| DriverError::new(Code::InvalidArgument, "machine has no name"))?;
        let class = request.class.metadata.name.clone().unwrap_or_default();
        let provider_id = self.provider_id(&machine);
        let node_name = machine.clone();
        let delay = sim.ready_delay.unwrap_or(self.config.ready_delay);
        let ready_at = k8s_openapi::jiff::SignedDuration::try_from(delay)
            .ok()
            .and_then(|d| Timestamp::now().checked_add(d).ok())
            .unwrap_or_else(Timestamp::now);
        let vm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(vm_name(&machine)),
                labels: Some(
                    [
                        (VM_LABEL.to_owned(), "true".to_owned()),
                        (CLASS_LABEL.to_owned(), class),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                ("providerID".to_owned(), provider_id.clone()),
                ("nodeName".to_owned(), node_name.clone()),
                ("machine".to_owned(), machine.clone()),
                ("readyAt".to_owned(), ready_at.to_string()),
                ("neverReady".to_owned(), sim.never_ready.to_string()),
            ])),
            ..ConfigMap::default()
        };
        let (vms, nodes, post) = (self.vms(), self.nodes(), PostParams::default());
        let record = VmRecord {
            provider_id: provider_id.clone(),
            node_name: node_name.clone(),
        };
        // Recorded before it is sent: any watch event after this one is at least as new.
        self.cache.record_vm(&vm_name(&machine), record);
        match with_retries(RetryPolicy::STEP, "record VM", || vms.create(&post, &vm)).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 409) => {}
            Err(e) => {
                self.cache.forget_vm(&vm_name(&machine));
                return Err(kube_err("record VM", e));
            }
        }
        let node = Node {
            metadata: ObjectMeta {
                name: Some(node_name.clone()),
                labels: Some(
                    [
                        ("kubernetes.io/hostname".to_owned(), node_name.clone()),
                        (NODE_LABEL_MACHINE_NAME.to_owned(), machine.clone()),
                        (VM_LABEL.to_owned(), "true".to_owned()),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                provider_id: Some(provider_id.clone()),
                ..Default::default()
            }),
            status: None,
        };
        // The VM is recorded but not "created" until its Node is registered: a failure here
        // fails the call, and `GetMachineStatus` reports NotFound, so the next reconcile calls
        // CreateMachine again (every step is idempotent).
        self.cache.record_node(&node_name);
        let mut registered_not_ready = false;
        match with_retries(RetryPolicy::STEP, "register node", || {
            nodes.create(&post, &node)
        })
        .await
        {
            Ok(_) => {
                registered_not_ready = true;
                let (params, not_ready) =
                    (PatchParams::default(), Patch::Merge(node_status("False")));
                let registered = with_retries(RetryPolicy::STEP, "register node status", || {
                    nodes.patch_status(&node_name, &params, &not_ready)
                })
                .await;
                if let Err(err) = registered {
                    // Not fatal: a Node without conditions is not healthy either, and the Ready
                    // task below writes the conditions.
                    tracing::warn!(node = %node_name, %err, "could not write the NotReady status of a new node");
                }
            }
            // The Node exists already (a retried create, or a Node of another machine: the
            // controller checks ownership).
            Err(e) if is_status(&e, 409) => {}
            Err(e) => {
                self.cache.forget_node(&node_name);
                return Err(kube_err("register node", e));
            }
        }
        if !sim.never_ready {
            self.schedule_ready(node_name.clone(), delay, registered_not_ready);
        }
        Ok(MachineInfo {
            provider_id,
            addresses: addresses(&node_name),
            node_name,
            last_known_state: String::new(),
        })
    }

    async fn status(&self, request: &MachineRequest) -> Result<MachineStatusInfo, DriverError> {
        injected(simulate_of(request)?.get_error.as_ref(), "GetMachineStatus")?;
        let machine = request.machine.metadata.name.as_deref().unwrap_or_default();
        let not_found =
            |why: &str| DriverError::new(Code::NotFound, format!("machine {machine} {why}"));
        // A miss in the synced cache is the answer, unless the Machine records a providerID: then
        // the API confirms the VM (or its Node) is gone before the driver says so.
        let recorded = request
            .machine
            .spec
            .provider_id
            .as_deref()
            .is_some_and(|id| !id.is_empty());
        let vm_name = vm_name(machine);
        let vm = match self.cache.vm(&vm_name) {
            Cached::Found(vm) => vm,
            Cached::Missing if !recorded => return Err(not_found("not found")),
            Cached::Missing | Cached::Unsynced => {
                // A one-name list, not a GET: the VM cache's list and watch grants cover it.
                let (vms, params) = (
                    self.vms(),
                    ListParams::default().fields(&format!("metadata.name={vm_name}")),
                );
                with_retries(RetryPolicy::STEP, "look up VM", || vms.list(&params))
                    .await
                    .map_err(|e| kube_err("look up VM", e))?
                    .items
                    .first()
                    .map(VmRecord::of)
                    .ok_or_else(|| not_found("not found"))?
            }
        };
        let node_name = vm.node_name;
        // A VM whose Node never got registered is not created yet.
        let registered = !node_name.is_empty()
            && match self.cache.node(&node_name) {
                Cached::Found(_) => true,
                Cached::Missing if !recorded => false,
                Cached::Missing | Cached::Unsynced => {
                    let nodes = self.nodes();
                    with_retries(RetryPolicy::STEP, "get node", || nodes.get_opt(&node_name))
                        .await
                        .map_err(|e| kube_err("get node", e))?
                        .is_some()
                }
            };
        if !registered {
            return Err(not_found("has no registered node yet"));
        }
        Ok(MachineStatusInfo {
            provider_id: vm.provider_id,
            addresses: addresses(&node_name),
            node_name,
        })
    }

    async fn delete(&self, request: &MachineRequest) -> Result<String, DriverError> {
        // A bad simulate block must not keep a Machine from being deleted: only a well-formed
        // deleteError is honoured here.
        let delete_error = simulate_of(request).ok().and_then(|s| s.delete_error);
        injected(delete_error.as_ref(), "DeleteMachine")?;
        let machine = request.machine.metadata.name.as_deref().unwrap_or_default();
        let (vms, vm_name, params) = (self.vms(), vm_name(machine), DeleteParams::default());
        self.cache.record_vm_deleted(&vm_name);
        match with_retries(RetryPolicy::STEP, "delete VM", || {
            vms.delete(&vm_name, &params)
        })
        .await
        {
            Ok(_) => Ok(String::new()),
            Err(e) if is_status(&e, 404) => Err(DriverError::new(
                Code::NotFound,
                format!("machine {machine} not found"),
            )),
            Err(e) => {
                self.cache.forget_vm(&vm_name);
                Err(kube_err("delete VM", e))
            }
        }
    }

    async fn list(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<BTreeMap<String, String>, DriverError> {
        let class = request.class.metadata.name.as_deref().unwrap_or_default();
        let selector = format!("{VM_LABEL},{CLASS_LABEL}={class}");
        let (vms, params) = (self.vms(), ListParams::default().labels(&selector));
        let list = with_retries(RetryPolicy::STEP, "list VMs", || vms.list(&params))
            .await
            .map_err(|e| kube_err("list VMs", e))?;
        Ok(list
            .into_iter()
            .filter_map(|vm| {
                let data = vm.data?;
                Some((
                    data.get("providerID")?.clone(),
                    data.get("machine")?.clone(),
                ))
            })
            .collect())
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn node_status(ready: &str) -> serde_json::Value {
    let now = Timestamp::now().to_string();
    let reason = if ready == "True" {
        "KubeletReady"
    } else {
        "KubeletNotReady"
    };
    json!({"status": {"conditions": [
        {"type": "Ready", "status": ready, "reason": reason, "lastHeartbeatTime": now, "lastTransitionTime": now},
        {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "lastHeartbeatTime": now, "lastTransitionTime": now},
    ]}})
}

/// Volume ids of the CSI volumes of [`CSI_DRIVER`].
pub fn sim_volume_ids(specs: &[PersistentVolumeSpec]) -> Vec<String> {
    specs
        .iter()
        .filter_map(|s| s.csi.as_ref())
        .filter(|csi| csi.driver == CSI_DRIVER)
        .map(|csi| csi.volume_handle.clone())
        .collect()
}

impl Driver for SimDriver {
    fn create_machine<'a>(&'a self, request: &'a MachineRequest) -> DriverFuture<'a, MachineInfo> {
        Box::pin(self.create(request))
    }

    fn initialize_machine<'a>(
        &'a self,
        request: &'a MachineRequest,
    ) -> DriverFuture<'a, MachineInfo> {
        Box::pin(async move {
            injected(
                simulate_of(request)?.initialize_error.as_ref(),
                "InitializeMachine",
            )?;
            Err(DriverError::new(
                Code::Unimplemented,
                "the simulator needs no initialization",
            ))
        })
    }

    fn delete_machine<'a>(&'a self, request: &'a MachineRequest) -> DriverFuture<'a, String> {
        Box::pin(self.delete(request))
    }

    fn get_machine_status<'a>(
        &'a self,
        request: &'a MachineRequest,
    ) -> DriverFuture<'a, MachineStatusInfo> {
        Box::pin(self.status(request))
    }

    fn list_machines<'a>(
        &'a self,
        request: &'a ListMachinesRequest,
    ) -> DriverFuture<'a, BTreeMap<String, String>> {
        Box::pin(self.list(request))
    }

    fn get_volume_ids<'a>(
        &'a self,
        specs: &'a [PersistentVolumeSpec],
    ) -> DriverFuture<'a, Vec<String>> {
        Box::pin(async move { Ok(sim_volume_ids(specs)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::CSIPersistentVolumeSource;

    #[test]
    fn only_own_csi_volumes_have_ids() {
        let spec = |driver: &str, handle: &str| PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: handle.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ids = sim_volume_ids(&[
            spec(CSI_DRIVER, "vol-1"),
            spec("ebs.csi.aws.com", "vol-2"),
            PersistentVolumeSpec::default(),
        ]);
        assert_eq!(ids, ["vol-1"]);
    }

    #[test]
    fn injected_errors_use_the_named_code() {
        let err =
            injected(Some(&"ResourceExhausted".to_owned()), "CreateMachine").expect_err("injected");
        assert_eq!(err.code, Code::ResourceExhausted);
        assert!(err.message.contains("CreateMachine"));
        // An unknown name still fails, as Internal.
        assert_eq!(
            injected(Some(&"Nope".to_owned()), "x")
                .expect_err("injected")
                .code,
            Code::Internal
        );
        assert_eq!(injected(None, "x"), Ok(()));
    }

    #[test]
    fn addresses_are_stable_per_node() {
        assert_eq!(addresses("n-1"), addresses("n-1"));
        assert_ne!(addresses("n-1")[0], addresses("n-2")[0]);
    }
}
