//! Secret reconcile: `machine.sapcloud.io/machine-controller` while some MachineClass references
//! the Secret (by `secretRef` or `credentialsSecretRef`, namespace and name).

use std::sync::Arc;

use capstan_apis::machine::FINALIZER_SECRET;
use capstan_runtime::controller::Target;
use capstan_runtime::runner::Next;
use capstan_runtime::sync::lock;
use k8s_openapi::api::core::v1::Secret;
use machineclass_core::meta::{finalizers_with, finalizers_without, has_finalizer};
use machineclass_core::secret::{SecretAction, decide_secret};

use crate::context::{Context, key};
use crate::error::Error;
use crate::io::patch_finalizers;

pub async fn reconcile(secret: Arc<Secret>, ctx: Arc<Context>) -> Result<Next, Error> {
    let target = Target::of("Secret", &*secret);
    ctx.reconciler
        .reconcile(target, reconcile_inner(&secret, &ctx))
        .await
}

async fn reconcile_inner(secret: &Secret, ctx: &Context) -> Result<Next, Error> {
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
    Ok(Next::Requeue(ctx.retry.long))
}
