//! Kubernetes custom resource types for every API group Capstan serves, and their CRDs.
//!
//! One module per API group: [`machine`] (Gardener MCM), [`slo`] (Koordinator), [`worker`] and
//! [`networking`] (KubeSlice). JSON names, enum strings, label keys and finalizers are the wire
//! contract of the reference systems. [`crds`] builds the CustomResourceDefinitions the chart
//! ships (`cargo xtask crdgen`). No client code lives here.
//!
//! String enums keep unknown strings in an `Other(String)` variant (see [`wire`]), so objects
//! written by other controllers always decode and round-trip unchanged.

pub mod crds;
pub mod duration;
pub mod machine;
pub mod networking;
pub mod slo;
pub mod wire;
pub mod worker;
