//! Bad input gets the status code and reason kube-apiserver gives, and nothing is stored.

mod common;

use common::{count, raw_json};
use serde_json::json;

const CMS: &str = "/api/v1/namespaces/default/configmaps";
const WIDGETS: &str = "/apis/example.com/v1/namespaces/default/widgets";

async fn with_widget_crd() -> kube_sim::KubeSim {
    let sim = common::start().await;
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced", "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object",
                    "required": ["size"],
                    "properties": {"size": {"type": "integer", "minimum": 1},
                                   "name": {"type": "string", "pattern": "^[a-z]+$"},
                                   "mode": {"type": "string", "enum": ["on", "off"]}}}}}}}]}});
    let (code, body) = raw_json(
        &sim,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        "application/json",
        &crd.to_string(),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    sim
}

#[tokio::test]
async fn malformed_json_and_yaml_are_bad_requests() {
    let sim = common::start().await;
    let (code, status) = raw_json(&sim, "POST", CMS, "application/json", "{not json").await;
    assert_eq!(
        (
            code,
            status["reason"].as_str(),
            status["kind"].as_str(),
            status["code"].as_u64()
        ),
        (400, Some("BadRequest"), Some("Status"), Some(400))
    );
    let (code, status) =
        raw_json(&sim, "POST", CMS, "application/yaml", "metadata: [unclosed").await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")));
    assert_eq!(count(&sim, CMS).await, 0, "nothing stored");
    // YAML bodies are accepted when well formed.
    let (code, _) = raw_json(
        &sim,
        "POST",
        CMS,
        "application/yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\n",
    )
    .await;
    assert_eq!(code, 201);
    sim.shutdown().await;
}

#[tokio::test]
async fn schema_violations_list_every_cause() {
    let sim = with_widget_crd().await;
    let bad = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                     "spec": {"size": 0, "name": "ABC", "mode": "auto"}});
    let (code, status) =
        raw_json(&sim, "POST", WIDGETS, "application/json", &bad.to_string()).await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")));
    assert_eq!(status["details"]["kind"], "Widget");
    assert_eq!(status["details"]["group"], "example.com");
    assert_eq!(status["details"]["name"], "w");
    let mut fields: Vec<&str> = status["details"]["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    fields.sort();
    assert_eq!(fields, ["spec.mode", "spec.name", "spec.size"]);
    assert!(
        status["message"]
            .as_str()
            .expect("message")
            .starts_with("Widget.example.com \"w\" is invalid: [")
    );
    let missing = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}});
    let (code, status) = raw_json(
        &sim,
        "POST",
        WIDGETS,
        "application/json",
        &missing.to_string(),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        status["message"],
        "Widget.example.com \"w\" is invalid: spec.size: Required value"
    );
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "FieldValueRequired"
    );
    assert_eq!(count(&sim, WIDGETS).await, 0, "nothing stored");
    sim.shutdown().await;
}

#[tokio::test]
async fn stale_resource_version_conflicts() {
    let sim = common::start().await;
    let (_, created) = raw_json(
        &sim,
        "POST",
        CMS,
        "application/json",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"a":"1"}}"#,
    )
    .await;
    let mut first = created.clone();
    first["data"]["a"] = json!("2");
    let (code, _) = raw_json(
        &sim,
        "PUT",
        &format!("{CMS}/c"),
        "application/json",
        &first.to_string(),
    )
    .await;
    assert_eq!(code, 200);
    let mut second = created;
    second["data"]["a"] = json!("3");
    let (code, status) = raw_json(
        &sim,
        "PUT",
        &format!("{CMS}/c"),
        "application/json",
        &second.to_string(),
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (409, Some("Conflict")));
    assert_eq!(
        status["message"],
        "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(
        status["details"],
        json!({"name": "c", "kind": "configmaps"})
    );
    let (_, now) = raw_json(&sim, "GET", &format!("{CMS}/c"), "", "").await;
    assert_eq!(now["data"]["a"], "2", "the stale write was not stored");
    // A create of an existing name is AlreadyExists.
    let (code, status) = raw_json(
        &sim,
        "POST",
        CMS,
        "application/json",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}"#,
    )
    .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (409, Some("AlreadyExists"))
    );
    // Delete preconditions.
    let (code, status) = raw_json(
        &sim,
        "DELETE",
        &format!("{CMS}/c"),
        "application/json",
        r#"{"preconditions":{"uid":"not-the-uid"}}"#,
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (409, Some("Conflict")));
    assert_eq!(count(&sim, CMS).await, 1);
    // A completed delete of a ConfigMap answers a Status naming it, as kube-apiserver does.
    let (code, status) =
        raw_json(&sim, "DELETE", &format!("{CMS}/c"), "application/json", "").await;
    assert_eq!(code, 200);
    assert_eq!(
        (status["kind"].as_str(), status["status"].as_str()),
        (Some("Status"), Some("Success"))
    );
    assert_eq!(status["details"]["name"], "c");
    assert_eq!(status["details"]["kind"], "configmaps");
    assert_eq!(count(&sim, CMS).await, 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn patches_that_do_not_apply() {
    let sim = with_widget_crd().await;
    raw_json(
        &sim,
        "POST",
        CMS,
        "application/json",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"a":"1"}}"#,
    )
    .await;
    let path = format!("{CMS}/c");
    let (code, status) = raw_json(
        &sim,
        "PATCH",
        &path,
        "application/json-patch+json",
        r#"[{"op":"test","path":"/data/a","value":"9"},{"op":"remove","path":"/data/a"}]"#,
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")));
    assert_eq!(
        status["message"],
        "the server rejected our request due to an error in our request"
    );
    let (code, status) = raw_json(
        &sim,
        "PATCH",
        &path,
        "application/json-patch+json",
        r#"{"op":"add"}"#,
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")));
    let (code, status) = raw_json(
        &sim,
        "PATCH",
        &path,
        "application/merge-patch+json",
        "{oops",
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")));
    let (code, status) = raw_json(&sim, "PATCH", &path, "text/plain", "{}").await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    let (code, status) = raw_json(
        &sim,
        "PATCH",
        &format!("{CMS}/missing"),
        "application/merge-patch+json",
        "{}",
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (404, Some("NotFound")));
    let (code, status) = raw_json(
        &sim,
        "PATCH",
        &path,
        "application/apply-patch+yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n",
    )
    .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (422, Some("Invalid")),
        "apply needs a fieldManager"
    );
    assert_eq!(
        status["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
    let (_, now) = raw_json(&sim, "GET", &path, "", "").await;
    assert_eq!(now["data"], json!({"a": "1"}), "nothing changed");
    // Strategic merge patch is for built-in kinds only.
    let w = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1}});
    raw_json(&sim, "POST", WIDGETS, "application/json", &w.to_string()).await;
    let (code, status) = raw_json(
        &sim,
        "PATCH",
        &format!("{WIDGETS}/w"),
        "application/strategic-merge-patch+json",
        r#"{"spec":{"size":2}}"#,
    )
    .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    // A patch that breaks the schema is Invalid.
    let (code, status) = raw_json(
        &sim,
        "PATCH",
        &format!("{WIDGETS}/w"),
        "application/merge-patch+json",
        r#"{"spec":{"size":"big"}}"#,
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")));
    assert_eq!(status["details"]["causes"][0]["field"], "spec.size");
    sim.shutdown().await;
}

#[tokio::test]
async fn unknown_resources_and_missing_namespaces_are_not_found() {
    let sim = common::start().await;
    for path in [
        "/api/v1/namespaces/default/foos",
        "/apis/nope.example.com/v1/things",
        "/apis/apps/v9/deployments",
    ] {
        let (code, status) = raw_json(&sim, "GET", path, "", "").await;
        assert_eq!(
            (code, status["reason"].as_str()),
            (404, Some("NotFound")),
            "{path}"
        );
        assert_eq!(
            status["message"],
            "the server could not find the requested resource"
        );
    }
    let (code, status) = raw_json(
        &sim,
        "POST",
        "/api/v1/namespaces/ghost/configmaps",
        "application/json",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}"#,
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (404, Some("NotFound")));
    assert_eq!(status["message"], "namespaces \"ghost\" not found");
    assert_eq!(
        status["details"],
        json!({"name": "ghost", "kind": "namespaces"})
    );
    assert_eq!(count(&sim, "/api/v1/configmaps").await, 0);
    // Reading, replacing or deleting in a missing namespace is about the object, not the namespace.
    for method in ["GET", "DELETE"] {
        let (code, status) = raw_json(
            &sim,
            method,
            "/api/v1/namespaces/ghost/configmaps/c",
            "application/json",
            "",
        )
        .await;
        assert_eq!(
            (code, status["message"].as_str()),
            (404, Some("configmaps \"c\" not found")),
            "{method}"
        );
    }
    let (code, status) = raw_json(
        &sim,
        "PATCH",
        "/api/v1/namespaces/ghost/configmaps/c",
        "application/merge-patch+json",
        "{}",
    )
    .await;
    assert_eq!(
        (code, status["message"].as_str()),
        (404, Some("configmaps \"c\" not found"))
    );
    // Names must be DNS subdomains; a name or generateName is required.
    let (code, status) = raw_json(
        &sim,
        "POST",
        CMS,
        "application/json",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name"}}"#,
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")));
    assert_eq!(status["details"]["causes"][0]["field"], "metadata.name");
    let (code, status) = raw_json(
        &sim,
        "POST",
        CMS,
        "application/json",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}"#,
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")));
    assert_eq!(
        status["message"],
        "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required"
    );
    let (code, status) = raw_json(&sim, "POST", CMS, "application/json", r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"l","labels":{"ok":"bad value!"}}}"#).await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")));
    assert_eq!(status["details"]["causes"][0]["field"], "metadata.labels");
    assert!(status["message"].as_str().expect("message").starts_with("ConfigMap \"l\" is invalid: metadata.labels: Invalid value: \"bad value!\": a valid label must be"));
    let (code, status) = raw_json(
        &sim,
        "GET",
        &format!("{CMS}?labelSelector=a%20in%20b"),
        "",
        "",
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")));
    sim.shutdown().await;
}

#[tokio::test]
async fn list_resource_version_match_rules() {
    let sim = common::start().await;
    let (_, list) = raw_json(&sim, "GET", CMS, "", "").await;
    let rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .parse()
        .expect("numeric");
    let (code, status) = raw_json(
        &sim,
        "GET",
        &format!("{CMS}?resourceVersionMatch=Exact"),
        "",
        "",
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")));
    let (code, _) = raw_json(
        &sim,
        "GET",
        &format!("{CMS}?resourceVersion={rv}&resourceVersionMatch=Exact"),
        "",
        "",
    )
    .await;
    assert_eq!(code, 200);
    let (code, _) = raw_json(
        &sim,
        "GET",
        &format!("{CMS}?resourceVersion=1&resourceVersionMatch=NotOlderThan"),
        "",
        "",
    )
    .await;
    assert_eq!(code, 200);
    raw_json(
        &sim,
        "POST",
        CMS,
        "application/json",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bump"}}"#,
    )
    .await;
    let (code, status) = raw_json(
        &sim,
        "GET",
        &format!("{CMS}?resourceVersion={rv}&resourceVersionMatch=Exact"),
        "",
        "",
    )
    .await;
    // Exact is served as it was at that version (kube-apiserver reads etcd at that revision).
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["metadata"]["resourceVersion"], rv.to_string());
    assert!(
        status["items"]
            .as_array()
            .is_some_and(|items| items.iter().all(|i| i["metadata"]["name"] != "bump")),
        "{status}"
    );
    let (code, status) = raw_json(
        &sim,
        "GET",
        &format!(
            "{CMS}?resourceVersion={}&resourceVersionMatch=NotOlderThan",
            rv + 100
        ),
        "",
        "",
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (504, Some("Timeout")));
    sim.shutdown().await;
}
