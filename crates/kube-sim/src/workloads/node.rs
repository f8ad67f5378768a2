//! Kubelet heartbeats: Nodes that report Ready (with `lastHeartbeatTime` renewed) while their
//! simulated kubelet is alive, and `Unknown` once it is switched off, as the node lifecycle
//! controller shows a node whose kubelet stopped posting.

use super::{WorkloadError, node_ready, opts, write_err};
use crate::cluster::{Cluster, Sub};
use crate::store::ObjKey;
use crate::util;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Mutex;

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

    /// Takes over every stored Node no simulated kubelet runs yet (created by a user, a chart or
    /// the demo): its status gets what a kubelet registers (capacity, addresses, node info) where
    /// missing, a Ready condition, and heartbeats from then on. Returns how many it took over.
    pub fn adopt(&self, cluster: &mut Cluster) -> Result<usize, WorkloadError> {
        let Some(info) = cluster.registry.lookup("", "v1", "nodes").cloned() else {
            return Ok(0);
        };
        let stored: Vec<std::sync::Arc<Value>> = cluster
            .store
            .list_values(&info.storage_key(), None)
            .map(|(_, v)| v)
            .collect();
        let mut adopted = 0;
        for node in stored {
            let name = node["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if name.is_empty() || self.lock().contains_key(&name) {
                continue;
            }
            let index = self.lock().len() as u32;
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 1, 1)) + index).to_string();
            let registered = node_object(&name, &BTreeMap::new(), &ip);
            let mut updated = (*node).clone();
            if !updated["status"].is_object() {
                updated["status"] = json!({});
            }
            for key in ["capacity", "allocatable", "addresses", "nodeInfo"] {
                if updated["status"][key].is_null() {
                    updated["status"][key] = registered["status"][key].clone();
                }
            }
            if updated != *node {
                cluster
                    .update(&info, "", &name, updated, Sub::Status, &opts("kubelet"))
                    .map_err(|e| write_err("a Node status", &e))?;
            }
            self.lock().insert(name.clone(), true);
            self.post_status(cluster, &name, true, true)?;
            adopted += 1;
        }
        Ok(adopted)
    }

    /// Whether a simulated kubelet runs (or ran) on this node.
    pub fn knows(&self, name: &str) -> bool {
        self.lock().contains_key(name)
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
