//! The pure decisions of MCM's machine layer above Machines: MachineSets ([`set`]), which own
//! Machines, and MachineDeployments ([`deployment`], [`rolling`], [`bounds`]), which own
//! MachineSets. No client and no clock: `now` is a parameter. The facts these follow, and where
//! Capstan differs on purpose, are in `docs/machineset.md`.
//!
//! - [`machines`]: what a set reads of one Machine (phase rank, priority, availability).
//! - [`autoscaler`]: the cluster-autoscaler's trigger-deletion annotation on a deployment.
//! - [`ownership`]: adoption and release by controller reference and selector.
//! - [`set`]: replicas to create or delete, and a set's status.
//! - [`bounds`]: maxSurge and maxUnavailable resolved against the desired replicas.
//! - [`rolling`]: how far a roll may grow the new set and shrink the old ones.
//! - [`deployment`]: template hash, the new set, revisions, status and conditions, history.
//! - [`safety`]: the freeze of sets backed by far more Machines than they should have.

pub mod autoscaler;
pub mod bounds;
pub mod deployment;
pub mod machines;
pub mod ownership;
pub mod rolling;
pub mod safety;
pub mod set;

pub use k8s_openapi::jiff::Timestamp;
