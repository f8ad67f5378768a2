//! Machine reconcile for live Machines (MCM's machine controller): finalizer, validation,
//! creation flow, health, node-template sync and the Node's finalizer. Deleting Machines go to
//! [`crate::deletion`].

use std::collections::BTreeMap;
use std::sync::Arc;

use capstan_apis::machine::{
    Code, FINALIZER_MCM, FINALIZER_NODE, LABEL_MACHINE_DEPLOYMENT, LABEL_NODE, Machine,
    MachineClass, MachineOperationType, MachinePhase, MachineState, MachineStatus,
    NODE_LABEL_MACHINE_NAME,
};
use capstan_runtime::controller::Target;
use capstan_runtime::events::Event;
use capstan_runtime::kube_errors::{is_conflict, is_not_found};
use capstan_runtime::runner::Next;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use machine_driver::{DriverError, MachineInfo, MachineRequest};
use machineclass_core::Timestamp;
use machineclass_core::creation::{
    VmLookup, after_status_lookup, another_failed_in_deployment, node_owned_by_another,
    same_conditions,
};
use machineclass_core::driver_error::creation_failure;
use machineclass_core::health::{HealthInput, evaluate_health};
use machineclass_core::meta::{finalizers_with, has_finalizer};
use machineclass_core::node_patch::node_patch;
use machineclass_core::node_template::{Decoration, sync_node_template, virtual_capacity_update};
use machineclass_core::status::{Operation, StatusChange};
use machineclass_core::validate::{
    MachineTimeouts, merge_secret_data, validate_class, validate_class_ref,
};
use serde_json::json;

use crate::context::{Context, MachineGate};
use crate::error::Error;
use crate::io::{patch_finalizers, write_machine_status};

/// lastOperation description after a successful CreateMachine (MCM's wording).
pub const CREATING: &str = "Creating machine on cloud provider";

pub async fn reconcile(machine: Arc<Machine>, ctx: Arc<Context>) -> Result<Next, Error> {
    // A Node's event may come before the echo of this process's last write to the Machine.
    let machine = ctx.own_machines.freshest(machine);
    // The kit boxes this state machine (about 17 KiB) before it is moved anywhere.
    let work = async {
        match ctx.machine_gate(&machine) {
            MachineGate::Hold(hold) => Ok(hold),
            MachineGate::Release => release(&machine, &ctx).await,
            MachineGate::Proceed if machine.metadata.deletion_timestamp.is_some() => {
                crate::deletion::run(&machine, &ctx).await
            }
            MachineGate::Proceed => live(&machine, &ctx).await,
        }
    };
    ctx.reconciler
        .reconcile(Target::of("Machine", &*machine), work)
        .await
}

/// Sharded: the drain acknowledgement. The runner runs one reconcile per Machine at a time, so
/// none of this shard runs on it now; after the release it is no longer in this shard's watch.
/// A later requeue from a cache that still holds the drained copy lands here again and finds
/// it no longer ours (the release is guarded by a `test` of the shard label): no write.
async fn release(machine: &Machine, ctx: &Context) -> Result<Next, Error> {
    let Some(member) = &ctx.shard else {
        return Ok(Next::AwaitChange);
    };
    let outcome = member
        .release(machine)
        .await
        .map_err(|source| Error::ReleaseShard {
            machine: machine.name_any(),
            source,
        })?;
    tracing::debug!(machine = %machine.name_any(), ?outcome, "machine handed over to another shard");
    Ok(Next::AwaitChange)
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn created_at(machine: &Machine) -> Timestamp {
    machine
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or_else(now, |t| t.0)
}

/// Writes `next` when it differs from the Machine's status; returns the updated Machine.
pub(crate) async fn store_status(
    ctx: &Context,
    machine: &Machine,
    next: MachineStatus,
) -> Result<Option<Machine>, Error> {
    let unchanged = match machine.status.as_ref() {
        Some(current) => *current == next,
        None => next == MachineStatus::default(),
    };
    if unchanged {
        return Ok(None);
    }
    let api = ctx.machines_api();
    let written = ctx
        .own_machines
        .write(machine, write_machine_status(&api, machine, &next))
        .await?;
    Ok(Some(Arc::unwrap_or_clone(written)))
}

/// Applies a status change; `Some(updated)` when something was written.
pub(crate) async fn apply_change(
    ctx: &Context,
    machine: &Machine,
    change: &StatusChange,
) -> Result<Option<Machine>, Error> {
    match change.apply(machine.status.as_ref(), now()) {
        Some(next) => store_status(ctx, machine, next).await,
        None => Ok(None),
    }
}

async fn live(original: &Machine, ctx: &Context) -> Result<Next, Error> {
    let api = ctx.machines_api();
    let namespace = original.metadata.namespace.clone().unwrap_or_default();
    let mut machine = original.clone();

    // 1. Finalizer first; the same pass continues.
    if let Some(list) = finalizers_with(&machine.metadata, FINALIZER_MCM) {
        let written = patch_finalizers(&api, &machine.metadata, list);
        machine = Arc::unwrap_or_clone(ctx.own_machines.write(&machine, written).await?);
    }

    // 2. Validation.
    let class_name = match validate_class_ref(&machine.spec) {
        Ok(name) => name.to_owned(),
        Err(e) => return report_invalid(ctx, &machine, e.to_string(), ctx.retry.long).await,
    };
    let timeouts = match MachineTimeouts::from_spec_or(&machine.spec, &ctx.timeouts) {
        Ok(t) => t,
        Err(e) => return report_invalid(ctx, &machine, e.to_string(), ctx.retry.long).await,
    };
    let Some(mut class) = ctx
        .classes
        .get(&ObjectRef::new(&class_name).within(&namespace))
    else {
        let message = format!("machine class {class_name} not found");
        return report_invalid(ctx, &machine, message, ctx.retry.short).await;
    };
    if !has_finalizer(&class.metadata, FINALIZER_MCM) {
        if !ctx.sharded() || class.metadata.deletion_timestamp.is_some() {
            // The class reconcile adds it; come back shortly (MCM's `ValidateMachineClass`).
            let _ = ctx.class_triggers.send(ObjectRef::from_obj(&*class));
            return Ok(Next::Requeue(ctx.retry.short));
        }
        // Sharded, the class reconcile runs on the leader, which caches only its own share of
        // the Machines: the shard that reconciles a user of the class guards it itself.
        match add_class_finalizer(ctx, &class).await? {
            Some(written) => class = Arc::new(written),
            None => return Ok(Next::Requeue(ctx.retry.conflict)),
        }
    }
    let problems = validate_class(&class);
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
        let message = format!("machine class {class_name} is invalid: {}", list.join("; "));
        return report_invalid(ctx, &machine, message, ctx.retry.long).await;
    }
    let secret_data = match collect_secret_data(ctx, &class) {
        Ok(data) => data,
        Err(message) => return report_invalid(ctx, &machine, message, ctx.retry.short).await,
    };

    // 3. Health and node templates once the Machine has a Node and a phase.
    let mut requeue = ctx.retry.long;
    if machine.node_name().is_some() && machine.phase().is_some() {
        match health_and_node(ctx, &machine, &class, &timeouts).await? {
            HealthOutcome::MachineDeleted => return Ok(Next::AwaitChange),
            HealthOutcome::Checked {
                machine: updated,
                recheck,
            } => {
                machine = *updated;
                if let Some(after) = recheck {
                    requeue = requeue.min(after);
                }
            }
        }
    }

    // 4. Creation flow.
    let no_provider_id = machine
        .spec
        .provider_id
        .as_deref()
        .is_none_or(str::is_empty);
    let phase = machine.phase().cloned();
    if no_provider_id || phase.is_none() || phase == Some(MachinePhase::CrashLoopBackOff) {
        let request = MachineRequest {
            machine: machine.clone(),
            class: (*class).clone(),
            secret_data,
        };
        return create_flow(ctx, &machine, request, &timeouts).await;
    }
    Ok(Next::Requeue(requeue))
}

/// Sharded: adds the MCM finalizer to a live `class` one of this shard's Machines uses, guarded
/// by the class's resourceVersion. `None` when another replica wrote the class first (a 409):
/// the caller comes back once the watch brought the newer class.
///
/// **Decision** (ours; MCM's machine controller only enqueues the class and retries, leaving
/// the finalizer to the class reconcile): with sharding the class reconcile runs on the leader,
/// which does not cache the Machines of other shards, so the shard that reconciles a Machine
/// makes sure its class keeps the finalizer while the Machine uses it.
async fn add_class_finalizer(
    ctx: &Context,
    class: &MachineClass,
) -> Result<Option<MachineClass>, Error> {
    let Some(list) = finalizers_with(&class.metadata, FINALIZER_MCM) else {
        return Ok(Some(class.clone()));
    };
    match patch_finalizers(&ctx.classes_api(), &class.metadata, list).await {
        Ok(written) => {
            tracing::info!(class = %class.name_any(), "added the class finalizer for a machine of this shard");
            Ok(Some(written))
        }
        Err(Error::PatchFinalizers { source, .. }) if is_conflict(&source) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Reports bad input on the Machine: a Warning Event and lastOperation Failed (written and
/// announced once; the phase is unchanged).
async fn report_invalid(
    ctx: &Context,
    machine: &Machine,
    message: String,
    retry: std::time::Duration,
) -> Result<Next, Error> {
    let change = StatusChange::operation(Operation::new(
        message.clone(),
        MachineState::Failed,
        MachineOperationType::Create,
    ));
    if apply_change(ctx, machine, &change).await?.is_some() {
        tracing::warn!(machine = ?machine.metadata.name, %message, "machine validation failed");
        let event = Event::warning("ValidationFailed", "Validate", message);
        ctx.event(&machine.object_ref(&()), event).await;
    }
    Ok(Next::Requeue(retry))
}

/// `secretRef` data merged with `credentialsSecretRef` data, or why it cannot be read.
/// **Decision**: a referenced Secret that does not exist is an error.
pub(crate) fn collect_secret_data(
    ctx: &Context,
    class: &MachineClass,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let class_ns = class.metadata.namespace.clone().unwrap_or_default();
    let class_name = class.metadata.name.clone().unwrap_or_default();
    let read =
        |reference: Option<&k8s_openapi::api::core::v1::SecretReference>| -> Result<_, String> {
            let Some(reference) = reference else {
                return Ok(None);
            };
            let name = reference.name.clone().unwrap_or_default();
            let ns = reference
                .namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| class_ns.clone());
            match ctx.secrets.get(&ObjectRef::new(&name).within(&ns)) {
                Some(secret) => Ok(Some(secret.data.clone().unwrap_or_default())),
                None => Err(format!(
                    "secret {ns}/{name} referenced by machine class {class_name} not found"
                )),
            }
        };
    let secret = read(class.spec.secret_ref.as_ref())?;
    let credentials = read(class.spec.credentials_secret_ref.as_ref())?;
    Ok(merge_secret_data(secret.as_ref(), credentials.as_ref()))
}

enum HealthOutcome {
    MachineDeleted,
    Checked {
        machine: Box<Machine>,
        recheck: Option<std::time::Duration>,
    },
}

async fn health_and_node(
    ctx: &Context,
    machine: &Machine,
    class: &MachineClass,
    timeouts: &MachineTimeouts,
) -> Result<HealthOutcome, Error> {
    let name = machine.metadata.name.clone().unwrap_or_default();
    let node_name = machine.node_name().unwrap_or_default().to_owned();
    let node = ctx.own_nodes.get(&ObjectRef::new(&node_name));
    if let Some(node) = &node
        && node.metadata.deletion_timestamp.is_some()
    {
        // A Node being deleted takes its Machine with it.
        match ctx
            .machines_api()
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(source) => {
                return Err(Error::DeleteMachine {
                    machine: name,
                    source,
                });
            }
        }
        tracing::info!(machine = %name, node = %node_name, "node is being deleted, deleting its machine");
        return Ok(HealthOutcome::MachineDeleted);
    }
    let conditions: Option<Vec<NodeCondition>> = node.as_ref().map(|n| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
    });
    let types = machine.spec.node_condition_types();
    let current = machine
        .status
        .as_ref()
        .and_then(|s| s.current_status.as_ref());
    let phase_since = current
        .and_then(|c| c.last_update_time.as_ref())
        .map_or_else(|| created_at(machine), |t| t.0);
    let phase = machine.phase();
    let deferred_check = phase == Some(&MachinePhase::Unknown)
        && another_failed_in_deployment_of(ctx, machine).await?;
    let decision = evaluate_health(&HealthInput {
        machine_name: &name,
        phase,
        phase_since,
        node_conditions: conditions.as_deref(),
        unhealthy_types: &types,
        timeouts: *timeouts,
        another_failed_in_deployment: deferred_check,
        now: now(),
    });
    let base = machine.status.clone().unwrap_or_default();
    let mut next = decision
        .change
        .as_ref()
        .and_then(|c| c.apply(Some(&base), now()))
        .unwrap_or_else(|| base.clone());
    if let Some(conditions) = &conditions
        && !same_conditions(conditions, next.conditions.as_deref().unwrap_or_default())
    {
        next.conditions = Some(conditions.clone());
    }
    let mut updated = machine.clone();
    if let Some(written) = store_status(ctx, machine, next).await? {
        if let Some(op) = decision.change.as_ref().and_then(|c| c.operation.as_ref()) {
            tracing::info!(machine = %name, phase = ?written.phase(), "{}", op.description);
        }
        updated = written;
    }
    let mut recheck = decision.recheck_after;
    if decision.replacement_deferred {
        tracing::info!(machine = %name, "health timeout passed, but other machines are getting replaced");
        recheck = Some(ctx.retry.short);
    }
    if let Some(node) = &node {
        let node = sync_node(ctx, &updated, node).await?;
        sync_virtual_capacity(ctx, class, &node).await?;
    }
    Ok(HealthOutcome::Checked {
        machine: Box::new(updated),
        recheck,
    })
}

/// MCM's "another Machine of this MachineDeployment failed" (a replacement is deferred while one
/// is under way). Unsharded from the cache; sharded the other Machines of the deployment may be
/// on other shards, so from a fresh LIST by the deployment's label (asked only for a Machine in
/// phase `Unknown`).
async fn another_failed_in_deployment_of(ctx: &Context, machine: &Machine) -> Result<bool, Error> {
    if !ctx.sharded() {
        let cached = ctx.own_machines.store().state();
        return Ok(another_failed_in_deployment(
            machine,
            cached.iter().map(|m| &**m),
        ));
    }
    let Some(deployment) = machine
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_MACHINE_DEPLOYMENT))
    else {
        return Ok(false);
    };
    let selector = format!("{LABEL_MACHINE_DEPLOYMENT}={deployment}");
    let mut found = false;
    ctx.each_machine("the machines of its deployment", Some(&selector), |other| {
        found = found || another_failed_in_deployment(machine, [other]);
    })
    .await?;
    Ok(found)
}

fn node_view(node: &Node) -> Decoration {
    Decoration {
        labels: node.metadata.labels.clone().unwrap_or_default(),
        annotations: node.metadata.annotations.clone().unwrap_or_default(),
        taints: node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default(),
    }
}

/// Applies the node template, the machine-name label and the Node finalizer in one patch guarded
/// by the fields it replaces (see [`node_patch`]), or writes nothing when all are in place.
/// Returns the Node as it now is: the one written, or `node`.
async fn sync_node(ctx: &Context, machine: &Machine, node: &Arc<Node>) -> Result<Arc<Node>, Error> {
    let machine_name = machine.metadata.name.clone().unwrap_or_default();
    let current = node_view(node);
    let template = Decoration::of_template(machine.spec.node_template.as_ref());
    let mut next = sync_node_template(&current, &template).unwrap_or(current);
    next.labels
        .insert(NODE_LABEL_MACHINE_NAME.to_owned(), machine_name);
    let finalizers = finalizers_with(&node.metadata, FINALIZER_NODE);
    let Some(patch) = node_patch(node, &next, finalizers.as_deref()) else {
        return Ok(node.clone());
    };
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let api = ctx.nodes_api();
    let params = PatchParams::default();
    let written = ctx
        .own_nodes
        .write(
            node,
            api.patch(&node_name, &params, &Patch::Json::<()>(patch)),
        )
        .await
        .map_err(|source| Error::SyncNode {
            node: node_name.clone(),
            source,
        })?;
    tracing::debug!(node = %node_name, "node synced");
    Ok(written)
}

/// Adds the class's `nodeTemplate.virtualCapacity` to the Node's `status.capacity`, guarded by the
/// Node's resourceVersion (the kubelet owns that status and may have just rewritten it).
async fn sync_virtual_capacity(
    ctx: &Context,
    class: &MachineClass,
    node: &Node,
) -> Result<(), Error> {
    let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
    let virtual_capacity = class
        .spec
        .node_template
        .as_ref()
        .and_then(|t| t.virtual_capacity.as_ref());
    let missing = virtual_capacity_update(capacity, virtual_capacity);
    if missing.is_empty() {
        return Ok(());
    }
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "status": {"capacity": missing},
    });
    let api = ctx.nodes_api();
    let params = PatchParams::default();
    let patch = Patch::Merge(&patch);
    ctx.own_nodes
        .write(node, api.patch_status(&node_name, &params, &patch))
        .await
        .map_err(|source| Error::SyncVirtualCapacity {
            node: node_name,
            source,
        })?;
    Ok(())
}

async fn create_flow(
    ctx: &Context,
    machine: &Machine,
    request: MachineRequest,
    timeouts: &MachineTimeouts,
) -> Result<Next, Error> {
    let name = machine.metadata.name.clone().unwrap_or_default();
    // An existing VM (for example created before a restart) is adopted, not created twice.
    let info = match ctx.driver.get_machine_status(&request).await {
        Ok(status) => MachineInfo {
            provider_id: status.provider_id,
            node_name: status.node_name,
            last_known_state: machine
                .status
                .as_ref()
                .and_then(|s| s.last_known_state.clone())
                .unwrap_or_default(),
            addresses: status.addresses,
        },
        Err(e) if after_status_lookup(Some(e.code)) == VmLookup::Create => {
            match ctx.driver.create_machine(&request).await {
                Ok(info) => info,
                Err(e) => return creation_failed(ctx, machine, &e, timeouts).await,
            }
        }
        Err(e) => return creation_failed(ctx, machine, &e, timeouts).await,
    };
    match ctx.driver.initialize_machine(&request).await {
        Ok(_) => {}
        Err(e) if e.code == Code::Unimplemented => {}
        Err(e) => return creation_failed(ctx, machine, &e, timeouts).await,
    }

    // A Node of that name that belongs to another machine: this VM must not take it over.
    if let Some(node) = ctx.own_nodes.get(&ObjectRef::new(&info.node_name)) {
        let owner = node.labels().get(NODE_LABEL_MACHINE_NAME);
        if node_owned_by_another(owner.map(String::as_str), &name) {
            if let Err(e) = ctx.driver.delete_machine(&request).await {
                tracing::warn!(machine = %name, %e, "could not delete the VM that collided with an old node");
            }
            let change = StatusChange::phase(MachinePhase::Failed).with_operation(Operation::new(
                format!("VM using old node obj {}", info.node_name),
                MachineState::Failed,
                MachineOperationType::Create,
            ));
            apply_change(ctx, machine, &change).await?;
            return Ok(Next::Requeue(ctx.retry.long));
        }
    }

    let mut machine = machine.clone();
    let recorded_id = machine.spec.provider_id.as_deref().unwrap_or_default();
    if recorded_id != info.provider_id || machine.node_name() != Some(info.node_name.as_str()) {
        let patch = json!({"metadata": {"labels": {LABEL_NODE: info.node_name}}, "spec": {"providerID": info.provider_id}});
        let api = ctx.machines_api();
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        let written = ctx
            .own_machines
            .write(&machine, api.patch(&name, &params, &patch))
            .await
            .map_err(|source| Error::RecordProviderId {
                machine: name.clone(),
                source,
            })?;
        machine = Arc::unwrap_or_clone(written);
        tracing::info!(machine = %name, provider_id = %info.provider_id, node = %info.node_name, "machine created on provider");
    }
    let mut change = StatusChange::operation(Operation::new(
        CREATING,
        MachineState::Processing,
        MachineOperationType::Create,
    ));
    if matches!(machine.phase(), None | Some(MachinePhase::CrashLoopBackOff)) {
        change.phase = Some(MachinePhase::Pending);
        change.timeout_active = Some(true);
    }
    let base = machine.status.clone().unwrap_or_default();
    let mut next = change
        .apply(Some(&base), now())
        .unwrap_or_else(|| base.clone());
    if !info.addresses.is_empty() {
        next.addresses = Some(info.addresses.clone());
    }
    if !info.last_known_state.is_empty() {
        next.last_known_state = Some(info.last_known_state.clone());
    }
    store_status(ctx, &machine, next).await?;
    Ok(Next::Requeue(ctx.retry.short))
}

async fn creation_failed(
    ctx: &Context,
    machine: &Machine,
    error: &DriverError,
    timeouts: &MachineTimeouts,
) -> Result<Next, Error> {
    let failure = creation_failure(
        error.code,
        &error.message,
        created_at(machine),
        now(),
        timeouts.creation,
        &ctx.retry,
    );
    let old_phase = machine.phase().cloned();
    if let Some(written) = apply_change(ctx, machine, &failure.status).await?
        && written.phase().cloned() != old_phase
    {
        let note = format!("{} ({})", error.message, error.code);
        let event = Event::warning("CreateFailed", "Create", note);
        ctx.event(&machine.object_ref(&()), event).await;
    }
    tracing::info!(machine = ?machine.metadata.name, code = %error.code, retry = ?failure.retry_after, "machine creation failed");
    Ok(Next::Requeue(failure.retry_after))
}
