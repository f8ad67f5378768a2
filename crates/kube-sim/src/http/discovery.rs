//! Legacy discovery documents (`/api`, `/apis`, `/apis/<g>`, `/apis/<g>/<v>`) and `/version`.

use crate::registry::Registry;
use serde_json::{Value, json};

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "32",
        "gitVersion": "v1.33.0",
        "gitCommit": "60a317eadfcb839692a5551a0fc1b0c3ed5d0d1a",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T13:07:46Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub fn api_versions(server_address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

pub fn api_group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn api_group(registry: &Registry, group: &str) -> Option<Value> {
    let (g, vs) = registry.groups().into_iter().find(|(g, _)| g == group)?;
    let mut v = group_json(&g, &vs);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Some(v)
}

pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    if !registry.has_group_version(group, version) {
        return None;
    }
    let mut resources = vec![];
    for r in registry
        .all()
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut main = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            main["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            main["categories"] = json!(r.categories);
        }
        resources.push(main);
        for sub in &r.subresources {
            let (kind, group_, version_, verbs): (&str, &str, &str, Vec<&str>) = match sub.as_str()
            {
                "scale" => ("Scale", "autoscaling", "v1", vec!["get", "patch", "update"]),
                "eviction" => ("Eviction", "policy", "v1", vec!["create"]),
                "finalize" => (r.kind.as_str(), "", "", vec!["update"]),
                _ => (r.kind.as_str(), "", "", vec!["get", "patch", "update"]),
            };
            let mut s = json!({"name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced,
                               "kind": kind, "verbs": verbs});
            if !group_.is_empty() {
                s["group"] = json!(group_);
                s["version"] = json!(version_);
            }
            resources.push(s);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn scope(namespaced: bool) -> &'static str {
    if namespaced { "Namespaced" } else { "Cluster" }
}

/// Aggregated discovery (`apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`) for `/api` (core) or `/apis`.
pub fn aggregated(registry: &Registry, core: bool) -> Value {
    let mut groups: Vec<(String, Vec<String>)> = if core {
        vec![(String::new(), vec!["v1".to_string()])]
    } else {
        registry.groups()
    };
    groups.retain(|(g, _)| g.is_empty() == core);
    let items: Vec<Value> = groups
        .iter()
        .map(|(group, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|version| {
                    let resources: Vec<Value> = registry
                        .all()
                        .iter()
                        .filter(|r| &r.group == group && &r.version == version)
                        .map(|r| {
                            let subresources: Vec<Value> = r
                                .subresources
                                .iter()
                                .map(|sub| {
                                    let (kind, g, v, verbs): (&str, &str, &str, Vec<&str>) = match sub.as_str() {
                                        "scale" => ("Scale", "autoscaling", "v1", vec!["get", "patch", "update"]),
                                        "eviction" => ("Eviction", "policy", "v1", vec!["create"]),
                                        "finalize" => (r.kind.as_str(), r.group.as_str(), r.version.as_str(), vec!["update"]),
                                        _ => (r.kind.as_str(), r.group.as_str(), r.version.as_str(), vec!["get", "patch", "update"]),
                                    };
                                    json!({"subresource": sub, "responseKind": {"group": g, "version": v, "kind": kind}, "verbs": verbs})
                                })
                                .collect();
                            let mut res = json!({
                                "resource": r.plural,
                                "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
                                "scope": scope(r.namespaced),
                                "singularResource": r.singular,
                                "verbs": r.verbs(),
                            });
                            if !r.short_names.is_empty() {
                                res["shortNames"] = json!(r.short_names);
                            }
                            if !r.categories.is_empty() {
                                res["categories"] = json!(r.categories);
                            }
                            if !subresources.is_empty() {
                                res["subresources"] = json!(subresources);
                            }
                            res
                        })
                        .collect();
                    json!({"version": version, "resources": resources, "freshness": "Current"})
                })
                .collect();
            let mut meta = json!({"creationTimestamp": null});
            if !group.is_empty() {
                meta["name"] = json!(group);
            }
            json!({"metadata": meta, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// The media type of aggregated discovery, when the client's Accept prefers it.
pub fn wants_aggregated(accept: &str) -> Option<&'static str> {
    let first = accept.split(',').next().unwrap_or("");
    if !first.contains("as=APIGroupDiscoveryList") {
        return None;
    }
    if first.contains("v=v2beta1") {
        Some("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList")
    } else {
        Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_and_aggregated_discovery_agree() {
        let reg = Registry::default();
        let core = resource_list(&reg, "", "v1").expect("core");
        let pods = core["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["name"] == "pods")
            .expect("pods");
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["namespaced"], true);
        assert!(
            core["resources"]
                .as_array()
                .expect("resources")
                .iter()
                .any(|r| r["name"] == "pods/status")
        );

        let agg = aggregated(&reg, false);
        assert_eq!(agg["kind"], "APIGroupDiscoveryList");
        let apps = agg["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|g| g["metadata"]["name"] == "apps")
            .expect("apps");
        let deploy = &apps["versions"][0]["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["resource"] == "deployments")
            .cloned()
            .expect("deployments");
        assert_eq!(deploy["scope"], "Namespaced");
        assert_eq!(deploy["responseKind"]["kind"], "Deployment");
        assert!(
            deploy["subresources"]
                .as_array()
                .expect("subs")
                .iter()
                .any(|s| s["subresource"] == "scale" && s["responseKind"]["kind"] == "Scale")
        );
        let core_agg = aggregated(&reg, true);
        assert_eq!(core_agg["items"].as_array().map(Vec::len), Some(1));
        assert!(core_agg["items"][0]["metadata"].get("name").is_none());

        assert!(wants_aggregated("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json").is_some());
        assert!(wants_aggregated("application/json").is_none());
    }
}
