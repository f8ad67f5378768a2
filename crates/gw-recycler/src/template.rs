//! The gateway Deployment the slice gateway reconciler creates: KubeSlice's names and labels,
//! one replica running Capstan's `gw-sidecar` on the pod IP (memory backend: the NSM IP is the
//! pod IP, the tunnel `tun0` is UP, so each pod reports a distinct next hop).
//!
//! Placement as KubeSlice's worker-operator places gateways: required node affinity to nodes
//! labelled `kubeslice.io/node-type=gateway`, tolerations of that label's NoSchedule and NoExecute
//! taints, and a preferred (weight 100) pod anti-affinity on `kubernetes.io/hostname`, so a
//! recycled gateway is scheduled away from its SliceGateway's other instances where a node allows.
//! **Decision**: the anti-affinity selects the pods of the same SliceGateway (`kubeslice.io/slice-gw`),
//! not every gateway pod; preferred, not required, since make-before-break runs the old and the
//! new pod of an instance at once and two gateway nodes must be enough for two instances.

use std::collections::BTreeMap;

use capstan_apis::networking::{
    LABEL_NODE_TYPE, LABEL_POD_TYPE, LABEL_SLICE, LABEL_SLICE_GW, LABEL_SLICE_GW_DEP,
    LABEL_SLICEGW, NODE_TYPE_GATEWAY, POD_TYPE_SLICEGATEWAY, SIDECAR_GRPC_PORT,
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
                    "spec": {
                        "affinity": placement(slicegw),
                        "tolerations": tolerations(),
                        "containers": [{
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
                    }]
                    }
                }
            }
        });
        // Built from literals of the right shape; a failure would be a bug in this function.
        serde_json::from_value(value).unwrap_or_default()
    }
}

/// Tolerates the gateway nodes' taints (`kubeslice.io/node-type=gateway`, either effect).
fn tolerations() -> serde_json::Value {
    ["NoSchedule", "NoExecute"]
        .map(|effect| {
            json!({"key": LABEL_NODE_TYPE, "operator": "Equal", "value": NODE_TYPE_GATEWAY, "effect": effect})
        })
        .into()
}

/// Gateway nodes only; away from the SliceGateway's other pods where a node allows.
fn placement(slicegw: &str) -> serde_json::Value {
    json!({
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [
                {"key": LABEL_NODE_TYPE, "operator": "In", "values": [NODE_TYPE_GATEWAY]}
            ]}
        ]}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {
                "labelSelector": {"matchExpressions": [
                    {"key": LABEL_POD_TYPE, "operator": "In", "values": [POD_TYPE_SLICEGATEWAY]},
                    {"key": LABEL_SLICE_GW, "operator": "In", "values": [slicegw]}
                ]},
                "topologyKey": "kubernetes.io/hostname"
            }
        }]}
    })
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

    #[test]
    fn gateway_pods_go_to_gateway_nodes_away_from_their_gateways_other_pods() {
        let template = GatewayTemplate {
            image: "img:1".into(),
            extra_args: vec![],
        };
        let d = template.deployment("kubeslice-system", "red-a-b", "red", "red-a-b-1-0");
        let spec = d.spec.and_then(|s| s.template.spec).expect("a pod spec");
        let affinity = spec.affinity.expect("affinity");
        let required = affinity
            .node_affinity
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .expect("required node affinity");
        let term = &required.node_selector_terms[0]
            .match_expressions
            .as_ref()
            .expect("expressions")[0];
        assert_eq!(
            (
                term.key.as_str(),
                term.operator.as_str(),
                term.values.as_deref()
            ),
            (
                "kubeslice.io/node-type",
                "In",
                Some(&["gateway".to_owned()][..])
            )
        );
        let preferred = affinity
            .pod_anti_affinity
            .and_then(|a| a.preferred_during_scheduling_ignored_during_execution)
            .expect("preferred pod anti-affinity");
        assert_eq!(preferred[0].weight, 100);
        let term = &preferred[0].pod_affinity_term;
        assert_eq!(term.topology_key, "kubernetes.io/hostname");
        let selects: Vec<(String, Vec<String>)> = term
            .label_selector
            .as_ref()
            .and_then(|s| s.match_expressions.clone())
            .expect("expressions")
            .into_iter()
            .map(|e| (e.key, e.values.unwrap_or_default()))
            .collect();
        assert_eq!(
            selects,
            [
                (
                    "kubeslice.io/pod-type".to_owned(),
                    vec!["slicegateway".to_owned()]
                ),
                (
                    "kubeslice.io/slice-gw".to_owned(),
                    vec!["red-a-b".to_owned()]
                ),
            ]
        );
        let tolerated: Vec<_> = spec
            .tolerations
            .expect("tolerations")
            .into_iter()
            .map(|t| (t.key, t.value, t.effect))
            .collect();
        let gateway = |effect: &str| {
            (
                Some("kubeslice.io/node-type".to_owned()),
                Some("gateway".to_owned()),
                Some(effect.to_owned()),
            )
        };
        assert_eq!(tolerated, [gateway("NoSchedule"), gateway("NoExecute")]);
    }
}
