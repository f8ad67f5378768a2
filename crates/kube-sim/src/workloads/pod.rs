//! The scheduler and the kubelets' pod side: an unbound Pod goes to the least loaded schedulable
//! Node (Ready, not cordoned, taints tolerated; a default node is registered when there is none),
//! gets a `podIP` from the pool and the status a kubelet writes: Running and Ready, or, for
//! containers the kubelet really runs (`--exec-images`, see `crate::kubelet`), what their
//! processes do.

use super::write_status;
use super::{
    Infos, PassReport, Simulation, WorkloadError, all, deleting, name, namespace, node_ready, opts,
    write_err,
};
use crate::cluster::{Cluster, Sub};
use crate::util;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

/// Whether a taint's effect keeps pods off a node.
fn repels(taint: &Value) -> bool {
    matches!(taint["effect"].as_str(), Some("NoSchedule" | "NoExecute"))
}

/// Whether one toleration tolerates one taint, by Kubernetes' matching rules.
pub(super) fn tolerates(toleration: &Value, taint: &Value) -> bool {
    let effect_ok = toleration["effect"]
        .as_str()
        .is_none_or(|e| e.is_empty() || Some(e) == taint["effect"].as_str());
    let key = toleration["key"].as_str().unwrap_or("");
    let key_ok = key.is_empty() || Some(key) == taint["key"].as_str();
    let value_ok = match toleration["operator"].as_str().unwrap_or("Equal") {
        "Exists" => true,
        _ => toleration["value"].as_str().unwrap_or("") == taint["value"].as_str().unwrap_or(""),
    };
    effect_ok && key_ok && value_ok
}

/// Whether the scheduler may put a pod with this spec on the node: Ready, not cordoned, every
/// NoSchedule/NoExecute taint tolerated.
pub fn schedulable(node: &Value, pod_spec: &Value) -> bool {
    let tolerations = pod_spec["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    node_ready(node)
        && node["spec"]["unschedulable"] != json!(true)
        && node["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| repels(t))
            .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)))
}

fn internal_ip(node: &Value) -> Option<String> {
    node["status"]["addresses"]
        .as_array()?
        .iter()
        .find(|a| a["type"] == "InternalIP")?["address"]
        .as_str()
        .map(String::from)
}

/// The status a running, ready Pod reports (timestamps kept from `old` when already set).
pub fn running_status(pod: &Value, ip: Ipv4Addr, host_ip: &str, ready: bool) -> Value {
    let old = &pod["status"];
    let start = old["startTime"]
        .as_str()
        .map(String::from)
        .unwrap_or_else(util::now_rfc3339);
    let ready_s = if ready { "True" } else { "False" };
    let cond = |t: &str, s: &str| {
        let prev = old["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == t && c["status"] == s)
            .and_then(|c| c["lastTransitionTime"].as_str())
            .map(String::from)
            .unwrap_or_else(|| start.clone());
        json!({"type": t, "status": s, "lastProbeTime": null, "lastTransitionTime": prev})
    };
    let containers: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
                   "started": true, "restartCount": 0,
                   "state": {"running": {"startedAt": start}}})
        })
        .collect();
    json!({
        "phase": "Running",
        "conditions": [cond("PodReadyToStartContainers", "True"), cond("Initialized", "True"),
                       cond("Ready", ready_s), cond("ContainersReady", ready_s),
                       cond("PodScheduled", "True")],
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
        "startTime": start, "qosClass": "BestEffort",
        "containerStatuses": containers,
    })
}

/// What a pass reads of one Node for the pods on it.
struct NodeFacts {
    ready: bool,
    host_ip: Option<String>,
}

/// Pods: schedule and run.
///
/// Runs on every pass under the cluster lock, so it reads each pod once, copies a pod only to
/// bind it, and reads the Nodes once (as the decoded trees the store keeps).
pub(super) fn sync(
    cluster: &mut Cluster,
    i: &Infos,
    sim: &Simulation,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    let pool = super::IpPool::parse(&sim.options.pod_cidr)?;
    let pods = all(cluster, &i.pods);
    let mut taken: HashSet<Ipv4Addr> = HashSet::with_capacity(pods.len());
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in &pods {
        if let Some(ip) = p["status"]["podIP"].as_str().and_then(|s| s.parse().ok()) {
            taken.insert(ip);
        }
        if let Some(n) = p["spec"]["nodeName"].as_str() {
            *per_node.entry(n.to_string()).or_insert(0) += 1;
        }
    }
    let mut nodes: HashMap<String, NodeFacts> = all(cluster, &i.nodes)
        .iter()
        .map(|n| {
            let facts = NodeFacts {
                ready: node_ready(n),
                host_ip: internal_ip(n),
            };
            (name(n).to_string(), facts)
        })
        .collect();
    let mut live: HashSet<String> = HashSet::with_capacity(pods.len());
    for p in pods {
        if deleting(&p) {
            continue;
        }
        live.insert(super::uid(&p).to_string());
        let mut pod = p;
        if pod["spec"]["nodeName"].as_str().unwrap_or("").is_empty() {
            let Some(node) = pick_node(cluster, i, sim, &pod["spec"], &per_node)? else {
                continue;
            };
            *per_node.entry(node.clone()).or_insert(0) += 1;
            if !nodes.contains_key(&node) {
                // The default node, registered just now for this pod.
                let registered = cluster
                    .store
                    .get(&i.nodes.storage_key(), &(String::new(), node.clone()));
                let facts = NodeFacts {
                    ready: registered.as_deref().is_none_or(node_ready),
                    host_ip: registered.as_deref().and_then(internal_ip),
                };
                nodes.insert(node.clone(), facts);
            }
            let mut bound = Value::clone(&pod);
            bound["spec"]["nodeName"] = json!(node);
            let (ns, pod_name) = (namespace(&pod).to_owned(), name(&pod).to_owned());
            // The update answers with the object as stored: the pass goes on with that.
            let stored = cluster
                .update(
                    &i.pods,
                    &ns,
                    &pod_name,
                    bound,
                    Sub::Main,
                    &opts("kube-scheduler"),
                )
                .map_err(|e| write_err("a Pod binding", &e))?;
            report.writes += 1;
            pod = Arc::new(stored);
        }
        let node = nodes.get(pod["spec"]["nodeName"].as_str().unwrap_or_default());
        // A pod on an unknown node runs; on a known node it is as ready as the node.
        let node_up = node.is_none_or(|n| n.ready);
        let host_ip = node
            .and_then(|n| n.host_ip.as_deref())
            .unwrap_or("127.0.0.1");
        let ip = match pod["status"]["podIP"].as_str().and_then(|s| s.parse().ok()) {
            Some(ip) => ip,
            None => match pool.allocate(&taken) {
                Some(ip) => {
                    taken.insert(ip);
                    ip
                }
                None => {
                    tracing::warn!(pod = name(&pod), "pod IP pool exhausted");
                    continue;
                }
            },
        };
        let runs = sim.kubelet.runs(&pod);
        let terminal = matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        );
        if terminal && !runs {
            continue;
        }
        let status = if runs {
            // Its containers really run: the status follows their processes.
            let ip_text = ip.to_string();
            sim.kubelet.ensure_started(&pod, &ip_text);
            sim.kubelet
                .pod_status(&pod, &ip_text, host_ip)
                .unwrap_or_else(|| running_status(&pod, ip, host_ip, node_up))
        } else if super::job::runs_to_completion(&pod) && pod["status"]["phase"] == "Running" {
            // A simulated Job pod completes one pass after it started running.
            super::job::succeeded_status(&pod)
        } else {
            running_status(&pod, ip, host_ip, node_up)
        };
        write_status(cluster, &i.pods, &pod, status, "kubelet", report)?;
    }
    // Deleted pods' processes stop (SIGTERM, then SIGKILL after the grace period).
    sim.kubelet.stop_missing(&live);
    Ok(())
}

/// The least loaded schedulable node (by name on ties). In a cluster without Nodes, the default
/// node is registered (Ready, heartbeating) so that the binding names a Node that exists.
fn pick_node(
    cluster: &mut Cluster,
    i: &Infos,
    sim: &Simulation,
    pod_spec: &Value,
    per_node: &BTreeMap<String, usize>,
) -> Result<Option<String>, WorkloadError> {
    let nodes: Vec<Arc<Value>> = all(cluster, &i.nodes);
    let best = nodes
        .iter()
        .filter(|n| schedulable(n, pod_spec))
        .map(|n| name(n).to_string())
        .min_by_key(|n| (per_node.get(n).copied().unwrap_or(0), n.clone()));
    if best.is_some() {
        return Ok(best);
    }
    if !nodes.is_empty() {
        // Nodes exist but take no such pod (cordoned, tainted, NotReady): it stays Pending.
        return Ok(None);
    }
    let default = sim.options.default_node.clone();
    sim.nodes.add(cluster, &default, &BTreeMap::new())?;
    Ok(Some(default))
}
