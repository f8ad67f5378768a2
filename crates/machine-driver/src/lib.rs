//! The provider boundary of the machineclass-controller: MCM's `Driver` interface as a Rust
//! trait ([`Driver`]), with MCM's error codes ([`DriverError`]), and three implementations:
//!
//! - [`sim::SimDriver`]: a simulated provider that records its "VMs" in ConfigMaps (so they
//!   survive a controller restart) and registers a Node per VM that turns Ready after a delay;
//!   failures are injected from the class's `providerSpec.simulate`.
//! - [`grpc::GrpcDriver`]: a client of `capstan.machine.v1.MachineDriver` (`proto/machine_driver.proto`).
//! - [`grpc::DriverService`]: a gRPC server serving any [`Driver`] (so the simulator, or any
//!   provider written against this trait, can run out of process).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use capstan_apis::machine::{Code, Machine, MachineClass};
use k8s_openapi::api::core::v1::{NodeAddress, PersistentVolumeSpec};

pub mod grpc;
pub mod retry;
pub mod sim;
pub mod simulate;

/// A driver call's error: an MCM code and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct DriverError {
    pub code: Code,
    pub message: String,
}

impl DriverError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Input of the per-machine calls.
#[derive(Debug, Clone)]
pub struct MachineRequest {
    pub machine: Machine,
    pub class: MachineClass,
    /// `secretRef` data merged with `credentialsSecretRef` data (credentials win).
    pub secret_data: BTreeMap<String, Vec<u8>>,
}

/// What `CreateMachine` and `InitializeMachine` report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MachineInfo {
    pub provider_id: String,
    pub node_name: String,
    pub last_known_state: String,
    pub addresses: Vec<NodeAddress>,
}

/// What `GetMachineStatus` reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MachineStatusInfo {
    pub provider_id: String,
    pub node_name: String,
    pub addresses: Vec<NodeAddress>,
}

/// Input of `ListMachines`.
#[derive(Debug, Clone)]
pub struct ListMachinesRequest {
    pub class: MachineClass,
    pub secret_data: BTreeMap<String, Vec<u8>>,
}

/// A boxed driver call (object-safe async).
pub type DriverFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, DriverError>> + Send + 'a>>;

/// MCM's provider `Driver` interface.
pub trait Driver: Send + Sync + 'static {
    /// Creates the VM; idempotent for the same Machine.
    fn create_machine<'a>(&'a self, request: &'a MachineRequest) -> DriverFuture<'a, MachineInfo>;
    /// Finishes VM setup; `Unimplemented` means none is needed.
    fn initialize_machine<'a>(
        &'a self,
        request: &'a MachineRequest,
    ) -> DriverFuture<'a, MachineInfo>;
    /// Deletes the VM (returns the new lastKnownState); `NotFound` counts as deleted.
    fn delete_machine<'a>(&'a self, request: &'a MachineRequest) -> DriverFuture<'a, String>;
    /// Looks the VM up; `NotFound` when it does not exist.
    fn get_machine_status<'a>(
        &'a self,
        request: &'a MachineRequest,
    ) -> DriverFuture<'a, MachineStatusInfo>;
    /// providerID -> machine name of every VM of the class.
    fn list_machines<'a>(
        &'a self,
        request: &'a ListMachinesRequest,
    ) -> DriverFuture<'a, BTreeMap<String, String>>;
    /// Provider volume ids of the specs this provider owns.
    fn get_volume_ids<'a>(
        &'a self,
        specs: &'a [PersistentVolumeSpec],
    ) -> DriverFuture<'a, Vec<String>>;
}
