//! What can go wrong in one reconcile: one variant per step, carrying what the step was working
//! on. Each has a short snake_case label for metrics and spans; a 409 in the source makes the
//! controller kit retry soon (the watch brings the newer object) instead of backing off.

use capstan_runtime::ErrorLabel;
use capstan_runtime::controller::ReconcileFailure;

use crate::sidecars::SidecarError;

#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ReconcileError {
    #[error("creating gateway deployment {deployment}: {source}")]
    CreateDeployment {
        deployment: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting marked gateway deployment {deployment}: {source}")]
    DeleteDeployment {
        deployment: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing status.gatewayPodStatus of SliceGateway {gateway}: {source}")]
    WriteGatewayPodStatus {
        gateway: String,
        #[source]
        source: kube::Error,
    },
    #[error("pushing the next hops of SliceGateway {gateway} to router {router}: {source}")]
    PushNextHops {
        gateway: String,
        router: String,
        #[source]
        source: SidecarError,
    },
    #[error("editing the intermediate deployments of SliceGateway {gateway}: {source}")]
    EditIntermediate {
        gateway: String,
        #[source]
        source: kube::Error,
    },
    #[error("labelling gateway pod {pod} exclude-gw-route: {source}")]
    ExcludeGatewayPod {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("labelling gateway deployment {deployment} marked-for-deletion: {source}")]
    MarkForDeletion {
        deployment: String,
        #[source]
        source: kube::Error,
    },
    #[error("withdrawing the route via {nsm_ip} from router {router}: {source}")]
    WithdrawRoute {
        router: String,
        nsm_ip: String,
        #[source]
        source: SidecarError,
    },
    #[error("writing spec.state of recycler {recycler}: {source}")]
    WriteState {
        recycler: String,
        #[source]
        source: kube::Error,
    },
    #[error("recording the failure of recycler {recycler}: {source}")]
    WriteCondition {
        recycler: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing status.client.response of recycler {recycler}: {source}")]
    WriteResponse {
        recycler: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting finished recycler {recycler}: {source}")]
    DeleteFinished {
        recycler: String,
        #[source]
        source: kube::Error,
    },
    #[error("triggering a rebalancing recycle of deployment {deployment}: {source}")]
    TriggerRebalance {
        deployment: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "no gateway pod of SliceGateway {gateway} is known to carry traffic and the sidecars of \
         {pods:?} did not answer GetStatus: the router keeps its next hops"
    )]
    SidecarsSilent { gateway: String, pods: Vec<String> },
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

/// The label is the variant's name in snake case (`strum::IntoStaticStr`).
impl ErrorLabel for ReconcileError {
    fn metric_label(&self) -> &'static str {
        self.into()
    }
}

impl ReconcileFailure for ReconcileError {}
