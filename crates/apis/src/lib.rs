//! Kubernetes custom resource types for every API group Capstan serves, and their CRDs.
//!
//! One module per API group: [`machine`] (Gardener MCM), [`slo`] (Koordinator), [`worker`] and
//! [`networking`] (KubeSlice). JSON names, enum strings, label keys and finalizers are the wire
//! contract of the reference systems. [`crds`] builds the CustomResourceDefinitions the chart
//! ships (`cargo xtask crdgen`); [`selector`] matches `LabelSelector`s as the API machinery
//! does, [`meta`] reads and edits finalizers. No client code lives here.
//!
//! String enums keep unknown strings in an `Other(String)` variant (see [`wire`]), so objects
//! written by other controllers always decode and round-trip unchanged.
//!
//! Printer columns (`kubectl get`): Machine's are MCM's (Status, Age, Node, ProviderID).
//! **Decision:** MCM's MachineClass, Koordinator's NodeSLO and KubeSlice's WorkerSliceGwRecycler
//! CRDs declare none, so theirs are ours, chosen for a user: a class's provider, instance type,
//! region (zone in `-o wide`); a NodeSLO's BE threshold switch and percents (CPU burst policy
//! wide); a recycle's state, slice and gateways (request and response wide). Extra columns
//! change no stored field, so objects stay wire-compatible (`tests/printer_columns.rs`).

pub mod crds;
pub mod duration;
pub mod machine;
pub mod meta;
pub mod networking;
pub mod selector;
pub mod slo;
pub mod wire;
pub mod worker;
