//! `meta.k8s.io/v1` Table rendering for `kubectl get`, with printer columns.

use crate::registry::{PrinterColumn, ResourceInfo};
use crate::util;
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// Evaluates the JSONPath subset printer columns use: `.a.b`, `.a[0].b`, `.a[*].b`,
/// `.a[?(@.type=="Ready")].status`, plus `.data.#count` (number of keys) for built-ins.
pub fn json_path(obj: &Value, path: &str) -> Vec<Value> {
    let path = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    let mut current = vec![obj.clone()];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            rest = &r[end..];
            if field == "#count" {
                current = current
                    .iter()
                    .map(|v| json!(v.as_object().map_or(0, Map::len)))
                    .collect();
                continue;
            }
            if field.is_empty() {
                continue;
            }
            current = current
                .iter()
                .filter_map(|v| v.get(field).cloned())
                .collect();
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else {
                return vec![];
            };
            let inner = &r[..end];
            rest = &r[end + 1..];
            let mut next = vec![];
            for v in &current {
                let Some(items) = v.as_array() else { continue };
                if inner == "*" {
                    next.extend(items.iter().cloned());
                } else if let Ok(i) = inner.parse::<i64>() {
                    let idx = if i < 0 { items.len() as i64 + i } else { i };
                    if let Some(x) = usize::try_from(idx).ok().and_then(|i| items.get(i)) {
                        next.push(x.clone());
                    }
                } else if let Some(filter) =
                    inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')'))
                {
                    let (field, want) = match filter.split_once("==") {
                        Some((f, w)) => (
                            f.trim(),
                            Some(w.trim().trim_matches(|c| c == '"' || c == '\'')),
                        ),
                        None => (filter.trim(), None),
                    };
                    for item in items {
                        let mut cur = item;
                        for seg in field.split('.') {
                            cur = &cur[seg];
                        }
                        let ok = match (want, cur) {
                            (None, v) => !v.is_null(),
                            (Some(w), Value::String(s)) => s == w,
                            (Some(w), v) => !v.is_null() && *v == w,
                        };
                        if ok {
                            next.push(item.clone());
                        }
                    }
                }
            }
            current = next;
        } else {
            return vec![];
        }
    }
    current
}

fn column_definition(
    name: &str,
    type_: &str,
    format: &str,
    description: &str,
    priority: i64,
) -> Value {
    json!({"name": name, "type": type_, "format": format, "description": description, "priority": priority})
}

/// Cells kube-apiserver's built-in printers compute rather than read.
pub fn computed(obj: &Value, name: &str) -> Option<Value> {
    if let Some(path) = name.strip_prefix("#0") {
        return Some(json_path(obj, path).into_iter().next().unwrap_or(json!(0)));
    }
    // Strings the printers spell out when unset (kubectl prints a null cell as blank).
    for (prefix, unset) in [("#none", "<none>"), ("#unknown", "<unknown>")] {
        if let Some(path) = name.strip_prefix(prefix) {
            let first = json_path(obj, path).into_iter().next();
            return Some(match first {
                Some(Value::String(s)) if !s.is_empty() => json!(s),
                _ => json!(unset),
            });
        }
    }
    let status = &obj["status"];
    let int = |v: &Value| v.as_i64().unwrap_or(0);
    Some(match name {
        "#pod-ready" => {
            let total = obj["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = status["containerStatuses"]
                .as_array()
                .map_or(0, |c| c.iter().filter(|s| s["ready"] == true).count());
            json!(format!("{ready}/{total}"))
        }
        "#pod-status" => {
            if !obj["metadata"]["deletionTimestamp"].is_null() {
                return Some(json!("Terminating"));
            }
            let waiting = status["containerStatuses"].as_array().and_then(|cs| {
                cs.iter()
                    .find_map(|c| c["state"]["waiting"]["reason"].as_str().map(String::from))
            });
            // A container that ran to its end shows why (`Completed`, `Error`), as kubelet's
            // printer does once nothing waits or runs.
            let running = status["containerStatuses"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["state"]["running"].is_object()));
            let terminated = status["containerStatuses"].as_array().and_then(|cs| {
                cs.iter().find_map(|c| {
                    c["state"]["terminated"]["reason"]
                        .as_str()
                        .map(String::from)
                })
            });
            let reason = status["reason"].as_str().map(String::from);
            json!(
                reason
                    .or(waiting)
                    .or(terminated.filter(|_| !running))
                    .unwrap_or_else(|| status["phase"].as_str().unwrap_or("Pending").to_string())
            )
        }
        "#pod-readiness-gates" => {
            let gates = obj["spec"]["readinessGates"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if gates.is_empty() {
                return Some(json!("<none>"));
            }
            let met = gates
                .iter()
                .filter(|g| {
                    status["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == g["conditionType"] && c["status"] == "True")
                })
                .count();
            json!(format!("{met}/{}", gates.len()))
        }
        "#node-selector" => {
            let selector: Vec<String> = obj["spec"]["template"]["spec"]["nodeSelector"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect();
            joined_or_none(&selector)
        }
        "#job-status" => {
            let has = |kind: &str| {
                status["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == kind && c["status"] == "True")
            };
            let terminating = !obj["metadata"]["deletionTimestamp"].is_null();
            json!(match () {
                _ if has("Complete") => "Complete",
                _ if has("Failed") => "Failed",
                _ if terminating => "Terminating",
                _ if has("Suspended") => "Suspended",
                _ if has("FailureTarget") => "FailureTarget",
                _ if has("SuccessCriteriaMet") => "SuccessCriteriaMet",
                _ => "Running",
            })
        }
        "#job-completions" => {
            let succeeded = int(&status["succeeded"]);
            let spec = &obj["spec"];
            json!(match spec["completions"].as_i64() {
                Some(n) => format!("{succeeded}/{n}"),
                None => match spec["parallelism"].as_i64().unwrap_or(1) {
                    p if p > 1 => format!("{succeeded}/1 of {p}"),
                    _ => format!("{succeeded}/1"),
                },
            })
        }
        "#job-duration" => {
            let at = |v: &Value| v.as_str().and_then(util::parse_rfc3339);
            json!(
                match (at(&status["startTime"]), at(&status["completionTime"])) {
                    (None, _) => String::new(),
                    (Some(start), None) => util::human_duration(util::now_unix() - start),
                    (Some(start), Some(end)) => util::human_duration(end - start),
                }
            )
        }
        "#cronjob-timezone" => json!(obj["spec"]["timeZone"].as_str().unwrap_or("<none>")),
        "#cronjob-suspend" => json!(obj["spec"]["suspend"].as_bool().unwrap_or(false)),
        "#cronjob-active" => json!(status["active"].as_array().map_or(0, Vec::len)),
        "#cronjob-last-schedule" => json!(
            status["lastScheduleTime"]
                .as_str()
                .and_then(util::parse_rfc3339)
                .map_or("<none>".to_string(), |t| util::human_duration(
                    util::now_unix() - t
                ))
        ),
        "#pod-restarts" => {
            let n: i64 = status["containerStatuses"]
                .as_array()
                .map_or(0, |cs| cs.iter().map(|c| int(&c["restartCount"])).sum());
            json!(n.to_string())
        }
        "#deploy-ready" => json!(format!(
            "{}/{}",
            int(&status["readyReplicas"]),
            obj["spec"]["replicas"].as_i64().unwrap_or(1)
        )),
        "#node-status" => {
            let ready = status["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"].as_str().unwrap_or_default().to_string());
            let mut s = match ready.as_deref() {
                Some("True") => "Ready".to_string(),
                Some("False") => "NotReady".to_string(),
                _ => "Unknown".to_string(),
            };
            if obj["spec"]["unschedulable"] == true {
                s.push_str(",SchedulingDisabled");
            }
            json!(s)
        }
        "#node-roles" => {
            let roles: Vec<&str> = obj["metadata"]["labels"]
                .as_object()
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .collect()
                })
                .unwrap_or_default();
            joined_or_none(&roles)
        }
        "#svc-external" => {
            let ips: Vec<String> = status["loadBalancer"]["ingress"]
                .as_array()
                .map(|i| {
                    i.iter()
                        .filter_map(|x| {
                            x["ip"]
                                .as_str()
                                .or(x["hostname"].as_str())
                                .map(String::from)
                        })
                        .collect()
                })
                .unwrap_or_default();
            match obj["spec"]["externalName"].as_str() {
                Some(external) => json!(external),
                None => joined_or_none(&ips),
            }
        }
        "#svc-ports" => {
            let ports: Vec<String> = obj["spec"]["ports"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            let proto = p["protocol"].as_str().unwrap_or("TCP");
                            match p["nodePort"].as_i64() {
                                Some(np) => format!("{}:{np}/{proto}", int(&p["port"])),
                                None => format!("{}/{proto}", int(&p["port"])),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            joined_or_none(&ports)
        }
        "#event-object" => {
            let o = &obj["involvedObject"];
            json!(format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or_default().to_lowercase(),
                o["name"].as_str().unwrap_or_default()
            ))
        }
        _ => return None,
    })
}

/// A list cell: comma-separated, `<none>` when empty, as the printers write it.
fn joined_or_none(items: &[impl AsRef<str>]) -> Value {
    if items.is_empty() {
        json!("<none>")
    } else {
        json!(
            items
                .iter()
                .map(AsRef::as_ref)
                .collect::<Vec<_>>()
                .join(",")
        )
    }
}

fn cell(obj: &Value, col: &PrinterColumn, now: i64) -> Value {
    if col.json_path.starts_with('#') {
        return computed(obj, &col.json_path).unwrap_or(Value::Null);
    }
    let values = json_path(obj, &col.json_path);
    let Some(first) = values.first() else {
        // A missing map has no keys.
        return if col.json_path.ends_with(".#count") {
            json!(0)
        } else {
            Value::Null
        };
    };
    if col.type_ == "date"
        && let Some(t) = first.as_str().and_then(util::parse_rfc3339)
    {
        return json!(util::human_duration(now - t));
    }
    match (col.type_.as_str(), first) {
        ("string", Value::String(_)) => first.clone(),
        ("string", v) if values.len() == 1 => json!(v.to_string()),
        ("string", _) => json!(
            values
                .iter()
                .map(|v| v.as_str().map_or(v.to_string(), String::from))
                .collect::<Vec<_>>()
                .join(",")
        ),
        _ => first.clone(),
    }
}

fn partial_metadata(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

/// Renders objects as a Table. `include_object` is `None`, `Object` or `Metadata` (the default).
pub fn to_table(
    info: &ResourceInfo,
    objects: &[Arc<Value>],
    list_meta: Value,
    with_headers: bool,
    include_object: &str,
) -> Value {
    let now = util::now_unix();
    let age = PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata".into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    };
    let mut columns: Vec<PrinterColumn> = info.printer_columns.clone();
    match columns
        .iter()
        .position(|c| c.json_path == crate::registry::AGE_COLUMN)
    {
        Some(at) => columns[at] = age,
        None if !info.custom || columns.is_empty() => columns.push(age),
        None => {}
    }
    let mut defs = vec![column_definition(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
        0,
    )];
    defs.extend(
        columns
            .iter()
            .map(|c| column_definition(&c.name, &c.type_, &c.format, &c.description, c.priority)),
    );
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![o["metadata"]["name"].clone()];
            cells.extend(columns.iter().map(|c| cell(o, c, now)));
            let mut row = Map::new();
            row.insert("cells".into(), Value::Array(cells));
            match include_object {
                "None" => {}
                "Object" => {
                    row.insert("object".into(), (**o).clone());
                }
                _ => {
                    row.insert("object".into(), partial_metadata(o));
                }
            }
            Value::Object(row)
        })
        .collect();
    let mut t = Map::new();
    t.insert("kind".into(), json!("Table"));
    t.insert("apiVersion".into(), json!("meta.k8s.io/v1"));
    t.insert("metadata".into(), list_meta);
    if with_headers {
        t.insert("columnDefinitions".into(), Value::Array(defs));
    } else {
        t.insert("columnDefinitions".into(), Value::Null);
    }
    t.insert("rows".into(), Value::Array(rows));
    Value::Object(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_subset() {
        let o = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "False"}]},
                       "spec": {"items": [1, 2]}, "data": {"a": "1", "b": "2"}});
        assert_eq!(
            json_path(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            vec![json!("True")]
        );
        assert_eq!(json_path(&o, ".spec.items[1]"), vec![json!(2)]);
        assert_eq!(json_path(&o, ".spec.items[*]"), vec![json!(1), json!(2)]);
        assert_eq!(json_path(&o, ".data.#count"), vec![json!(2)]);
        assert!(json_path(&o, ".spec.missing").is_empty());
    }

    #[test]
    fn computed_cells_match_kubectl_get() {
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2},
                {"name": "b", "ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        assert_eq!(computed(&pod, "#pod-ready"), Some(json!("1/2")));
        assert_eq!(
            computed(&pod, "#pod-status"),
            Some(json!("CrashLoopBackOff"))
        );
        assert_eq!(computed(&pod, "#pod-restarts"), Some(json!("3")));
        let deploy = json!({"spec": {"replicas": 3}, "status": {"readyReplicas": 2}});
        assert_eq!(computed(&deploy, "#deploy-ready"), Some(json!("2/3")));
        assert_eq!(
            computed(&deploy, "#0.status.availableReplicas"),
            Some(json!(0))
        );
        let svc = json!({"spec": {"ports": [{"port": 80, "protocol": "TCP"}, {"port": 443, "nodePort": 30443}]}});
        assert_eq!(
            computed(&svc, "#svc-ports"),
            Some(json!("80/TCP,443:30443/TCP"))
        );
        assert_eq!(computed(&svc, "#svc-external"), Some(json!("<none>")));
        let node = json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}},
            "spec": {"unschedulable": true}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            computed(&node, "#node-status"),
            Some(json!("Ready,SchedulingDisabled"))
        );
        assert_eq!(computed(&node, "#node-roles"), Some(json!("control-plane")));
        let completed = json!({"status": {"phase": "Succeeded", "containerStatuses": [
            {"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
        assert_eq!(
            computed(&completed, "#pod-status"),
            Some(json!("Completed"))
        );
        let job = json!({"spec": {"completions": 3, "parallelism": 2},
            "status": {"succeeded": 3, "startTime": "2026-01-01T00:00:00Z",
                       "completionTime": "2026-01-01T00:00:07Z",
                       "conditions": [{"type": "SuccessCriteriaMet", "status": "True"},
                                      {"type": "Complete", "status": "True"}]}});
        assert_eq!(computed(&job, "#job-status"), Some(json!("Complete")));
        assert_eq!(computed(&job, "#job-completions"), Some(json!("3/3")));
        assert_eq!(computed(&job, "#job-duration"), Some(json!("7s")));
        let running = json!({"spec": {"parallelism": 2}, "status": {"active": 2}});
        assert_eq!(computed(&running, "#job-status"), Some(json!("Running")));
        assert_eq!(
            computed(&running, "#job-completions"),
            Some(json!("0/1 of 2"))
        );
        let ds = json!({"spec": {"template": {"spec": {"nodeSelector": {"role": "worker"}}}}});
        assert_eq!(computed(&ds, "#node-selector"), Some(json!("role=worker")));
        assert_eq!(
            computed(&json!({}), "#node-selector"),
            Some(json!("<none>"))
        );
    }

    #[test]
    fn age_sits_where_kube_apiservers_printers_put_it() {
        let names = |group: &str, plural: &str| -> Vec<String> {
            let info = crate::registry::builtin_resources()
                .into_iter()
                .find(|r| r.group == group && r.plural == plural)
                .expect("built in");
            to_table(&info, &[], json!({}), true, "None")["columnDefinitions"]
                .as_array()
                .expect("columns")
                .iter()
                .map(|c| c["name"].as_str().unwrap_or_default().to_string())
                .collect()
        };
        assert_eq!(
            names("", "pods"),
            [
                "Name",
                "Ready",
                "Status",
                "Restarts",
                "Age",
                "IP",
                "Node",
                "Nominated Node",
                "Readiness Gates"
            ]
        );
        assert_eq!(
            names("", "nodes"),
            [
                "Name",
                "Status",
                "Roles",
                "Age",
                "Version",
                "Internal-IP",
                "External-IP",
                "OS-Image",
                "Kernel-Version",
                "Container-Runtime"
            ]
        );
        assert_eq!(
            names("batch", "cronjobs"),
            [
                "Name",
                "Schedule",
                "Timezone",
                "Suspend",
                "Active",
                "Last Schedule",
                "Age"
            ]
        );
        assert_eq!(
            names("apps", "replicasets"),
            ["Name", "Desired", "Current", "Ready", "Age"]
        );
    }
}
