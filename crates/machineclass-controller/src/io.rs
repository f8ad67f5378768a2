//! Writes at the edge: guarded finalizer patches and minimal merge patches.

use std::fmt::Debug;

use capstan_apis::machine::{Machine, MachineStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::error::Error;

use capstan_runtime::patch::merge_patch_diff;

/// Replaces the finalizer list (see [`capstan_runtime::patch::finalizers`]).
pub async fn patch_finalizers<K>(
    api: &Api<K>,
    meta: &ObjectMeta,
    finalizers: Vec<String>,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    capstan_runtime::patch::finalizers(api, meta, finalizers)
        .await
        .map_err(|source| Error::PatchFinalizers {
            kind: K::kind(&()).into_owned(),
            name: meta.name.clone().unwrap_or_default(),
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
