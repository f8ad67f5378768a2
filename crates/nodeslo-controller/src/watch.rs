//! The watches that keep the NodeSLO controller's projections current: Nodes and NodeSLOs
//! become small facts (only what the decision reads), the ConfigMap becomes the merged config.
//! Each change queues the node names it affects.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, RwLock};

use capstan_apis::slo::NodeSlo;
use capstan_runtime::controller::watch_events;
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::sync::{read, write};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use nodeslo_core::{MergedConfig, NodeFacts, SloFacts};

use crate::controller::NodeSloController;
use crate::projection::Projection;

impl NodeSloController {
    /// The watcher config of a ring object's watch: sharded, only this shard's objects.
    fn shard_config(&self, sharded_kind: bool) -> watcher::Config {
        match &self.sharded {
            Some(sharded) if sharded_kind => sharded.member.watcher_config(),
            _ => watcher::Config::default(),
        }
    }

    /// The drain label's key in sharded mode.
    pub(crate) fn drain_label(&self) -> Option<String> {
        self.sharded.as_ref().map(|s| s.member.ring().drain_label())
    }

    pub(crate) async fn watch_nodes(self: Arc<Self>) {
        let api: Api<Node> = Api::all(self.client.clone());
        let labelled = self.sharded.as_ref().is_some_and(|s| s.node_labels);
        let events = watch_events(api, self.shard_config(labelled));
        self.consume(
            events,
            &self.nodes,
            |node| (node.name_any(), node_facts(&node)),
            NodeFacts::eq,
        )
        .await;
    }

    pub(crate) async fn watch_nodeslos(self: Arc<Self>) {
        let api: Api<NodeSlo> = Api::all(self.client.clone());
        let events = watch_events(api, self.shard_config(true));
        let drain_label = self.drain_label();
        self.consume(
            events,
            &self.slos,
            |slo| project_slo(slo, drain_label.as_deref()),
            SloEntry::same_for_reconcile,
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
                    let changed = write(projection).apply(project_event(event, &project), same);
                    self.metrics
                        .set_cached(read(&self.nodes).len(), read(&self.slos).len());
                    self.enqueue(changed);
                    self.update_synced();
                }
                // watch_events backs off and retries; the error is worth a log line, not a crash.
                Err(error) => tracing::warn!(%error, "watch error, retrying"),
            }
        }
    }

    /// Follows the SLO ConfigMap. Every replica applies it (sharded: to its own share; a
    /// standby: to its warm state); only the one holding the leader Lease publishes its problems
    /// as Events and stores the last good texts, once more when it starts leading.
    pub(crate) async fn watch_config(self: Arc<Self>, leader: LeaderHandle) {
        let api: Api<ConfigMap> =
            Api::namespaced(self.client.clone(), &self.settings.config_namespace);
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.settings.config_name));
        let mut events = std::pin::pin!(watch_events(api, config));
        // The last good values of the previous run are what a bad key keeps.
        let stored = self.last_good.load().await;
        write(&self.config).current = Arc::new(nodeslo_core::last_good::restore(&stored));
        // During a re-list the ConfigMap is only known to be absent once the list is complete.
        let mut listed: Option<ConfigMap> = None;
        // The ConfigMap last applied (`Some(None)`: known absent), applied again on gaining the
        // lead so that the new leader publishes what its predecessor may not have.
        let mut applied: Option<Option<ConfigMap>> = None;
        let mut gained = std::pin::pin!(leader.acquired());
        let mut awaiting_lead = !leader.is_leader();
        loop {
            let cm = tokio::select! {
                event = events.next() => match event {
                    None => break,
                    Some(Ok(watcher::Event::Init)) => {
                        listed = None;
                        continue;
                    }
                    Some(Ok(watcher::Event::InitApply(cm))) => {
                        listed = Some(cm);
                        continue;
                    }
                    Some(Ok(watcher::Event::InitDone)) => listed.take(),
                    Some(Ok(watcher::Event::Apply(cm))) => Some(cm),
                    Some(Ok(watcher::Event::Delete(_))) => None,
                    Some(Err(error)) => {
                        tracing::warn!(%error, "ConfigMap watch error, retrying");
                        continue;
                    }
                },
                acquired = &mut gained, if awaiting_lead => {
                    awaiting_lead = false;
                    match (acquired, &applied) {
                        (true, Some(cm)) => cm.clone(),
                        _ => continue,
                    }
                }
            };
            let cm = applied.insert(cm);
            self.apply_config(cm.as_ref(), leader.is_leader()).await;
        }
    }

    /// Recomputes the merged config from the ConfigMap (absent: defaults). Problems are logged
    /// once per ConfigMap version, and while `leading` published once per version and the texts
    /// in force stored; a changed merged config reconciles every node.
    async fn apply_config(&self, cm: Option<&ConfigMap>, leading: bool) {
        let version = cm
            .map(|c| c.resource_version().unwrap_or_default())
            .unwrap_or_default();
        let (outcome, log, publish) = {
            let state = read(&self.config);
            let outcome =
                MergedConfig::from_config_map(cm.and_then(|c| c.data.as_ref()), &state.current);
            (
                outcome,
                state.reported_version.as_deref() != Some(version.as_str()),
                leading && state.published_version.as_deref() != Some(version.as_str()),
            )
        };
        if log {
            self.log_config_problems(cm, &outcome.problems);
        }
        if publish {
            self.publish_config_problems(cm, &outcome.problems).await;
        }
        if leading {
            self.last_good
                .save(cm.and_then(|c| c.data.as_ref()), &outcome.problems)
                .await;
        }
        let changed = {
            let mut state = write(&self.config);
            if leading {
                state.published_version = Some(version.clone());
            }
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
}

/// What a reconcile reads of a NodeSLO: the facts the decision compares, and (sharded) whether
/// the sharder asked for it back.
#[derive(Clone, Debug, PartialEq)]
pub struct SloEntry {
    pub facts: SloFacts,
    pub draining: bool,
}

impl SloEntry {
    pub fn same_for_reconcile(&self, other: &Self) -> bool {
        self.draining == other.draining && self.facts.same_for_reconcile(&other.facts)
    }
}

/// A NodeSLO's entry; `drain_label` is the ring's drain label key when sharded.
pub(crate) fn project_slo(slo: NodeSlo, drain_label: Option<&str>) -> (String, SloEntry) {
    let facts = SloFacts::from_spec(
        &slo.spec,
        slo.metadata.generation,
        slo.metadata.resource_version.clone(),
    );
    let draining = drain_label.is_some_and(|key| slo.labels().contains_key(key));
    (slo.name_any(), SloEntry { facts, draining })
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

/// What the decision reads of a Node: labels, the bandwidth annotation and a digest of
/// `allocatable` (heartbeats and conditions change constantly and decide nothing).
pub fn node_facts(node: &Node) -> NodeFacts {
    let mut hasher = DefaultHasher::new();
    if let Some(allocatable) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
        // BTreeMap: sorted, so the digest does not depend on the order the server wrote.
        for (resource, quantity) in allocatable {
            (resource, &quantity.0).hash(&mut hasher);
        }
    }
    NodeFacts {
        labels: node.metadata.labels.clone().unwrap_or_default().into(),
        bandwidth: node
            .annotations()
            .get(capstan_apis::slo::ANNOTATION_NETWORK_BANDWIDTH)
            .cloned(),
        allocatable_digest: hasher.finish(),
    }
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
}
