//! The pure core of the NodeSLO controller (Koordinator's slo-controller NodeSLO loop).
//!
//! No client lives here: the controller fetches the Node, the NodeSLO and the `slo-controller-config`
//! ConfigMap, and these modules decide what the NodeSLO spec must be.
//!
//! - [`merge`]: deep merge of JSON strategies (absent or null keeps the base, arrays are replaced).
//! - [`selector`]: Kubernetes `LabelSelector` validation and matching.
//! - [`quantity`]: validation of Kubernetes quantities (the bandwidth annotation).
//! - [`bounds`]: the CRD's numeric bounds and quantity syntax, checked at config time.
//! - [`config`]: the five ConfigMap keys, their defaults, and the per-key "last good" rule.
//! - [`last_good`]: the key texts in force, stored so a restart keeps a bad key's last good value.
//! - [`spec`]: choosing one node's spec from the merged config, and semantic comparison.
//! - [`labels`]: a Node's labels, kept compact between watch events.
//! - [`decide`]: the level-triggered decision (create, update, delete or nothing) for one node.

pub mod bounds;
pub mod config;
pub mod decide;
pub mod labels;
pub mod last_good;
pub mod merge;
pub mod quantity;
pub use capstan_apis::selector;
pub mod spec;

pub use config::{ConfigKey, ConfigProblem, MergedConfig};
pub use decide::{Decision, NodeFacts, SloFacts, decide};
pub use labels::NodeLabels;
pub use spec::{NodeInput, NodeSpecOutcome, compute_node_spec, semantically_equal};
