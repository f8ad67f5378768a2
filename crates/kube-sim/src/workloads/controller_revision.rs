//! The DaemonSet controller's history, as kube-controller-manager keeps it: a ControllerRevision
//! per pod template (`<daemonset>-<hash>`, `data` the patch that puts the template back,
//! `revision` numbered in rollout order), which `kubectl rollout history` lists and `kubectl
//! rollout undo` patches back onto the DaemonSet; old ones beyond `revisionHistoryLimit` go.

use super::{
    PassReport, WorkloadError, controller_uid, name, namespace, opts, owner_ref, uid, write_err,
};
use crate::cluster::{Cluster, DeleteOptions, Sub};
use crate::registry::ResourceInfo;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;

const MANAGER: &str = "kube-controller-manager";
/// The label naming a revision's template hash, on the revision and on the pods made from it.
pub(super) const HASH_LABEL: &str = "controller-revision-hash";

/// The patch that restores `ds`'s pod template (upstream `getPatch`): the template under
/// `spec.template`, with a strategic-merge `$patch: replace` directive.
pub fn template_patch(ds: &Value) -> Value {
    let mut template = ds["spec"]["template"].clone();
    if let Some(m) = template.as_object_mut() {
        m.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": template}})
}

fn number(revision: &Value) -> i64 {
    revision["revision"].as_i64().unwrap_or(0)
}

/// The revision of `ds`'s current template, as the controller creates it.
fn snapshot(ds: &Value, hash: &str, number: i64) -> Value {
    let mut labels = ds["spec"]["template"]["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels[HASH_LABEL] = json!(hash);
    let mut metadata = json!({
        "name": format!("{}-{hash}", name(ds)),
        "namespace": namespace(ds),
        "labels": labels,
        "ownerReferences": [owner_ref(ds, "apps/v1", "DaemonSet")],
    });
    // Upstream copies the DaemonSet's annotations (`kubernetes.io/change-cause` is the
    // CHANGE-CAUSE column of `kubectl rollout history`).
    if let Some(a) = ds["metadata"]["annotations"]
        .as_object()
        .filter(|a| !a.is_empty())
    {
        metadata["annotations"] = json!(a);
    }
    json!({"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": metadata,
           "data": template_patch(ds), "revision": number})
}

/// Records `ds`'s current template (hash `hash`) as its newest revision: creates the revision,
/// or renumbers the existing one past every other (a rollback makes an old template current
/// again, upstream `constructHistory`). Returns the DaemonSet's older revisions.
pub(super) fn record(
    cluster: &mut Cluster,
    revisions: &ResourceInfo,
    ds: &Value,
    hash: &str,
    report: &mut PassReport,
) -> Result<Vec<Arc<Value>>, WorkloadError> {
    let in_namespace: Vec<Arc<Value>> = cluster
        .store
        .list_values(&revisions.storage_key(), Some(namespace(ds)))
        .map(|(_, r)| r)
        .collect();
    let current_name = format!("{}-{hash}", name(ds));
    let (current, old): (Vec<Arc<Value>>, Vec<Arc<Value>>) = in_namespace
        .iter()
        .filter(|r| controller_uid(r) == Some(uid(ds)))
        .cloned()
        .partition(|r| name(r) == current_name);
    let next = old.iter().map(|r| number(r)).max().unwrap_or(0) + 1;
    match current.first() {
        None if in_namespace.iter().any(|r| name(r) == current_name) => {
            // Another owner's revision holds the name (a deleted DaemonSet's, until garbage
            // collection removes it): the next pass records this one.
        }
        None => {
            cluster
                .create(
                    revisions,
                    namespace(ds),
                    snapshot(ds, hash, next),
                    &opts(MANAGER),
                )
                .map_err(|e| write_err("a ControllerRevision", &e))?;
            report.writes += 1;
        }
        Some(cur) if number(cur) < next => {
            let mut renumbered = (**cur).clone();
            renumbered["revision"] = json!(next);
            cluster
                .update(
                    revisions,
                    namespace(cur),
                    name(cur),
                    renumbered,
                    Sub::Main,
                    &opts(MANAGER),
                )
                .map_err(|e| write_err("a ControllerRevision", &e))?;
            report.writes += 1;
        }
        Some(_) => {}
    }
    Ok(old)
}

/// Deletes the oldest of `old` beyond `spec.revisionHistoryLimit` (default 10), sparing those a
/// live pod still runs (`live_hashes`), as upstream `cleanupHistory` does.
pub(super) fn clean_up(
    cluster: &mut Cluster,
    revisions: &ResourceInfo,
    ds: &Value,
    mut old: Vec<Arc<Value>>,
    live_hashes: &BTreeSet<String>,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    let limit = ds["spec"]["revisionHistoryLimit"]
        .as_u64()
        .map_or(10, |n| n as usize);
    let mut excess = old.len().saturating_sub(limit);
    old.sort_by_key(|r| number(r));
    for r in old {
        if excess == 0 {
            break;
        }
        let hash = r["metadata"]["labels"][HASH_LABEL]
            .as_str()
            .unwrap_or_default();
        if live_hashes.contains(hash) {
            continue;
        }
        cluster
            .delete(
                revisions,
                namespace(&r),
                name(&r),
                &DeleteOptions::default(),
            )
            .map_err(|e| write_err("a ControllerRevision", &e))?;
        report.writes += 1;
        excess -= 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds() -> Value {
        json!({"metadata": {"name": "agent", "namespace": "default", "uid": "u-1",
                            "annotations": {"kubernetes.io/change-cause": "v2"}},
               "spec": {"template": {"metadata": {"labels": {"app": "agent"}},
                                     "spec": {"containers": [{"name": "a", "image": "agent:2"}]}}}})
    }

    #[test]
    fn the_revision_holds_the_template_as_a_replacing_patch_owned_by_the_daemonset() {
        let r = snapshot(&ds(), "5d8f9c7b6", 3);
        assert_eq!(r["metadata"]["name"], "agent-5d8f9c7b6");
        assert_eq!(
            r["metadata"]["labels"],
            json!({"app": "agent", "controller-revision-hash": "5d8f9c7b6"})
        );
        assert_eq!(r["revision"], 3);
        assert_eq!(
            r["metadata"]["annotations"]["kubernetes.io/change-cause"],
            "v2"
        );
        assert_eq!(
            r["metadata"]["ownerReferences"][0],
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u-1",
                   "controller": true, "blockOwnerDeletion": true})
        );
        // Upstream's patch: spec.template with `"$patch":"replace"`, keys in order.
        assert_eq!(
            serde_json::to_string(&r["data"]).expect("json"),
            r#"{"spec":{"template":{"$patch":"replace","metadata":{"labels":{"app":"agent"}},"spec":{"containers":[{"image":"agent:2","name":"a"}]}}}}"#
        );
    }
}
