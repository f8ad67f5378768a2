//! Pure decision logic of the machineclass-controller, following Gardener
//! machine-controller-manager (MCM): which finalizer a MachineClass or Secret needs, whether a
//! Machine is valid, how a driver error maps to a phase and a retry period, how Node health moves
//! the phase, how node templates are synced onto a Node, and which deletion step comes next.
//!
//! Nothing here talks to a cluster or reads a clock: callers pass objects and `now` in, and apply
//! the returned decisions at the edge.

pub mod class;
pub mod creation;
pub mod deletion;
pub mod driver_error;
pub mod health;
pub mod index;
pub use capstan_apis::meta;
pub mod node_patch;
pub mod node_template;
pub mod safety;
pub mod secret;
pub mod status;
pub mod validate;

pub use k8s_openapi::jiff::Timestamp;
