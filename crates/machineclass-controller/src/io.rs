//! Writes at the edge: guarded finalizer patches and minimal merge patches.

use std::fmt::Debug;

use capstan_apis::machine::{Machine, MachineStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::error::Error;

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

/// Replaces the finalizer list, guarded by the object's resourceVersion (a stale cache gets a 409,
/// which the kit retries soon, after the watch brought the newer object).
pub async fn patch_finalizers<K>(
    api: &Api<K>,
    meta: &ObjectMeta,
    finalizers: Vec<String>,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let name = meta.name.clone().unwrap_or_default();
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": meta.resource_version}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::PatchFinalizers {
            kind: K::kind(&()).into_owned(),
            name,
            source,
        })
}

/// Writes `new` as the Machine's status with a minimal merge patch against `machine`'s status,
/// guarded by `machine`'s resourceVersion: the diff is only right against the status it was
/// computed from.
pub async fn write_machine_status(
    api: &Api<Machine>,
    machine: &Machine,
    new: &MachineStatus,
) -> Result<Machine, Error> {
    let name = machine.metadata.name.clone().unwrap_or_default();
    let encode = |source| Error::EncodeStatus {
        machine: name.clone(),
        source,
    };
    let old = serde_json::to_value(machine.status.clone().unwrap_or_default()).map_err(encode)?;
    let diff = merge_patch_diff(&old, &serde_json::to_value(new).map_err(encode)?);
    let patch = json!({
        "metadata": {"resourceVersion": machine.metadata.resource_version},
        "status": diff,
    });
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::WriteStatus {
            machine: name.clone(),
            source,
        })
}

#[cfg(test)]
mod tests {
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
