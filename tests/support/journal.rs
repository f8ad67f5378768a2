//! Reading kube-sim's write journal in the sharding scenarios.

use std::collections::BTreeMap;

use kube_sim::ObjectWrite;

/// Whether `write` changed nothing but a ring's shard and drain labels (`shard_label`,
/// `drain_label`): the sharder's assignments and drains, and a shard's release.
pub fn ring_labels_only(write: &ObjectWrite, shard_label: &str, drain_label: &str) -> bool {
    let strip = |labels: &Option<BTreeMap<String, String>>| {
        labels.clone().map(|mut labels| {
            labels.remove(shard_label);
            labels.remove(drain_label);
            labels
        })
    };
    write.verb == "patch"
        && write.subresource.is_empty()
        && write.labels_before.is_some()
        && write.labels_before != write.labels_after
        && strip(&write.labels_before) == strip(&write.labels_after)
}
