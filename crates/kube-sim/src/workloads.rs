//! Workload simulation: an in-process controller over the store that plays kube-controller-manager,
//! the scheduler and the kubelets. Deployments get a ReplicaSet per pod template (named
//! `<deployment>-<pod-template-hash>`), ReplicaSets get Pods (owner references, the
//! `pod-template-hash` label), Pods are bound to a Ready node (or a default node name when there is
//! none), get a distinct `podIP` from a pool (default `127.10.0.0/16`, so a process can bind it on
//! loopback), phase Running and Ready conditions; ReplicaSet and Deployment status follow. Nodes
//! added with [`crate::KubeSim::add_node`] are Ready and heartbeat until switched NotReady.
//!
//! Each pass reads the whole state and writes only what differs, so a quiet cluster stays quiet.

use crate::cluster::{Cluster, DeleteOptions, Sub, WriteOptions};
use crate::registry::ResourceInfo;
use crate::shared::Shared;
use crate::store::ObjKey;
use crate::util;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Settings of the simulation.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    /// Pod IPs come from this IPv4 CIDR.
    pub pod_cidr: String,
    /// Node name for Pods when no node is Ready.
    pub default_node: String,
    /// How often nodes added through the helper post a heartbeat.
    pub heartbeat_interval: Duration,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        Self {
            pod_cidr: "127.10.0.0/16".into(),
            default_node: "kube-sim-node".into(),
            heartbeat_interval: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkloadError {
    #[error("invalid pod CIDR {0:?}: expected an IPv4 CIDR such as 127.10.0.0/16")]
    InvalidCidr(String),
    #[error("cannot write {what}: {message}")]
    Write { what: String, message: String },
}

/// An IPv4 range handing out the lowest free address (network and broadcast excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPool {
    first: u32,
    last: u32,
}

impl IpPool {
    pub fn parse(cidr: &str) -> Result<Self, WorkloadError> {
        let bad = || WorkloadError::InvalidCidr(cidr.to_string());
        let (addr, len) = cidr.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let len: u32 = len.parse().map_err(|_| bad())?;
        if !(8..=30).contains(&len) {
            return Err(bad());
        }
        let mask = u32::MAX << (32 - len);
        let network = u32::from(addr) & mask;
        Ok(Self {
            first: network + 1,
            last: (network | !mask) - 1,
        })
    }

    pub fn allocate(&self, taken: &HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
        (self.first..=self.last)
            .map(Ipv4Addr::from)
            .find(|ip| !taken.contains(ip))
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        (self.first..=self.last).contains(&u32::from(ip))
    }
}

/// A stable hash of a pod template, spelled with kube's "safe" alphabet (no vowels).
pub fn pod_template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let text = serde_json::to_string(template).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (0..10)
        .map(|_| {
            let c = ALPHABET[(h % ALPHABET.len() as u64) as usize] as char;
            h /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

fn uid(obj: &Value) -> &str {
    obj["metadata"]["uid"].as_str().unwrap_or_default()
}

fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

fn namespace(obj: &Value) -> &str {
    obj["metadata"]["namespace"].as_str().unwrap_or_default()
}

fn deleting(obj: &Value) -> bool {
    !obj["metadata"]["deletionTimestamp"].is_null()
}

/// The uid of the controller owner, if any.
fn controller_uid(obj: &Value) -> Option<&str> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == json!(true))?["uid"]
        .as_str()
}

fn owner_ref(owner: &Value, api_version: &str, kind: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name(owner), "uid": uid(owner),
           "controller": true, "blockOwnerDeletion": true})
}

fn replicas(obj: &Value) -> i64 {
    obj["spec"]["replicas"].as_i64().unwrap_or(1).max(0)
}

fn node_ready(node: &Value) -> bool {
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The ReplicaSet a Deployment wants for its current template.
pub fn desired_replicaset(deploy: &Value, hash: &str) -> Value {
    let mut template = deploy["spec"]["template"].clone();
    template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
    let mut selector = deploy["spec"]["selector"].clone();
    selector["matchLabels"]["pod-template-hash"] = json!(hash);
    let mut labels = deploy["spec"]["template"]["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["pod-template-hash"] = json!(hash);
    json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {
            "name": format!("{}-{hash}", name(deploy)),
            "namespace": namespace(deploy),
            "labels": labels,
            "annotations": {"deployment.kubernetes.io/revision": "1"},
            "ownerReferences": [owner_ref(deploy, "apps/v1", "Deployment")],
        },
        "spec": {"replicas": replicas(deploy), "selector": selector, "template": template,
                 "minReadySeconds": deploy["spec"]["minReadySeconds"].as_i64().unwrap_or(0)},
    })
}

/// A new Pod of a ReplicaSet (named by `generateName`).
pub fn desired_pod(rs: &Value) -> Value {
    let template = &rs["spec"]["template"];
    let mut metadata = template["metadata"].clone();
    if !metadata.is_object() {
        metadata = json!({});
    }
    metadata["generateName"] = json!(format!("{}-", name(rs)));
    metadata["namespace"] = json!(namespace(rs));
    metadata["ownerReferences"] = json!([owner_ref(rs, "apps/v1", "ReplicaSet")]);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
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

/// What the simulation writes, for logging and tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub writes: usize,
}

struct Infos {
    deployments: ResourceInfo,
    replicasets: ResourceInfo,
    pods: ResourceInfo,
    nodes: ResourceInfo,
}

fn infos(cluster: &Cluster) -> Option<Infos> {
    let r = &cluster.registry;
    Some(Infos {
        deployments: r.lookup("apps", "v1", "deployments")?.clone(),
        replicasets: r.lookup("apps", "v1", "replicasets")?.clone(),
        pods: r.lookup("", "v1", "pods")?.clone(),
        nodes: r.lookup("", "v1", "nodes")?.clone(),
    })
}

fn all(cluster: &Cluster, info: &ResourceInfo) -> Vec<Arc<Value>> {
    cluster
        .store
        .list_values(&info.storage_key(), None)
        .map(|(_, v)| v)
        .collect()
}

fn opts(manager: &str) -> WriteOptions {
    WriteOptions {
        field_manager: manager.into(),
        ..Default::default()
    }
}

fn write_err(what: &str, e: &crate::error::ApiError) -> WorkloadError {
    WorkloadError::Write {
        what: what.into(),
        message: e.message.clone(),
    }
}

/// One reconciliation pass over Deployments, ReplicaSets, Pods; returns how much it wrote.
pub fn reconcile(
    cluster: &mut Cluster,
    options: &WorkloadOptions,
) -> Result<PassReport, WorkloadError> {
    let pool = IpPool::parse(&options.pod_cidr)?;
    let Some(i) = infos(cluster) else {
        return Ok(PassReport::default());
    };
    let mut report = PassReport::default();

    // Deployments -> ReplicaSets.
    let replicasets = all(cluster, &i.replicasets);
    for d in all(cluster, &i.deployments) {
        if deleting(&d) {
            continue;
        }
        let hash = pod_template_hash(&d["spec"]["template"]);
        let want = desired_replicaset(&d, &hash);
        let want_name = name(&want).to_string();
        let owned: Vec<&Arc<Value>> = replicasets
            .iter()
            .filter(|rs| controller_uid(rs) == Some(uid(&d)))
            .collect();
        if !owned.iter().any(|rs| name(rs) == want_name) {
            cluster
                .create(
                    &i.replicasets,
                    namespace(&d),
                    want,
                    &opts("kube-controller-manager"),
                )
                .map_err(|e| write_err("a ReplicaSet", &e))?;
            report.writes += 1;
        }
        for rs in owned {
            let target = if name(rs) == want_name {
                replicas(&d)
            } else {
                0
            };
            if rs["spec"]["replicas"].as_i64() != Some(target) && !deleting(rs) {
                let mut updated = (**rs).clone();
                updated["spec"]["replicas"] = json!(target);
                cluster
                    .update(
                        &i.replicasets,
                        namespace(rs),
                        name(rs),
                        updated,
                        Sub::Main,
                        &opts("kube-controller-manager"),
                    )
                    .map_err(|e| write_err("a ReplicaSet", &e))?;
                report.writes += 1;
            }
        }
    }

    // ReplicaSets -> Pods.
    let pods = all(cluster, &i.pods);
    for rs in all(cluster, &i.replicasets) {
        if deleting(&rs) {
            continue;
        }
        let mut owned: Vec<&Arc<Value>> = pods
            .iter()
            .filter(|p| controller_uid(p) == Some(uid(&rs)) && !deleting(p))
            .collect();
        let want = replicas(&rs) as usize;
        for _ in owned.len()..want {
            cluster
                .create(
                    &i.pods,
                    namespace(&rs),
                    desired_pod(&rs),
                    &opts("kube-controller-manager"),
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
                    .delete(&i.pods, namespace(p), name(p), &DeleteOptions::default())
                    .map_err(|e| write_err("a Pod", &e))?;
                report.writes += 1;
            }
        }
    }

    // Pods: schedule and run.
    let nodes = all(cluster, &i.nodes);
    let ready_nodes: Vec<&Arc<Value>> = nodes.iter().filter(|n| node_ready(n)).collect();
    let mut taken: HashSet<Ipv4Addr> = all(cluster, &i.pods)
        .iter()
        .filter_map(|p| p["status"]["podIP"].as_str()?.parse().ok())
        .collect();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in all(cluster, &i.pods) {
        if let Some(n) = p["spec"]["nodeName"].as_str() {
            *per_node.entry(n.to_string()).or_insert(0) += 1;
        }
    }
    for p in all(cluster, &i.pods) {
        if deleting(&p) {
            continue;
        }
        let mut pod = (*p).clone();
        if pod["spec"]["nodeName"].as_str().unwrap_or("").is_empty() {
            // The least loaded Ready node, by name on ties.
            let node = ready_nodes
                .iter()
                .map(|n| name(n).to_string())
                .min_by_key(|n| (per_node.get(n).copied().unwrap_or(0), n.clone()))
                .unwrap_or_else(|| options.default_node.clone());
            *per_node.entry(node.clone()).or_insert(0) += 1;
            pod["spec"]["nodeName"] = json!(node);
            cluster
                .update(
                    &i.pods,
                    namespace(&pod),
                    name(&pod),
                    pod.clone(),
                    Sub::Main,
                    &opts("kube-scheduler"),
                )
                .map_err(|e| write_err("a Pod binding", &e))?;
            report.writes += 1;
            match cluster.store.get(
                &i.pods.storage_key(),
                &(namespace(&pod).to_string(), name(&pod).to_string()),
            ) {
                Some(now) => pod = (*now).clone(),
                None => continue,
            }
        }
        let node_name = pod["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let node = nodes.iter().find(|n| name(n) == node_name);
        // A pod on an unknown node (the default one) runs; on a known node it is as ready as the node.
        let ready = node.is_none_or(|n| node_ready(n));
        let host_ip = node
            .and_then(|n| {
                n["status"]["addresses"]
                    .as_array()?
                    .iter()
                    .find(|a| a["type"] == "InternalIP")?["address"]
                    .as_str()
                    .map(String::from)
            })
            .unwrap_or_else(|| "127.0.0.1".into());
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
        let status = running_status(&pod, ip, &host_ip, ready);
        if pod["status"] != status {
            pod["status"] = status;
            cluster
                .update(
                    &i.pods,
                    namespace(&pod),
                    name(&pod),
                    pod.clone(),
                    Sub::Status,
                    &opts("kubelet"),
                )
                .map_err(|e| write_err("a Pod status", &e))?;
            report.writes += 1;
        }
    }

    // Status of ReplicaSets and Deployments.
    let pods = all(cluster, &i.pods);
    let rs_counts = |rs: &Value| {
        let owned: Vec<&Arc<Value>> = pods
            .iter()
            .filter(|p| controller_uid(p) == Some(uid(rs)) && !deleting(p))
            .collect();
        let ready = owned.iter().filter(|p| pod_ready(p)).count() as i64;
        (owned.len() as i64, ready)
    };
    let replicasets = all(cluster, &i.replicasets);
    for rs in &replicasets {
        if deleting(rs) {
            continue;
        }
        let (total, ready) = rs_counts(rs);
        let mut status = json!({"replicas": total, "fullyLabeledReplicas": total,
            "readyReplicas": ready, "availableReplicas": ready,
            "observedGeneration": rs["metadata"]["generation"].as_i64().unwrap_or(1)});
        strip_zeroes(&mut status);
        if rs["status"] != status {
            let mut updated = (**rs).clone();
            updated["status"] = status;
            cluster
                .update(
                    &i.replicasets,
                    namespace(rs),
                    name(rs),
                    updated,
                    Sub::Status,
                    &opts("kube-controller-manager"),
                )
                .map_err(|e| write_err("a ReplicaSet status", &e))?;
            report.writes += 1;
        }
    }
    for d in all(cluster, &i.deployments) {
        if deleting(&d) {
            continue;
        }
        let hash = pod_template_hash(&d["spec"]["template"]);
        let current = format!("{}-{hash}", name(&d));
        let (mut total, mut ready, mut updated_n) = (0, 0, 0);
        for rs in replicasets
            .iter()
            .filter(|rs| controller_uid(rs) == Some(uid(&d)))
        {
            let (t, r) = rs_counts(rs);
            total += t;
            ready += r;
            if name(rs) == current {
                updated_n = t;
            }
        }
        let want = replicas(&d);
        let available = ready >= want;
        let old_conditions = d["status"]["conditions"].clone();
        let cond = |t: &str, s: &str, reason: &str, message: String| {
            let since = old_conditions
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == t && c["status"] == s)
                .and_then(|c| c["lastTransitionTime"].as_str())
                .map(String::from)
                .unwrap_or_else(util::now_rfc3339);
            json!({"type": t, "status": s, "reason": reason, "message": message,
                   "lastUpdateTime": since, "lastTransitionTime": since})
        };
        let mut status = json!({
            "observedGeneration": d["metadata"]["generation"].as_i64().unwrap_or(1),
            "replicas": total, "updatedReplicas": updated_n, "readyReplicas": ready,
            "availableReplicas": ready, "unavailableReplicas": (want - ready).max(0),
            "conditions": [
                if available {
                    cond("Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.".into())
                } else {
                    cond("Available", "False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.".into())
                },
                cond("Progressing", "True", "NewReplicaSetAvailable", format!("ReplicaSet \"{current}\" has successfully progressed.")),
            ],
        });
        strip_zeroes(&mut status);
        if d["status"] != status {
            let mut updated = (*d).clone();
            updated["status"] = status;
            cluster
                .update(
                    &i.deployments,
                    namespace(&d),
                    name(&d),
                    updated,
                    Sub::Status,
                    &opts("kube-controller-manager"),
                )
                .map_err(|e| write_err("a Deployment status", &e))?;
            report.writes += 1;
        }
    }
    Ok(report)
}

/// Kubernetes omits zero counts (`omitempty`), except `replicas` of a ReplicaSet.
fn strip_zeroes(status: &mut Value) {
    if let Some(m) = status.as_object_mut() {
        m.retain(|k, v| k == "replicas" || v != &json!(0));
    }
}

/// A Ready node as a kubelet registers it.
pub fn node_object(name: &str, labels: &BTreeMap<String, String>, internal_ip: &str) -> Value {
    let mut all_labels = json!({"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64"});
    for (k, v) in labels {
        all_labels[k] = json!(v);
    }
    let now = util::now_rfc3339();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {},
        "status": {
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": internal_ip}, {"type": "Hostname", "address": name}],
            "conditions": [ready_condition(true, &now, &now)],
            "nodeInfo": {"kubeletVersion": "v1.33.0", "operatingSystem": "linux", "architecture": "amd64",
                         "containerRuntimeVersion": "kube-sim://1", "kernelVersion": "", "osImage": "kube-sim",
                         "machineID": "", "systemUUID": "", "bootID": "", "kubeProxyVersion": ""},
        },
    })
}

fn ready_condition(ready: bool, heartbeat: &str, transition: &str) -> Value {
    if ready {
        json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
               "message": "kubelet is posting ready status", "lastHeartbeatTime": heartbeat,
               "lastTransitionTime": transition})
    } else {
        json!({"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
               "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": heartbeat,
               "lastTransitionTime": transition})
    }
}

/// Nodes managed by the helper: name -> whether the "kubelet" is alive.
#[derive(Debug, Default)]
pub struct Nodes {
    alive: Mutex<BTreeMap<String, bool>>,
}

impl Nodes {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, bool>> {
        self.alive.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates (or takes over) a Ready node.
    pub fn add(
        &self,
        cluster: &mut Cluster,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), WorkloadError> {
        let Some(info) = cluster.registry.lookup("", "v1", "nodes").cloned() else {
            return Ok(());
        };
        let index = self.lock().len() as u32;
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 1, 1)) + index).to_string();
        let body = node_object(name, labels, &ip);
        match cluster.create(&info, "", body.clone(), &opts("kubelet")) {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => return Err(write_err("a Node", &e)),
        }
        // Creation resets status; the kubelet posts it right after.
        if let Some(cur) = cluster
            .store
            .get(&info.storage_key(), &(String::new(), name.to_string()))
        {
            let mut updated = (*cur).clone();
            updated["status"] = body["status"].clone();
            cluster
                .update(&info, "", name, updated, Sub::Status, &opts("kubelet"))
                .map_err(|e| write_err("a Node status", &e))?;
        }
        self.lock().insert(name.to_string(), true);
        Ok(())
    }

    /// Switches a node's kubelet on (Ready, heartbeats) or off (Ready Unknown, no heartbeats).
    pub fn set_ready(
        &self,
        cluster: &mut Cluster,
        name: &str,
        ready: bool,
    ) -> Result<(), WorkloadError> {
        self.lock().insert(name.to_string(), ready);
        self.post_status(cluster, name, ready, true)
    }

    fn post_status(
        &self,
        cluster: &mut Cluster,
        name: &str,
        ready: bool,
        force: bool,
    ) -> Result<(), WorkloadError> {
        let Some(info) = cluster.registry.lookup("", "v1", "nodes").cloned() else {
            return Ok(());
        };
        let key: ObjKey = (String::new(), name.to_string());
        let Some(cur) = cluster.store.get(&info.storage_key(), &key) else {
            return Ok(());
        };
        let was_ready = node_ready(&cur);
        if !ready && !was_ready && !force {
            return Ok(());
        }
        let now = util::now_rfc3339();
        let old = cur["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready")
            .cloned()
            .unwrap_or(Value::Null);
        let transition = if was_ready == ready {
            old["lastTransitionTime"]
                .as_str()
                .unwrap_or(&now)
                .to_string()
        } else {
            now.clone()
        };
        let heartbeat = if ready {
            now.clone()
        } else {
            old["lastHeartbeatTime"]
                .as_str()
                .unwrap_or(&now)
                .to_string()
        };
        let mut updated = (*cur).clone();
        let mut conditions: Vec<Value> = cur["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["type"] != "Ready")
            .cloned()
            .collect();
        conditions.push(ready_condition(ready, &heartbeat, &transition));
        updated["status"]["conditions"] = json!(conditions);
        if updated == *cur {
            return Ok(());
        }
        cluster
            .update(&info, "", name, updated, Sub::Status, &opts("kubelet"))
            .map_err(|e| write_err("a Node status", &e))?;
        Ok(())
    }

    /// One heartbeat round: live nodes renew `lastHeartbeatTime`.
    pub fn heartbeat(&self, cluster: &mut Cluster) {
        let nodes: Vec<(String, bool)> = self.lock().iter().map(|(k, v)| (k.clone(), *v)).collect();
        for (name, alive) in nodes {
            if let Err(e) = self.post_status(cluster, &name, alive, false) {
                tracing::warn!(node = %name, error = %e, "node heartbeat failed");
            }
        }
    }
}

fn relevant(key: &crate::registry::StorageKey) -> bool {
    matches!(
        (key.0.as_str(), key.1.as_str()),
        ("apps", "deployments") | ("apps", "replicasets") | ("", "pods") | ("", "nodes")
    )
}

/// Runs the simulation (when `simulate`) and node heartbeats until the server shuts down.
pub fn spawn(
    shared: Arc<Shared>,
    nodes: Arc<Nodes>,
    options: WorkloadOptions,
    simulate: bool,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut heartbeat = tokio::time::interval(options.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut rx, _) = shared.lock().store.subscribe();
        loop {
            // Everything up to this version has been reconciled.
            let mut settled_rv = 0;
            if simulate {
                // Passes until nothing changes; each pass's own writes wake the next one.
                for _ in 0..10 {
                    let mut cluster = shared.lock();
                    let pass = reconcile(&mut cluster, &options);
                    settled_rv = cluster.store.resource_version();
                    match pass {
                        Ok(r) if r.writes == 0 => break,
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "workload simulation pass failed");
                            break;
                        }
                    }
                }
            }
            // Drop the events the passes already saw; a later relevant one means another pass.
            let mut pending = false;
            while let Ok(ev) = rx.try_recv() {
                pending |= simulate && ev.rv > settled_rv && relevant(&ev.key);
            }
            if pending {
                continue;
            }
            loop {
                tokio::select! {
                    _ = shared.shutdown.cancelled() => return,
                    _ = heartbeat.tick() => {
                        nodes.heartbeat(&mut shared.lock());
                        break;
                    }
                    ev = rx.recv() => match ev {
                        Ok(ev) if simulate && ev.rv > settled_rv && relevant(&ev.key) => break,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_hand_out_distinct_lowest_free_addresses() {
        let pool = IpPool::parse("127.10.0.0/16").expect("valid");
        let mut taken = HashSet::new();
        let a = pool.allocate(&taken).expect("free");
        assert_eq!(a, Ipv4Addr::new(127, 10, 0, 1));
        taken.insert(a);
        let b = pool.allocate(&taken).expect("free");
        assert_eq!(b, Ipv4Addr::new(127, 10, 0, 2));
        taken.remove(&a);
        assert_eq!(
            pool.allocate(&taken),
            Some(a),
            "released addresses are reused"
        );
        let tiny = IpPool::parse("10.0.0.0/30").expect("valid");
        let full: HashSet<_> = [Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)].into();
        assert_eq!(tiny.allocate(&full), None);
        assert!(IpPool::parse("127.0.0.1").is_err());
        assert!(IpPool::parse("300.0.0.0/8").is_err());
    }

    #[test]
    fn template_hashes_are_stable_and_template_sensitive() {
        let t1 = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
        let t2 = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx:2"}]}});
        assert_eq!(pod_template_hash(&t1), pod_template_hash(&t1.clone()));
        assert_ne!(pod_template_hash(&t1), pod_template_hash(&t2));
        assert_eq!(pod_template_hash(&t1).len(), 10);
    }

    fn deploy(cluster: &mut Cluster, replicas: i64) {
        let info = cluster
            .registry
            .lookup("apps", "v1", "deployments")
            .cloned()
            .expect("built in");
        let body = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
        cluster
            .create(&info, "default", body, &WriteOptions::default())
            .expect("created");
    }

    fn settle(cluster: &mut Cluster) -> usize {
        let opts = WorkloadOptions::default();
        let mut passes = 0;
        while reconcile(cluster, &opts).expect("pass").writes > 0 {
            passes += 1;
            assert!(passes < 10, "does not settle");
        }
        passes
    }

    #[test]
    fn a_deployment_gets_running_pods_and_settles() {
        let mut c = Cluster::new(1000);
        deploy(&mut c, 2);
        assert!(settle(&mut c) > 0);
        let pods = all(
            &c,
            &c.registry.lookup("", "v1", "pods").cloned().expect("pods"),
        );
        assert_eq!(pods.len(), 2);
        for p in &pods {
            assert_eq!(p["status"]["phase"], "Running");
            assert_eq!(p["spec"]["nodeName"], "kube-sim-node");
            assert!(pod_ready(p));
            assert_eq!(p["metadata"]["labels"]["app"], "web");
            assert_eq!(
                p["metadata"]["labels"]["pod-template-hash"]
                    .as_str()
                    .map(str::len),
                Some(10)
            );
        }
        let d = c
            .store
            .get(
                &("apps".into(), "deployments".into()),
                &("default".into(), "web".into()),
            )
            .expect("deployment");
        assert_eq!(d["status"]["readyReplicas"], 2);
        assert_eq!(d["status"]["updatedReplicas"], 2);
        // Quiet: nothing more to write.
        assert_eq!(
            reconcile(&mut c, &WorkloadOptions::default())
                .expect("pass")
                .writes,
            0
        );
    }

    #[test]
    fn pods_go_to_ready_nodes_only() {
        let mut c = Cluster::new(1000);
        let nodes = Nodes::default();
        nodes.add(&mut c, "a", &BTreeMap::new()).expect("node a");
        nodes.add(&mut c, "b", &BTreeMap::new()).expect("node b");
        nodes.set_ready(&mut c, "b", false).expect("b down");
        deploy(&mut c, 3);
        settle(&mut c);
        let pods = all(
            &c,
            &c.registry.lookup("", "v1", "pods").cloned().expect("pods"),
        );
        assert!(
            pods.iter().all(|p| p["spec"]["nodeName"] == "a"),
            "{pods:?}"
        );
        assert!(pods.iter().all(|p| p["status"]["hostIP"] == "127.0.1.1"));
        // Node a goes NotReady: its pods stop being Ready.
        nodes.set_ready(&mut c, "a", false).expect("a down");
        settle(&mut c);
        let pods = all(
            &c,
            &c.registry.lookup("", "v1", "pods").cloned().expect("pods"),
        );
        assert!(pods.iter().all(|p| !pod_ready(p)));
        let node = c
            .store
            .get(
                &(String::new(), "nodes".into()),
                &(String::new(), "a".into()),
            )
            .expect("node");
        assert!(!node_ready(&node));
    }
}
