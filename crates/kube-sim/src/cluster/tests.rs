//! Verb semantics driven on `Cluster` directly, without HTTP.

use super::*;
use crate::selectors::LabelSelector;

fn crd(status_subresource: bool) -> Value {
    let mut version = json!({"name": "v1", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
    if status_subresource {
        version["subresources"] = json!({"status": {}});
    }
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "gadgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"kind": "Gadget", "plural": "gadgets"}, "versions": [version]}})
}

fn generation_after_status_change(status_subresource: bool) -> i64 {
    let mut c = Cluster::new(100);
    let opts = WriteOptions {
        field_manager: "test".into(),
        ..Default::default()
    };
    let crds = c
        .registry
        .lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        .cloned()
        .expect("crds");
    c.create(&crds, "", crd(status_subresource), &opts)
        .expect("crd");
    let gadgets = c
        .registry
        .lookup("example.com", "v1", "gadgets")
        .cloned()
        .expect("served");
    let obj = json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}, "spec": {"a": 1}});
    let created = c.create(&gadgets, "default", obj, &opts).expect("create");
    let mut changed = created.clone();
    changed["status"] = json!({"ready": true});
    let sub = if status_subresource {
        Sub::Status
    } else {
        Sub::Main
    };
    let updated = c
        .update(&gadgets, "default", "g", changed, sub, &opts)
        .expect("update");
    assert_eq!(updated["status"]["ready"], true);
    updated["metadata"]["generation"]
        .as_i64()
        .expect("generation")
}

#[test]
fn status_changes_bump_generation_only_without_a_status_subresource() {
    assert_eq!(generation_after_status_change(true), 1);
    assert_eq!(generation_after_status_change(false), 2);
}

#[test]
fn deleting_a_crd_waits_for_instance_finalizers() {
    let mut c = Cluster::new(100);
    let opts = WriteOptions {
        field_manager: "test".into(),
        ..Default::default()
    };
    let crds = c
        .registry
        .lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        .cloned()
        .expect("crds");
    c.create(&crds, "", crd(true), &opts).expect("crd");
    let gadgets = c
        .registry
        .lookup("example.com", "v1", "gadgets")
        .cloned()
        .expect("served");
    let held = json!({"apiVersion": "example.com/v1", "kind": "Gadget",
        "metadata": {"name": "held", "finalizers": ["example.com/cleanup"]}});
    c.create(&gadgets, "default", held, &opts).expect("held");
    c.create(
        &gadgets,
        "default",
        json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "free"}}),
        &opts,
    )
    .expect("free");

    c.delete(&crds, "", "gadgets.example.com", &DeleteOptions::default())
        .expect("delete crd");
    let crd_obj = c
        .get(&crds, "", "gadgets.example.com")
        .expect("terminating CRD stays");
    assert!(
        crd_obj["status"]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .any(|c| c["type"] == "Terminating")
    );
    assert!(
        c.get(&gadgets, "default", "free").is_err(),
        "instances without finalizers go at once"
    );
    let held = c
        .get(&gadgets, "default", "held")
        .expect("held by its finalizer");
    assert!(!held["metadata"]["deletionTimestamp"].is_null());
    let refused = c
        .create(
            &gadgets,
            "default",
            json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "new"}}),
            &opts,
        )
        .expect_err("no creates while terminating");
    assert_eq!(refused.code, 405);

    let mut released = (*held).clone();
    released["metadata"]["finalizers"] = json!([]);
    c.update(&gadgets, "default", "held", released, Sub::Main, &opts)
        .expect("release");
    assert!(
        c.get(&crds, "", "gadgets.example.com").is_err(),
        "CRD removed with its last instance"
    );
    assert!(
        c.registry.lookup("example.com", "v1", "gadgets").is_none(),
        "no longer served"
    );
}

fn builtin(c: &Cluster, group: &str, version: &str, plural: &str) -> ResourceInfo {
    c.registry
        .lookup(group, version, plural)
        .cloned()
        .expect("built in")
}

fn by_test() -> WriteOptions {
    WriteOptions {
        field_manager: "test".into(),
        ..Default::default()
    }
}

fn configmap(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})
}

#[test]
fn read_lists_with_selectors_and_pages_at_one_resource_version() {
    let mut c = Cluster::new(100);
    let cms = builtin(&c, "", "v1", "configmaps");
    for i in 0..5 {
        let tier = if i % 2 == 0 { "web" } else { "db" };
        c.create(
            &cms,
            "default",
            configmap(&format!("c{i}"), json!({"tier": tier})),
            &by_test(),
        )
        .expect("create");
    }
    let web = ListOptions {
        labels: LabelSelector::parse("tier=web").expect("selector"),
        ..Default::default()
    };
    let names = |r: &ListResult| -> Vec<String> {
        r.values()
            .iter()
            .map(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(
        names(&c.list(&cms, Some("default"), &web).expect("list")),
        ["c0", "c2", "c4"]
    );

    let first = c
        .list(
            &cms,
            Some("default"),
            &ListOptions {
                limit: Some(2),
                ..Default::default()
            },
        )
        .expect("page 1");
    assert_eq!(
        (names(&first), first.remaining),
        (vec!["c0".into(), "c1".into()], Some(3))
    );
    let second = c
        .list(
            &cms,
            Some("default"),
            &ListOptions {
                limit: Some(2),
                continue_token: first.continue_token.clone(),
                ..Default::default()
            },
        )
        .expect("page 2");
    assert_eq!(names(&second), ["c2", "c3"]);
    assert_eq!(second.resource_version, first.resource_version);
    // As kube-apiserver: with a selector, a page has a continue token but no remaining count.
    let selected = c
        .list(
            &cms,
            Some("default"),
            &ListOptions {
                limit: Some(1),
                ..web.clone()
            },
        )
        .expect("selected page");
    assert_eq!(
        (names(&selected), selected.remaining),
        (vec!["c0".into()], None)
    );
    let rest = c
        .list(
            &cms,
            Some("default"),
            &ListOptions {
                continue_token: selected.continue_token.clone(),
                ..web.clone()
            },
        )
        .expect("the rest");
    assert_eq!(names(&rest), ["c2", "c4"]);
    assert_eq!(
        c.list(&cms, Some("other"), &ListOptions::default())
            .expect("empty")
            .items
            .len(),
        0
    );
    assert_eq!(
        c.get(&cms, "default", "nope").expect_err("missing").code,
        404
    );
}

#[test]
fn write_conflicts_and_generated_names_as_kube_apiserver() {
    let mut c = Cluster::new(100);
    let cms = builtin(&c, "", "v1", "configmaps");
    let first = c
        .create(&cms, "default", configmap("a", json!({})), &by_test())
        .expect("create");
    let again = c
        .create(&cms, "default", configmap("a", json!({})), &by_test())
        .expect_err("exists");
    assert_eq!((again.code, again.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(again.message, "configmaps \"a\" already exists");

    let mut stale = first.clone();
    stale["data"]["k"] = json!("1");
    c.update(&cms, "default", "a", stale.clone(), Sub::Main, &by_test())
        .expect("update");
    let conflict = c
        .update(&cms, "default", "a", stale, Sub::Main, &by_test())
        .expect_err("stale");
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    assert!(
        conflict.message.contains("the object has been modified; please apply your changes to the latest version and try again"),
        "{}",
        conflict.message
    );

    let generated =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-"}});
    let made = c
        .create(&cms, "default", generated, &by_test())
        .expect("generateName");
    let name = made["metadata"]["name"].as_str().expect("named");
    assert!(
        name.starts_with("gen-") && name.len() == "gen-".len() + 5,
        "{name}"
    );
    let missing_ns = c
        .create(&cms, "nowhere", configmap("b", json!({})), &by_test())
        .expect_err("no namespace");
    assert_eq!(missing_ns.code, 404);
}

#[test]
fn delete_waits_for_finalizers_and_collects_dependents() {
    let mut c = Cluster::new(100);
    let cms = builtin(&c, "", "v1", "configmaps");
    let mut held = configmap("held", json!({}));
    held["metadata"]["finalizers"] = json!(["example.com/keep"]);
    c.create(&cms, "default", held, &by_test()).expect("create");
    let pending = c
        .delete(&cms, "default", "held", &DeleteOptions::default())
        .expect("delete");
    assert!(!pending["metadata"]["deletionTimestamp"].is_null());
    let mut released = (*c.get(&cms, "default", "held").expect("still there")).clone();
    released["metadata"]["finalizers"] = json!([]);
    c.update(&cms, "default", "held", released, Sub::Main, &by_test())
        .expect("release");
    assert_eq!(c.get(&cms, "default", "held").expect_err("gone").code, 404);

    let owner = c
        .create(&cms, "default", configmap("owner", json!({})), &by_test())
        .expect("owner");
    let mut child = configmap("child", json!({}));
    child["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
        "name": "owner", "uid": owner["metadata"]["uid"]}]);
    c.create(&cms, "default", child, &by_test()).expect("child");
    let wrong_uid = DeleteOptions {
        precondition_uid: Some("other".into()),
        ..Default::default()
    };
    assert_eq!(
        c.delete(&cms, "default", "owner", &wrong_uid)
            .expect_err("precondition")
            .code,
        409
    );
    c.delete(&cms, "default", "owner", &DeleteOptions::default())
        .expect("delete owner");
    assert_eq!(
        c.get(&cms, "default", "child").expect_err("collected").code,
        404
    );
}

/// A cluster serving Gadgets whose schema wants `spec.size` >= 1.
fn cluster_with_sized_gadgets() -> (Cluster, ResourceInfo) {
    let mut c = Cluster::new(100);
    let crds = builtin(
        &c,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    );
    let mut def = crd(false);
    def["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = json!({"type": "object",
        "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer", "minimum": 1}}}}});
    c.create(&crds, "", def, &by_test()).expect("crd");
    let gadgets = builtin(&c, "example.com", "v1", "gadgets");
    (c, gadgets)
}

#[test]
fn admission_validates_custom_resources_against_their_schema() {
    let (mut c, gadgets) = cluster_with_sized_gadgets();
    let bad = json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"},
        "spec": {"size": 0, "unknown": true}});
    let err = c
        .create(&gadgets, "default", bad, &by_test())
        .expect_err("invalid");
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message.contains(
            "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"
        ),
        "{}",
        err.message
    );
    let good = json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"},
        "spec": {"size": 2, "unknown": true}});
    let stored = c
        .create(&gadgets, "default", good, &by_test())
        .expect("valid");
    assert!(
        stored["spec"].get("unknown").is_none(),
        "unknown fields are pruned"
    );
}

#[test]
fn validation_names_the_field_with_apimachinery_messages() {
    let mut c = Cluster::new(100);
    let cms = builtin(&c, "", "v1", "configmaps");
    let err = c
        .create(
            &cms,
            "default",
            configmap("Bad_Name", json!({})),
            &by_test(),
        )
        .expect_err("bad name");
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
        "{}",
        err.message
    );
    let mut wrong_kind = configmap("a", json!({}));
    wrong_kind["kind"] = json!("Secret");
    assert_eq!(
        c.create(&cms, "default", wrong_kind, &by_test())
            .expect_err("kind")
            .code,
        400
    );
}

/// A create prepared outside the cluster's lock answers in kube-sim's order all the same: the
/// request's own name first, then the namespace and a name taken, only then admission.
#[test]
fn a_create_checks_namespace_and_name_before_admission() {
    let (mut c, gadgets) = cluster_with_sized_gadgets();
    let gadget = |name: &str, size: i64| {
        json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": name},
            "spec": {"size": size}})
    };
    let code = |c: &mut Cluster, ns: &str, obj: Value| {
        let prepared = PreparedCreate::new(&gadgets, ns, obj, &by_test(), &c.random.clone());
        prepared
            .and_then(|p| c.create_prepared(&gadgets, p, &by_test()))
            .map(drop)
            .map_err(|e| (e.code, e.reason))
    };
    assert_eq!(
        code(&mut c, "nowhere", gadget("Bad_Name", 0)),
        Err((422, "Invalid".into())),
        "the name is the request's own"
    );
    assert_eq!(
        code(&mut c, "nowhere", gadget("g", 0)),
        Err((404, "NotFound".into())),
        "the namespace comes before admission"
    );
    assert_eq!(code(&mut c, "default", gadget("g", 2)), Ok(()));
    assert_eq!(
        code(&mut c, "default", gadget("g", 0)),
        Err((409, "AlreadyExists".into())),
        "a name taken comes before admission"
    );
    assert_eq!(
        code(&mut c, "default", gadget("h", 0)),
        Err((422, "Invalid".into()))
    );
}

/// The memo of terminating namespaces follows the namespace's stored versions.
#[test]
fn creates_see_a_namespace_start_terminating() {
    let mut c = Cluster::new(100);
    let namespaces = builtin(&c, "", "v1", "namespaces");
    let configmaps = builtin(&c, "", "v1", "configmaps");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "team", "finalizers": ["example.com/hold"]}});
    c.create(&namespaces, "", ns, &by_test())
        .expect("namespace");
    c.create(&configmaps, "team", configmap("a", json!({})), &by_test())
        .expect("a create in a live namespace");
    c.delete(&namespaces, "", "team", &DeleteOptions::default())
        .expect("delete starts");
    let err = c
        .create(&configmaps, "team", configmap("b", json!({})), &by_test())
        .expect_err("terminating");
    assert_eq!((err.code, err.reason.as_str()), (403, "Forbidden"));
}

#[test]
fn create_and_update_refuse_a_body_that_is_not_an_object_of_the_urls_kind() {
    let mut c = Cluster::new(100);
    let cms = builtin(&c, "", "v1", "configmaps");
    for body in [json!([1]), json!("text")] {
        let e = c
            .create(&cms, "default", body.clone(), &by_test())
            .expect_err("not an object");
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "the body of the request must be an object")
        );
        let e = c
            .update(&cms, "default", "a", body, Sub::Main, &by_test())
            .expect_err("not an object");
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "the body of the request must be an object")
        );
    }
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}});
    let e = c
        .create(&cms, "default", secret.clone(), &by_test())
        .expect_err("another kind");
    assert_eq!(e.code, 400);
    assert!(e.message.contains("Secret"), "{}", e.message);
    c.create(&cms, "default", configmap("a", json!({})), &by_test())
        .expect("a ConfigMap");
    let e = c
        .update(&cms, "default", "a", secret, Sub::Main, &by_test())
        .expect_err("another kind");
    assert_eq!(e.code, 400);
}
