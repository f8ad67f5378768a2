//! The NodeSLO controller: three watches (Nodes, NodeSLOs, the one ConfigMap) feed small
//! projections and a work queue of node names; workers decide with `nodeslo-core` (pure) and make
//! at most one write per node here.
//!
//! Why not kube-runtime's `Controller`: it only reconciles objects present in its cache, and this
//! loop must act on a name whose Node is gone (delete its NodeSLO) or whose NodeSLO does not exist
//! yet (create it). The key is the node name; NodeSLO and Node share it.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use capstan_apis::slo::{NodeSlo, NodeSloSpec};
use capstan_runtime::ErrorLabel;
use capstan_runtime::admin::Readiness;
use capstan_runtime::backoff::PerObjectBackoff;
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::shutdown::Shutdown;
use capstan_runtime::workqueue::WorkQueue;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use nodeslo_core::{ConfigProblem, Decision, MergedConfig, NodeFacts, SloFacts, decide};
use tokio::sync::watch;

use crate::metrics::SloMetrics;
use crate::projection::Projection;

/// The object kind in the runtime's reconcile metrics.
const KIND: &str = "NodeSLO";

/// What the controller needs to know that is not in the cluster.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config_namespace: String,
    pub config_name: String,
    pub workers: usize,
    /// How soon to retry after a conflict (stale cache): the watch brings the news shortly.
    pub conflict_retry: Duration,
    /// Field manager and Event reporter name.
    pub manager: String,
}

/// Why one reconcile failed; the label feeds metrics and logs.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("creating NodeSLO: {0}")]
    Create(#[source] kube::Error),
    #[error("updating NodeSLO: {0}")]
    Update(#[source] kube::Error),
    #[error("deleting NodeSLO: {0}")]
    Delete(#[source] kube::Error),
    #[error(transparent)]
    Shape(#[from] nodeslo_core::decide::SpecShapeError),
}

impl ErrorLabel for ReconcileError {
    fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Create(_) => "createNodeSLO",
            ReconcileError::Update(_) => "updateNodeSLO",
            ReconcileError::Delete(_) => "deleteNodeSLO",
            ReconcileError::Shape(_) => "specShape",
        }
    }
}

/// The merged config in force and the ConfigMap version it was last computed from.
#[derive(Debug, Default)]
struct ConfigState {
    current: Arc<MergedConfig>,
    /// `resourceVersion` of the ConfigMap whose problems were last reported (`""`: absent).
    reported_version: Option<String>,
    synced: bool,
}

pub struct NodeSloController {
    client: Client,
    settings: Settings,
    nodes: RwLock<Projection<NodeFacts>>,
    slos: RwLock<Projection<SloFacts>>,
    config: RwLock<ConfigState>,
    queue: WorkQueue<String>,
    backoff: PerObjectBackoff<String>,
    metrics: SloMetrics,
    controller_metrics: ControllerMetrics,
    recorder: Recorder,
    /// Invalid bandwidth annotations already reported, so a value gets one Event, not one per reconcile.
    reported_bandwidth: Mutex<HashMap<String, String>>,
    synced: watch::Sender<bool>,
    /// The key texts in force, kept across restarts (issue 15).
    last_good: crate::last_good::LastGoodStore,
}

impl NodeSloController {
    pub fn new(
        client: Client,
        settings: Settings,
        metrics: SloMetrics,
        controller_metrics: ControllerMetrics,
        backoff: PerObjectBackoff<String>,
    ) -> Arc<Self> {
        let reporter = Reporter {
            controller: settings.manager.clone(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let last_good = crate::last_good::LastGoodStore::new(
            client.clone(),
            &settings.config_namespace,
            &settings.config_name,
            &settings.manager,
        );
        Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            nodes: RwLock::default(),
            slos: RwLock::default(),
            config: RwLock::default(),
            queue: WorkQueue::new(),
            backoff,
            metrics,
            controller_metrics,
            reported_bandwidth: Mutex::default(),
            synced: watch::Sender::new(false),
            last_good,
        })
    }

    /// Runs until `shutdown`: watches at once (a standby keeps warm caches), marks ready when all
    /// three caches are synced, reconciles only while `leader` holds the lease. Returns after the
    /// in-flight reconciles finish.
    pub async fn run(
        self: Arc<Self>,
        readiness: Readiness,
        leader: LeaderHandle,
        shutdown: Shutdown,
    ) {
        let watches = futures::future::join3(
            self.clone().watch_nodes(),
            self.clone().watch_nodeslos(),
            self.clone().watch_config(),
        );
        let work = async {
            let mut synced = self.synced.subscribe();
            tokio::select! {
                result = synced.wait_for(|s| *s) => if result.is_err() { return },
                // Asked to stop before the caches ever synced: nothing to drain.
                () = shutdown.cancelled() => return,
            }
            readiness.set_ready(true);
            tracing::info!(nodes = self.nodes_len(), "caches synced");
            if !leader.acquired().await {
                return;
            }
            tracing::info!("leading: reconciling");
            self.queue
                .run(self.settings.workers, |name| self.clone().reconcile(name))
                .await;
        };
        let mut work = std::pin::pin!(work);
        let work_done = tokio::select! {
            _ = watches => {
                tracing::error!("watches ended unexpectedly");
                false
            }
            () = shutdown.cancelled() => false,
            // Only when stopped before the caches synced or before leading: nothing to drain.
            () = &mut work => true,
        };
        // Drain: no new reconcile starts, the running ones finish.
        self.queue.shutdown();
        if !work_done {
            work.await;
        }
    }

    fn nodes_len(&self) -> usize {
        self.nodes.read().map(|n| n.len()).unwrap_or(0)
    }

    fn enqueue(&self, names: impl IntoIterator<Item = String>) {
        for name in names {
            self.queue.add(name);
        }
    }

    fn enqueue_all(&self) {
        let mut names: Vec<String> = read_lock(&self.nodes).names().cloned().collect();
        names.extend(read_lock(&self.slos).names().cloned());
        self.enqueue(names);
    }

    fn update_synced(&self) {
        let all = read_lock(&self.nodes).is_synced()
            && read_lock(&self.slos).is_synced()
            && read_lock(&self.config).synced;
        self.synced
            .send_if_modified(|s| std::mem::replace(s, all) != all);
    }

    async fn watch_nodes(self: Arc<Self>) {
        let api: Api<Node> = Api::all(self.client.clone());
        let events = watcher(api, watcher::Config::default()).default_backoff();
        self.consume(
            events,
            &self.nodes,
            |node| (node.name_any(), node_facts(&node)),
            NodeFacts::eq,
        )
        .await;
    }

    async fn watch_nodeslos(self: Arc<Self>) {
        let api: Api<NodeSlo> = Api::all(self.client.clone());
        let events = watcher(api, watcher::Config::default()).default_backoff();
        self.consume(
            events,
            &self.slos,
            project_slo,
            SloFacts::same_for_reconcile,
        )
        .await;
    }

    /// Feeds a watch into a projection and queues the names that changed.
    async fn consume<K, T>(
        &self,
        events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
        projection: &RwLock<Projection<T>>,
        project: impl Fn(K) -> (String, T),
        same: impl Fn(&T, &T) -> bool + Copy,
    ) {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => {
                    let changed =
                        write_lock(projection).apply(project_event(event, &project), same);
                    self.metrics
                        .set_cached_nodeslos(read_lock(&self.slos).len());
                    self.enqueue(changed);
                    self.update_synced();
                }
                // default_backoff() retries; the error is worth a log line, not a crash.
                Err(error) => tracing::warn!(%error, "watch error, retrying"),
            }
        }
    }

    async fn watch_config(self: Arc<Self>) {
        let api: Api<ConfigMap> =
            Api::namespaced(self.client.clone(), &self.settings.config_namespace);
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.settings.config_name));
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        // The last good values of the previous run are what a bad key keeps.
        let stored = self.last_good.load().await;
        write_lock(&self.config).current = Arc::new(nodeslo_core::last_good::restore(&stored));
        // During a re-list the ConfigMap is only known to be absent once the list is complete.
        let mut listed: Option<ConfigMap> = None;
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => listed = None,
                Ok(watcher::Event::InitApply(cm)) => listed = Some(cm),
                Ok(watcher::Event::InitDone) => self.apply_config(listed.take()).await,
                Ok(watcher::Event::Apply(cm)) => self.apply_config(Some(cm)).await,
                Ok(watcher::Event::Delete(_)) => self.apply_config(None).await,
                Err(error) => tracing::warn!(%error, "ConfigMap watch error, retrying"),
            }
        }
    }

    /// Recomputes the merged config from the ConfigMap (absent: defaults). Problems are reported
    /// once per ConfigMap version; a changed merged config reconciles every node.
    async fn apply_config(&self, cm: Option<ConfigMap>) {
        let version = cm
            .as_ref()
            .map(|c| c.resource_version().unwrap_or_default())
            .unwrap_or_default();
        let (outcome, report) = {
            let state = read_lock(&self.config);
            let outcome = MergedConfig::from_config_map(
                cm.as_ref().and_then(|c| c.data.as_ref()),
                &state.current,
            );
            (
                outcome,
                state.reported_version.as_deref() != Some(version.as_str()),
            )
        };
        if report {
            self.report_config_problems(cm.as_ref(), &outcome.problems)
                .await;
        }
        self.last_good
            .save(cm.as_ref().and_then(|c| c.data.as_ref()), &outcome.problems)
            .await;
        let changed = {
            let mut state = write_lock(&self.config);
            state.reported_version = Some(version);
            state.synced = true;
            let changed = *state.current != outcome.config;
            if changed {
                state.current = Arc::new(outcome.config);
            }
            changed
        };
        if changed {
            tracing::info!("merged SLO config changed: reconciling every node");
            self.enqueue_all();
        }
        self.update_synced();
    }

    async fn report_config_problems(&self, cm: Option<&ConfigMap>, problems: &[ConfigProblem]) {
        let Some(cm) = cm else { return };
        for key in nodeslo_core::ConfigKey::ALL {
            if cm
                .data
                .as_ref()
                .is_some_and(|d| d.contains_key(key.data_key()))
            {
                let failed = problems
                    .iter()
                    .any(|p| matches!(p, ConfigProblem::Unmarshal { key: k, .. } if *k == key));
                self.metrics.parse(!failed, key.data_key());
            }
        }
        for problem in problems {
            tracing::warn!(configmap = %cm.name_any(), %problem, "invalid SLO config");
            if let ConfigProblem::InvalidSelector { .. } = problem {
                self.metrics.parse(false, problem.metric_reason());
            }
            let event = Event {
                type_: EventType::Warning,
                reason: problem.metric_reason().to_string(),
                note: Some(truncate(problem.to_string(), 1000)),
                action: "ParseSLOConfig".into(),
                secondary: None,
            };
            self.publish(&event, &cm.object_ref(&())).await;
        }
    }

    async fn publish(&self, event: &Event, reference: &ObjectReference) {
        if let Err(error) = self.recorder.publish(event, reference).await {
            tracing::warn!(%error, reason = %event.reason, "could not publish Event");
        }
    }

    /// One level-triggered pass for `name`; returns when to look again (`None`: on the next change).
    async fn reconcile(self: Arc<Self>, name: String) -> Option<Duration> {
        let mut measurer = self.controller_metrics.measure(KIND);
        let node = read_lock(&self.nodes).get(&name).cloned();
        let slo = read_lock(&self.slos).get(&name).cloned();
        let config = read_lock(&self.config).current.clone();
        let result = match decide(node.as_ref(), slo.as_ref(), &config) {
            Ok(outcome) => {
                if let Some(value) = &outcome.invalid_bandwidth {
                    self.report_invalid_bandwidth(&name, value).await;
                }
                self.write(&name, outcome.decision).await
            }
            Err(error) => Err(ReconcileError::from(error)),
        };
        match result {
            Ok(()) => {
                self.backoff.reset(&name);
                None
            }
            Err(error) if is_conflict(&error) => {
                tracing::debug!(node = %name, %error, "stale cache, retrying soon");
                Some(self.settings.conflict_retry)
            }
            Err(error) => {
                measurer.set_failure(&error);
                let delay = self.backoff.next_delay(&name);
                tracing::warn!(node = %name, %error, retry_in = ?delay, "reconcile failed");
                Some(delay)
            }
        }
    }

    async fn write(&self, name: &str, decision: Decision) -> Result<(), ReconcileError> {
        let api: Api<NodeSlo> = Api::all(self.client.clone());
        let (reason, result) = match decision {
            Decision::Nothing => return Ok(()),
            Decision::Create(spec) => {
                let params = PostParams {
                    field_manager: Some(self.settings.manager.clone()),
                    ..PostParams::default()
                };
                let result = api.create(&params, &NodeSlo::new(name, spec)).await;
                if let Ok(created) = &result {
                    self.remember_written(name, None, created);
                }
                (
                    "createNodeSLO",
                    result.map(drop).map_err(ReconcileError::Create),
                )
            }
            Decision::Update {
                spec,
                resource_version,
            } => {
                let patch = replace_spec_patch(&spec, resource_version.as_deref())?;
                let params = PatchParams {
                    field_manager: Some(self.settings.manager.clone()),
                    ..PatchParams::default()
                };
                let result = api.patch(name, &params, &Patch::Json::<()>(patch)).await;
                if let Ok(updated) = &result {
                    self.remember_written(name, resource_version.as_deref(), updated);
                }
                (
                    "updateNodeSLO",
                    result.map(drop).map_err(ReconcileError::Update),
                )
            }
            Decision::Delete => {
                let result = match api.delete(name, &DeleteParams::default()).await {
                    Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                    other => other.map(drop),
                };
                ("deleteNodeSLO", result.map_err(ReconcileError::Delete))
            }
        };
        self.metrics.write(result.is_ok(), reason);
        if result.is_ok() {
            tracing::debug!(node = %name, action = reason, "NodeSLO written");
        }
        result
    }

    /// Records what our own successful write left on the server, so that the watch event echoing
    /// it finds nothing new and costs no second reconcile. Only when the projection still holds
    /// the version the write was based on (`None`: no NodeSLO): if the watch has already moved
    /// past it, the projection is newer than our write and stays as it is.
    fn remember_written(&self, name: &str, based_on: Option<&str>, written: &NodeSlo) {
        let mut slos = write_lock(&self.slos);
        let unchanged_since_decision = match (based_on, slos.get(name)) {
            (None, None) => true,
            (Some(rv), Some(facts)) => facts.resource_version.as_deref() == Some(rv),
            _ => false,
        };
        if unchanged_since_decision {
            slos.apply(
                watcher::Event::Apply(project_slo(written.clone())),
                SloFacts::same_for_reconcile,
            );
        }
    }

    async fn report_invalid_bandwidth(&self, node: &str, value: &str) {
        {
            let mut reported = self
                .reported_bandwidth
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if reported.get(node).is_some_and(|v| v == value) {
                return;
            }
            reported.insert(node.to_string(), value.to_string());
        }
        let event = Event {
            type_: EventType::Warning,
            reason: "InvalidNetworkBandwidth".into(),
            note: Some(format!(
                "annotation {}={value:?} is not a valid quantity; the SLO strategy's totalNetworkBandwidth is used",
                capstan_apis::slo::ANNOTATION_NETWORK_BANDWIDTH
            )),
            action: "ComputeNodeSLO".into(),
            secondary: None,
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..ObjectReference::default()
        };
        self.publish(&event, &reference).await;
    }
}

fn project_slo(slo: NodeSlo) -> (String, SloFacts) {
    let facts = SloFacts::from_spec(
        &slo.spec,
        slo.metadata.generation,
        slo.metadata.resource_version.clone(),
    );
    (slo.name_any(), facts)
}

fn project_event<K, T>(event: watcher::Event<K>, project: impl Fn(K) -> T) -> watcher::Event<T> {
    match event {
        watcher::Event::Apply(obj) => watcher::Event::Apply(project(obj)),
        watcher::Event::Delete(obj) => watcher::Event::Delete(project(obj)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(obj) => watcher::Event::InitApply(project(obj)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// A JSON patch that replaces the whole spec (so removed fields go too) only if the NodeSLO is
/// still at the version the decision was made from.
fn replace_spec_patch(
    spec: &NodeSloSpec,
    resource_version: Option<&str>,
) -> Result<json_patch::Patch, ReconcileError> {
    let mut ops = Vec::new();
    if let Some(rv) = resource_version {
        ops.push(
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}),
        );
    }
    let spec = serde_json::to_value(spec).map_err(nodeslo_core::decide::SpecShapeError::from)?;
    ops.push(serde_json::json!({"op": "add", "path": "/spec", "value": spec}));
    serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|e| ReconcileError::Shape(nodeslo_core::decide::SpecShapeError::from(e)))
}

/// Stale cache: a create of an existing name (409) or a failed resourceVersion test (409/422).
fn is_conflict(error: &ReconcileError) -> bool {
    let status = match error {
        ReconcileError::Create(kube::Error::Api(s))
        | ReconcileError::Update(kube::Error::Api(s)) => s,
        _ => return false,
    };
    status.code == 409 || (matches!(error, ReconcileError::Update(_)) && status.code == 422)
}

pub fn node_facts(node: &Node) -> NodeFacts {
    let mut hasher = DefaultHasher::new();
    if let Some(allocatable) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
        // BTreeMap: sorted, so the digest does not depend on the order the server wrote.
        for (resource, quantity) in allocatable {
            (resource, &quantity.0).hash(&mut hasher);
        }
    }
    NodeFacts {
        labels: node.metadata.labels.clone().unwrap_or_default(),
        bandwidth: node
            .annotations()
            .get(capstan_apis::slo::ANNOTATION_NETWORK_BANDWIDTH)
            .cloned(),
        allocatable_digest: hasher.finish(),
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

// Lock helpers: a poisoned lock only means a panic elsewhere mid-update of plain data, which
// every writer here finishes before it could panic, so the data is still consistent.
fn read_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn node_with(labels: &[(&str, &str)], cpu: &str, heartbeat: bool) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        node.status = Some(NodeStatus {
            allocatable: Some([("cpu".to_string(), Quantity(cpu.into()))].into()),
            conditions: heartbeat.then(Vec::new),
            ..NodeStatus::default()
        });
        node
    }

    #[test]
    fn node_facts_ignore_heartbeats_but_see_labels_and_allocatable() {
        let base = node_facts(&node_with(&[("a", "b")], "4", false));
        assert_eq!(base, node_facts(&node_with(&[("a", "b")], "4", true)));
        assert_ne!(base, node_facts(&node_with(&[("a", "c")], "4", false)));
        assert_ne!(base, node_facts(&node_with(&[("a", "b")], "8", false)));
    }

    #[test]
    fn update_patch_tests_the_version_then_replaces_the_spec() {
        let patch = replace_spec_patch(&NodeSloSpec::default(), Some("7")).expect("patch");
        assert_eq!(
            serde_json::to_value(&patch).expect("json"),
            serde_json::json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/spec", "value": {}}
            ])
        );
    }
}
