//! The Machine deletion flow: one step after the other, each recorded in
//! `status.lastOperation.description` before the next runs, so a restarted controller resumes at
//! the recorded step (see [`machineclass_core::deletion`]).

use std::time::Duration;

use capstan_apis::machine::{Code, FINALIZER_MCM, FINALIZER_NODE, Machine};
use capstan_runtime::runner::Next;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use machine_driver::MachineRequest;
use machineclass_core::deletion::{
    DeletionStep, DrainMode, current_step, drain_mode, pod_needs_eviction, record_step,
    record_step_failure,
};
use machineclass_core::driver_error::retry_after;
use machineclass_core::meta::{finalizers_without, has_finalizer};
use machineclass_core::status::StatusChange;
use machineclass_core::validate::MachineTimeouts;
use serde_json::json;

use crate::context::Context;
use crate::error::Error;
use crate::io::patch_finalizers;
use crate::machine::{apply_change, collect_secret_data};
use capstan_runtime::kube_errors::is_not_found;

enum StepOutcome {
    /// Go on with the next step; the text says what just happened.
    Done(Option<String>),
    /// Stay at this step (optionally recording why) and come back later.
    Retry {
        after: Duration,
        status: Option<StatusChange>,
    },
    /// The Machine finalizer is gone.
    Finished,
}

/// Runs the deletion flow from the recorded step as far as it goes in one pass.
pub async fn run(original: &Machine, ctx: &Context) -> Result<Next, Error> {
    if !has_finalizer(&original.metadata, FINALIZER_MCM) {
        return Ok(Next::AwaitChange);
    }
    let name = original.metadata.name.clone().unwrap_or_default();
    let mut machine = original.clone();
    loop {
        let step = current_step(&machine);
        tracing::info!(machine = %name, step = step.label(), "deletion step");
        match run_step(ctx, &machine, step).await? {
            StepOutcome::Finished => {
                tracing::info!(machine = %name, "machine deleted");
                return Ok(Next::AwaitChange);
            }
            StepOutcome::Retry { after, status } => {
                if let Some(change) = status {
                    apply_change(ctx, &machine, &change).await?;
                }
                return Ok(Next::Requeue(after));
            }
            StepOutcome::Done(what) => {
                let Some(next) = step.next() else {
                    return Ok(Next::AwaitChange);
                };
                let change = record_step(next, what.as_deref());
                if let Some(updated) = apply_change(ctx, &machine, &change).await? {
                    machine = updated;
                }
            }
        }
    }
}

fn request_for(ctx: &Context, machine: &Machine) -> Option<MachineRequest> {
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let class_name = machine
        .spec
        .class
        .as_ref()?
        .machine_class_name()?
        .to_owned();
    let class = ctx
        .classes
        .get(&ObjectRef::new(&class_name).within(&namespace))?;
    // Deletion goes on with whatever secret data is still there.
    let secret_data = collect_secret_data(ctx, &class).unwrap_or_default();
    Some(MachineRequest {
        machine: machine.clone(),
        class: (*class).clone(),
        secret_data,
    })
}

async fn run_step(
    ctx: &Context,
    machine: &Machine,
    step: DeletionStep,
) -> Result<StepOutcome, Error> {
    match step {
        DeletionStep::SetTerminating => Ok(StepOutcome::Done(None)),
        DeletionStep::GetVmStatus => get_vm_status(ctx, machine).await,
        DeletionStep::Drain => drain(ctx, machine).await,
        DeletionStep::DeleteVolumeAttachments => delete_volume_attachments(ctx, machine).await,
        DeletionStep::DeleteVm => delete_vm(ctx, machine).await,
        DeletionStep::DeleteNode => delete_node(ctx, machine).await,
        DeletionStep::RemoveFinalizer => {
            if let Some(list) = finalizers_without(&machine.metadata, FINALIZER_MCM) {
                patch_finalizers(&ctx.machines_api(), &machine.metadata, list).await?;
            }
            Ok(StepOutcome::Finished)
        }
    }
}

fn driver_retry(
    ctx: &Context,
    step: DeletionStep,
    error: &machine_driver::DriverError,
) -> StepOutcome {
    StepOutcome::Retry {
        after: retry_after(error.code, &ctx.retry),
        status: Some(record_step_failure(
            step,
            &format!("Cloud provider message - {}", error.message),
            Some(error.code.name()),
        )),
    }
}

fn class_missing(ctx: &Context, step: DeletionStep) -> StepOutcome {
    StepOutcome::Retry {
        after: ctx.retry.short,
        status: Some(record_step_failure(
            step,
            "Machine class of the machine not found",
            None,
        )),
    }
}

async fn get_vm_status(ctx: &Context, machine: &Machine) -> Result<StepOutcome, Error> {
    let Some(request) = request_for(ctx, machine) else {
        return Ok(class_missing(ctx, DeletionStep::GetVmStatus));
    };
    match ctx.driver.get_machine_status(&request).await {
        Ok(_) => Ok(StepOutcome::Done(Some("VM found".into()))),
        Err(e) if matches!(e.code, Code::NotFound | Code::Unimplemented) => {
            Ok(StepOutcome::Done(Some("VM not found at provider".into())))
        }
        Err(e) => Ok(driver_retry(ctx, DeletionStep::GetVmStatus, &e)),
    }
}

fn unhealthy_since(node: &Node) -> Option<Timestamp> {
    let ready = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    (ready.status != "True")
        .then(|| ready.last_transition_time.as_ref().map(|t| t.0))
        .flatten()
}

async fn drain(ctx: &Context, machine: &Machine) -> Result<StepOutcome, Error> {
    let Some(node_name) = machine.node_name().map(str::to_owned) else {
        return Ok(StepOutcome::Done(Some("No node to drain".into())));
    };
    let drain_failed = |source| Error::Drain {
        node: node_name.clone(),
        source,
    };
    let nodes = ctx.nodes_api();
    let Some(node) = nodes.get_opt(&node_name).await.map_err(drain_failed)? else {
        return Ok(StepOutcome::Done(Some(
            "Node not found, skipping drain".into(),
        )));
    };
    if !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        nodes
            .patch(
                &node_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
            )
            .await
            .map_err(drain_failed)?;
        tracing::info!(node = %node_name, "node cordoned");
    }
    let all_pods: Api<Pod> = Api::all(ctx.client.clone());
    let listed = all_pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await
        .map_err(drain_failed)?;
    let pods: Vec<Pod> = listed
        .into_iter()
        .filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str())
        })
        .filter(pod_needs_eviction)
        .collect();
    if pods.is_empty() {
        return Ok(StepOutcome::Done(Some("Drain successful".into())));
    }
    let timeouts = MachineTimeouts::from_spec_or(&machine.spec, &ctx.timeouts).ok();
    let drain_timeout = timeouts.map_or(ctx.timeouts.drain, |t| t.drain);
    let started = machine
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    let mode = drain_mode(
        machine,
        started,
        drain_timeout,
        unhealthy_since(&node),
        Timestamp::now(),
    );
    // Pods already terminating only need a forced delete; a graceful pass leaves them be.
    for pod in pods
        .iter()
        .filter(|p| mode == DrainMode::Force || p.metadata.deletion_timestamp.is_none())
    {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let result = match mode {
            DrainMode::Graceful => api.evict(&name, &EvictParams::default()).await.map(drop),
            DrainMode::Force => api
                .delete(
                    &name,
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    },
                )
                .await
                .map(drop),
        };
        match result {
            Ok(()) => tracing::info!(pod = %format!("{namespace}/{name}"), ?mode, "pod evicted"),
            Err(e) if is_not_found(&e) => {}
            // 429: a PodDisruptionBudget blocks it for now; retried on the next pass.
            Err(e) => {
                tracing::info!(pod = %format!("{namespace}/{name}"), %e, "eviction not possible yet")
            }
        }
    }
    Ok(StepOutcome::Retry {
        after: ctx.retry.short,
        status: Some(record_step(
            DeletionStep::Drain,
            Some(&format!(
                "Drain in progress, {} pod(s) left ({mode:?})",
                pods.len()
            )),
        )),
    })
}

async fn delete_volume_attachments(ctx: &Context, machine: &Machine) -> Result<StepOutcome, Error> {
    let Some(node_name) = machine.node_name().map(str::to_owned) else {
        return Ok(StepOutcome::Done(Some("No volume attachments".into())));
    };
    let failed = |source| Error::DeleteVolumeAttachments {
        node: node_name.clone(),
        source,
    };
    let api: Api<VolumeAttachment> = Api::all(ctx.client.clone());
    let attachments = api.list(&ListParams::default()).await.map_err(failed)?;
    let mut deleted = 0;
    for va in attachments
        .into_iter()
        .filter(|va| va.spec.node_name == node_name)
    {
        let name = va.metadata.name.clone().unwrap_or_default();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(StepOutcome::Done(Some(format!(
        "Deleted {deleted} volume attachment(s)"
    ))))
}

async fn delete_vm(ctx: &Context, machine: &Machine) -> Result<StepOutcome, Error> {
    let Some(request) = request_for(ctx, machine) else {
        return Ok(class_missing(ctx, DeletionStep::DeleteVm));
    };
    match ctx.driver.delete_machine(&request).await {
        Ok(_) => Ok(StepOutcome::Done(Some("VM deletion was successful".into()))),
        Err(e) if e.code == Code::NotFound => {
            Ok(StepOutcome::Done(Some("VM not found at provider".into())))
        }
        Err(e) => Ok(driver_retry(ctx, DeletionStep::DeleteVm, &e)),
    }
}

async fn delete_node(ctx: &Context, machine: &Machine) -> Result<StepOutcome, Error> {
    let Some(node_name) = machine.node_name().map(str::to_owned) else {
        return Ok(StepOutcome::Done(Some("No node object".into())));
    };
    let failed = |source| Error::DeleteNode {
        node: node_name.clone(),
        source,
    };
    let nodes = ctx.nodes_api();
    if let Some(node) = nodes.get_opt(&node_name).await.map_err(failed)? {
        if let Some(list) = finalizers_without(&node.metadata, FINALIZER_NODE) {
            patch_finalizers(&nodes, &node.metadata, list).await?;
        }
        match nodes.delete(&node_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(failed(e)),
        }
        tracing::info!(node = %node_name, "node deleted");
    }
    Ok(StepOutcome::Done(Some("Node object deleted".into())))
}
