//! What a container process is started with, as kubelet computes it: the environment from the
//! container's `env` (plain values, `fieldRef`s to the pod), then `$(VAR)` expansion of env
//! values, command and args (`$$` escapes a `$`, unknown references stay as written).

use serde_json::Value;
use std::collections::BTreeMap;

/// Expands `$(NAME)` references in `input` from `vars`, as Kubernetes' `expansion.Expand`:
/// `$$` is a literal `$`, `$(UNKNOWN)` and an unterminated `$(` stay as written.
pub fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match vars.get(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The value of a `fieldRef` the kubelet resolves; `None` for paths it does not support.
fn field_value(pod: &Value, pod_ip: &str, path: &str) -> Option<String> {
    match path {
        "status.podIP" => Some(pod_ip.to_string()),
        "metadata.name" => pod["metadata"]["name"].as_str().map(String::from),
        "metadata.namespace" => pod["metadata"]["namespace"].as_str().map(String::from),
        "metadata.uid" => pod["metadata"]["uid"].as_str().map(String::from),
        "spec.nodeName" => pod["spec"]["nodeName"].as_str().map(String::from),
        "spec.serviceAccountName" => pod["spec"]["serviceAccountName"].as_str().map(String::from),
        "status.hostIP" => pod["status"]["hostIP"].as_str().map(String::from),
        _ => {
            // `metadata.annotations['KEY']` and `metadata.labels['KEY']` (an Indexed Job's
            // JOB_COMPLETION_INDEX reads its annotation this way).
            let (map, rest) = path
                .strip_prefix("metadata.annotations[")
                .map(|rest| ("annotations", rest))
                .or_else(|| path.strip_prefix("metadata.labels[").map(|r| ("labels", r)))?;
            let key = rest
                .strip_suffix(']')?
                .trim_matches(|c| c == '\'' || c == '"');
            Some(
                pod["metadata"][map][key]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        }
    }
}

/// The container's environment, in declaration order; each value may refer to earlier ones.
pub fn container_env(pod: &Value, container: &Value, pod_ip: &str) -> Vec<(String, String)> {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut ordered: Vec<(String, String)> = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let Some(name) = e["name"].as_str() else {
            continue;
        };
        let value = if let Some(v) = e["value"].as_str() {
            expand(v, &vars)
        } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            field_value(pod, pod_ip, path).unwrap_or_default()
        } else {
            String::new()
        };
        vars.insert(name.to_string(), value.clone());
        ordered.retain(|(k, _)| k != name);
        ordered.push((name.to_string(), value));
    }
    ordered
}

/// `command` and `args` after expansion against the container's environment.
pub fn command_line(container: &Value, env: &[(String, String)]) -> (Vec<String>, Vec<String>) {
    let vars: BTreeMap<String, String> = env.iter().cloned().collect();
    let list = |key: &str| -> Vec<String> {
        container[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|s| expand(s, &vars))
            .collect()
    };
    (list("command"), list("args"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let v = vars(&[("POD_IP", "127.10.0.7"), ("PORT", "5000")]);
        assert_eq!(expand("$(POD_IP):$(PORT)", &v), "127.10.0.7:5000");
        assert_eq!(expand("$$(POD_IP)", &v), "$(POD_IP)");
        assert_eq!(expand("cost $$5", &v), "cost $5");
        assert_eq!(expand("$(MISSING)-x", &v), "$(MISSING)-x");
        assert_eq!(expand("$(POD_IP", &v), "$(POD_IP");
        assert_eq!(expand("a$b", &v), "a$b");
        assert_eq!(expand("end$", &v), "end$");
    }

    #[test]
    fn env_resolves_field_refs_and_earlier_variables() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"team": "net"},
            "annotations": {"batch.kubernetes.io/job-completion-index": "2"}},
            "spec": {"nodeName": "n1"}});
        let c = json!({"env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
            {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
            {"name": "ADDR", "value": "$(POD_IP):5000"},
            {"name": "LATER", "value": "$(UNSET)"}],
            "command": ["server"], "args": ["--listen", "$(ADDR)", "$$(ADDR)"]});
        let env = container_env(&pod, &c, "127.10.0.3");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("POD_IP"), Some("127.10.0.3"));
        assert_eq!(get("NAME"), Some("p"));
        assert_eq!(get("NS"), Some("ns"));
        assert_eq!(get("NODE"), Some("n1"));
        assert_eq!(get("INDEX"), Some("2"));
        assert_eq!(get("TEAM"), Some("net"));
        assert_eq!(get("ADDR"), Some("127.10.0.3:5000"));
        assert_eq!(get("LATER"), Some("$(UNSET)"));
        let (cmd, args) = command_line(&c, &env);
        assert_eq!(cmd, vec!["server"]);
        assert_eq!(args, vec!["--listen", "127.10.0.3:5000", "$(ADDR)"]);
    }
}
