//! Reconcile errors: one variant per step, carrying what the step was working on (Stackable
//! style). Each has a short snake_case label for metrics, spans and Event reasons; a 409 in the
//! source makes the kit retry soon instead of backing off.

use capstan_runtime::ErrorLabel;
use capstan_runtime::controller::ReconcileFailure;

#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Error {
    #[error("patching the finalizers of {kind} {name}: {source}")]
    PatchFinalizers {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the status of machine {machine}: {source}")]
    WriteStatus {
        machine: String,
        #[source]
        source: kube::Error,
    },
    #[error("encoding the status of machine {machine}: {source}")]
    EncodeStatus {
        machine: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("recording the provider ID and node of machine {machine}: {source}")]
    RecordProviderId {
        machine: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting machine {machine}, whose node is being deleted: {source}")]
    DeleteMachine {
        machine: String,
        #[source]
        source: kube::Error,
    },
    #[error("syncing node {node} with its machine: {source}")]
    SyncNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("adding the class's virtual capacity to node {node}: {source}")]
    SyncVirtualCapacity {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("draining node {node}: {source}")]
    Drain {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting the volume attachments of node {node}: {source}")]
    DeleteVolumeAttachments {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting node {node}: {source}")]
    DeleteNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// A fresh LIST of Machines (sharded: the decisions that need every Machine, not one shard's).
    #[error("listing machines ({what}): {source}")]
    ListMachines {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// Sharded: the drain acknowledgement of a Machine the sharder moves to another shard.
    #[error("releasing machine {machine} to another shard: {source}")]
    ReleaseShard {
        machine: String,
        #[source]
        source: capstan_runtime::sharding::ShardingError,
    },
    /// A deleting MachineClass is still used.
    #[error("{message}")]
    StillReferred { class: String, message: String },
}

/// The label is the variant's name in snake case (`strum::IntoStaticStr`).
impl ErrorLabel for Error {
    fn metric_label(&self) -> &'static str {
        self.into()
    }
}

impl ReconcileFailure for Error {}
