//! The overshooting freeze of MCM's safety controller: every
//! `--machine-safety-overshooting-period` the leader counts the Machines backing each set and
//! freezes (or thaws) the first set that needs it, with its deployment
//! (`machineset_core::safety`). A frozen set creates no Machines (`machineset_core::set`).

use std::sync::Arc;
use std::time::Duration;

use capstan_apis::machine::{
    ConditionStatus, Machine, MachineDeployment, MachineDeploymentCondition,
    MachineDeploymentConditionType, MachineSet, MachineSetCondition, MachineSetConditionType,
};
use capstan_runtime::events::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use machineset_core::Timestamp;
use machineset_core::bounds;
use machineset_core::ownership::controller_of;
use machineset_core::safety::{
    ANNOTATION_UNFREEZE, DeploymentFreeze, FreezeAction, FreezeState, MESSAGE_STATE_SYNC,
    REASON_OVERSHOOTING, REASON_STATE_SYNC, decide, decide_deployment, limits,
};
use machineset_core::set::{LABEL_FREEZE, has_freeze_label, is_frozen};
use serde_json::{Value, json};

use crate::context::Context;
use crate::error::Error;

/// The freeze thresholds' settings (MCM's flags).
#[derive(Debug, Clone, Copy)]
pub struct SafetyConfig {
    pub period: Duration,
    pub up: i32,
    pub down: i32,
}

/// Runs a pass every `period` while this replica leads and its caches are synced.
pub async fn run_passes(ctx: Arc<Context>, config: SafetyConfig) {
    loop {
        tokio::time::sleep(config.period).await;
        if ctx.hold_writes().is_some() {
            continue;
        }
        if let Err(err) = pass(&ctx, config).await {
            tracing::warn!(%err, "safety pass failed; the next one retries");
        }
    }
}

/// Machines backing `set`: an owner reference naming it (any kind, as MCM) and every template
/// label; Terminating ones count, their VMs still run.
fn backing(set: &MachineSet, machines: &[Arc<Machine>]) -> i32 {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    let template = set
        .spec
        .template
        .as_ref()
        .map(|t| t.labels())
        .unwrap_or_default();
    let n = machines
        .iter()
        .filter(|m| {
            m.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.name == name)
        })
        .filter(|m| {
            let labels = m.metadata.labels.clone().unwrap_or_default();
            template.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
        .count();
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// One pass: the first set (by name) that needs a freeze or a thaw gets it, as MCM stops after
/// one change per pass. Returns whether something changed.
pub async fn pass(ctx: &Context, config: SafetyConfig) -> Result<bool, Error> {
    let machines = ctx.machines.store().state();
    let mut sets = ctx.sets.state();
    sets.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for set in sets {
        let name = set.metadata.name.clone().unwrap_or_default();
        let deployment = controller_of(&set.metadata)
            .filter(|r| r.kind == "MachineDeployment")
            .and_then(|r| {
                ctx.deployments
                    .get(&ObjectRef::new(&r.name).within(&ctx.namespace))
            });
        let bounds = deployment.as_ref().map(|d| {
            let surge = bounds::of(d).map(|b| b.max_surge).unwrap_or(0);
            (d.spec.replicas, surge)
        });
        let limits = limits(set.spec.replicas, bounds, config.up, config.down);
        let state = FreezeState {
            machines: backing(&set, &machines),
            labelled: is_frozen(&set),
            conditioned: set_conditioned(&set),
            unfreeze_requested: unfreeze_requested(&set.metadata),
        };
        match decide(&name, state, limits) {
            FreezeAction::Nothing => continue,
            FreezeAction::Freeze(message) => {
                tracing::warn!(set = %name, machines = state.machines, limit = limits.higher, "freezing machine set");
                freeze_set(ctx, &set, Some(&message)).await?;
                if let Some(d) = &deployment {
                    freeze_deployment(ctx, d, Some((REASON_OVERSHOOTING, &message))).await?;
                }
                ctx.event(
                    &*set,
                    Event::warning(REASON_OVERSHOOTING, "Freeze", message),
                )
                .await;
            }
            FreezeAction::Unfreeze => {
                tracing::info!(set = %name, machines = state.machines, "unfreezing machine set");
                freeze_set(ctx, &set, None).await?;
                if let Some(d) = &deployment {
                    freeze_deployment(ctx, d, None).await?;
                }
                let message = format!(
                    "MachineSet {name} is backed by {} machines again",
                    state.machines
                );
                ctx.event(
                    &*set,
                    Event::normal("UnderShootingReplicaCount", "Unfreeze", message),
                )
                .await;
            }
        }
        return Ok(true);
    }
    sync_deployments(ctx).await
}

/// The set carries a `Frozen` condition.
fn set_conditioned(set: &MachineSet) -> bool {
    set.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == MachineSetConditionType::Frozen)
}

/// The deployment carries a `Frozen` condition.
fn deployment_conditioned(d: &MachineDeployment) -> bool {
    d.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == MachineDeploymentConditionType::Frozen)
}

fn unfreeze_requested(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANNOTATION_UNFREEZE))
}

/// When no set changed: the first deployment whose freeze disagrees with its sets', or whose
/// operator asked to unfreeze it, is brought in line (MCM's state sync and manual unfreeze).
async fn sync_deployments(ctx: &Context) -> Result<bool, Error> {
    let sets = ctx.sets.state();
    let mut deployments = ctx.deployments.state();
    deployments.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for d in deployments {
        let uid = d.metadata.uid.clone().unwrap_or_default();
        let owned: Vec<&Arc<MachineSet>> = sets
            .iter()
            .filter(|s| controller_of(&s.metadata).is_some_and(|r| r.uid == uid))
            .collect();
        let set_frozen = owned.iter().any(|s| is_frozen(s) || set_conditioned(s));
        let labelled = has_freeze_label(&d.metadata);
        let conditioned = deployment_conditioned(&d);
        let requested = unfreeze_requested(&d.metadata);
        let name = d.metadata.name.clone().unwrap_or_default();
        match decide_deployment(labelled, conditioned, set_frozen, requested) {
            DeploymentFreeze::Nothing => continue,
            DeploymentFreeze::Freeze => {
                tracing::warn!(deployment = %name, "a machine set of it is frozen: freezing the deployment");
                freeze_deployment(ctx, &d, Some((REASON_STATE_SYNC, MESSAGE_STATE_SYNC))).await?;
            }
            DeploymentFreeze::Unfreeze => {
                tracing::info!(deployment = %name, "no machine set of it is frozen: unfreezing the deployment");
                freeze_deployment(ctx, &d, None).await?;
            }
            DeploymentFreeze::UnfreezeWithSets => {
                tracing::info!(deployment = %name, "unfreeze requested: unfreezing the deployment and asking its machine sets to");
                freeze_deployment(ctx, &d, None).await?;
                let api = ctx.sets_api();
                for set in owned {
                    let set_name = set.metadata.name.clone().unwrap_or_default();
                    let patch = json!({"metadata": {"annotations": {ANNOTATION_UNFREEZE: "True"}}});
                    ctx.sets
                        .write(
                            set,
                            api.patch(&set_name, &PatchParams::default(), &Patch::Merge(&patch)),
                        )
                        .await
                        .map_err(|source| Error::Freeze {
                            action: "asking to unfreeze",
                            kind: "MachineSet",
                            name: set_name,
                            source,
                        })?;
                }
            }
        }
        return Ok(true);
    }
    Ok(false)
}

/// Label, annotation and metadata patch of a freeze (`Some`) or thaw (`None`).
fn label_patch(freeze: bool) -> Value {
    if freeze {
        json!({"metadata": {"labels": {LABEL_FREEZE: "True"}}})
    } else {
        json!({"metadata": {"labels": {LABEL_FREEZE: null}, "annotations": {ANNOTATION_UNFREEZE: null}}})
    }
}

async fn freeze_set(ctx: &Context, set: &MachineSet, message: Option<&str>) -> Result<(), Error> {
    let name = set.metadata.name.clone().unwrap_or_default();
    let action = if message.is_some() {
        "freezing"
    } else {
        "unfreezing"
    };
    let err = |source| Error::Freeze {
        action,
        kind: "MachineSet",
        name: name.clone(),
        source,
    };
    let mut conditions: Vec<MachineSetCondition> = set
        .status
        .iter()
        .flat_map(|s| s.conditions.clone().unwrap_or_default())
        .filter(|c| c.type_ != MachineSetConditionType::Frozen)
        .collect();
    if let Some(message) = message {
        conditions.push(MachineSetCondition {
            type_: MachineSetConditionType::Frozen,
            status: ConditionStatus::True,
            last_transition_time: Some(Time(Timestamp::now())),
            reason: Some(REASON_OVERSHOOTING.into()),
            message: Some(message.into()),
        });
    }
    let api = ctx.sets_api();
    let status = json!({"status": {"machineSetCondition": if conditions.is_empty() { Value::Null } else { json!(conditions) }}});
    let written = ctx
        .sets
        .write(
            set,
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)),
        )
        .await
        .map_err(err)?;
    ctx.sets
        .write(
            &written,
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&label_patch(message.is_some())),
            ),
        )
        .await
        .map_err(err)?;
    Ok(())
}

async fn freeze_deployment(
    ctx: &Context,
    d: &MachineDeployment,
    frozen: Option<(&str, &str)>,
) -> Result<(), Error> {
    let name = d.metadata.name.clone().unwrap_or_default();
    let action = if frozen.is_some() {
        "freezing"
    } else {
        "unfreezing"
    };
    let err = |source| Error::Freeze {
        action,
        kind: "MachineDeployment",
        name: name.clone(),
        source,
    };
    let now = Time(Timestamp::now());
    let mut conditions: Vec<MachineDeploymentCondition> = d
        .status
        .iter()
        .flat_map(|s| s.conditions.clone().unwrap_or_default())
        .filter(|c| c.type_ != MachineDeploymentConditionType::Frozen)
        .collect();
    if let Some((reason, message)) = frozen {
        conditions.push(MachineDeploymentCondition {
            type_: MachineDeploymentConditionType::Frozen,
            status: ConditionStatus::True,
            last_update_time: Some(now.clone()),
            last_transition_time: Some(now),
            reason: Some(reason.into()),
            message: Some(message.into()),
        });
    }
    let api = ctx.deployments_api();
    let status = json!({"status": {"conditions": if conditions.is_empty() { Value::Null } else { json!(conditions) }}});
    let written = ctx
        .deployments
        .write(
            d,
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)),
        )
        .await
        .map_err(err)?;
    ctx.deployments
        .write(
            &written,
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&label_patch(frozen.is_some())),
            ),
        )
        .await
        .map_err(err)?;
    Ok(())
}
