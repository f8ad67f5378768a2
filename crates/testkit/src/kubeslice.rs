//! A KubeSlice worker cluster's objects as its worker-operator makes them, for whatever runs the
//! gw-recycler against kube-sim (the scenarios, the chart's RBAC test, the demo, the bench): a
//! SliceGateway with its `status.config`, and the slice router pod running `router-sidecar`.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use capstan_apis::networking::SliceGateway;

use crate::objects::from_json;

/// Where the sidecars listen for gRPC on their pod IP (KubeSlice's port).
pub const SIDECAR_PORT: u16 = 5000;

/// Creates SliceGateway `namespace/name` of `slice` and writes its `status.config` (host type
/// `Server` or `Client`, the remote side's subnet) as the worker-operator does.
pub async fn create_slice_gateway(
    client: &kube::Client,
    namespace: &str,
    slice: &str,
    name: &str,
    host_type: &str,
    remote_subnet: &str,
) -> Result<SliceGateway, kube::Error> {
    let gateways: Api<SliceGateway> = Api::namespaced(client.clone(), namespace);
    let gateway = from_json(json!({
        "apiVersion": "networking.kubeslice.io/v1beta1", "kind": "SliceGateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"sliceName": slice}
    }));
    gateways.create(&PostParams::default(), &gateway).await?;
    let status = json!({"status": {"config": {
        "sliceName": slice, "sliceGatewayName": name, "sliceGatewayHostType": host_type,
        "sliceGatewayRemoteSubnet": remote_subnet
    }}});
    gateways
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
}

/// The name of `slice`'s router pod.
pub fn slice_router_name(slice: &str) -> String {
    format!("vl3-slice-router-{slice}")
}

/// `slice`'s router pod in `namespace` (labelled as the reference's selector finds it): a
/// container of `image` running `router-sidecar` with the memory backend on its pod IP, gRPC on
/// [`SIDECAR_PORT`], metrics on 8080, then `extra_args`.
pub fn slice_router_pod(namespace: &str, slice: &str, image: &str, extra_args: &[&str]) -> Pod {
    let listen = format!("$(POD_IP):{SIDECAR_PORT}");
    let mut args = vec![
        "--backend",
        "memory",
        "--listen",
        &listen,
        "--metrics-addr",
        "$(POD_IP):8080",
    ];
    args.extend_from_slice(extra_args);
    from_json(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": slice_router_name(slice), "namespace": namespace,
                     "labels": {"networkservicemesh.io/impl": format!("vl3-service-{slice}")}},
        "spec": {"containers": [{
            "name": "kubeslice-router-sidecar", "image": image,
            "command": ["router-sidecar"],
            "args": args,
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
        }]}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_pod_is_found_by_the_reference_selector_and_listens_on_its_pod_ip() {
        let pod = slice_router_pod("kubeslice-system", "red", "img", &["--log-level", "info"]);
        assert_eq!(pod.metadata.name.as_deref(), Some("vl3-slice-router-red"));
        assert_eq!(
            pod.metadata.labels.unwrap_or_default()["networkservicemesh.io/impl"],
            "vl3-service-red"
        );
        let container = &pod.spec.expect("spec").containers[0];
        assert_eq!(
            container.command.as_deref(),
            Some(&["router-sidecar".to_owned()][..])
        );
        let args = container.args.clone().unwrap_or_default().join(" ");
        assert_eq!(
            args,
            "--backend memory --listen $(POD_IP):5000 --metrics-addr $(POD_IP):8080 --log-level info"
        );
    }
}
