//! The DaemonSet controller: one Pod per eligible Node (the template's `nodeSelector` matches and
//! the Node's NoSchedule/NoExecute taints are tolerated, counting the tolerations the controller
//! adds, so cordoned Nodes keep their daemons), a rolling update on template change
//! (`maxUnavailable`, default 1), the status counts `kubectl rollout status` reads, and a
//! ControllerRevision per template (`controller_revision`) for `kubectl rollout history|undo`.

use super::controller_revision::{self, HASH_LABEL};
use super::write_status;
use super::{
    PassReport, WorkloadError, all, controller_uid, deleting, name, namespace, opts, pod_ready,
    strip_zeroes, uid, write_err,
};
use crate::cluster::{Cluster, DeleteOptions};
use crate::registry::ResourceInfo;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const MANAGER: &str = "kube-controller-manager";

/// The tolerations the DaemonSet controller adds to every daemon pod (k8s.io/kubernetes
/// pkg/controller/daemon/util.AddOrUpdateDaemonPodTolerations).
fn daemon_tolerations() -> Vec<Value> {
    let mut t = Vec::new();
    for key in ["not-ready", "unreachable"] {
        t.push(json!({"key": format!("node.kubernetes.io/{key}"), "operator": "Exists", "effect": "NoExecute"}));
    }
    for key in [
        "disk-pressure",
        "memory-pressure",
        "pid-pressure",
        "unschedulable",
    ] {
        t.push(json!({"key": format!("node.kubernetes.io/{key}"), "operator": "Exists", "effect": "NoSchedule"}));
    }
    t
}

/// The template's spec as a daemon pod runs it: its tolerations plus the controller's.
fn pod_spec(ds: &Value) -> Value {
    let mut spec = ds["spec"]["template"]["spec"].clone();
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for t in daemon_tolerations() {
        if !tolerations.contains(&t) {
            tolerations.push(t);
        }
    }
    spec["tolerations"] = json!(tolerations);
    spec
}

/// (should run a daemon pod here, may keep an existing one): the node selector matches, and
/// every NoSchedule and NoExecute taint (to run) or every NoExecute taint (to keep) is tolerated.
fn eligibility(node: &Value, spec: &Value) -> (bool, bool) {
    let labels = &node["metadata"]["labels"];
    let selected = spec["nodeSelector"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    let tolerated = |effect: &str| {
        node["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["effect"] == effect)
            .all(|t| tolerations.iter().any(|tol| super::pod::tolerates(tol, t)))
    };
    let no_execute = tolerated("NoExecute");
    (
        selected && no_execute && tolerated("NoSchedule"),
        selected && no_execute,
    )
}

fn template_hash(ds: &Value) -> String {
    super::pod_template_hash(&ds["spec"]["template"])
}

/// A new daemon pod for `node`: a Pod of the template (as a ReplicaSet makes one), labelled with
/// the template's hash and generation, bound by node affinity, as the controller does, and to the node.
fn daemon_pod(ds: &Value, node: &str, hash: &str) -> Value {
    let mut pod = super::replicaset::desired_pod_of(ds, "apps/v1", "DaemonSet");
    let labels = &mut pod["metadata"]["labels"];
    labels[HASH_LABEL] = json!(hash);
    labels["pod-template-generation"] = json!(
        ds["metadata"]["generation"]
            .as_i64()
            .unwrap_or(1)
            .to_string()
    );
    let mut spec = pod_spec(ds);
    spec["affinity"]["nodeAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}});
    spec["nodeName"] = json!(node);
    pod["spec"] = spec;
    pod
}

/// `maxUnavailable` of a RollingUpdate (an integer or a percentage of `desired`, at least 1).
fn max_unavailable(ds: &Value, desired: usize) -> usize {
    let v = &ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"];
    let n = match (v.as_u64(), v.as_str().and_then(|s| s.strip_suffix('%'))) {
        (Some(n), _) => n as usize,
        (None, Some(pct)) => pct.parse::<usize>().map_or(1, |p| desired * p / 100),
        _ => 1,
    };
    n.max(1)
}

fn on_delete(ds: &Value) -> bool {
    ds["spec"]["updateStrategy"]["type"] == "OnDelete"
}

/// Where the DaemonSet controller reads and writes.
pub(super) struct DaemonSetInfos<'a> {
    pub daemonsets: &'a ResourceInfo,
    pub pods: &'a ResourceInfo,
    pub nodes: &'a ResourceInfo,
    /// Served once the registry has them (`apps/v1` `controllerrevisions`).
    pub revisions: Option<&'a ResourceInfo>,
}

/// DaemonSets -> their template's revision, one Pod per eligible Node, then their status.
pub(super) fn sync(
    cluster: &mut Cluster,
    infos: &DaemonSetInfos,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    let (daemonsets, pods_info) = (infos.daemonsets, infos.pods);
    let nodes = all(cluster, infos.nodes);
    for ds in all(cluster, daemonsets) {
        if deleting(&ds) {
            continue;
        }
        let hash = template_hash(&ds);
        let old_revisions = match infos.revisions {
            Some(r) => controller_revision::record(cluster, r, &ds, &hash, report)?,
            None => Vec::new(),
        };
        let pods = all(cluster, pods_info);
        let mut by_node: BTreeMap<String, Vec<Arc<Value>>> = BTreeMap::new();
        for p in pods
            .iter()
            .filter(|p| controller_uid(p) == Some(uid(&ds)) && !deleting(p))
        {
            let node = p["spec"]["nodeName"].as_str().unwrap_or_default();
            by_node.entry(node.to_string()).or_default().push(p.clone());
        }
        let spec = pod_spec(&ds);
        let mut create = Vec::new();
        let mut remove: Vec<Arc<Value>> = Vec::new();
        let mut eligible = Vec::new();
        for node in &nodes {
            let node_name = name(node).to_string();
            let (run, keep) = eligibility(node, &spec);
            let here = by_node.remove(&node_name).unwrap_or_default();
            if run {
                eligible.push(node_name.clone());
            }
            match here.split_first() {
                None if run => create.push(node_name),
                Some((_, extra)) if run || keep => remove.extend(extra.iter().cloned()),
                Some(_) => remove.extend(here.iter().cloned()),
                None => {}
            }
        }
        // Pods on nodes that no longer exist.
        remove.extend(by_node.into_values().flatten());
        for node in &create {
            cluster
                .create(
                    pods_info,
                    namespace(&ds),
                    daemon_pod(&ds, node, &hash),
                    &opts(MANAGER),
                )
                .map_err(|e| write_err("a daemon Pod", &e))?;
            report.writes += 1;
        }
        // Rolling update: outdated pods go, at most maxUnavailable daemons down at a time.
        let current: Vec<Arc<Value>> = all(cluster, pods_info)
            .into_iter()
            .filter(|p| controller_uid(p) == Some(uid(&ds)) && !deleting(p))
            .filter(|p| !remove.iter().any(|r| uid(r) == uid(p)))
            .collect();
        if !on_delete(&ds) {
            let available = current.iter().filter(|p| pod_ready(p)).count();
            let unavailable = eligible.len().saturating_sub(available);
            let budget = max_unavailable(&ds, eligible.len()).saturating_sub(unavailable);
            let mut outdated: Vec<&Arc<Value>> = current
                .iter()
                .filter(|p| p["metadata"]["labels"][HASH_LABEL] != hash)
                .collect();
            // Not-ready outdated pods first: replacing them costs no availability.
            outdated.sort_by_key(|p| (pod_ready(p), name(p).to_string()));
            let mut spent = 0;
            for p in outdated {
                if pod_ready(p) {
                    if spent >= budget {
                        break;
                    }
                    spent += 1;
                }
                remove.push((*p).clone());
            }
        }
        for p in &remove {
            cluster
                .delete(pods_info, namespace(p), name(p), &DeleteOptions::default())
                .map_err(|e| write_err("a daemon Pod", &e))?;
            report.writes += 1;
        }
        if let Some(r) = infos.revisions {
            let live: BTreeSet<String> = all(cluster, pods_info)
                .iter()
                .filter(|p| controller_uid(p) == Some(uid(&ds)))
                .filter_map(|p| {
                    p["metadata"]["labels"][HASH_LABEL]
                        .as_str()
                        .map(String::from)
                })
                .collect();
            controller_revision::clean_up(cluster, r, &ds, old_revisions, &live, report)?;
        }
        sync_status(cluster, daemonsets, pods_info, &ds, &nodes, report)?;
    }
    Ok(())
}

fn sync_status(
    cluster: &mut Cluster,
    daemonsets: &ResourceInfo,
    pods_info: &ResourceInfo,
    ds: &Value,
    nodes: &[Arc<Value>],
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    let spec = pod_spec(ds);
    let hash = template_hash(ds);
    let pods: Vec<Arc<Value>> = all(cluster, pods_info)
        .into_iter()
        .filter(|p| controller_uid(p) == Some(uid(ds)) && !deleting(p))
        .collect();
    let (mut desired, mut current, mut misscheduled, mut ready, mut updated) = (0, 0, 0, 0, 0);
    for node in nodes {
        let (run, _) = eligibility(node, &spec);
        let here: Vec<&Arc<Value>> = pods
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node["metadata"]["name"])
            .collect();
        if run {
            desired += 1;
        }
        if here.is_empty() {
            continue;
        }
        if !run {
            misscheduled += 1;
            continue;
        }
        current += 1;
        if here.iter().any(|p| pod_ready(p)) {
            ready += 1;
        }
        if here
            .iter()
            .any(|p| p["metadata"]["labels"][HASH_LABEL] == hash)
        {
            updated += 1;
        }
    }
    // The four counts Kubernetes always writes, then the ones it omits when zero.
    let mut optional = json!({"observedGeneration": ds["metadata"]["generation"].as_i64().unwrap_or(1),
        "updatedNumberScheduled": updated, "numberAvailable": ready,
        "numberUnavailable": desired - ready});
    strip_zeroes(&mut optional);
    let mut status = json!({"currentNumberScheduled": current, "numberMisscheduled": misscheduled,
        "desiredNumberScheduled": desired, "numberReady": ready});
    if let (Some(s), Some(o)) = (status.as_object_mut(), optional.as_object()) {
        s.extend(o.clone());
    }
    write_status(cluster, daemonsets, ds, status, MANAGER, report)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(node_selector: Value) -> Value {
        json!({"metadata": {"name": "agent", "generation": 2},
               "spec": {"template": {"spec": {"nodeSelector": node_selector,
                                              "containers": [{"name": "a"}]}}}})
    }

    #[test]
    fn cordoned_nodes_keep_daemons_and_untolerated_taints_keep_them_off() {
        let spec = pod_spec(&ds(json!({"role": "worker"})));
        let worker = json!({"metadata": {"name": "n", "labels": {"role": "worker"}}});
        assert_eq!(eligibility(&worker, &spec), (true, true));
        let cordoned = json!({"metadata": {"labels": {"role": "worker"}},
            "spec": {"unschedulable": true, "taints": [
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}});
        assert_eq!(eligibility(&cordoned, &spec), (true, true));
        let no_schedule = json!({"metadata": {"labels": {"role": "worker"}},
            "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}});
        // Not placed there, but one already there stays.
        assert_eq!(eligibility(&no_schedule, &spec), (false, true));
        let no_execute = json!({"metadata": {"labels": {"role": "worker"}},
            "spec": {"taints": [{"key": "dedicated", "effect": "NoExecute"}]}});
        assert_eq!(eligibility(&no_execute, &spec), (false, false));
        let other = json!({"metadata": {"labels": {"role": "db"}}});
        assert_eq!(eligibility(&other, &spec), (false, false));
    }

    #[test]
    fn daemon_pods_are_bound_to_their_node_with_the_controllers_tolerations() {
        let pod = daemon_pod(&ds(json!(null)), "n1", "abc");
        assert_eq!(pod["spec"]["nodeName"], "n1");
        assert_eq!(
            pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchFields"][0],
            json!({"key": "metadata.name", "operator": "In", "values": ["n1"]})
        );
        assert_eq!(pod["metadata"]["labels"][HASH_LABEL], "abc");
        assert_eq!(pod["metadata"]["labels"]["pod-template-generation"], "2");
        assert_eq!(pod["spec"]["tolerations"].as_array().map(Vec::len), Some(6));
    }

    #[test]
    fn max_unavailable_reads_integers_and_percentages() {
        let with = |v: Value| json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": v}}}});
        assert_eq!(max_unavailable(&with(json!(3)), 10), 3);
        assert_eq!(max_unavailable(&with(json!("50%")), 10), 5);
        assert_eq!(max_unavailable(&with(json!("5%")), 10), 1);
        assert_eq!(max_unavailable(&json!({}), 10), 1);
    }
}
