//! MachineSet reconcile (MCM's `reconcileClusterMachineSet`): finalizer, claims, replicas,
//! status. The decisions are `machineset_core::set`'s; this module reads caches and writes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_apis::machine::{FINALIZER_MCM, Machine, MachineSet};
use capstan_apis::meta::{finalizers_with, finalizers_without};
use capstan_apis::selector::Selector;
use capstan_runtime::controller::Target;
use capstan_runtime::events::Event;
use capstan_runtime::runner::Next;
use capstan_runtime::status_batch::Batch;
use futures::future::join_all;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use machineset_core::Timestamp;
use machineset_core::machines::is_ready;
use machineset_core::ownership::{Claim, Owner, claim, controller_ref};
use machineset_core::set::{
    ReplicaPlan, is_busy, machine_name, plan_replicas, selector_of, status,
};
use serde_json::json;

use crate::context::Context;
use crate::error::Error;

const KIND: &str = "MachineSet";

pub async fn reconcile(set: Arc<MachineSet>, ctx: Arc<Context>) -> Result<Next, Error> {
    let set = ctx.sets.freshest(set);
    let target = Target::of(KIND, &*set);
    ctx.reconciler
        .reconcile(target, reconcile_inner(&set, &ctx))
        .await
}

async fn reconcile_inner(set: &MachineSet, ctx: &Context) -> Result<Next, Error> {
    if let Some(hold) = ctx.hold_writes() {
        return Ok(hold);
    }
    let name = set.metadata.name.clone().unwrap_or_default();
    let deleting = set.metadata.deletion_timestamp.is_some();
    let set = if deleting {
        set.clone()
    } else {
        ensure_finalizer(set, ctx).await?
    };
    let selector = match selector_of(&set) {
        Ok(selector) => selector,
        Err(err) => {
            // Invalid input: nothing is created or deleted until the set is fixed.
            let message = format!("machine set {name} is not processed: {err}");
            tracing::warn!(set = %name, "{message}");
            ctx.event(&set, Event::warning("InvalidSelector", "Validate", message))
                .await;
            return Ok(Next::AwaitChange);
        }
    };
    let owned = claim_machines(&set, &selector, ctx).await?;
    if deleting {
        return finish_deletion(&set, &owned, ctx).await;
    }
    let machines: Vec<&Machine> = owned.iter().map(|m| &**m).collect();
    let plan = plan_replicas(&set, &machines);
    let result = apply(&set, &plan, &machines, ctx).await;
    // The status counts what the cache holds now, our creates and deletes included.
    let owned = owned_machines(&set, ctx);
    let machines: Vec<&Machine> = owned.iter().map(|m| &**m).collect();
    let failure = result.as_ref().err().map(ToString::to_string);
    let held = write_status(&set, &machines, failure.as_deref(), ctx).await?;
    ctx.wake_owner_of(&set);
    result?;
    // A status held back is written when its batch is due.
    Ok(next_pass(&set, &machines, ctx).sooner(held))
}

async fn ensure_finalizer(set: &MachineSet, ctx: &Context) -> Result<MachineSet, Error> {
    let Some(list) = finalizers_with(&set.metadata, FINALIZER_MCM) else {
        return Ok(set.clone());
    };
    let api = ctx.sets_api();
    let written = ctx
        .sets
        .write(
            set,
            capstan_runtime::patch::finalizers(&api, &set.metadata, list),
        )
        .await
        .map_err(|source| Error::PatchFinalizers {
            kind: KIND,
            name: set.metadata.name.clone().unwrap_or_default(),
            source,
        })?;
    Ok((*written).clone())
}

/// The Machines the set owns after adopting matching orphans and releasing owned Machines that
/// no longer match.
async fn claim_machines(
    set: &MachineSet,
    selector: &Selector,
    ctx: &Context,
) -> Result<Vec<Arc<Machine>>, Error> {
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let owner = Owner {
        uid: &uid,
        deleting: set.metadata.deletion_timestamp.is_some(),
        selector,
    };
    let mut owned = Vec::new();
    for machine in ctx.machines.state() {
        match claim(owner, &machine.metadata) {
            Claim::Owned => owned.push(machine),
            Claim::Adopt => owned.push(adopt(set, &machine, ctx).await?),
            Claim::Release => release(&uid, &machine, ctx).await?,
            Claim::Ignore => {}
        }
    }
    Ok(owned)
}

async fn adopt(set: &MachineSet, machine: &Machine, ctx: &Context) -> Result<Arc<Machine>, Error> {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let mut refs = machine
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    refs.push(controller_ref(
        KIND,
        &set_name,
        set.metadata.uid.as_deref().unwrap_or_default(),
    ));
    let written = patch_owners(machine, refs, ctx).await?;
    tracing::info!(set = %set_name, machine = ?machine.metadata.name, "adopted machine");
    Ok(written)
}

async fn release(uid: &str, machine: &Machine, ctx: &Context) -> Result<(), Error> {
    let refs: Vec<_> = machine
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != uid)
        .cloned()
        .collect();
    patch_owners(machine, refs, ctx).await?;
    tracing::info!(machine = ?machine.metadata.name, "released machine");
    Ok(())
}

async fn patch_owners(
    machine: &Machine,
    refs: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    ctx: &Context,
) -> Result<Arc<Machine>, Error> {
    let name = machine.metadata.name.clone().unwrap_or_default();
    let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": machine.metadata.resource_version}});
    let api = ctx.machines_api();
    ctx.machines
        .write(
            machine,
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map_err(|source| Error::Claim {
            kind: "Machine",
            name,
            source,
        })
}

/// The Machines controlled by `set` in the cache (no claims: after this pass's writes).
fn owned_machines(set: &MachineSet, ctx: &Context) -> Vec<Arc<Machine>> {
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    ctx.machines
        .state()
        .into_iter()
        .filter(|m| {
            machineset_core::ownership::controller_of(&m.metadata).is_some_and(|r| r.uid == uid)
        })
        .collect()
}

async fn apply(
    set: &MachineSet,
    plan: &ReplicaPlan,
    machines: &[&Machine],
    ctx: &Context,
) -> Result<(), Error> {
    let name = set.metadata.name.clone().unwrap_or_default();
    if plan.frozen {
        tracing::info!(set = %name, "machine set is frozen: not scaling up");
    }
    if plan.create > 0 {
        let created = create_machines(set, plan.create, ctx).await;
        let count = match &created {
            Ok(n) | Err((n, _)) => *n,
        };
        if count > 0 {
            ctx.metrics.created(count);
            let message = format!(
                "Created {count} machine(s) for machine set {name} (replicas {})",
                set.spec.replicas
            );
            ctx.event(set, Event::normal("SuccessfulCreate", "Create", message))
                .await;
        }
        created.map_err(|(_, e)| e)?;
    }
    let doomed: Vec<&Machine> = machines
        .iter()
        .copied()
        .filter(|m| {
            plan.delete
                .iter()
                .any(|d| m.metadata.name.as_ref() == Some(d))
        })
        .collect();
    for machine in doomed {
        delete_machine(set, machine, ctx).await?;
    }
    if !plan.delete.is_empty() {
        ctx.metrics.deleted(plan.delete.len());
        let message = format!(
            "Deleted machine(s) {} of machine set {name} (replicas {})",
            plan.delete.join(", "),
            set.spec.replicas
        );
        ctx.event(set, Event::normal("SuccessfulDelete", "Delete", message))
            .await;
    }
    Ok(())
}

/// MCM's slow start: batches of 1, 2, 4 ... created concurrently, stopping after a batch with a
/// failure so a quota error costs one request, not hundreds. Returns how many were created.
async fn create_machines(
    set: &MachineSet,
    count: usize,
    ctx: &Context,
) -> Result<usize, (usize, Error)> {
    let mut created = 0;
    let mut batch = 1;
    while created < count {
        let size = batch.min(count - created);
        let results = join_all((0..size).map(|_| create_machine(set, ctx))).await;
        let mut failure = None;
        for result in results {
            match result {
                Ok(()) => created += 1,
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            return Err((created, e));
        }
        batch *= 2;
    }
    Ok(created)
}

async fn create_machine(set: &MachineSet, ctx: &Context) -> Result<(), Error> {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let api = ctx.machines_api();
    // A name taken by chance is drawn again, once.
    let mut attempt = 0;
    loop {
        let machine = machine_from_template(set, &machine_name(&set_name, ctx.entropy()));
        let name = machine.metadata.name.clone().unwrap_or_default();
        match ctx
            .machines
            .write(&machine, api.create(&PostParams::default(), &machine))
            .await
        {
            Ok(_) => {
                tracing::debug!(set = %set_name, machine = %name, "created machine");
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 409 && attempt == 0 => attempt += 1,
            Err(source) => {
                return Err(Error::CreateMachine {
                    set: set_name,
                    machine: name,
                    source,
                });
            }
        }
    }
}

/// A Machine from the set's template: its labels, annotations and spec, owned by the set.
pub fn machine_from_template(set: &MachineSet, name: &str) -> Machine {
    let template = set.spec.template.clone().unwrap_or_default();
    let mut spec = template.spec.unwrap_or_default();
    if spec.class.is_none() {
        spec.class = set.spec.machine_class.clone();
    }
    let mut machine = Machine::new(name, spec);
    let meta = template.metadata.unwrap_or_default();
    machine.metadata.namespace = set.metadata.namespace.clone();
    machine.metadata.labels = meta.labels;
    machine.metadata.annotations = meta.annotations;
    machine.metadata.owner_references = Some(vec![controller_ref(
        KIND,
        set.metadata.name.as_deref().unwrap_or_default(),
        set.metadata.uid.as_deref().unwrap_or_default(),
    )]);
    machine
}

async fn delete_machine(set: &MachineSet, machine: &Machine, ctx: &Context) -> Result<(), Error> {
    if machine.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let name = machine.metadata.name.clone().unwrap_or_default();
    let api = ctx.machines_api();
    match ctx
        .machines
        .delete(machine, api.delete(&name, &DeleteParams::default()))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::DeleteMachine {
            set: set.metadata.name.clone().unwrap_or_default(),
            machine: name,
            source,
        }),
    }
}

/// A deleting set deletes its Machines, and lets go of its finalizer once none is left.
async fn finish_deletion(
    set: &MachineSet,
    owned: &[Arc<Machine>],
    ctx: &Context,
) -> Result<Next, Error> {
    if owned.is_empty() {
        // Going: no status is written again.
        ctx.status_batches
            .written(set.metadata.uid.as_deref().unwrap_or_default());
        if let Some(list) = finalizers_without(&set.metadata, FINALIZER_MCM) {
            let api = ctx.sets_api();
            capstan_runtime::patch::finalizers(&api, &set.metadata, list)
                .await
                .map_err(|source| Error::PatchFinalizers {
                    kind: KIND,
                    name: set.metadata.name.clone().unwrap_or_default(),
                    source,
                })?;
        }
        return Ok(Next::AwaitChange);
    }
    for machine in owned {
        delete_machine(set, machine, ctx).await?;
    }
    // Each Machine's deletion event wakes the set again.
    Ok(Next::Requeue(ctx.resync))
}

async fn write_status(
    set: &MachineSet,
    machines: &[&Machine],
    failure: Option<&str>,
    ctx: &Context,
) -> Result<Option<Duration>, Error> {
    let name = set.metadata.name.clone().unwrap_or_default();
    let now = Timestamp::now();
    let new = status(set, machines, failure, now);
    let encode = |source| Error::Encode {
        what: format!("the status of machine set {name}"),
        source,
    };
    let old = serde_json::to_value(set.status.clone().unwrap_or_default()).map_err(encode)?;
    let new = serde_json::to_value(&new).map_err(encode)?;
    // Nothing changed: nothing is written, and the cached object stays what later passes read.
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    let Some(diff) = capstan_runtime::patch::status_diff(&old, &new) else {
        ctx.status_batches.written(uid);
        return Ok(None);
    };
    // A failure is said at once; counts of Machines still changing wait for their batch.
    let busy = failure.is_none() && is_busy(set, machines, now);
    if let Batch::WriteIn(after) = ctx.status_batches.changed(uid, busy, Instant::now()) {
        return Ok(Some(after));
    }
    let api = ctx.sets_api();
    ctx.sets
        .write(
            set,
            capstan_runtime::patch::status(&api, &set.metadata, &diff),
        )
        .await
        .map_err(|source| Error::WriteStatus {
            kind: KIND,
            name,
            source,
        })?;
    ctx.status_batches.written(uid);
    Ok(None)
}

/// When to look again: when a Running Machine will have been ready for `minReadySeconds`, else
/// at the periodic resync (Machine events wake the set before that).
fn next_pass(set: &MachineSet, machines: &[&Machine], ctx: &Context) -> Next {
    let min_ready = u64::try_from(set.spec.min_ready_seconds).unwrap_or(0);
    if min_ready == 0 {
        return Next::Requeue(ctx.resync);
    }
    let now = Timestamp::now();
    let soonest = machines
        .iter()
        .filter(|m| is_ready(m))
        .filter_map(|m| {
            let since = m
                .status
                .as_ref()?
                .current_status
                .as_ref()?
                .last_update_time
                .as_ref()?
                .0;
            let ready_for = now.as_second() - since.as_second();
            let left = i64::try_from(min_ready).unwrap_or(i64::MAX) - ready_for;
            (left > 0).then(|| Duration::from_secs(u64::try_from(left).unwrap_or(0)))
        })
        .min();
    Next::Requeue(soonest.map_or(ctx.resync, |left| left.min(ctx.resync)))
}
