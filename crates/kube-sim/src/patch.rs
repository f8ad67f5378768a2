//! Patch formats: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and Kubernetes strategic merge patch.

use serde_json::{Map, Value};

/// The key that identifies items of a list of objects in built-in kinds (`patchMergeKey`),
/// decided by the list's field name and, for `ports`, by the items themselves.
pub fn builtin_merge_key(field: &str, items: &[Value]) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "secrets"
        | "resourceClaims" => Some("name"),
        "ports" => {
            if items.iter().any(|i| i.get("containerPort").is_some()) {
                Some("containerPort")
            } else {
                Some("port")
            }
        }
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" | "addresses" => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        "topologySpreadConstraints" => Some("topologyKey"),
        _ => None,
    }
}

/// Lists of scalars merged as sets (`patchStrategy: merge` on primitives).
pub fn is_set_list(field: &str) -> bool {
    field == "finalizers"
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatchError {
    /// The patch document itself is malformed (400).
    #[error("{0}")]
    Malformed(String),
    /// The patch is well formed but cannot be applied to the object (422).
    #[error("{0}")]
    Failed(String),
}

/// Applies an RFC 6902 JSON patch.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| PatchError::Malformed(e.to_string()))?;
    let mut work = doc.clone();
    for op in ops.0 {
        // Like Go's json-patch, `test` of null against a missing path succeeds (kube-rs relies on it).
        if let json_patch::PatchOperation::Test(t) = &op
            && t.value.is_null()
            && work.pointer(t.path.as_str()).is_none()
        {
            continue;
        }
        json_patch::patch(&mut work, &[op]).map_err(|e| match e.kind {
            // Go's json-patch (evanphx v4) words it so, and clients match on it.
            json_patch::PatchErrorKind::TestFailed => {
                PatchError::Failed(format!("testing value {} failed: test failed", e.path))
            }
            _ => PatchError::Failed(e.to_string()),
        })?;
    }
    *doc = work;
    Ok(())
}

/// Applies an RFC 7386 JSON merge patch.
pub fn merge_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    if !patch.is_object() {
        return Err(PatchError::Malformed(
            "merge patch must be a JSON object".into(),
        ));
    }
    json_patch::merge(doc, patch);
    Ok(())
}

/// Removes `$patch`, `$setElementOrder/...`, `$retainKeys` and `$deleteFromPrimitiveList/...` directives.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// Applies a strategic merge patch to a built-in object.
pub fn strategic_merge_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    if !patch.is_object() {
        return Err(PatchError::Malformed(
            "strategic merge patch must be a JSON object".into(),
        ));
    }
    smp_object(doc, patch);
    Ok(())
}

fn smp_object(doc: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else { return };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *doc = strip_directives(patch);
            return;
        }
        Some("delete") => {
            *doc = Value::Object(Map::new());
            return;
        }
        _ => {}
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(d) = doc else { return };
    for (key, pv) in p {
        if let Some(list) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(del)) = (d.get_mut(list), pv) {
                items.retain(|i| !del.contains(i));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        match pv {
            Value::Null => {
                d.remove(key);
            }
            Value::Object(po) if po.get("$patch").and_then(Value::as_str) == Some("delete") => {
                d.remove(key);
            }
            Value::Object(_) => smp_object(d.entry(key.clone()).or_insert(Value::Null), pv),
            Value::Array(items) => {
                let target = d.entry(key.clone()).or_insert_with(|| Value::Array(vec![]));
                smp_list(target, items, key);
            }
            other => {
                d.insert(key.clone(), other.clone());
            }
        }
    }
}

fn smp_list(doc: &mut Value, patch: &[Value], field: &str) {
    let objects = !patch.is_empty() && patch.iter().all(Value::is_object);
    if objects
        && patch
            .iter()
            .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *doc = Value::Array(
            patch
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .map(strip_directives)
                .collect(),
        );
        return;
    }
    let existing = doc.as_array().cloned().unwrap_or_default();
    let key = if objects {
        builtin_merge_key(field, patch)
    } else {
        None
    };
    match key {
        Some(key) => {
            let mut out = existing;
            for item in patch {
                let id = &item[key];
                let pos = out.iter().position(|e| &e[key] == id);
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    if let Some(pos) = pos {
                        out.remove(pos);
                    }
                    continue;
                }
                match pos {
                    Some(pos) => smp_object(&mut out[pos], item),
                    None => out.push(strip_directives(item)),
                }
            }
            *doc = Value::Array(out);
        }
        None if is_set_list(field) => {
            let mut out = existing;
            for item in patch {
                if !out.contains(item) {
                    out.push(item.clone());
                }
            }
            *doc = Value::Array(out);
        }
        None => *doc = Value::Array(patch.iter().map(strip_directives).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_merges_containers_env_and_ports_by_key() {
        let mut doc = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}], "ports": [{"containerPort": 80}]},
            {"name": "b", "image": "b:1"}]}}}});
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [
            {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}], "ports": [{"containerPort": 80, "name": "http"}]},
            {"name": "c", "image": "c:1"},
            {"name": "b", "$patch": "delete"}]}}}});
        strategic_merge_patch(&mut doc, &patch).expect("patch applies");
        let cs = &doc["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs.as_array().map(Vec::len), Some(2));
        assert_eq!(cs[0]["image"], "a:2");
        assert_eq!(
            cs[0]["env"],
            json!([{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}])
        );
        assert_eq!(
            cs[0]["ports"],
            json!([{"containerPort": 80, "name": "http"}])
        );
        assert_eq!(cs[1]["name"], "c");
        assert!(
            doc["spec"]["template"]["spec"]
                .get("$setElementOrder/containers")
                .is_none()
        );
    }

    #[test]
    fn strategic_merge_conditions_finalizers_and_nulls() {
        let mut doc = json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}, "spec": {"args": ["1", "2"]}});
        let patch = json!({"metadata": {"finalizers": ["b"], "labels": {"x": null}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Synced", "status": "True"}]},
            "spec": {"args": ["3"]}});
        strategic_merge_patch(&mut doc, &patch).expect("patch applies");
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(doc["metadata"]["labels"], json!({"y": "2"}));
        assert_eq!(doc["status"]["conditions"][0]["status"], "True");
        assert_eq!(doc["status"]["conditions"][1]["type"], "Synced");
        assert_eq!(doc["spec"]["args"], json!(["3"]));
        let mut doc2 = json!({"metadata": {"finalizers": ["a", "b"]}});
        strategic_merge_patch(
            &mut doc2,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .expect("patch applies");
        assert_eq!(doc2["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn json_patch_test_op_fails_cleanly() {
        let mut doc = json!({"metadata": {"finalizers": ["a"]}});
        let bad = json!([{"op": "test", "path": "/metadata/finalizers", "value": ["b"]},
                         {"op": "remove", "path": "/metadata/finalizers/0"}]);
        assert_eq!(
            json_patch(&mut doc, &bad),
            Err(PatchError::Failed(
                "testing value /metadata/finalizers failed: test failed".into()
            ))
        );
        assert_eq!(doc["metadata"]["finalizers"], json!(["a"]));
        assert!(matches!(
            json_patch(&mut doc, &json!({"op": "add"})),
            Err(PatchError::Malformed(_))
        ));
        let good = json!([{"op": "test", "path": "/metadata/finalizers", "value": ["a"]},
                          {"op": "remove", "path": "/metadata/finalizers/0"}]);
        json_patch(&mut doc, &good).expect("patch applies");
        assert_eq!(doc["metadata"]["finalizers"], json!([]));
    }

    #[test]
    fn merge_patch_replaces_lists_and_deletes_nulls() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge_patch(&mut doc, &json!({"a": {"b": null}, "l": [3]})).expect("patch applies");
        assert_eq!(doc, json!({"a": {"c": 2}, "l": [3]}));
    }
}
