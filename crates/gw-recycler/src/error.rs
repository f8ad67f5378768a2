//! What can go wrong in one reconcile; every variant is retried on the next pass.

use crate::sidecars::SidecarError;

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Sidecar(#[from] SidecarError),
    #[error("SliceGateway {0} is not in the cache")]
    GatewayMissing(String),
    #[error("SliceGateway {gateway} has no {field}")]
    GatewayField {
        gateway: String,
        field: &'static str,
    },
    #[error("no Running slice router for slice {0}")]
    RouterMissing(String),
}

impl ReconcileError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Kube(e) if is_conflict(e) => "conflict",
            ReconcileError::Kube(_) => "kube",
            ReconcileError::Sidecar(e) => e.metric_label(),
            ReconcileError::GatewayMissing(_) => "gateway_missing",
            ReconcileError::GatewayField { .. } => "gateway_field",
            ReconcileError::RouterMissing(_) => "router_missing",
        }
    }
}

impl capstan_runtime::ErrorLabel for ReconcileError {
    fn metric_label(&self) -> &'static str {
        ReconcileError::metric_label(self)
    }
}

pub fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 409)
}

pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}
