//! Reconcile errors: one variant per step, carrying what the step was working on. Each has a
//! short snake_case label for metrics, spans and Event reasons; a 409 in the source makes the kit
//! retry soon instead of backing off.

use capstan_runtime::ErrorLabel;
use capstan_runtime::controller::ReconcileFailure;

#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Error {
    #[error("creating machine {machine} of machine set {set}: {source}")]
    CreateMachine {
        set: String,
        machine: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting machine {machine} of machine set {set}: {source}")]
    DeleteMachine {
        set: String,
        machine: String,
        #[source]
        source: kube::Error,
    },
    #[error("changing the owner of {kind} {name}: {source}")]
    Claim {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("patching the finalizers of {kind} {name}: {source}")]
    PatchFinalizers {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the status of {kind} {name}: {source}")]
    WriteStatus {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating machine set {set} of machine deployment {deployment}: {source}")]
    CreateSet {
        deployment: String,
        set: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating machine set {set} of machine deployment {deployment}: {source}")]
    UpdateSet {
        deployment: String,
        set: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting old machine set {set} of machine deployment {deployment}: {source}")]
    DeleteSet {
        deployment: String,
        set: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing {what} of machine deployment {deployment}: {source}")]
    PatchDeployment {
        deployment: String,
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("marking machine {machine} for deletion by the autoscaler: {source}")]
    MarkMachine {
        machine: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action} {kind} {name}: {source}")]
    Freeze {
        action: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("encoding {what}: {source}")]
    Encode {
        what: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The label is the variant's name in snake case (`strum::IntoStaticStr`).
impl ErrorLabel for Error {
    fn metric_label(&self) -> &'static str {
        self.into()
    }
}

impl ReconcileFailure for Error {}
