//! The gateway Deployment the slice gateway reconciler creates: KubeSlice's names and labels,
//! one replica running Capstan's `gw-sidecar` on the pod IP (memory backend: the NSM IP is the
//! pod IP, the tunnel `tun0` is UP, so each pod reports a distinct next hop).

use std::collections::BTreeMap;

use capstan_apis::networking::{
    LABEL_POD_TYPE, LABEL_SLICE, LABEL_SLICE_GW, LABEL_SLICE_GW_DEP, LABEL_SLICEGW,
    POD_TYPE_SLICEGATEWAY, SIDECAR_GRPC_PORT,
};
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;

/// What varies between gateway Deployments of a cluster.
#[derive(Debug, Clone)]
pub struct GatewayTemplate {
    pub image: String,
    /// Appended to the `gw-sidecar` arguments.
    pub extra_args: Vec<String>,
}

/// The default image: Capstan's, at this build's version (the chart's).
pub fn default_image() -> String {
    format!("ghcr.io/capstan/capstan:{}", env!("CARGO_PKG_VERSION"))
}

impl GatewayTemplate {
    pub fn deployment(
        &self,
        namespace: &str,
        slicegw: &str,
        slice: &str,
        name: &str,
    ) -> Deployment {
        let deployment_labels: BTreeMap<&str, &str> = [
            (LABEL_SLICE, slice),
            (LABEL_POD_TYPE, POD_TYPE_SLICEGATEWAY),
            (LABEL_SLICEGW, slicegw),
        ]
        .into();
        let mut pod_labels = deployment_labels.clone();
        pod_labels.insert(LABEL_SLICE_GW, slicegw);
        pod_labels.insert(LABEL_SLICE_GW_DEP, name);
        let mut args: Vec<String> = [
            "--backend",
            "memory",
            "--listen",
            &format!("$(POD_IP):{SIDECAR_GRPC_PORT}"),
            "--metrics-addr",
            "$(POD_IP):8080",
            "--nsm-ip",
            "$(POD_IP)",
            "--tunnel-interface",
            "tun0",
        ]
        .map(str::to_owned)
        .into();
        args.extend(self.extra_args.iter().cloned());
        let value = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": deployment_labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {LABEL_SLICE_GW: slicegw, LABEL_SLICE_GW_DEP: name}},
                "template": {
                    "metadata": {"labels": pod_labels},
                    "spec": {"containers": [{
                        "name": "kubeslice-sidecar",
                        "image": self.image,
                        "command": ["gw-sidecar"],
                        "args": args,
                        "env": [
                            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                            {"name": "HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                        ],
                        "ports": [{"name": "grpc", "containerPort": SIDECAR_GRPC_PORT}]
                    }]}
                }
            }
        });
        // Built from literals of the right shape; a failure would be a bug in this function.
        serde_json::from_value(value).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_deployment_has_the_reference_labels_and_runs_gw_sidecar_on_the_pod_ip() {
        let template = GatewayTemplate {
            image: "img:1".into(),
            extra_args: vec!["--log-level=debug".into()],
        };
        let d = template.deployment("kubeslice-system", "red-a-b", "red", "red-a-b-0-1");
        let v = serde_json::to_value(&d).expect("json");
        assert_eq!(v["metadata"]["name"], "red-a-b-0-1");
        assert_eq!(v["metadata"]["labels"]["kubeslice.io/slice"], "red");
        assert_eq!(
            v["metadata"]["labels"]["kubeslice.io/pod-type"],
            "slicegateway"
        );
        assert_eq!(v["metadata"]["labels"]["kubeslice.io/slicegw"], "red-a-b");
        let pod = &v["spec"]["template"];
        assert_eq!(
            pod["metadata"]["labels"]["kubeslice.io/slice-gw"],
            "red-a-b"
        );
        assert_eq!(
            pod["metadata"]["labels"]["kubeslice.io/slice-gw-dep"],
            "red-a-b-0-1"
        );
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["command"][0], "gw-sidecar");
        let args = c["args"].as_array().expect("args");
        assert_eq!(
            args[..4],
            [
                json!("--backend"),
                json!("memory"),
                json!("--listen"),
                json!("$(POD_IP):5000")
            ]
        );
        assert_eq!(
            c["args"].as_array().expect("args").last(),
            Some(&json!("--log-level=debug"))
        );
        assert_eq!(
            c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
            "status.podIP"
        );
        assert!(default_image().starts_with("ghcr.io/capstan/capstan:"));
    }
}
