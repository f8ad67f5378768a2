//! The ReplicaSet controller: keeps `spec.replicas` Pods of the template (owner references, newest
//! deleted first when scaling down) and reports `replicas`/`readyReplicas`/... in the status.
//! ReplicationControllers are kept the same way (see [`sync_pods`]'s `owner_kind`).

use super::write_status;
use super::{
    Owned, PassReport, WorkloadError, all, deleting, name, namespace, opts, owner_ref, pod_ready,
    replicas, strip_zeroes, write_err,
};
use crate::cluster::{Cluster, DeleteOptions};
use crate::registry::ResourceInfo;
use serde_json::{Value, json};
use std::sync::Arc;

const MANAGER: &str = "kube-controller-manager";

/// A new Pod of a ReplicaSet (named by `generateName`).
pub fn desired_pod(rs: &Value) -> Value {
    desired_pod_of(rs, "apps/v1", "ReplicaSet")
}

/// A new Pod of any pod-template owner.
pub(super) fn desired_pod_of(owner: &Value, api_version: &str, kind: &str) -> Value {
    let template = &owner["spec"]["template"];
    let mut metadata = template["metadata"].clone();
    if !metadata.is_object() {
        metadata = json!({});
    }
    metadata["generateName"] = json!(format!("{}-", name(owner)));
    metadata["namespace"] = json!(namespace(owner));
    metadata["ownerReferences"] = json!([owner_ref(owner, api_version, kind)]);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
}

/// (pods, ready pods) of `owned` (what one controller owns), deleting ones excluded.
pub(super) fn owned_pod_counts(owned: &[&Arc<Value>]) -> (i64, i64) {
    owned
        .iter()
        .filter(|p| !deleting(p))
        .fold((0, 0), |(pods, ready), p| {
            (pods + 1, ready + i64::from(pod_ready(p)))
        })
}

/// Owners (ReplicaSets, or ReplicationControllers with `owner_kind`) -> Pods.
pub(super) fn sync_pods(
    cluster: &mut Cluster,
    owners: &ResourceInfo,
    pods_info: &ResourceInfo,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    let pods = all(cluster, pods_info);
    let pods_of = Owned::index(&pods);
    let api_version = owners.api_version();
    for rs in all(cluster, owners) {
        if deleting(&rs) {
            continue;
        }
        let mut owned: Vec<&Arc<Value>> = pods_of
            .of(&rs)
            .iter()
            .copied()
            .filter(|p| !deleting(p))
            .collect();
        let want = replicas(&rs) as usize;
        for _ in owned.len()..want {
            cluster
                .create(
                    pods_info,
                    namespace(&rs),
                    desired_pod_of(&rs, &api_version, &owners.kind),
                    &opts(MANAGER),
                )
                .map_err(|e| write_err("a Pod", &e))?;
            report.writes += 1;
        }
        if owned.len() > want {
            // Newest first, as the ReplicaSet controller prefers younger pods for deletion.
            owned.sort_by(|a, b| {
                b["metadata"]["creationTimestamp"]
                    .as_str()
                    .cmp(&a["metadata"]["creationTimestamp"].as_str())
                    .then_with(|| name(b).cmp(name(a)))
            });
            for p in &owned[..owned.len() - want] {
                cluster
                    .delete(pods_info, namespace(p), name(p), &DeleteOptions::default())
                    .map_err(|e| write_err("a Pod", &e))?;
                report.writes += 1;
            }
        }
    }
    Ok(())
}

/// Status of every owner: counts of its pods.
pub(super) fn sync_status(
    cluster: &mut Cluster,
    owners: &ResourceInfo,
    pods_info: &ResourceInfo,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    let pods = all(cluster, pods_info);
    let pods_of = Owned::index(&pods);
    for rs in all(cluster, owners) {
        if deleting(&rs) {
            continue;
        }
        let (total, ready) = owned_pod_counts(pods_of.of(&rs));
        let mut status = json!({"replicas": total, "fullyLabeledReplicas": total,
            "readyReplicas": ready, "availableReplicas": ready,
            "observedGeneration": rs["metadata"]["generation"].as_i64().unwrap_or(1)});
        strip_zeroes(&mut status);
        write_status(cluster, owners, &rs, status, MANAGER, report)?;
    }
    Ok(())
}
