//! The Deployment controller: a ReplicaSet per pod template (named `<deployment>-<hash>`), the
//! current one scaled to `spec.replicas` and older ones to zero, and the Deployment's status
//! (replica counts, `Available` and `Progressing` conditions) summed over its ReplicaSets.

use super::replicaset::owned_pod_counts;
use super::write_status;
use super::{
    Infos, Owned, PassReport, WorkloadError, all, deleting, name, namespace, opts, owner_ref,
    replicas, strip_zeroes, uid, write_err,
};
use crate::cluster::{Cluster, Sub};
use crate::util;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

const MANAGER: &str = "kube-controller-manager";
/// The annotation numbering a Deployment's ReplicaSets in rollout order (`kubectl rollout
/// history` and `undo` read it); the Deployment carries its current one's.
const REVISION: &str = "deployment.kubernetes.io/revision";

fn revision(object: &Value) -> u64 {
    object["metadata"]["annotations"][REVISION]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// A stable hash of a pod template, spelled with kube's "safe" alphabet (no vowels). Null fields
/// count as absent, as in the typed template upstream hashes (`kubectl rollout undo` sends back
/// a template with `creationTimestamp: null`, which must find its old ReplicaSet).
pub fn pod_template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut fnv = Fnv1a(0xcbf2_9ce4_8422_2325);
    // The template's JSON, nulls left out, goes straight into the hash: no copy, no text.
    let _ = serde_json::to_writer(&mut fnv, &WithoutNulls(template));
    let mut h = fnv.0;
    (0..10)
        .map(|_| {
            let c = ALPHABET[(h % ALPHABET.len() as u64) as usize] as char;
            h /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// A JSON value serialized without its null object members, at any depth.
struct WithoutNulls<'a>(&'a Value);

impl serde::Serialize for WithoutNulls<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(m) => {
                let mut map = s.serialize_map(None)?;
                for (k, v) in m.iter().filter(|(_, v)| !v.is_null()) {
                    map.serialize_entry(k, &WithoutNulls(v))?;
                }
                map.end()
            }
            Value::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(&WithoutNulls(v))?;
                }
                seq.end()
            }
            other => other.serialize(s),
        }
    }
}

/// 64-bit FNV-1a over the bytes written to it.
struct Fnv1a(u64);

impl std::io::Write for Fnv1a {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Pod template hashes of Deployments by uid, each with the generation it was taken at. Every
/// pass needs each Deployment's hash twice, and serializing the template for it was the
/// simulation's largest cost per Deployment; a template changes only with a new generation.
#[derive(Debug, Default)]
pub struct TemplateHashes(Mutex<HashMap<String, (i64, String)>>);

impl TemplateHashes {
    /// The hash of `deploy`'s current template.
    fn of(&self, deploy: &Value) -> String {
        let Some(generation) = deploy["metadata"]["generation"].as_i64() else {
            return pod_template_hash(&deploy["spec"]["template"]);
        };
        let mut memo = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match memo.get(uid(deploy)) {
            Some((at, hash)) if *at == generation => hash.clone(),
            _ => {
                let hash = pod_template_hash(&deploy["spec"]["template"]);
                memo.insert(uid(deploy).to_string(), (generation, hash.clone()));
                hash
            }
        }
    }

    /// Forgets the Deployments not in `live` (every Deployment there is); a pass that finds
    /// no more remembered than live, as most do, builds no set.
    fn keep_only(&self, live: &[Arc<Value>]) {
        let mut memo = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if memo.len() > live.len() {
            let live: HashSet<&str> = live.iter().map(|d| uid(d)).collect();
            memo.retain(|uid, _| live.contains(uid.as_str()));
        }
    }
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

/// Deployments -> ReplicaSets: creates the current template's ReplicaSet and scales them all.
pub(super) fn sync_replicasets(
    cluster: &mut Cluster,
    i: &Infos,
    hashes: &TemplateHashes,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    let replicasets = all(cluster, &i.replicasets);
    let replicasets_of = Owned::index(&replicasets);
    let deployments = all(cluster, &i.deployments);
    hashes.keep_only(&deployments);
    for d in deployments {
        if deleting(&d) {
            continue;
        }
        let hash = hashes.of(&d);
        let want_name = format!("{}-{hash}", name(&d));
        let owned = replicasets_of.of(&d);
        // As the upstream controller numbers them: the current template's ReplicaSet is one past
        // every other (so a rollback renumbers the old one it returns to).
        let next = owned
            .iter()
            .filter(|rs| name(rs) != want_name)
            .map(|rs| revision(rs))
            .max()
            .unwrap_or(0)
            + 1;
        let existing = owned.iter().find(|rs| name(rs) == want_name);
        let current_revision = existing
            .map_or(next, |rs| revision(rs).max(next))
            .to_string();
        if existing.is_none() {
            let mut want = desired_replicaset(&d, &hash);
            want["metadata"]["annotations"][REVISION] = json!(current_revision);
            cluster
                .create(&i.replicasets, namespace(&d), want, &opts(MANAGER))
                .map_err(|e| write_err("a ReplicaSet", &e))?;
            report.writes += 1;
        }
        for rs in owned {
            let (want_replicas, want_revision) = if name(rs) == want_name {
                (replicas(&d), Some(&current_revision))
            } else {
                (0, None)
            };
            let revision_ok = want_revision
                .is_none_or(|r| rs["metadata"]["annotations"][REVISION].as_str() == Some(r));
            // Most passes change nothing here: compare before copying the ReplicaSet.
            if rs["spec"]["replicas"] == json!(want_replicas) && revision_ok {
                continue;
            }
            let mut updated = Value::clone(rs);
            updated["spec"]["replicas"] = json!(want_replicas);
            if let Some(revision) = want_revision {
                updated["metadata"]["annotations"][REVISION] = json!(revision);
            }
            if !deleting(rs) {
                cluster
                    .update(
                        &i.replicasets,
                        namespace(rs),
                        name(rs),
                        updated,
                        Sub::Main,
                        &opts(MANAGER),
                    )
                    .map_err(|e| write_err("a ReplicaSet", &e))?;
                report.writes += 1;
            }
        }
        if d["metadata"]["annotations"][REVISION] != json!(current_revision) {
            let mut updated = (*d).clone();
            updated["metadata"]["annotations"][REVISION] = json!(current_revision);
            cluster
                .update(
                    &i.deployments,
                    namespace(&d),
                    name(&d),
                    updated,
                    Sub::Main,
                    &opts(MANAGER),
                )
                .map_err(|e| write_err("a Deployment", &e))?;
            report.writes += 1;
        }
    }
    Ok(())
}

/// Deployment status, summed over its ReplicaSets' pods.
pub(super) fn sync_status(
    cluster: &mut Cluster,
    i: &Infos,
    hashes: &TemplateHashes,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    let pods = all(cluster, &i.pods);
    let pods_of = Owned::index(&pods);
    let replicasets = all(cluster, &i.replicasets);
    let replicasets_of = Owned::index(&replicasets);
    for d in all(cluster, &i.deployments) {
        if deleting(&d) {
            continue;
        }
        let current = format!("{}-{}", name(&d), hashes.of(&d));
        let (mut total, mut ready, mut updated_n) = (0, 0, 0);
        for rs in replicasets_of.of(&d) {
            let (t, r) = owned_pod_counts(pods_of.of(rs));
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
        write_status(cluster, &i.deployments, &d, status, MANAGER, report)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_hashes_are_stable_and_template_sensitive() {
        let t1 = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
        let t2 = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx:2"}]}});
        assert_eq!(pod_template_hash(&t1), pod_template_hash(&t1.clone()));
        assert_ne!(pod_template_hash(&t1), pod_template_hash(&t2));
        assert_eq!(pod_template_hash(&t1).len(), 10);
    }

    #[test]
    fn a_remembered_hash_follows_the_template_to_its_next_generation() {
        let hashes = TemplateHashes::default();
        let deployment = |generation: Option<i64>, image: &str| {
            let mut d = json!({"metadata": {"uid": "u1"},
                "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}});
            if let Some(g) = generation {
                d["metadata"]["generation"] = json!(g);
            }
            d
        };
        let v1 = deployment(Some(1), "nginx:1");
        let v2 = deployment(Some(2), "nginx:2");
        assert_eq!(hashes.of(&v1), pod_template_hash(&v1["spec"]["template"]));
        assert_eq!(hashes.of(&v2), pod_template_hash(&v2["spec"]["template"]));
        assert_ne!(hashes.of(&v1), hashes.of(&v2));
        // No generation to key on: hashed every time, never from memory.
        let bare = deployment(None, "nginx:3");
        assert_eq!(
            hashes.of(&bare),
            pod_template_hash(&bare["spec"]["template"])
        );
        hashes.keep_only(&[]);
        assert_eq!(hashes.0.lock().expect("memo").len(), 0);
    }

    /// The hash as first written (the template copied without nulls, serialized to text, hashed):
    /// names of ReplicaSets already stored depend on it, so it must never change.
    fn hash_as_first_written(template: &Value) -> String {
        fn without_nulls(v: &Value) -> Value {
            match v {
                Value::Object(m) => Value::Object(
                    m.iter()
                        .filter(|(_, v)| !v.is_null())
                        .map(|(k, v)| (k.clone(), without_nulls(v)))
                        .collect(),
                ),
                Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
                other => other.clone(),
            }
        }
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let text = serde_json::to_string(&without_nulls(template)).expect("json");
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

    #[test]
    fn template_hashes_are_those_of_stored_replicasets() {
        let templates = [
            json!({}),
            json!({"metadata": {"creationTimestamp": null, "labels": {"app": "web"}},
                   "spec": {"containers": [{"name": "c", "image": "nginx", "resources": {},
                                            "args": ["a", null, "b \"q\" \u{e9}\n"],
                                            "env": [{"name": "X", "value": null}]}],
                            "replicas": 3, "ratio": 0.5, "enabled": true, "nothing": null}}),
            json!({"spec": {"nested": [[{"a": null}], [], {"b": [1, -2, 3.25]}]}}),
        ];
        for t in &templates {
            assert_eq!(pod_template_hash(t), hash_as_first_written(t), "{t}");
        }
        assert_eq!(
            pod_template_hash(&templates[1]),
            pod_template_hash(&json!({"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx", "resources": {},
                                         "args": ["a", null, "b \"q\" \u{e9}\n"],
                                         "env": [{"name": "X"}]}],
                         "replicas": 3, "ratio": 0.5, "enabled": true}})),
            "null members count as absent"
        );
    }
}
