//! MachineDeployment reconcile (MCM's `reconcileClusterMachineDeployment`): finalizer, claims,
//! the new set of the current template, one rollout step (RollingUpdate or Recreate), history,
//! status. The arithmetic is `machineset_core`'s; this module reads caches and writes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_apis::machine::{
    ANNOTATION_DESIRED_REPLICAS, ANNOTATION_MACHINE_PRIORITY, ANNOTATION_MAX_REPLICAS,
    ANNOTATION_REVISION, FINALIZER_MCM, Machine, MachineDeployment, MachineSet, MachineState,
    MachineSummary, StrategyType,
};
use capstan_apis::meta::{finalizers_with, finalizers_without};
use capstan_apis::selector::Selector;
use capstan_runtime::controller::Target;
use capstan_runtime::events::Event;
use capstan_runtime::runner::Next;
use capstan_runtime::status_batch::Batch;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use machineset_core::Timestamp;
use machineset_core::autoscaler::{self, Named};
use machineset_core::bounds::{self, Bounds};
use machineset_core::deployment::{
    MachineCounts, Observed, Rollback, created, find_new_set, history_to_delete, new_set,
    next_revision, revision, rollback, set_annotations, strategy, template_hash,
};
use machineset_core::machines::{is_available, is_failed, is_ready, is_terminating};
use machineset_core::ownership::{Claim, Owner, claim, controller_of, controller_ref};
use machineset_core::rolling::{
    ScaledSet, SetCounts, new_set_replicas, old_sets_scale_down, proportional,
};
use machineset_core::set::{
    ANNOTATION_MARKED_FOR_DELETION, ANNOTATION_SCALER_CHANGE, SetSelectorError, validated_selector,
};
use serde_json::json;

use crate::context::Context;
use crate::error::Error;

const KIND: &str = "MachineDeployment";

pub async fn reconcile(d: Arc<MachineDeployment>, ctx: Arc<Context>) -> Result<Next, Error> {
    let d = ctx.deployments.freshest(d);
    let target = Target::of(KIND, &*d);
    ctx.reconciler
        .reconcile(target, reconcile_inner(&d, &ctx))
        .await
}

fn name_of(d: &MachineDeployment) -> String {
    d.metadata.name.clone().unwrap_or_default()
}

/// Why a deployment is not rolled: the Event's reason and its message.
struct Refused(&'static str, String);

/// A deployment's selector, validated as a set's (`machineset_core::set::validated_selector`);
/// an empty one is MCM's `SelectingAll`.
fn selector_of(d: &MachineDeployment) -> Result<Selector, Refused> {
    validated_selector(d.spec.selector.as_ref(), &d.spec.template.labels()).map_err(|e| match e {
        SetSelectorError::Empty => Refused(
            "SelectingAll",
            "This deployment is selecting all machines. A non-empty selector is required.".into(),
        ),
        other => Refused("InvalidSpec", other.to_string()),
    })
}

/// A merge patch of the deployment itself (annotations, template, rollbackTo), through this
/// process's own writes; `what` names it in the error.
async fn patch_deployment(
    d: &MachineDeployment,
    patch: &serde_json::Value,
    what: &'static str,
    ctx: &Context,
) -> Result<(), Error> {
    let api = ctx.deployments_api();
    ctx.deployments
        .write(
            d,
            api.patch(&name_of(d), &PatchParams::default(), &Patch::Merge(patch)),
        )
        .await
        .map_err(|source| Error::PatchDeployment {
            deployment: name_of(d),
            what,
            source,
        })?;
    Ok(())
}

async fn reconcile_inner(d: &MachineDeployment, ctx: &Context) -> Result<Next, Error> {
    if let Some(hold) = ctx.hold_writes() {
        return Ok(hold);
    }
    let name = name_of(d);
    tracing::debug!(deployment = %name, generation = ?d.metadata.generation, "pass");
    if d.metadata.deletion_timestamp.is_some() {
        return finish_deletion(d, ctx).await;
    }
    let d = ensure_finalizer(d, ctx).await?;
    let checked = selector_of(&d).and_then(|selector| {
        let bounds = match strategy(&d) {
            StrategyType::RollingUpdate => {
                bounds::of(&d).map_err(|e| Refused("InvalidSpec", e.to_string()))?
            }
            _ => Bounds {
                max_surge: 0,
                max_unavailable: 0,
            },
        };
        Ok((selector, bounds))
    });
    let (selector, bounds) = match checked {
        Ok(ok) => ok,
        Err(Refused(reason, detail)) => {
            // Invalid input: the sets stay as they are until the deployment is fixed.
            let message = format!("machine deployment {name} is not rolled: {detail}");
            tracing::warn!(deployment = %name, "{message}");
            ctx.event(&d, Event::warning(reason, "Validate", message))
                .await;
            return Ok(Next::AwaitChange);
        }
    };
    // The cluster-autoscaler's named Machines are marked before any scaling; a first sight of its
    // annotation only stamps it, and our own write wakes the next pass.
    if stamp_or_mark_for_autoscaler(&d, ctx).await? {
        return Ok(Next::AwaitChange);
    }
    let sets = claim_sets(&d, &selector, ctx).await?;
    if d.spec.rollback_to.is_some() {
        let refs: Vec<&MachineSet> = sets.iter().map(|s| &**s).collect();
        roll_back(&d, &refs, ctx).await?;
        return Ok(Next::AwaitChange);
    }
    let machines = ctx.machines.state();
    let counts = count_machines(&d, &sets, &machines, &ctx.machines.store().state());
    let counts_of = |set: &MachineSet| {
        counts
            .get(set.metadata.uid.as_deref().unwrap_or_default())
            .copied()
            .unwrap_or_default()
    };

    let set_refs: Vec<&MachineSet> = sets.iter().map(|s| &**s).collect();
    let mut new = find_new_set(&d, &set_refs).cloned();
    let old: Vec<MachineSet> = sets
        .iter()
        .filter(|s| {
            new.as_ref()
                .is_none_or(|n| n.metadata.uid != s.metadata.uid)
        })
        .map(|s| (**s).clone())
        .collect();
    let old_refs: Vec<&MachineSet> = old.iter().collect();
    let mut created_new = false;

    if d.spec.paused {
        scale_only(&d, new.as_ref(), &old, bounds, ctx).await?;
    } else {
        let current = match new.take() {
            Some(existing) => sync_new_set(&d, existing, &old_refs, bounds, ctx).await?,
            None => {
                let initial = initial_replicas(&d, &old, bounds, &counts_of);
                let created = create_new_set(&d, &old_refs, initial, bounds, ctx).await?;
                created_new = created.is_some();
                match created {
                    Some(set) => set,
                    // A name collision: counted in the status, retried at once.
                    None => return Ok(Next::Requeue(Duration::ZERO)),
                }
            }
        };
        record_revision(&d, &current, ctx).await?;
        if created_new {
            // The Machines it causes are seen before the next step.
        } else if scaling_event(&d, &current, &old) {
            scale_proportionally(&d, &current, &old, bounds, ctx).await?;
        } else {
            step(&d, &current, &old, bounds, &counts_of, ctx).await?;
        }
        new = Some(current);
    }

    // Status over the sets as they are now.
    let new_name = new
        .as_ref()
        .and_then(|n| n.metadata.name.clone())
        .unwrap_or_default();
    let new_counts = new.as_ref().map(&counts_of);
    let all: Vec<MachineCounts> = sets.iter().map(|s| counts_of(s)).collect();
    let failed = failed_machines(&sets, &machines);
    let observed = Observed {
        new: new_counts.map(|c| (new_name.as_str(), c)),
        created_new,
        all: &all,
        failed,
        max_unavailable: bounds.max_unavailable,
        now: Timestamp::now(),
    };
    let status = machineset_core::deployment::status(&d, &observed);
    // Busy while any set's Machines are still changing (its spec as this pass left it).
    let busy = sets.iter().any(|s| {
        let fresh = ctx.sets.get(&ObjectRef::from_obj(&**s));
        let replicas = fresh.as_deref().unwrap_or(s).spec.replicas;
        !counts_of(s).settled(replicas)
    });
    let held = write_status(&d, &status, busy, ctx).await?;
    // A status held back is written when its batch is due.
    Ok(next_pass(&d, &status, ctx).sooner(held))
}

async fn ensure_finalizer(
    d: &MachineDeployment,
    ctx: &Context,
) -> Result<MachineDeployment, Error> {
    let Some(list) = finalizers_with(&d.metadata, FINALIZER_MCM) else {
        return Ok(d.clone());
    };
    let api = ctx.deployments_api();
    let written = ctx
        .deployments
        .write(
            d,
            capstan_runtime::patch::finalizers(&api, &d.metadata, list),
        )
        .await
        .map_err(|source| Error::PatchFinalizers {
            kind: KIND,
            name: name_of(d),
            source,
        })?;
    Ok((*written).clone())
}

/// A deleting deployment deletes its sets (each deletes its Machines), and lets go of its
/// finalizer once none is left.
async fn finish_deletion(d: &MachineDeployment, ctx: &Context) -> Result<Next, Error> {
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let owned: Vec<Arc<MachineSet>> = ctx
        .sets
        .state()
        .into_iter()
        .filter(|s| controller_of(&s.metadata).is_some_and(|r| r.uid == uid))
        .collect();
    if owned.is_empty() {
        // Going: no status is written again.
        ctx.status_batches.written(&uid);
        if let Some(list) = finalizers_without(&d.metadata, FINALIZER_MCM) {
            let api = ctx.deployments_api();
            capstan_runtime::patch::finalizers(&api, &d.metadata, list)
                .await
                .map_err(|source| Error::PatchFinalizers {
                    kind: KIND,
                    name: name_of(d),
                    source,
                })?;
        }
        return Ok(Next::AwaitChange);
    }
    for set in owned
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
    {
        delete_set(d, set, ctx).await?;
    }
    Ok(Next::Requeue(ctx.resync))
}

async fn claim_sets(
    d: &MachineDeployment,
    selector: &Selector,
    ctx: &Context,
) -> Result<Vec<Arc<MachineSet>>, Error> {
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let owner = Owner {
        uid: &uid,
        deleting: false,
        selector,
    };
    let mut owned = Vec::new();
    for set in ctx.sets.state() {
        let refs = match claim(owner, &set.metadata) {
            Claim::Owned => {
                owned.push(set);
                continue;
            }
            Claim::Ignore => continue,
            Claim::Adopt => {
                let mut refs = set.metadata.owner_references.clone().unwrap_or_default();
                refs.push(controller_ref(KIND, &name_of(d), &uid));
                refs
            }
            Claim::Release => set
                .metadata
                .owner_references
                .iter()
                .flatten()
                .filter(|r| r.uid != uid)
                .cloned()
                .collect(),
        };
        let set_name = set.metadata.name.clone().unwrap_or_default();
        let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": set.metadata.resource_version}});
        let api = ctx.sets_api();
        let written = ctx
            .sets
            .write(
                &set,
                api.patch(&set_name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await
            .map_err(|source| Error::Claim {
                kind: "MachineSet",
                name: set_name.clone(),
                source,
            })?;
        if controller_of(&written.metadata).is_some_and(|r| r.uid == uid) {
            tracing::info!(deployment = %name_of(d), set = %set_name, "adopted machine set");
            owned.push(written);
        } else {
            tracing::info!(deployment = %name_of(d), set = %set_name, "released machine set");
        }
    }
    Ok(owned)
}

/// Machine counts per set uid, from the Machines in the cache.
/// The deprecated `spec.rollbackTo`: the deployment takes the template of that revision, with MCM's
/// Events, and the field is cleared in the same write; the next pass rolls as for any change.
async fn roll_back(
    d: &MachineDeployment,
    sets: &[&MachineSet],
    ctx: &Context,
) -> Result<(), Error> {
    let name = name_of(d);
    let mut patch = json!({"spec": {"rollbackTo": null}});
    let event = match rollback(d, sets) {
        Some(Rollback::To { revision, template }) => {
            patch["spec"]["template"] =
                serde_json::to_value(&*template).map_err(|source| Error::Encode {
                    what: format!("the template of revision {revision}"),
                    source,
                })?;
            Event::normal(
                "DeploymentRollback",
                "Rollback",
                format!("Rolled back deployment \"{name}\" to revision {revision}"),
            )
        }
        Some(Rollback::Unchanged { revision }) => Event::warning(
            "DeploymentRollbackTemplateUnchanged",
            "Rollback",
            format!(
                "The rollback revision {revision} contains the same template as current deployment \"{name}\""
            ),
        ),
        Some(Rollback::NotFound { wanted }) => Event::warning(
            "DeploymentRollbackRevisionNotFound",
            "Rollback",
            if wanted == 0 {
                "Unable to find last revision.".to_owned()
            } else {
                "Unable to find the revision to rollback to.".to_owned()
            },
        ),
        None => return Ok(()),
    };
    patch_deployment(d, &patch, "the rollback", ctx).await?;
    ctx.event(d, event).await;
    Ok(())
}

/// MCM's trigger-deletion path (`machineset_core::autoscaler`): marks the Machines the autoscaler
/// named, and writes the deployment's annotations. True when the deployment was written (the pass
/// ends there).
async fn stamp_or_mark_for_autoscaler(d: &MachineDeployment, ctx: &Context) -> Result<bool, Error> {
    let annotation = |key: &str| {
        d.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let plan = autoscaler::plan(
        annotation(autoscaler::ANNOTATION_TRIGGER_DELETION),
        annotation(ANNOTATION_SCALER_CHANGE),
        Timestamp::now(),
        |name| match ctx
            .machines
            .get(&ObjectRef::new(name).within(&ctx.namespace))
        {
            None => Named::Missing,
            Some(m) if is_failed(&m) || is_terminating(&m) => Named::Going,
            Some(m) => Named::Live {
                marked: m
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(ANNOTATION_MARKED_FOR_DELETION)),
            },
        },
    );
    for (name, time) in &plan.marks {
        let Some(machine) = ctx
            .machines
            .get(&ObjectRef::new(name).within(&ctx.namespace))
        else {
            continue;
        };
        let prioritised = machine
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_MACHINE_PRIORITY))
            .is_some_and(|p| p == "1");
        if prioritised && time.is_none() {
            continue;
        }
        let mut annotations = serde_json::Map::new();
        annotations.insert(ANNOTATION_MACHINE_PRIORITY.into(), json!("1"));
        if let Some(time) = time {
            annotations.insert(ANNOTATION_MARKED_FOR_DELETION.into(), json!(time));
        }
        let patch = json!({"metadata": {"annotations": annotations}});
        let api = ctx.machines_api();
        ctx.machines
            .write(
                &machine,
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await
            .map_err(|source| Error::MarkMachine {
                machine: name.clone(),
                source,
            })?;
        tracing::info!(deployment = %name_of(d), machine = %name, "marked for deletion by the autoscaler");
    }
    if plan.deployment_annotations.is_empty() {
        return Ok(false);
    }
    let patch = json!({"metadata": {"annotations": plan.deployment_annotations}});
    patch_deployment(d, &patch, "the autoscaler's annotations", ctx).await?;
    Ok(true)
}

/// Machine counts per set uid. Live, ready and available come from this process's view (a
/// Machine it deleted is gone from it at once); `existing` from the watch's plain cache, where a
/// deleted Machine stays until its VM is gone and its Delete event arrives.
fn count_machines(
    d: &MachineDeployment,
    sets: &[Arc<MachineSet>],
    view: &[Arc<Machine>],
    cached: &[Arc<Machine>],
) -> HashMap<String, MachineCounts> {
    let min_ready = Duration::from_secs(u64::try_from(d.spec.min_ready_seconds).unwrap_or(0));
    let now = Timestamp::now();
    let mut counts: HashMap<String, MachineCounts> = sets
        .iter()
        .filter_map(|s| s.metadata.uid.clone())
        .map(|uid| (uid, MachineCounts::default()))
        .collect();
    let owner_of = |machine: &Machine| controller_of(&machine.metadata).map(|r| r.uid.clone());
    for machine in cached {
        if let Some(c) = owner_of(machine).and_then(|uid| counts.get_mut(&uid)) {
            c.existing += 1;
        }
    }
    for machine in view {
        let Some(c) = owner_of(machine).and_then(|uid| counts.get_mut(&uid)) else {
            continue;
        };
        if is_terminating(machine) {
            continue;
        }
        c.live += 1;
        c.ready += i32::from(is_ready(machine));
        c.available += i32::from(is_available(machine, min_ready, now));
    }
    counts
}

fn failed_machines(sets: &[Arc<MachineSet>], machines: &[Arc<Machine>]) -> Vec<MachineSummary> {
    let uids: Vec<&str> = sets
        .iter()
        .filter_map(|s| s.metadata.uid.as_deref())
        .collect();
    machines
        .iter()
        .filter(|m| controller_of(&m.metadata).is_some_and(|r| uids.contains(&r.uid.as_str())))
        .filter_map(|m| {
            let op = m.status.as_ref()?.last_operation.as_ref()?;
            (op.state == Some(MachineState::Failed)).then(|| MachineSummary {
                name: m.metadata.name.clone(),
                provider_id: m.spec.provider_id.clone(),
                last_operation: Some(op.clone()),
                owner_ref: controller_of(&m.metadata).map(|r| r.name.clone()),
            })
        })
        .collect()
}

fn set_counts(set: &MachineSet, counts: MachineCounts) -> SetCounts {
    SetCounts {
        name: set.metadata.name.clone().unwrap_or_default(),
        created: created(set),
        replicas: set.spec.replicas,
        existing: counts.existing,
        available: counts.available,
    }
}

/// The replicas a new set is created with: what the first rolling step allows, or for Recreate
/// none while old Machines remain.
fn initial_replicas(
    d: &MachineDeployment,
    old: &[MachineSet],
    bounds: Bounds,
    counts_of: &impl Fn(&MachineSet) -> MachineCounts,
) -> i32 {
    match strategy(d) {
        StrategyType::Recreate => {
            let old_left = old
                .iter()
                .any(|s| s.spec.replicas > 0 || counts_of(s).live > 0);
            if old_left { 0 } else { d.spec.replicas }
        }
        _ => {
            let empty = SetCounts {
                name: String::new(),
                created: Timestamp::now(),
                replicas: 0,
                existing: 0,
                available: 0,
            };
            let old: Vec<SetCounts> = old.iter().map(|s| set_counts(s, counts_of(s))).collect();
            new_set_replicas(d.spec.replicas, bounds, &empty, &old)
        }
    }
}

/// Creates the set of the current template. `None` when a set of another template holds the
/// name: the collision count goes up and the next pass hashes again.
async fn create_new_set(
    d: &MachineDeployment,
    old: &[&MachineSet],
    replicas: i32,
    bounds: Bounds,
    ctx: &Context,
) -> Result<Option<MachineSet>, Error> {
    let collisions = d.status.as_ref().and_then(|s| s.collision_count);
    let hash = template_hash(&d.spec.template, collisions);
    let set = new_set(d, &hash, next_revision(old), replicas, bounds.max_surge);
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let api = ctx.sets_api();
    match ctx
        .sets
        .write(&set, api.create(&PostParams::default(), &set))
        .await
    {
        Ok(created) => {
            tracing::info!(deployment = %name_of(d), set = %set_name, replicas, "created machine set");
            if replicas > 0 {
                let message = format!("Scaled up machine set {set_name} to {replicas}");
                ctx.event(d, Event::normal("ScalingMachineSet", "Scale", message))
                    .await;
            }
            Ok(Some((*created).clone()))
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let count = collisions.unwrap_or(0).saturating_add(1);
            tracing::info!(deployment = %name_of(d), set = %set_name, count, "machine set name taken by another template: hashing again");
            let status = json!({"status": {"collisionCount": count}, "metadata": {"resourceVersion": d.metadata.resource_version}});
            let dapi = ctx.deployments_api();
            ctx.deployments
                .write(
                    d,
                    dapi.patch_status(&name_of(d), &PatchParams::default(), &Patch::Merge(&status)),
                )
                .await
                .map_err(|source| Error::WriteStatus {
                    kind: KIND,
                    name: name_of(d),
                    source,
                })?;
            Ok(None)
        }
        Err(source) => {
            // Said where an operator looks (a Warning Event, and the Progressing condition when
            // progress is tracked), then retried with backoff.
            let message =
                machineset_core::deployment::create_failed_message(&set_name, &source.to_string());
            ctx.event(
                d,
                Event::warning(
                    machineset_core::deployment::reason::MACHINE_SET_CREATE_ERROR,
                    "Create",
                    message.clone(),
                ),
            )
            .await;
            let failed = machineset_core::deployment::create_failed(d, &message, Timestamp::now());
            if let Some(status) = failed
                && let Err(error) = write_status(d, &status, false, ctx).await
            {
                tracing::warn!(deployment = %name_of(d), %error, "could not record the failed create in the status");
            }
            Err(Error::CreateSet {
                deployment: name_of(d),
                set: set_name,
                source,
            })
        }
    }
}

/// The new set's annotations (revision, desired and max replicas) and `minReadySeconds` brought
/// up to date; a template that came back gets the next revision.
async fn sync_new_set(
    d: &MachineDeployment,
    set: MachineSet,
    old: &[&MachineSet],
    bounds: Bounds,
    ctx: &Context,
) -> Result<MachineSet, Error> {
    let max_old = old.iter().map(|s| revision(&s.metadata)).max().unwrap_or(0);
    let current = revision(&set.metadata);
    let wanted_revision = if current > max_old {
        current
    } else {
        max_old + 1
    };
    let mut annotations = set_annotations(
        d,
        set.metadata.annotations.as_ref(),
        wanted_revision,
        bounds.max_surge,
    );
    // The replica annotations say what the set was last scaled for: only a scale rewrites them
    // (they are how a scaling event and its proportions are told).
    for key in [ANNOTATION_DESIRED_REPLICAS, ANNOTATION_MAX_REPLICAS] {
        if let Some(kept) = set.metadata.annotations.as_ref().and_then(|a| a.get(key)) {
            annotations.insert(key.to_owned(), kept.clone());
        }
    }
    let same_annotations = set.metadata.annotations.as_ref() == Some(&annotations);
    if same_annotations && set.spec.min_ready_seconds == d.spec.min_ready_seconds {
        return Ok(set);
    }
    let patch = json!({
        "metadata": {"annotations": annotations, "resourceVersion": set.metadata.resource_version},
        "spec": {"minReadySeconds": d.spec.min_ready_seconds},
    });
    patch_set(d, &set, &patch, ctx).await
}

async fn patch_set(
    d: &MachineDeployment,
    set: &MachineSet,
    patch: &serde_json::Value,
    ctx: &Context,
) -> Result<MachineSet, Error> {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let api = ctx.sets_api();
    let written = ctx
        .sets
        .write(
            set,
            api.patch(&set_name, &PatchParams::default(), &Patch::Merge(patch)),
        )
        .await
        .map_err(|source| Error::UpdateSet {
            deployment: name_of(d),
            set: set_name,
            source,
        })?;
    Ok((*written).clone())
}

/// The deployment carries its new set's revision, as MCM writes it.
async fn record_revision(
    d: &MachineDeployment,
    new: &MachineSet,
    ctx: &Context,
) -> Result<(), Error> {
    let wanted = revision(&new.metadata).to_string();
    let current = d
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REVISION));
    if current == Some(&wanted) {
        return Ok(());
    }
    let patch = json!({"metadata": {"annotations": {ANNOTATION_REVISION: wanted}}});
    patch_deployment(d, &patch, "the revision", ctx).await
}

/// Scales `set` to `replicas` and records the replicas it is now scaled for (the desired and
/// max replicas annotations), with an Event when the replicas change. Nothing when both hold.
async fn scale(
    d: &MachineDeployment,
    set: &MachineSet,
    replicas: i32,
    bounds: Bounds,
    ctx: &Context,
) -> Result<(), Error> {
    let from = set.spec.replicas;
    let annotations = set_annotations(
        d,
        set.metadata.annotations.as_ref(),
        revision(&set.metadata),
        bounds.max_surge,
    );
    if from == replicas && set.metadata.annotations.as_ref() == Some(&annotations) {
        return Ok(());
    }
    let patch = json!({
        "metadata": {"annotations": annotations, "resourceVersion": set.metadata.resource_version},
        "spec": {"replicas": replicas},
    });
    patch_set(d, set, &patch, ctx).await?;
    if from == replicas {
        return Ok(());
    }
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let direction = if replicas > from { "up" } else { "down" };
    let message = format!("Scaled {direction} machine set {set_name} to {replicas}");
    tracing::info!(deployment = %name_of(d), set = %set_name, from, to = replicas, "scaled machine set");
    ctx.event(d, Event::normal("ScalingMachineSet", "Scale", message))
        .await;
    Ok(())
}

/// One rollout step: at most one kind of change per pass, as MCM (the Machines it causes must be
/// seen before the next step is decided).
async fn step(
    d: &MachineDeployment,
    new: &MachineSet,
    old: &[MachineSet],
    bounds: Bounds,
    counts_of: &impl Fn(&MachineSet) -> MachineCounts,
    ctx: &Context,
) -> Result<(), Error> {
    let desired = d.spec.replicas;
    match strategy(d) {
        StrategyType::Recreate => {
            let active: Vec<&MachineSet> = old.iter().filter(|s| s.spec.replicas > 0).collect();
            if !active.is_empty() {
                for set in active {
                    scale(d, set, 0, bounds, ctx).await?;
                }
                return Ok(());
            }
            if old.iter().any(|s| counts_of(s).live > 0) {
                return Ok(()); // Every old Machine must be gone first.
            }
            scale(d, new, desired, bounds, ctx).await?;
        }
        _ => {
            let new_counts = set_counts(new, counts_of(new));
            let old_counts: Vec<SetCounts> =
                old.iter().map(|s| set_counts(s, counts_of(s))).collect();
            let target = new_set_replicas(desired, bounds, &new_counts, &old_counts);
            if target != new.spec.replicas {
                return scale(d, new, target, bounds, ctx).await;
            }
            let downs = old_sets_scale_down(desired, bounds, &new_counts, &old_counts);
            if !downs.is_empty() {
                for down in downs {
                    if let Some(set) = old
                        .iter()
                        .find(|s| s.metadata.name.as_deref() == Some(down.name.as_str()))
                    {
                        scale(d, set, down.replicas, bounds, ctx).await?;
                    }
                }
                return Ok(());
            }
        }
    }
    // Settled: old sets beyond the history limit go.
    let old_with_counts: Vec<(&MachineSet, MachineCounts)> =
        old.iter().map(|s| (s, counts_of(s))).collect();
    for name in history_to_delete(d, &old_with_counts) {
        if let Some(set) = old
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(name.as_str()))
        {
            delete_set(d, set, ctx).await?;
        }
    }
    Ok(())
}

fn annotation_number(set: &MachineSet, key: &str) -> Option<i32> {
    set.metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

/// More than one active set, and one of them was last scaled for other replicas than the
/// deployment's: its replicas changed mid-roll (MCM's `isScalingEvent`).
fn scaling_event(d: &MachineDeployment, new: &MachineSet, old: &[MachineSet]) -> bool {
    let active: Vec<&MachineSet> = std::iter::once(new)
        .chain(old.iter())
        .filter(|s| s.spec.replicas > 0)
        .collect();
    active.len() > 1
        && active.iter().any(|s| {
            annotation_number(s, ANNOTATION_DESIRED_REPLICAS).is_some_and(|n| n != d.spec.replicas)
        })
}

/// A replicas change mid-roll shared over the active sets by their last proportions
/// (`machineset_core::rolling::proportional`).
async fn scale_proportionally(
    d: &MachineDeployment,
    new: &MachineSet,
    old: &[MachineSet],
    bounds: Bounds,
    ctx: &Context,
) -> Result<(), Error> {
    let active: Vec<&MachineSet> = std::iter::once(new)
        .chain(old.iter())
        .filter(|s| s.spec.replicas > 0)
        .collect();
    let view: Vec<ScaledSet> = active
        .iter()
        .map(|s| ScaledSet {
            name: s.metadata.name.clone().unwrap_or_default(),
            created: created(s),
            replicas: s.spec.replicas,
            max_replicas: annotation_number(s, ANNOTATION_MAX_REPLICAS),
        })
        .collect();
    let fallback = d.status.as_ref().map_or(0, |s| s.replicas);
    let targets = proportional(d.spec.replicas, bounds.max_surge, fallback, &view);
    // Every active set is now scaled for these replicas, changed or not: that ends the event.
    for set in active {
        let replicas = targets
            .iter()
            .find(|t| set.metadata.name.as_deref() == Some(t.name.as_str()))
            .map_or(set.spec.replicas, |t| t.replicas);
        scale(d, set, replicas, bounds, ctx).await?;
    }
    Ok(())
}

/// Paused: no rollout; a replicas change still reaches the one active set (or the new one).
async fn scale_only(
    d: &MachineDeployment,
    new: Option<&MachineSet>,
    old: &[MachineSet],
    bounds: Bounds,
    ctx: &Context,
) -> Result<(), Error> {
    let active: Vec<&MachineSet> = new
        .into_iter()
        .chain(old.iter())
        .filter(|s| s.spec.replicas > 0)
        .collect();
    match (active.as_slice(), new) {
        ([only], _) => scale(d, only, d.spec.replicas, bounds, ctx).await,
        ([], Some(new)) => scale(d, new, d.spec.replicas, bounds, ctx).await,
        _ => Ok(()),
    }
}

async fn delete_set(d: &MachineDeployment, set: &MachineSet, ctx: &Context) -> Result<(), Error> {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let api = ctx.sets_api();
    match ctx
        .sets
        .delete(set, api.delete(&set_name, &DeleteParams::default()))
        .await
    {
        Ok(_) => {
            tracing::info!(deployment = %name_of(d), set = %set_name, "deleted old machine set");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::DeleteSet {
            deployment: name_of(d),
            set: set_name,
            source,
        }),
    }
}

/// Writes a changed status, unless the deployment is `busy` and its batch is not due: then the
/// delay until it is (see `status_batch`).
async fn write_status(
    d: &MachineDeployment,
    status: &capstan_apis::machine::MachineDeploymentStatus,
    busy: bool,
    ctx: &Context,
) -> Result<Option<Duration>, Error> {
    let name = name_of(d);
    let encode = |source| Error::Encode {
        what: format!("the status of machine deployment {name}"),
        source,
    };
    let old = serde_json::to_value(d.status.clone().unwrap_or_default()).map_err(encode)?;
    let new = serde_json::to_value(status).map_err(encode)?;
    let uid = d.metadata.uid.as_deref().unwrap_or_default();
    // Nothing changed: nothing is written, and the cached object stays what later passes read.
    let Some(diff) = capstan_runtime::patch::status_diff(&old, &new) else {
        ctx.status_batches.written(uid);
        return Ok(None);
    };
    if let Batch::WriteIn(after) = ctx.status_batches.changed(uid, busy, Instant::now()) {
        return Ok(Some(after));
    }
    let api = ctx.deployments_api();
    ctx.deployments
        .write(d, capstan_runtime::patch::status(&api, &d.metadata, &diff))
        .await
        .map_err(|source| Error::WriteStatus {
            kind: KIND,
            name: name.clone(),
            source,
        })?;
    ctx.status_batches.written(uid);
    Ok(None)
}

/// While a rollout with a deadline is unfinished, look again when the deadline would pass;
/// otherwise at the periodic resync (set and Machine events wake the deployment before that).
fn next_pass(
    d: &MachineDeployment,
    status: &capstan_apis::machine::MachineDeploymentStatus,
    ctx: &Context,
) -> Next {
    let unfinished = status.updated_replicas != d.spec.replicas
        || status.available_replicas != d.spec.replicas
        || status.replicas != d.spec.replicas;
    match d.spec.progress_deadline_seconds {
        Some(deadline) if unfinished && !d.spec.paused => {
            let after = Duration::from_secs(u64::try_from(deadline).unwrap_or(0) + 1);
            Next::Requeue(after.min(ctx.resync))
        }
        _ => Next::Requeue(ctx.resync),
    }
}
