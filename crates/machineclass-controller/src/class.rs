//! MachineClass reconcile (MCM's `reconcileClusterMachineClass`): finalizer while used, blocked
//! deletion while machines refer to it, finalizer removal when unused. It runs on the leader only;
//! sharded, the leader's Machine cache is its own share, so a decision that a local count cannot
//! settle ([`needs_every_machine`]) counts every Machine from a fresh, paginated LIST.

use std::sync::Arc;

use capstan_apis::machine::{FINALIZER_MCM, MachineClass};
use capstan_runtime::controller::Target;
use capstan_runtime::events::Event;
use capstan_runtime::runner::Next;
use capstan_runtime::sync::lock;
use kube::Resource;
use machineclass_core::class::{ClassAction, decide_class, needs_every_machine, users_among};
use machineclass_core::meta::{finalizers_with, finalizers_without};

use crate::context::{Context, key};
use crate::error::Error;
use crate::io::patch_finalizers;

pub async fn reconcile(class: Arc<MachineClass>, ctx: Arc<Context>) -> Result<Next, Error> {
    let target = Target::of("MachineClass", &*class);
    ctx.reconciler
        .reconcile(target, reconcile_inner(&class, &ctx))
        .await
}

async fn reconcile_inner(class: &MachineClass, ctx: &Context) -> Result<Next, Error> {
    if let Some(hold) = ctx.hold_writes() {
        return Ok(hold);
    }
    let namespace = class.metadata.namespace.clone().unwrap_or_default();
    let name = class.metadata.name.clone().unwrap_or_default();
    let class_key = key(&namespace, &name);
    let local = lock(&ctx.machine_index).referrer_count(&class_key);
    // Sharded, the index holds this shard's Machines only: a decision it cannot settle counts
    // every Machine from a fresh LIST.
    let users = if ctx.sharded() && needs_every_machine(class, local) {
        let mut users = 0;
        ctx.each_machine("the users of a machine class", None, |machine| {
            users += users_among([machine], &namespace, &name);
        })
        .await?;
        users
    } else {
        local
    };
    let api = ctx.classes_api();
    match decide_class(class, users) {
        ClassAction::InUse { add_finalizer } => {
            if add_finalizer && let Some(list) = finalizers_with(&class.metadata, FINALIZER_MCM) {
                patch_finalizers(&api, &class.metadata, list).await?;
                tracing::info!(class = %class_key, "added finalizer");
            }
            // Machines re-validate against a changed class (once per class version). Sharded,
            // every replica does this for its own Machines from the class watch instead.
            let version = class.metadata.resource_version.clone().unwrap_or_default();
            let changed = lock(&ctx.class_versions).insert(class_key.clone(), version.clone())
                != Some(version);
            if changed && !ctx.sharded() {
                ctx.enqueue_machines_of(&class_key);
            }
            Ok(Next::Requeue(ctx.retry.long))
        }
        ClassAction::DeletionBlocked { machines } => {
            let message = ClassAction::blocked_message(machines);
            // One Warning per change of the count, so a long-blocked deletion does not keep writing.
            let announced = lock(&ctx.blocked_classes).insert(class_key.clone(), machines);
            if announced != Some(machines) {
                let event = Event::warning("MachineClassInUse", "Delete", message.clone());
                ctx.event(&class.object_ref(&()), event).await;
            }
            Err(Error::StillReferred {
                class: class_key,
                message,
            })
        }
        ClassAction::Unused { remove_finalizer } => {
            if remove_finalizer
                && let Some(list) = finalizers_without(&class.metadata, FINALIZER_MCM)
            {
                patch_finalizers(&api, &class.metadata, list).await?;
                tracing::info!(class = %class_key, "removed finalizer");
            }
            lock(&ctx.class_versions).remove(&class_key);
            lock(&ctx.blocked_classes).remove(&class_key);
            Ok(Next::Requeue(ctx.retry.long))
        }
    }
}
