//! The orphan-VM sweep of MCM's safety controller (provider half): every
//! `--machine-safety-orphan-vms-period` the leader asks the driver for each class's VMs and
//! deletes those no Machine accounts for (`machineclass_core::safety::orphans`).

use std::sync::Arc;
use std::time::Duration;

use capstan_apis::machine::{Machine, MachinePhase, MachineSpec};
use kube::runtime::reflector::ObjectRef;
use machine_driver::{ListMachinesRequest, MachineRequest};
use machineclass_core::safety::{MachineRecord, orphans};

use crate::context::Context;
use crate::machine::collect_secret_data;
use crate::metrics::McmMetrics;

/// One sweep over every class; returns how many orphan VMs were deleted.
pub async fn sweep(ctx: &Context) -> usize {
    let mut deleted = 0;
    for class in ctx.classes.state() {
        let class_name = class.metadata.name.clone().unwrap_or_default();
        let Ok(secret_data) = collect_secret_data(ctx, &class) else {
            continue; // The class's own reconcile reports a missing Secret.
        };
        let request = ListMachinesRequest {
            class: (*class).clone(),
            secret_data: secret_data.clone(),
        };
        let vms = match ctx.driver.list_machines(&request).await {
            Ok(vms) => vms,
            Err(err) => {
                tracing::warn!(class = %class_name, %err, "listing the provider's VMs for the orphan sweep failed");
                continue;
            }
        };
        let found = orphans(&vms, |name| {
            match ctx
                .own_machines
                .get(&ObjectRef::new(name).within(&ctx.namespace))
            {
                None => MachineRecord::Missing,
                Some(machine) => MachineRecord::Present {
                    provider_id: machine.spec.provider_id.clone(),
                    creating: matches!(
                        machine.phase(),
                        None | Some(MachinePhase::CrashLoopBackOff)
                    ),
                },
            }
        });
        for orphan in found {
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
