//! Object builders for the objects every suite creates: written as the JSON a user would apply
//! (so a test reads like a manifest), typed on the way out. A builder panics on a malformed
//! object: that is a bug in the test, not input under test.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Secret};
use serde_json::{Value, json};

/// `value` as a typed object; panics naming the type when it does not fit.
pub fn from_json<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).unwrap_or_else(|e| {
        panic!(
            "test object is not a valid {}: {e}",
            std::any::type_name::<K>()
        )
    })
}

fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A Namespace `name`.
pub fn namespace(name: &str) -> Namespace {
    from_json(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
}

/// A Node `name` with `labels` (no spec, no status: kube-sim's testbed adds Ready nodes).
pub fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    from_json(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": string_map(labels)}
    }))
}

/// ConfigMap `namespace/name` holding `data`.
pub fn config_map(namespace: &str, name: &str, data: &[(&str, &str)]) -> ConfigMap {
    from_json(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": string_map(data)
    }))
}

/// Secret `namespace/name` whose `data` values are already base64 (as a manifest writes them).
pub fn secret(namespace: &str, name: &str, data: &[(&str, &str)]) -> Secret {
    from_json(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "data": string_map(data)
    }))
}

/// MachineClass `namespace/name` of the simulated provider, its credentials in Secret
/// `namespace/secret`, with `provider_spec` and a 2-CPU/8Gi node template.
pub fn machine_class(namespace: &str, name: &str, secret: &str, provider_spec: Value) -> Value {
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
        "metadata": {"name": name, "namespace": namespace},
        "provider": "simulated",
        "providerSpec": provider_spec,
        "secretRef": {"name": secret, "namespace": namespace},
        "nodeTemplate": {
            "capacity": {"cpu": "2", "gpu": "0", "memory": "8Gi"},
            "instanceType": "sim.large", "region": "sim-1", "zone": "sim-1a"
        }
    })
}

/// Machine `namespace/name` of MachineClass `class`, labelled `name=<deployment>` as a
/// MachineDeployment's machines are, with `extra_spec` merged into its spec.
pub fn machine(
    namespace: &str,
    name: &str,
    deployment: &str,
    class: &str,
    extra_spec: Value,
) -> Value {
    let mut spec = json!({"class": {"kind": "MachineClass", "name": class}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "namespace": namespace, "labels": {"name": deployment}},
        "spec": spec
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_make_the_objects_they_name() {
        let node = node("n1", &[("zone", "a")]);
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
        assert_eq!(node.metadata.labels.unwrap_or_default()["zone"], "a");
        let cm = config_map("koordinator-system", "cfg", &[("k", "v")]);
        assert_eq!(cm.metadata.namespace.as_deref(), Some("koordinator-system"));
        assert_eq!(cm.data.unwrap_or_default()["k"], "v");
        let secret = secret("default", "s", &[("userData", "Y2xvdWQtaW5pdA==")]);
        assert_eq!(
            secret.data.unwrap_or_default()["userData"].0,
            b"cloud-init".to_vec()
        );
        let machine = machine("default", "m", "md-1", "c", json!({"nodeTemplate": {}}));
        assert_eq!(machine["spec"]["class"]["name"], "c");
        assert_eq!(machine["spec"]["nodeTemplate"], json!({}));
        assert_eq!(machine["metadata"]["labels"]["name"], "md-1");
    }

    #[test]
    #[should_panic(expected = "not a valid")]
    fn a_malformed_object_names_its_type() {
        let _: Node = from_json(json!({"metadata": {"name": 5}}));
    }
}
