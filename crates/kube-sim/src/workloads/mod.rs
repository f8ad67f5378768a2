//! Workload simulation: an in-process controller over the store that plays kube-controller-manager,
//! the scheduler and the kubelets, one module per kind: `deployment` (a ReplicaSet per pod
//! template, named `<deployment>-<pod-template-hash>`), `replicaset` (Pods with owner references
//! and the `pod-template-hash` label), `pod` (scheduling onto schedulable Nodes, a distinct
//! `podIP` from the pool, default `127.10.0.0/16` so a process can bind it on loopback; phase
//! Running and Ready conditions), `daemonset` (a Pod per eligible Node, rolling updates; `controller_revision` keeps its
//! template history), `job` (Pods run to
//! completion, counted against `completions` and `backoffLimit`), `cronjob` (a Job at each
//! scheduled time), `node` (kubelet heartbeats: Nodes added with
//! [`crate::KubeSim::add_node`], and with simulation on every other Node too, are Ready and
//! heartbeat until switched NotReady).
//!
//! Each pass reads the whole state and writes only what differs, so a quiet cluster stays quiet.

mod controller_revision;
mod cronjob;
mod daemonset;
mod deployment;
mod ippool;
mod job;
mod namespace;
mod node;
mod pod;
mod replicaset;

pub use deployment::{desired_replicaset, pod_template_hash};
pub use ippool::IpPool;
pub use node::{Nodes, node_object};
pub use pod::{running_status, schedulable};
pub use replicaset::desired_pod;

use crate::cluster::{Cluster, WriteOptions};
use crate::registry::ResourceInfo;
use crate::shared::Shared;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Settings of the simulation.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    /// Pod IPs come from this IPv4 CIDR.
    pub pod_cidr: String,
    /// The Node registered for Pods when the cluster has no Node at all.
    pub default_node: String,
    /// How often simulated kubelets post a heartbeat.
    pub heartbeat_interval: Duration,
    /// The `ca.crt` of every namespace's `kube-root-ca.crt` ConfigMap (the server's CA with TLS).
    pub root_ca: String,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        Self {
            pod_cidr: "127.10.0.0/16".into(),
            default_node: "kube-sim-node".into(),
            heartbeat_interval: Duration::from_secs(10),
            root_ca: String::new(),
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

/// What one simulation runs with: its settings and the simulated kubelets.
pub struct Simulation {
    pub options: WorkloadOptions,
    pub nodes: Arc<Nodes>,
    /// Runs the containers of `--exec-images` pods as processes.
    pub kubelet: Arc<crate::kubelet::Kubelet>,
    /// What the Deployment controller remembers between passes.
    pub template_hashes: deployment::TemplateHashes,
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

/// Objects grouped by the uid of their controller, each group in listed order: built in one pass,
/// so finding what an owner owns does not scan every object once per owner.
struct Owned<'a>(HashMap<&'a str, Vec<&'a Arc<Value>>>);

impl<'a> Owned<'a> {
    fn index(objects: &'a [Arc<Value>]) -> Self {
        let mut by_owner: HashMap<&str, Vec<&Arc<Value>>> = HashMap::new();
        for obj in objects {
            if let Some(owner) = controller_uid(obj) {
                by_owner.entry(owner).or_default().push(obj);
            }
        }
        Self(by_owner)
    }

    /// What `owner` controls.
    fn of(&self, owner: &Value) -> &[&'a Arc<Value>] {
        self.0.get(uid(owner)).map_or(&[], Vec::as_slice)
    }
}

fn owner_ref(owner: &Value, api_version: &str, kind: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name(owner), "uid": uid(owner),
           "controller": true, "blockOwnerDeletion": true})
}

fn replicas(obj: &Value) -> i64 {
    obj["spec"]["replicas"].as_i64().unwrap_or(1).max(0)
}

/// Whether `conditions` hold one of type `kind` with status "True".
fn condition_true(conditions: &[Value], kind: &str) -> bool {
    conditions
        .iter()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// Whether the object's `status.conditions` hold `kind` True.
fn has_condition(obj: &Value, kind: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| condition_true(conditions, kind))
}

fn node_ready(node: &Value) -> bool {
    has_condition(node, "Ready")
}

fn pod_ready(pod: &Value) -> bool {
    has_condition(pod, "Ready")
}

/// Writes `status` to the status subresource of `obj` (of `info`) as `manager`, when it differs
/// from what `obj` holds: each controller computes the whole status, and an unchanged one is no
/// write.
fn write_status(
    cluster: &mut Cluster,
    info: &ResourceInfo,
    obj: &Value,
    status: Value,
    manager: &str,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    if obj["status"] == status {
        return Ok(());
    }
    let mut updated = obj.clone();
    updated["status"] = status;
    cluster
        .update(
            info,
            namespace(obj),
            name(obj),
            updated,
            crate::cluster::Sub::Status,
            &opts(manager),
        )
        .map_err(|e| write_err(&format!("a {} status", info.kind), &e))?;
    report.writes += 1;
    Ok(())
}

/// What the simulation writes, for logging and tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub writes: usize,
    /// When a CronJob's schedule next fires: the simulation wakes then, with no event to wait for.
    pub wake_at: Option<jiff::Timestamp>,
}

pub(crate) struct Infos {
    deployments: ResourceInfo,
    replicasets: ResourceInfo,
    pods: ResourceInfo,
    nodes: ResourceInfo,
    namespaces: ResourceInfo,
    serviceaccounts: ResourceInfo,
    configmaps: ResourceInfo,
    /// Served once the registry has them (core/v1 `replicationcontrollers`).
    replicationcontrollers: Option<ResourceInfo>,
    daemonsets: Option<ResourceInfo>,
    controllerrevisions: Option<ResourceInfo>,
    jobs: Option<ResourceInfo>,
    cronjobs: Option<ResourceInfo>,
}

fn infos(cluster: &Cluster) -> Option<Infos> {
    let r = &cluster.registry;
    Some(Infos {
        deployments: r.lookup("apps", "v1", "deployments")?.clone(),
        replicasets: r.lookup("apps", "v1", "replicasets")?.clone(),
        pods: r.lookup("", "v1", "pods")?.clone(),
        nodes: r.lookup("", "v1", "nodes")?.clone(),
        namespaces: r.lookup("", "v1", "namespaces")?.clone(),
        serviceaccounts: r.lookup("", "v1", "serviceaccounts")?.clone(),
        configmaps: r.lookup("", "v1", "configmaps")?.clone(),
        replicationcontrollers: r.lookup("", "v1", "replicationcontrollers").cloned(),
        daemonsets: r.lookup("apps", "v1", "daemonsets").cloned(),
        controllerrevisions: r.lookup("apps", "v1", "controllerrevisions").cloned(),
        jobs: r.lookup("batch", "v1", "jobs").cloned(),
        cronjobs: r.lookup("batch", "v1", "cronjobs").cloned(),
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

/// Kubernetes omits zero counts (`omitempty`), except `replicas` of a ReplicaSet.
fn strip_zeroes(status: &mut Value) {
    if let Some(m) = status.as_object_mut() {
        m.retain(|k, v| k == "replicas" || v != &json!(0));
    }
}

/// One controller's part of a pass: it acts on the state the steps before it left.
type Step = fn(&mut Cluster, &Infos, &Simulation, &mut PassReport) -> Result<(), WorkloadError>;

/// The steps of a pass, in order: owners before what they own, then the kubelets, then the
/// statuses that count what the kubelets did.
const STEPS: [(&str, Step); 11] = [
    ("nodes", |c, _, sim, r| {
        r.writes += sim.nodes.adopt(c)?;
        Ok(())
    }),
    ("namespaces", |c, i, sim, r| {
        namespace::sync(c, i, &sim.options.root_ca, r)
    }),
    ("deployments", |c, i, sim, r| {
        deployment::sync_replicasets(c, i, &sim.template_hashes, r)
    }),
    ("replicasets", |c, i, _, r| {
        replicaset::sync_pods(c, &i.replicasets, &i.pods, r)
    }),
    // ReplicationControllers keep their pods as ReplicaSets do.
    ("replicationcontrollers", |c, i, _, r| {
        match &i.replicationcontrollers {
            Some(rc) => replicaset::sync_pods(c, rc, &i.pods, r),
            None => Ok(()),
        }
    }),
    ("daemonsets", |c, i, _, r| {
        let Some(ds) = &i.daemonsets else {
            return Ok(());
        };
        let infos = daemonset::DaemonSetInfos {
            daemonsets: ds,
            pods: &i.pods,
            nodes: &i.nodes,
            revisions: i.controllerrevisions.as_ref(),
        };
        daemonset::sync(c, &infos, r)
    }),
    ("cronjobs", |c, i, _, r| {
        if let (Some(cronjobs), Some(jobs)) = (&i.cronjobs, &i.jobs) {
            r.wake_at = cronjob::sync(c, cronjobs, jobs, r)?;
        }
        Ok(())
    }),
    ("jobs", |c, i, _, r| match &i.jobs {
        Some(jobs) => job::sync(c, jobs, &i.pods, r),
        None => Ok(()),
    }),
    ("pods", |c, i, sim, r| pod::sync(c, i, sim, r)),
    ("replicaset status", |c, i, _, r| {
        replicaset::sync_status(c, &i.replicasets, &i.pods, r)?;
        match &i.replicationcontrollers {
            Some(rc) => replicaset::sync_status(c, rc, &i.pods, r),
            None => Ok(()),
        }
    }),
    ("deployment status", |c, i, sim, r| {
        deployment::sync_status(c, i, &sim.template_hashes, r)
    }),
];

/// What a pass needs before its steps: a valid pool and the simulated kinds (`None` until
/// the registry serves them).
fn prepare(cluster: &Cluster, sim: &Simulation) -> Result<Option<Infos>, WorkloadError> {
    IpPool::parse(&sim.options.pod_cidr)?;
    Ok(infos(cluster))
}

/// One reconciliation pass over every simulated kind, each as its controller would act on the
/// state the previous one left; returns how much it wrote.
pub fn reconcile(cluster: &mut Cluster, sim: &Simulation) -> Result<PassReport, WorkloadError> {
    let Some(i) = prepare(cluster, sim)? else {
        return Ok(PassReport::default());
    };
    let mut report = PassReport::default();
    for (_, step) in STEPS {
        step(cluster, &i, sim, &mut report)?;
    }
    Ok(report)
}

/// [`reconcile`] as the server runs it: the cluster lock is taken per step and other tasks get
/// a turn between steps, so an API request waits for one controller's step, not a whole pass.
async fn reconcile_shared(shared: &Shared, sim: &Simulation) -> Result<PassReport, WorkloadError> {
    let failed = |step: &str, e: &WorkloadError| {
        tracing::warn!(step, error = %e, "workload simulation pass failed");
    };
    let prepared = prepare(&shared.lock(), sim);
    let Some(i) = prepared.inspect_err(|e| failed("prepare", e))? else {
        return Ok(PassReport::default());
    };
    let mut report = PassReport::default();
    for (name, step) in STEPS {
        step(&mut shared.lock(), &i, sim, &mut report).inspect_err(|e| failed(name, e))?;
        tokio::task::yield_now().await;
    }
    Ok(report)
}

fn relevant(key: &crate::registry::StorageKey) -> bool {
    matches!(
        (key.0.as_str(), key.1.as_str()),
        (
            "apps",
            "deployments" | "replicasets" | "daemonsets" | "controllerrevisions"
        ) | ("batch", "jobs" | "cronjobs")
            | (
                "",
                "pods" | "nodes" | "namespaces" | "replicationcontrollers"
            )
    )
}

/// Where a run of passes left the cluster.
#[derive(Debug, Default)]
struct Settled {
    /// Everything written up to this resourceVersion has been reconciled: the version at the
    /// start of the last pass, since others write between its steps.
    rv: u64,
    /// When a schedule (CronJob) is next due.
    wake_at: Option<jiff::Timestamp>,
}

/// Passes until one writes nothing (each pass's own writes are the next one's input), at most
/// ten. A pass that fails or never settles leaves `rv` at the current version: it waits for
/// news, not for its own writes.
async fn run_passes(shared: &Shared, sim: &Simulation) -> Settled {
    let mut settled = Settled::default();
    for _ in 0..10 {
        settled.rv = shared.lock().store.resource_version();
        match reconcile_shared(shared, sim).await {
            Ok(r) => {
                settled.wake_at = r.wake_at;
                if r.writes == 0 {
                    return settled;
                }
            }
            // Logged with the step that failed.
            Err(_) => break,
        }
    }
    settled.rv = shared.lock().store.resource_version();
    settled
}

/// Drains the events queued in `changes`; true if one is news to passes settled at `settled_rv`
/// (a relevant write after it).
fn news_since(
    changes: &mut Option<tokio::sync::broadcast::Receiver<Arc<crate::store::Event>>>,
    settled_rv: u64,
) -> bool {
    let mut news = false;
    if let Some(rx) = changes.as_mut() {
        while let Ok(ev) = rx.try_recv() {
            news |= ev.rv > settled_rv && relevant(&ev.key);
        }
    }
    news
}

/// The next store event, or never without a subscription.
async fn next_change(
    changes: &mut Option<tokio::sync::broadcast::Receiver<Arc<crate::store::Event>>>,
) -> Result<Arc<crate::store::Event>, tokio::sync::broadcast::error::RecvError> {
    match changes {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Runs the simulation (when `simulate`) and node heartbeats until the server shuts down.
pub fn spawn(shared: Arc<Shared>, sim: Simulation, simulate: bool) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let nodes = sim.nodes.clone();
        let containers_changed = sim.kubelet.changed.clone();
        let mut heartbeat = tokio::time::interval(sim.options.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Only a simulation needs to hear of changes: without one, every write would wake this
        // task for nothing (a cross-thread wake-up per request).
        let mut changes = simulate.then(|| shared.lock().store.subscribe().0);
        loop {
            let Settled {
                rv: settled_rv,
                wake_at,
            } = if simulate {
                run_passes(&shared, &sim).await
            } else {
                Settled::default()
            };
            // Drop the events the passes already saw; a later relevant one means another pass.
            if news_since(&mut changes, settled_rv) {
                continue;
            }
            // A schedule's time is a reason for a pass too (a little after it, so it is due).
            let cron_due = wake_at.map(|at: jiff::Timestamp| {
                let wait = at.duration_since(jiff::Timestamp::now()).as_millis().max(0) as u64 + 50;
                tokio::time::Instant::now() + Duration::from_millis(wait)
            });
            loop {
                tokio::select! {
                    _ = shared.shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(cron_due.unwrap_or_else(tokio::time::Instant::now)), if cron_due.is_some() => break,
                    _ = containers_changed.notified(), if simulate => break,
                    _ = heartbeat.tick() => {
                        nodes.heartbeat(&mut shared.lock());
                        break;
                    }
                    ev = next_change(&mut changes) => match ev {
                        Ok(ev) if ev.rv > settled_rv && relevant(&ev.key) => break,
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
mod tests;
