//! Sharded mode (`--shards auto`): whether this replica may reconcile a node name. Pure, so the
//! rules are unit-tested; [`crate::reconcile`] asks it first and acts on the answer.
//!
//! The ring is `nodeslo`, keyed by the node name, over NodeSLOs (ours to label: the sharder
//! writes `shard.sharding.capstan.dev/nodeslo`, each replica watches only its own). Nodes are
//! not ours to label by default, so every replica watches all Nodes (trimmed to [`NodeFacts`],
//! a few hundred bytes each) and a NodeSLO that does not exist yet is created by the shard the
//! ring chooses among the ready shards it sees, with its own label. With `--shard-node-labels`
//! the sharder labels Nodes too (same ring and key, so a Node and its NodeSLO land on the same
//! shard) and each replica caches only its Nodes.
//!
//! [`NodeFacts`]: nodeslo_core::NodeFacts

/// What this shard's caches hold for one name: `Some(draining)` when the object is in the
/// shard's label-selected cache (so labelled with this shard), `None` when it is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardView {
    /// The NodeSLO, from the shard's own NodeSLO watch.
    pub slo: Option<bool>,
    /// The Node: `Some(false)` whenever it exists if all Nodes are watched; from the shard's own
    /// Node watch with `--shard-node-labels`.
    pub node: Option<bool>,
    /// `--shard-node-labels`: a Node missing from the cache may just be another shard's.
    pub nodes_sharded: bool,
    /// The ring chooses this shard for the name among the ready shards this replica sees.
    pub chosen: bool,
}

/// The answer for one name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Decide and write as an unsharded controller would.
    Reconcile,
    /// The sharder asked for the NodeSLO back: acknowledge the drain, write nothing else.
    ReleaseSlo,
    /// The sharder asked for the Node back (`--shard-node-labels`).
    ReleaseNode,
    /// Our NodeSLO, a Node not in our cache (`--shard-node-labels`): reconcile (delete the
    /// NodeSLO) only if a fresh read says the Node is gone, as it may be another shard's.
    ConfirmNodeGone,
    /// Not this shard's name.
    Skip,
}

pub fn gate(view: ShardView) -> Gate {
    match view {
        ShardView {
            slo: Some(true), ..
        } => Gate::ReleaseSlo,
        ShardView {
            node: Some(true), ..
        } => Gate::ReleaseNode,
        // Our NodeSLO: ours to update or delete.
        ShardView {
            slo: Some(false),
            node: Some(false),
            ..
        } => Gate::Reconcile,
        ShardView {
            slo: Some(false),
            node: None,
            nodes_sharded,
            ..
        } => {
            if nodes_sharded {
                Gate::ConfirmNodeGone
            } else {
                Gate::Reconcile
            }
        }
        // No NodeSLO of ours: create one only for a Node the ring gives us. Labelled Nodes say
        // so by being in our cache; otherwise our view of the ring decides.
        ShardView {
            slo: None,
            node: Some(false),
            nodes_sharded,
            chosen,
        } => {
            if nodes_sharded || chosen {
                Gate::Reconcile
            } else {
                Gate::Skip
            }
        }
        ShardView {
            slo: None,
            node: None,
            ..
        } => Gate::Skip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(slo: Option<bool>, node: Option<bool>, nodes_sharded: bool, chosen: bool) -> Gate {
        gate(ShardView {
            slo,
            node,
            nodes_sharded,
            chosen,
        })
    }

    #[test]
    fn a_drained_object_is_released_before_anything_is_written() {
        assert_eq!(view(Some(true), Some(false), false, true), Gate::ReleaseSlo);
        assert_eq!(view(Some(true), Some(true), true, true), Gate::ReleaseSlo);
        assert_eq!(view(Some(false), Some(true), true, true), Gate::ReleaseNode);
        assert_eq!(view(None, Some(true), true, false), Gate::ReleaseNode);
    }

    #[test]
    fn our_nodeslo_is_ours_to_update_and_to_delete_once_its_node_is_gone() {
        assert_eq!(
            view(Some(false), Some(false), false, false),
            Gate::Reconcile
        );
        // All Nodes watched: a missing Node is gone.
        assert_eq!(view(Some(false), None, false, false), Gate::Reconcile);
        // Labelled Nodes: a missing Node may be another shard's; read it first.
        assert_eq!(view(Some(false), None, true, true), Gate::ConfirmNodeGone);
    }

    #[test]
    fn a_missing_nodeslo_is_created_only_by_the_shard_the_ring_gives_the_node() {
        assert_eq!(view(None, Some(false), false, true), Gate::Reconcile);
        assert_eq!(view(None, Some(false), false, false), Gate::Skip);
        // Labelled Nodes: being in our cache is the ring's answer.
        assert_eq!(view(None, Some(false), true, false), Gate::Reconcile);
        assert_eq!(view(None, None, false, true), Gate::Skip);
        assert_eq!(view(None, None, true, true), Gate::Skip);
    }
}
