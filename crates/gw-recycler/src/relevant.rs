//! Which watch events of the worker's Pods and Deployments can change a decision. Every event
//! started a pass of the gateway reconciler and of each recycle naming the gateway, yet most say
//! nothing those passes read: a gateway Deployment's status counts (three or four events per
//! replacement), a pod's conditions, or a pod's progress while it is still Pending. An event goes
//! on only when the part of its object the decisions read (its [`View`]) changed, the object
//! entered or left that view, or it was deleted.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use futures::{Stream, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::world::{incarnation, is_running, pod_ip};

/// What the decisions read of one kind.
pub trait View {
    /// A digest of what the decisions read of the object; `None` when they do not see it at all.
    fn view(&self) -> Option<u64>;
}

/// The decisions see only Running, not deleting pods with an IP (`World::running_pods`), and of
/// those their identity (uid and restarts), labels, IP and node.
impl View for Pod {
    fn view(&self) -> Option<u64> {
        let node = self.spec.as_ref().and_then(|s| s.node_name.as_deref());
        is_running(self)
            .then(|| digest((incarnation(self), &self.metadata.labels, pod_ip(self), node)))
    }
}

/// The decisions read a gateway Deployment's existence, labels and deletion, never its spec or
/// status.
impl View for Deployment {
    fn view(&self) -> Option<u64> {
        let meta = &self.metadata;
        Some(digest((
            &meta.uid,
            &meta.labels,
            meta.deletion_timestamp.is_some(),
        )))
    }
}

fn digest(view: impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    view.hash(&mut hasher);
    hasher.finish()
}

/// The last view of each object the watch delivered (by `namespace/name`), as a digest.
#[derive(Default)]
struct Seen {
    views: HashMap<String, u64>,
    /// How many views may be held before the next sweep.
    sweep_at: usize,
}

/// The first sweep comes at this many objects; each then at twice what it left.
const FIRST_SWEEP: usize = 64;

impl Seen {
    /// Whether this watch event of `obj` changes what the decisions see; `cached` says whether
    /// the cache holds the object after the event (`false`: it was deleted).
    fn changed<K: View + Resource>(&mut self, obj: &K, cached: bool) -> bool {
        let meta = obj.meta();
        let key = format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        );
        let view = if cached { obj.view() } else { None };
        let before = match view {
            Some(v) => self.views.insert(key, v),
            None => self.views.remove(&key),
        };
        before != view
    }

    /// Forgets the objects (by `namespace/name`) `cached` says are gone, once there are many: a
    /// relist drops objects deleted meanwhile without a Delete event.
    fn sweep(&mut self, cached: impl Fn(&str) -> bool) {
        if self.views.len() < self.sweep_at.max(FIRST_SWEEP) {
            return;
        }
        self.views.retain(|key, _| cached(key));
        self.sweep_at = 2 * self.views.len();
    }
}

/// The objects of `touched` (a reflector's applied or deleted objects, `store` holding each as it
/// is after its event) whose event changed what the decisions see.
pub fn relevant_only<K, E>(
    touched: impl Stream<Item = Result<K, E>>,
    store: Store<K>,
) -> impl Stream<Item = Result<K, E>>
where
    K: View + Resource<DynamicType = ()> + Clone,
{
    let mut seen = Seen::default();
    touched.try_filter(move |obj| {
        let cached = store.get(&ObjectRef::from_obj(obj)).is_some();
        let changed = seen.changed(obj, cached);
        seen.sweep(|key| {
            let (namespace, name) = key.split_once('/').unwrap_or_default();
            store.get(&ObjectRef::new(name).within(namespace)).is_some()
        });
        std::future::ready(changed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn pod(phase: &str, labels: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "gw-0", "namespace": "ns", "uid": "u1", "labels": labels},
            "status": {"phase": phase, "podIP": "10.0.0.7", "conditions": []}
        }))
        .expect("pod")
    }

    #[test]
    fn a_pod_matters_once_running_and_then_only_for_what_is_read() {
        let mut seen = Seen::default();
        let labels = json!({"kubeslice.io/slice-gw": "red-s"});
        assert!(!seen.changed(&pod("Pending", labels.clone()), true));
        assert!(seen.changed(&pod("Running", labels.clone()), true));
        // A condition or a resourceVersion changed: nothing a decision reads.
        let mut ready = pod("Running", labels.clone());
        ready.metadata.resource_version = Some("9".into());
        assert!(!seen.changed(&ready, true));
        // A container restarted in place: a new incarnation (next hops pushed again).
        let mut restarted = ready.clone();
        restarted.status.get_or_insert_default().container_statuses = Some(vec![
            serde_json::from_value(json!({
                "name": "gw", "image": "i", "imageID": "", "ready": true, "restartCount": 1
            }))
            .expect("container status"),
        ]);
        assert!(seen.changed(&restarted, true));
        let excluded =
            json!({"kubeslice.io/slice-gw": "red-s", "kubeslice.io/exclude-gw-route": "true"});
        assert!(seen.changed(&pod("Running", excluded.clone()), true));
        // Deleting: it leaves the view, once.
        let mut deleting = pod("Running", excluded.clone());
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(seen.changed(&deleting, true));
        assert!(!seen.changed(&deleting, true));
        assert!(!seen.changed(&deleting, false), "already out of view");
    }

    #[test]
    fn a_deployment_matters_for_its_labels_deletion_and_existence_not_its_status() {
        let mut seen = Seen::default();
        let mut deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "red-s-0-1", "namespace": "ns", "uid": "u1"}
        }))
        .expect("deployment");
        assert!(seen.changed(&deployment, true));
        deployment.status = Some(Default::default());
        assert!(!seen.changed(&deployment, true));
        deployment
            .metadata
            .labels
            .get_or_insert_default()
            .insert("kubeslice.io/marked-for-deletion".into(), "true".into());
        assert!(seen.changed(&deployment, true));
        assert!(seen.changed(&deployment, false), "deleted");
        assert!(seen.changed(&deployment, true), "created again");
    }

    #[test]
    fn objects_gone_without_a_delete_event_are_forgotten() {
        let mut seen = Seen::default();
        for i in 0..100 {
            let mut p = pod("Running", json!({}));
            p.metadata.name = Some(format!("gw-{i}"));
            seen.changed(&p, true);
        }
        seen.sweep(|key| key == "ns/gw-1");
        assert_eq!(seen.views.len(), 1);
        // The next sweep waits until the memory doubles again.
        for i in 0..100 {
            let mut p = pod("Running", json!({}));
            p.metadata.name = Some(format!("again-{i}"));
            seen.changed(&p, true);
        }
        seen.sweep(|_| false);
        assert!(seen.views.is_empty());
    }
}
