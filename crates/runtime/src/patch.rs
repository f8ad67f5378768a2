//! Minimal writes: the merge patch that turns the object a controller read into the one it wants,
//! so a write carries only what changed (and nothing when nothing did).

use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// The JSON merge patch (RFC 7386) that turns `old` into `new`: changed members only, removed
/// members as `null`, arrays replaced whole.
pub fn merge_patch_diff(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = Map::new();
            for (key, old_value) in o {
                match n.get(key) {
                    None => {
                        patch.insert(key.clone(), Value::Null);
                    }
                    Some(new_value) if new_value != old_value => {
                        patch.insert(key.clone(), merge_patch_diff(old_value, new_value));
                    }
                    Some(_) => {}
                }
            }
            for (key, new_value) in n {
                if !o.contains_key(key) {
                    patch.insert(key.clone(), new_value.clone());
                }
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

/// Replaces the finalizer list, guarded by the object's resourceVersion (a stale cache gets a
/// 409, which the kit retries soon, after the watch brought the newer object).
pub async fn finalizers<K>(
    api: &Api<K>,
    meta: &ObjectMeta,
    finalizers: Vec<String>,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let name = meta.name.clone().unwrap_or_default();
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": meta.resource_version}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// The merge patch from status `old` to status `new` (both as JSON), or `None` when they are
/// equal: then there is nothing to write, and no request (nor stand-in) should be made.
pub fn status_diff(old: &Value, new: &Value) -> Option<Value> {
    let diff = merge_patch_diff(old, new);
    (!diff.as_object().is_some_and(Map::is_empty)).then_some(diff)
}

/// Writes a [`status_diff`] with a merge patch guarded by `meta`'s resourceVersion, since the
/// diff is only right against the status it came from.
pub async fn status<K>(api: &Api<K>, meta: &ObjectMeta, diff: &Value) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let name = meta.name.clone().unwrap_or_default();
    let patch = json!({"metadata": {"resourceVersion": meta.resource_version}, "status": diff});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn diff_sets_changes_adds_and_nulls_removed_members() {
        let old = json!({"a": 1, "b": {"x": 1, "y": 2}, "c": [1, 2], "gone": true});
        let new = json!({"a": 1, "b": {"x": 1, "y": 3, "z": 0}, "c": [1], "new": "n"});
        assert_eq!(
            merge_patch_diff(&old, &new),
            json!({"b": {"y": 3, "z": 0}, "c": [1], "gone": null, "new": "n"})
        );
        assert_eq!(merge_patch_diff(&new, &new), json!({}));
    }
}
