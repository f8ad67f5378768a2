//! The object write journal: which client wrote which object, with its labels before and after,
//! through kube-rs clients that send the User-Agent of a controller replica.

use super::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube_sim::{KubeSim, ObjectWrite};

const REPLICA_1: &str = "nodeslo-controller/0.1.0 (nodeslo-controller-1)";
const REPLICA_2: &str = "nodeslo-controller/0.1.0 (nodeslo-controller-2)";

/// A kube-rs client that sends `user_agent`.
fn client_as(sim: &KubeSim, user_agent: &str) -> kube::Client {
    let mut config = kube::Config::new(sim.url().parse().expect("the server's URL"));
    config.default_namespace = "default".into();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(user_agent).expect("a valid User-Agent"),
    ));
    kube::Client::try_from(config).expect("client")
}

fn labelled(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}))
    .expect("valid ConfigMap")
}

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// An expected write in namespace `default`; `seq` is set by [`numbered`].
fn write(
    verb: &str,
    subresource: &str,
    name: &str,
    user_agent: &str,
    labels_before: Option<BTreeMap<String, String>>,
    labels_after: Option<BTreeMap<String, String>>,
) -> ObjectWrite {
    ObjectWrite {
        seq: 0,
        verb: verb.into(),
        subresource: subresource.into(),
        namespace: Some("default".into()),
        name: name.into(),
        user_agent: user_agent.into(),
        labels_before,
        labels_after,
    }
}

/// `writes` numbered from `first`, as the journal orders them.
fn numbered(first: u64, writes: Vec<ObjectWrite>) -> Vec<ObjectWrite> {
    writes
        .into_iter()
        .zip(first..)
        .map(|(w, seq)| ObjectWrite { seq, ..w })
        .collect()
}

#[tokio::test]
async fn the_journal_records_every_configmap_write_with_its_writer_and_labels() {
    let sim = common::start().await;
    sim.journal_writes("", "configmaps");
    let one: Api<ConfigMap> = Api::namespaced(client_as(&sim, REPLICA_1), "default");
    let two: Api<ConfigMap> = Api::namespaced(client_as(&sim, REPLICA_2), "default");
    let pp = PostParams::default();

    one.create(&pp, &labelled("a", json!({"shard": "0"})))
        .await
        .expect("create");
    one.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"shard": "1"}}})),
    )
    .await
    .expect("merge patch of the labels");
    let json_patch: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/metadata/labels/owner", "value": "two"}]),
    )
    .expect("valid JSON patch");
    two.patch("a", &PatchParams::default(), &Patch::Json::<()>(json_patch))
        .await
        .expect("JSON patch");
    two.patch(
        "a",
        &PatchParams::apply("replica-2"),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "labels": {"applied": "yes"}}})),
    )
    .await
    .expect("server-side apply");
    let mut current = one.get("a").await.expect("get");
    current.labels_mut().remove("owner");
    one.replace("a", &pp, &current).await.expect("replace");
    one.delete("a", &DeleteParams::default())
        .await
        .expect("delete");

    // Refused writes are not writes.
    one.create(&pp, &labelled("taken", json!({})))
        .await
        .expect("create");
    two.create(&pp, &labelled("taken", json!({})))
        .await
        .expect_err("already exists");
    two.patch(
        "missing",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "x"}})),
    )
    .await
    .expect_err("not found");
    let mut stale = one.get("taken").await.expect("get");
    one.patch(
        "taken",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "newer"}})),
    )
    .await
    .expect("patch");
    stale.data = Some(BTreeMap::from([("k".into(), "stale".into())]));
    two.replace("taken", &pp, &stale)
        .await
        .expect_err("a stale resourceVersion conflicts");

    // A finalizer holds the object: the delete only marks it; removing the finalizer removes it.
    let held: ConfigMap = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "held", "labels": {"shard": "2"}, "finalizers": ["example.com/hold"]}}))
    .expect("valid ConfigMap");
    two.create(&pp, &held).await.expect("create");
    two.delete("held", &DeleteParams::default())
        .await
        .expect("delete starts");
    assert!(
        two.get("held")
            .await
            .expect("still there")
            .metadata
            .deletion_timestamp
            .is_some(),
        "being deleted"
    );
    two.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("finalizer removed");
    two.get("held").await.expect_err("gone with its finalizer");

    // A generated name is journaled as created.
    let generated: ConfigMap = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-"}}),
    )
    .expect("valid ConfigMap");
    let generated = one.create(&pp, &generated).await.expect("create");

    let shard = |s: &str| labels(&[("shard", s)]);
    let expected = numbered(
        0,
        vec![
            write("create", "", "a", REPLICA_1, None, shard("0")),
            write("patch", "", "a", REPLICA_1, shard("0"), shard("1")),
            write(
                "patch",
                "",
                "a",
                REPLICA_2,
                shard("1"),
                labels(&[("shard", "1"), ("owner", "two")]),
            ),
            write(
                "patch",
                "",
                "a",
                REPLICA_2,
                labels(&[("shard", "1"), ("owner", "two")]),
                labels(&[("shard", "1"), ("owner", "two"), ("applied", "yes")]),
            ),
            write(
                "update",
                "",
                "a",
                REPLICA_1,
                labels(&[("shard", "1"), ("owner", "two"), ("applied", "yes")]),
                labels(&[("shard", "1"), ("applied", "yes")]),
            ),
            write(
                "delete",
                "",
                "a",
                REPLICA_1,
                labels(&[("shard", "1"), ("applied", "yes")]),
                None,
            ),
            write("create", "", "taken", REPLICA_1, None, labels(&[])),
            write("patch", "", "taken", REPLICA_1, labels(&[]), labels(&[])),
            write("create", "", "held", REPLICA_2, None, shard("2")),
            write("delete", "", "held", REPLICA_2, shard("2"), shard("2")),
            write("patch", "", "held", REPLICA_2, shard("2"), None),
            write(
                "create",
                "",
                &generated.name_any(),
                REPLICA_1,
                None,
                labels(&[]),
            ),
        ],
    );
    assert_eq!(sim.object_writes(), expected);
    assert!(generated.name_any().starts_with("gen-"));
    sim.shutdown().await;
}

#[tokio::test]
async fn status_and_scale_writes_name_their_subresource() {
    let sim = common::start().await;
    let admin = sim.client().expect("client");
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .expect("valid CRD");
    Api::<CustomResourceDefinition>::all(admin)
        .create(&PostParams::default(), &crd)
        .await
        .expect("CRD created");
    // Journaled before the CRD is written would do as well; journaled after it, the CRD is not.
    sim.journal_writes("example.com", "widgets");
    sim.journal_writes("apps", "deployments");
    let client = client_as(&sim, REPLICA_1);
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "labels": {"shard": "3"}}, "spec": {"size": 1}
    }))
    .expect("valid Widget");
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .expect("create");
    widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": false}})),
        )
        .await
        .expect("status patch");
    let mut current = widgets.get("w").await.expect("get");
    current.data["status"] = json!({"ready": true});
    widgets
        .replace_status("w", &PostParams::default(), &current)
        .await
        .expect("status update");

    let deployments: Api<Deployment> = Api::namespaced(client, "default");
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d", "labels": {"shard": "4"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .expect("valid Deployment");
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create");
    deployments
        .patch_scale(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scale patch");

    let shard = |s: &str| labels(&[("shard", s)]);
    let expected = numbered(
        0,
        vec![
            write("create", "", "w", REPLICA_1, None, shard("3")),
            write("patch", "status", "w", REPLICA_1, shard("3"), shard("3")),
            write("update", "status", "w", REPLICA_1, shard("3"), shard("3")),
            write("create", "", "d", REPLICA_1, None, shard("4")),
            write("patch", "scale", "d", REPLICA_1, shard("4"), shard("4")),
        ],
    );
    assert_eq!(sim.object_writes(), expected);
    sim.shutdown().await;
}

#[tokio::test]
async fn only_journaled_resources_are_recorded_and_a_clear_keeps_counting() {
    let sim = common::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client_as(&sim, REPLICA_1), "default");
    let secrets: Api<Secret> = Api::namespaced(client_as(&sim, REPLICA_1), "default");
    let pp = PostParams::default();
    let secret = |name: &str| -> Secret {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name}}))
        .expect("valid Secret")
    };

    cms.create(&pp, &labelled("before", json!({})))
        .await
        .expect("create");
    assert_eq!(sim.object_writes(), vec![], "nothing is journaled");

    sim.journal_writes("", "secrets");
    cms.create(&pp, &labelled("unjournaled", json!({})))
        .await
        .expect("create");
    cms.delete("before", &DeleteParams::default())
        .await
        .expect("delete");
    secrets.create(&pp, &secret("s1")).await.expect("create");
    assert_eq!(
        sim.object_writes(),
        numbered(
            0,
            vec![write("create", "", "s1", REPLICA_1, None, labels(&[]))]
        ),
        "configmaps are not journaled"
    );

    sim.clear_object_writes();
    assert_eq!(sim.object_writes(), vec![]);
    secrets.create(&pp, &secret("s2")).await.expect("create");
    assert_eq!(
        sim.object_writes(),
        numbered(
            1,
            vec![write("create", "", "s2", REPLICA_1, None, labels(&[]))]
        ),
        "seq goes on after a clear; secrets are still journaled"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn what_kube_sim_writes_itself_has_no_user_agent() {
    let sim = common::start().await;
    sim.journal_writes("", "configmaps");
    let cms: Api<ConfigMap> = Api::namespaced(client_as(&sim, REPLICA_1), "default");
    let pp = PostParams::default();
    let owner = cms
        .create(&pp, &labelled("owner", json!({"shard": "0"})))
        .await
        .expect("create");
    let dependent: ConfigMap =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "dependent", "labels": {"shard": "1"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                "uid": owner.metadata.uid.clone().expect("a uid")}]}}))
        .expect("valid ConfigMap");
    cms.create(&pp, &dependent).await.expect("create");
    for name in ["x1", "x2"] {
        cms.create(&pp, &labelled(name, json!({"batch": "x"})))
            .await
            .expect("create");
    }
    sim.clear_object_writes();

    cms.delete("owner", &DeleteParams::background())
        .await
        .expect("delete");
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("batch=x"),
    )
    .await
    .expect("deletecollection");
    let batch = labels(&[("batch", "x")]);
    let shard = |s: &str| labels(&[("shard", s)]);
    assert_eq!(
        sim.object_writes(),
        numbered(
            4,
            vec![
                write("delete", "", "owner", REPLICA_1, shard("0"), None),
                // The garbage collector's, in the same request.
                write("delete", "", "dependent", "", shard("1"), None),
                write("delete", "", "x1", REPLICA_1, batch.clone(), None),
                write("delete", "", "x2", REPLICA_1, batch, None),
            ]
        )
    );

    // A node the testbed adds is kube-sim's own write too.
    sim.journal_writes("", "nodes");
    sim.add_node("n1", &BTreeMap::new()).expect("node added");
    let node_writes = sim.object_writes();
    let added = node_writes
        .iter()
        .find(|w| w.name == "n1")
        .expect("the node's creation");
    assert_eq!(
        (
            added.verb.as_str(),
            added.namespace.as_deref(),
            added.name.as_str(),
            added.user_agent.as_str(),
            &added.labels_before,
        ),
        ("create", None, "n1", "", &None),
        "{node_writes:?}"
    );
    sim.shutdown().await;
}
