//! Defaulting of built-in kinds, as kube-apiserver's `SetDefaults_*` functions do for the fields
//! clients most often observe (so that controllers see the objects they would see on a cluster).

use crate::registry::ResourceInfo;
use serde_json::{Value, json};

fn set_default(obj: &mut Value, key: &str, value: Value) {
    if let Some(m) = obj.as_object_mut() {
        m.entry(key.to_string()).or_insert(value);
    }
}

fn default_container(c: &mut Value) {
    let image = c["image"].as_str().unwrap_or_default();
    let tag = image.rsplit('/').next().unwrap_or_default();
    let pull = if image.contains('@') || (tag.contains(':') && !tag.ends_with(":latest")) {
        "IfNotPresent"
    } else {
        "Always"
    };
    set_default(c, "imagePullPolicy", json!(pull));
    set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
    set_default(c, "terminationMessagePolicy", json!("File"));
    set_default(c, "resources", json!({}));
    if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            set_default(p, "protocol", json!("TCP"));
        }
    }
}

/// `SetDefaults_PodSpec` and its containers.
pub fn default_pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    for list in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                default_container(c);
            }
        }
    }
}

/// `SetDefaults_Job`, and the selector and pod labels kube-apiserver generates from the uid
/// (unless `manualSelector`), which a Job without labels of its own then carries too.
fn default_job(obj: &mut Value) {
    let uid = obj["metadata"]["uid"].clone();
    let name = obj["metadata"]["name"].clone();
    let spec = &mut obj["spec"];
    if spec["completions"].is_null() && spec["parallelism"].is_null() {
        spec["completions"] = json!(1);
    }
    set_default(spec, "parallelism", json!(1));
    set_default(spec, "backoffLimit", json!(6));
    set_default(spec, "completionMode", json!("NonIndexed"));
    set_default(spec, "suspend", json!(false));
    set_default(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
    if spec["manualSelector"] != json!(true) && spec["selector"].is_null() && uid.is_string() {
        spec["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
        let labels = &mut spec["template"]["metadata"]["labels"];
        if !labels.is_object() {
            *labels = json!({});
        }
        for (k, v) in [
            ("batch.kubernetes.io/controller-uid", &uid),
            ("batch.kubernetes.io/job-name", &name),
            ("controller-uid", &uid),
            ("job-name", &name),
        ] {
            labels[k] = v.clone();
        }
    }
    default_pod_spec(&mut spec["template"]["spec"]);
    // `SetDefaults_Job`: a Job without labels takes its template's (so `kubectl get jobs -l
    // job-name=...` finds it, as on kube-apiserver, where defaulting runs again on read).
    let template_labels = obj["spec"]["template"]["metadata"]["labels"].clone();
    let labels = &mut obj["metadata"]["labels"];
    if template_labels.as_object().is_some_and(|l| !l.is_empty())
        && labels.as_object().is_none_or(|l| l.is_empty())
    {
        *labels = template_labels;
    }
}

/// Applies the built-in defaults of a kind in place (custom resources use their schema instead).
pub fn apply(info: &ResourceInfo, obj: &mut Value) {
    if info.custom {
        return;
    }
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "pods") => {
            default_pod_spec(&mut obj["spec"]);
            if obj["spec"].is_object() {
                set_default(&mut obj["spec"], "enableServiceLinks", json!(true));
                set_default(&mut obj["spec"], "serviceAccountName", json!("default"));
                set_default(&mut obj["spec"], "priority", json!(0));
            }
        }
        ("apps", "deployments") => {
            let spec = &mut obj["spec"];
            if !spec.is_object() {
                return;
            }
            set_default(spec, "replicas", json!(1));
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(spec, "progressDeadlineSeconds", json!(600));
            set_default(spec, "strategy", json!({"type": "RollingUpdate"}));
            if spec["strategy"]["type"] == "RollingUpdate" {
                set_default(&mut spec["strategy"], "rollingUpdate", json!({}));
                set_default(
                    &mut spec["strategy"]["rollingUpdate"],
                    "maxUnavailable",
                    json!("25%"),
                );
                set_default(
                    &mut spec["strategy"]["rollingUpdate"],
                    "maxSurge",
                    json!("25%"),
                );
            }
            default_pod_spec(&mut spec["template"]["spec"]);
        }
        ("apps", "replicasets") if obj["spec"].is_object() => {
            set_default(&mut obj["spec"], "replicas", json!(1));
            default_pod_spec(&mut obj["spec"]["template"]["spec"]);
        }
        ("apps", "daemonsets") if obj["spec"].is_object() => {
            let spec = &mut obj["spec"];
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(spec, "updateStrategy", json!({"type": "RollingUpdate"}));
            if spec["updateStrategy"]["type"] == "RollingUpdate" {
                set_default(
                    &mut spec["updateStrategy"],
                    "rollingUpdate",
                    json!({"maxUnavailable": 1, "maxSurge": 0}),
                );
            }
            default_pod_spec(&mut spec["template"]["spec"]);
        }
        ("", "replicationcontrollers") if obj["spec"].is_object() => {
            // An RC without a selector selects its template's labels, and is labelled with them.
            let labels = obj["spec"]["template"]["metadata"]["labels"].clone();
            if labels.is_object() {
                if obj["spec"]["selector"]
                    .as_object()
                    .is_none_or(|s| s.is_empty())
                {
                    obj["spec"]["selector"] = labels.clone();
                }
                if obj["metadata"]["labels"]
                    .as_object()
                    .is_none_or(|l| l.is_empty())
                {
                    obj["metadata"]["labels"] = labels;
                }
            }
            set_default(&mut obj["spec"], "replicas", json!(1));
            default_pod_spec(&mut obj["spec"]["template"]["spec"]);
        }
        ("batch", "jobs") if obj["spec"].is_object() => default_job(obj),
        ("", "services") => {
            let spec = &mut obj["spec"];
            if !spec.is_object() {
                return;
            }
            set_default(spec, "type", json!("ClusterIP"));
            set_default(spec, "sessionAffinity", json!("None"));
            if spec["type"] != "ExternalName" {
                set_default(spec, "ipFamilies", json!(["IPv4"]));
                set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
                set_default(spec, "internalTrafficPolicy", json!("Cluster"));
            }
            if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports {
                    set_default(p, "protocol", json!("TCP"));
                    let port = p["port"].clone();
                    set_default(p, "targetPort", port);
                }
            }
        }
        ("", "secrets") => set_default(obj, "type", json!("Opaque")),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn deployment_defaults_like_kube_apiserver() {
        let reg = Registry::default();
        let info = reg
            .lookup("apps", "v1", "deployments")
            .expect("deployments")
            .clone();
        let mut d = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "nginx:1.25", "ports": [{"containerPort": 80}]},
            {"name": "b", "image": "busybox"}]}}}});
        apply(&info, &mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        let cs = &d["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs[0]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(cs[1]["imagePullPolicy"], "Always");
        assert_eq!(cs[0]["ports"][0]["protocol"], "TCP");
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
        let mut explicit = json!({"spec": {"replicas": 0, "strategy": {"type": "Recreate"}}});
        apply(&info, &mut explicit);
        assert_eq!(explicit["spec"]["replicas"], 0);
        assert!(explicit["spec"]["strategy"].get("rollingUpdate").is_none());
    }

    #[test]
    fn service_ports_default_target_port() {
        let reg = Registry::default();
        let info = reg.lookup("", "v1", "services").expect("services").clone();
        let mut s = json!({"spec": {"ports": [{"port": 443}]}});
        apply(&info, &mut s);
        assert_eq!(s["spec"]["ports"][0]["targetPort"], 443);
        assert_eq!(s["spec"]["type"], "ClusterIP");
    }
}
