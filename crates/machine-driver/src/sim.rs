//! A simulated provider. Each "VM" is a ConfigMap `sim-vm-<machine>` in the driver's namespace
//! (labelled [`VM_LABEL`]), so VMs survive a restart of whatever process runs the driver. Creating
//! a VM registers a Node named after the Machine, NotReady at first and Ready after a delay (the
//! class's `providerSpec.simulate.readyDelaySeconds`, else the driver's default).
//!
//! Failure injection, in the class's `providerSpec`:
//! `{"simulate": {"createError": "ResourceExhausted", "deleteError": "...", "getError": "...",
//! "initializeError": "...", "readyDelaySeconds": 3, "neverReady": true}}`.

use std::collections::BTreeMap;
use std::time::Duration;

use capstan_apis::machine::{Code, NODE_LABEL_MACHINE_NAME};
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeAddress, PersistentVolumeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::json;

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

/// `providerSpec.simulate`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Simulate {
    create_error: Option<String>,
    delete_error: Option<String>,
    get_error: Option<String>,
    initialize_error: Option<String>,
    ready_delay_seconds: Option<f64>,
    never_ready: bool,
}

impl Simulate {
    fn of(request: &MachineRequest) -> Self {
        request
            .class
            .spec
            .provider_spec
            .get("simulate")
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }

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
}

/// The simulated provider.
#[derive(Clone)]
pub struct SimDriver {
    client: Client,
    config: SimConfig,
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
    pub fn new(client: Client, config: SimConfig) -> Self {
        Self { client, config }
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

    /// Schedules Ready for every recorded VM whose Node is not Ready yet (after a restart).
    pub async fn resume(&self) -> Result<usize, DriverError> {
        let list = self
            .vms()
            .list(&ListParams::default().labels(VM_LABEL))
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
                .unwrap_or_default();
            self.schedule_ready(node.clone(), wait);
            scheduled += 1;
        }
        Ok(scheduled)
    }

    fn schedule_ready(&self, node_name: String, after: Duration) {
        let nodes = self.nodes();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let Ok(Some(node)) = nodes.get_opt(&node_name).await else {
                return;
            };
            let already = node
                .status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if already {
                return;
            }
            if let Err(err) = nodes
                .patch_status(
                    &node_name,
                    &PatchParams::default(),
                    &Patch::Merge(node_status("True")),
                )
                .await
            {
                tracing::warn!(node = %node_name, %err, "simulated node could not turn Ready");
            }
        });
    }

    async fn create(&self, request: &MachineRequest) -> Result<MachineInfo, DriverError> {
        let sim = Simulate::of(request);
        Simulate::injected(sim.create_error.as_ref(), "CreateMachine")?;
        let machine = request
            .machine
            .metadata
            .name
            .clone()
            .ok_or_else(|| DriverError::new(Code::InvalidArgument, "machine has no name"))?;
        let class = request.class.metadata.name.clone().unwrap_or_default();
        let provider_id = self.provider_id(&machine);
        let node_name = machine.clone();
        let delay = sim
            .ready_delay_seconds
            .map_or(self.config.ready_delay, |s| {
                Duration::from_secs_f64(s.max(0.0))
            });
        let ready_at = Timestamp::now()
            .checked_add(k8s_openapi::jiff::SignedDuration::try_from(delay).unwrap_or_default())
            .unwrap_or_else(|_| Timestamp::now());
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
        match self.vms().create(&PostParams::default(), &vm).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 409) => {}
            Err(e) => return Err(kube_err("record VM", e)),
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
        match self.nodes().create(&PostParams::default(), &node).await {
            Ok(_) => {
                self.nodes()
                    .patch_status(
                        &node_name,
                        &PatchParams::default(),
                        &Patch::Merge(node_status("False")),
                    )
                    .await
                    .map_err(|e| kube_err("register node status", e))?;
            }
            // The Node exists already (a retried create, or a Node of another machine: the
            // controller checks ownership).
            Err(e) if is_status(&e, 409) => {}
            Err(e) => return Err(kube_err("register node", e)),
        }
        if !sim.never_ready {
            self.schedule_ready(node_name.clone(), delay);
        }
        Ok(MachineInfo {
            provider_id,
            addresses: addresses(&node_name),
            node_name,
            last_known_state: String::new(),
        })
    }

    async fn status(&self, request: &MachineRequest) -> Result<MachineStatusInfo, DriverError> {
        Simulate::injected(Simulate::of(request).get_error.as_ref(), "GetMachineStatus")?;
        let machine = request.machine.metadata.name.as_deref().unwrap_or_default();
        let vm = self
            .vms()
            .get_opt(&vm_name(machine))
            .await
            .map_err(|e| kube_err("get VM", e))?
            .ok_or_else(|| {
                DriverError::new(Code::NotFound, format!("machine {machine} not found"))
            })?;
        let data = vm.data.unwrap_or_default();
        let node_name = data.get("nodeName").cloned().unwrap_or_default();
        Ok(MachineStatusInfo {
            provider_id: data.get("providerID").cloned().unwrap_or_default(),
            addresses: addresses(&node_name),
            node_name,
        })
    }

    async fn delete(&self, request: &MachineRequest) -> Result<String, DriverError> {
        Simulate::injected(Simulate::of(request).delete_error.as_ref(), "DeleteMachine")?;
        let machine = request.machine.metadata.name.as_deref().unwrap_or_default();
        match self
            .vms()
            .delete(&vm_name(machine), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(String::new()),
            Err(e) if is_status(&e, 404) => Err(DriverError::new(
                Code::NotFound,
                format!("machine {machine} not found"),
            )),
            Err(e) => Err(kube_err("delete VM", e)),
        }
    }

    async fn list(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<BTreeMap<String, String>, DriverError> {
        let class = request.class.metadata.name.as_deref().unwrap_or_default();
        let list = self
            .vms()
            .list(&ListParams::default().labels(&format!("{VM_LABEL},{CLASS_LABEL}={class}")))
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
            Simulate::injected(
                Simulate::of(request).initialize_error.as_ref(),
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
        let err = Simulate::injected(Some(&"ResourceExhausted".to_owned()), "CreateMachine")
            .expect_err("injected");
        assert_eq!(err.code, Code::ResourceExhausted);
        assert!(err.message.contains("CreateMachine"));
        // An unknown name still fails, as Internal.
        assert_eq!(
            Simulate::injected(Some(&"Nope".to_owned()), "x")
                .expect_err("injected")
                .code,
            Code::Internal
        );
        assert_eq!(Simulate::injected(None, "x"), Ok(()));
    }

    #[test]
    fn addresses_are_stable_per_node() {
        assert_eq!(addresses("n-1"), addresses("n-1"));
        assert_ne!(addresses("n-1")[0], addresses("n-2")[0]);
    }
}
