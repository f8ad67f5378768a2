//! Secret reconcile: `machine.sapcloud.io/machine-controller` while some MachineClass references
//! the Secret (by `secretRef` or `credentialsSecretRef`, namespace and name).

use std::sync::Arc;

use capstan_apis::machine::FINALIZER_SECRET;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::controller::Action;
use machineclass_core::meta::{finalizers_with, finalizers_without, has_finalizer};
use machineclass_core::secret::{SecretAction, decide_secret};

use crate::context::{Ctx, key, lock};
use crate::error::Error;
use crate::io::patch_finalizers;

pub async fn reconcile(secret: Arc<Secret>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let mut measure = ctx.metrics.measure("Secret");
    let result = reconcile_inner(&secret, &ctx).await;
    if let Err(e) = &result {
        measure.set_failure(e);
    }
    result
}

async fn reconcile_inner(secret: &Secret, ctx: &Ctx) -> Result<Action, Error> {
    if let Some(hold) = ctx.hold_writes() {
        return Ok(hold);
    }
    let secret_key = key(
        secret.metadata.namespace.as_deref().unwrap_or_default(),
        secret.metadata.name.as_deref().unwrap_or_default(),
    );
    let referenced = lock(&ctx.secret_index).referrer_count(&secret_key) > 0;
    let api = ctx.secrets_api();
    let finalized = has_finalizer(&secret.metadata, FINALIZER_SECRET);
    let list = match decide_secret(finalized, referenced) {
        SecretAction::AddFinalizer => finalizers_with(&secret.metadata, FINALIZER_SECRET),
        SecretAction::RemoveFinalizer => finalizers_without(&secret.metadata, FINALIZER_SECRET),
        SecretAction::Unchanged => None,
    };
    if let Some(list) = list {
        patch_finalizers(&api, &secret.metadata, list).await?;
        tracing::info!(secret = %secret_key, referenced, "secret finalizer updated");
    }
    Ok(Action::requeue(ctx.retry.long))
}

pub fn error_policy(_secret: Arc<Secret>, error: &Error, ctx: Arc<Ctx>) -> Action {
    tracing::debug!(%error, "secret reconcile failed");
    match error {
        Error::Conflict(_) => Action::requeue(ctx.retry.conflict),
        _ => Action::requeue(ctx.retry.short),
    }
}
