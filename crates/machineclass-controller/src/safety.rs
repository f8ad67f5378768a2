//! The orphan-VM sweep of MCM's safety controller (provider half): every
//! `--machine-safety-orphan-vms-period` the leader asks the driver for each class's VMs and
//! deletes those no Machine accounts for (`machineclass_core::safety::orphans`).
//!
//! Unsharded the Machines are read from the cache. Sharded the leader caches its own share only,
//! so after listing the VMs it LISTs every Machine afresh (paginated): a VM listed first belongs
//! to a Machine that existed when it was created, so a Machine LIST taken after the VM lists
//! holds it unless it is really gone (a Machine keeps its finalizer until its VM is deleted).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use capstan_apis::machine::{Machine, MachineClass, MachineSpec};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use machine_driver::{ListMachinesRequest, MachineRequest};
use machineclass_core::safety::{MachineRecord, orphans};

use crate::context::Context;
use crate::machine::collect_secret_data;
use crate::metrics::McmMetrics;

/// One class's VMs as the driver listed them (provider ID -> machine name).
struct Listed {
    class: Arc<MachineClass>,
    secret_data: BTreeMap<String, Vec<u8>>,
    vms: BTreeMap<String, String>,
}

/// One sweep over every class; returns how many orphan VMs were deleted.
pub async fn sweep(ctx: &Context) -> usize {
    let mut listed = Vec::new();
    for class in ctx.classes.state() {
        let class_name = class.name_any();
        let Ok(secret_data) = collect_secret_data(ctx, &class) else {
            continue; // The class's own reconcile reports a missing Secret.
        };
        let request = ListMachinesRequest {
            class: (*class).clone(),
            secret_data: secret_data.clone(),
        };
        match ctx.driver.list_machines(&request).await {
            Ok(vms) => listed.push(Listed {
                class,
                secret_data,
                vms,
            }),
            Err(err) => {
                tracing::warn!(class = %class_name, %err, "listing the provider's VMs for the orphan sweep failed");
            }
        }
    }
    if listed.iter().all(|class| class.vms.is_empty()) {
        return 0;
    }
    // Sharded: every Machine, listed after the VMs.
    let fresh = if ctx.sharded() {
        let mut records = HashMap::new();
        let listing = ctx.each_machine("the orphan-VM sweep", None, |machine| {
            records.insert(machine.name_any(), MachineRecord::of(machine));
        });
        if let Err(err) = listing.await {
            tracing::warn!(%err, "listing the machines for the orphan sweep failed; the next sweep retries");
            return 0;
        }
        Some(records)
    } else {
        None
    };
    let record = |name: &str| match &fresh {
        Some(records) => records.get(name).cloned().unwrap_or(MachineRecord::Missing),
        None => ctx
            .own_machines
            .get(&ObjectRef::new(name).within(&ctx.namespace))
            .map_or(MachineRecord::Missing, |machine| {
                MachineRecord::of(&machine)
            }),
    };
    let mut deleted = 0;
    for Listed {
        class,
        secret_data,
        vms,
    } in listed
    {
        let class_name = class.name_any();
        for orphan in orphans(&vms, record) {
            let mut machine = Machine::new(&orphan.machine_name, MachineSpec::default());
            machine.metadata.namespace = Some(ctx.namespace.clone());
            machine.spec.provider_id = Some(orphan.provider_id.clone());
            let request = MachineRequest {
                machine,
                class: (*class).clone(),
                secret_data: secret_data.clone(),
            };
            match ctx.driver.delete_machine(&request).await {
                Ok(_) => {
                    deleted += 1;
                    tracing::info!(class = %class_name, machine = %orphan.machine_name, provider_id = %orphan.provider_id, "deleted orphan VM");
                }
                Err(err) => {
                    tracing::warn!(class = %class_name, machine = %orphan.machine_name, %err, "deleting orphan VM failed; the next sweep retries")
                }
            }
        }
    }
    deleted
}

/// Sweeps every `period` while this replica leads and its caches are synced, until dropped.
pub async fn run_sweeps(ctx: Arc<Context>, period: Duration, metrics: McmMetrics) {
    loop {
        tokio::time::sleep(period).await;
        if ctx.hold_writes().is_some() {
            continue;
        }
        let deleted = sweep(&ctx).await;
        metrics.orphans_deleted(deleted);
    }
}
