//! kube-rs `Api` CRUD on built-in kinds and CRDs, kube-apiserver's errors, defaulting, scale,
//! pagination and deletecollection.

use super::*;

#[tokio::test]
async fn builtin_crud_with_kube_apiserver_errors() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    let created = cms
        .create(&PostParams::default(), &cm("a", json!({"app": "x"})))
        .await
        .expect("create");
    let rv1: u64 = created
        .resource_version()
        .expect("rv")
        .parse()
        .expect("numeric rv");
    assert!(created.uid().is_some());
    assert!(created.creation_timestamp().is_some());
    cms.create(&PostParams::default(), &cm("b", json!({"app": "y"})))
        .await
        .expect("create b");

    let dup = api_status(
        cms.create(&PostParams::default(), &cm("a", json!({})))
            .await
            .expect_err("duplicate"),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(dup.message, "configmaps \"a\" already exists");

    let listed = cms
        .list(&ListParams::default().labels("app in (x,z)"))
        .await
        .expect("list");
    assert_eq!(
        listed
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>(),
        vec!["a"]
    );
    let listed = cms
        .list(&ListParams::default().labels("app!=x"))
        .await
        .expect("list");
    assert_eq!(
        listed
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>(),
        vec!["b"]
    );

    // Updates bump the cluster-wide resourceVersion; a stale one conflicts.
    let mut a = cms.get("a").await.expect("get");
    a.data
        .get_or_insert_default()
        .insert("k".into(), "v2".into());
    let updated = cms
        .replace("a", &PostParams::default(), &a)
        .await
        .expect("replace");
    let rv2: u64 = updated
        .resource_version()
        .expect("rv")
        .parse()
        .expect("numeric");
    assert!(rv2 > rv1);
    let stale = api_status(
        cms.replace("a", &PostParams::default(), &a)
            .await
            .expect_err("stale"),
    );
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    assert!(
        stale.message.contains("the object has been modified"),
        "{}",
        stale.message
    );

    // A no-op update writes nothing.
    let same = cms
        .replace("a", &PostParams::default(), &updated)
        .await
        .expect("no-op replace");
    assert_eq!(same.resource_version(), updated.resource_version());

    let missing = api_status(cms.get("nope").await.expect_err("missing"));
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    assert_eq!(missing.message, "configmaps \"nope\" not found");

    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "no-such-ns");
    let no_ns = api_status(
        elsewhere
            .create(&PostParams::default(), &cm("c", json!({})))
            .await
            .expect_err("missing namespace"),
    );
    assert_eq!((no_ns.code, no_ns.reason.as_str()), (404, "NotFound"));
    assert_eq!(no_ns.message, "namespaces \"no-such-ns\" not found");

    // generateName.
    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).expect("valid");
    let made = cms
        .create(&PostParams::default(), &generated)
        .await
        .expect("generateName create");
    assert!(
        made.name_any().starts_with("gen-") && made.name_any().len() == 9,
        "{}",
        made.name_any()
    );

    cms.delete("a", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(cms.get_opt("a").await.expect("get_opt").is_none());

    let namespaces: Api<Namespace> = Api::all(client);
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .expect("ns list")
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(names.contains(&ns.to_string()), "{names:?}");
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn crd_objects_are_validated_pruned_defaulted_and_removed_with_the_crd() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &widget_crd())
        .await
        .expect("create CRD");
    let established = kube::runtime::wait::await_condition(
        crds.clone(),
        "widgets.example.com",
        kube::runtime::conditions::is_crd_established(),
    );
    tokio::time::timeout(Duration::from_secs(5), established)
        .await
        .expect("established in time")
        .expect("await");

    let ar = ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let w: DynamicObject = serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 2, "unknown": true}, "status": {"ready": true}})).expect("valid");
    let created = widgets
        .create(&PostParams::default(), &w)
        .await
        .expect("create widget");
    assert_eq!(
        created.data["spec"],
        json!({"size": 2, "color": "red"}),
        "pruned and defaulted"
    );
    assert!(
        created.data.get("status").is_none(),
        "status is ignored on create with a status subresource"
    );
    assert_eq!(created.metadata.generation, Some(1));

    let bad: DynamicObject =
        serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "bad"}, "spec": {"size": 0, "color": "pink"}}))
        .expect("valid json");
    let err = api_status(
        widgets
            .create(&PostParams::default(), &bad)
            .await
            .expect_err("invalid"),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    let causes: Vec<String> = err
        .details
        .expect("details")
        .causes
        .iter()
        .map(|c| c.field.clone())
        .collect();
    assert_eq!(causes, vec!["spec.color", "spec.size"]);
    assert!(
        widgets.get_opt("bad").await.expect("get_opt").is_none(),
        "nothing stored"
    );

    // Status subresource: status changes leave generation alone, spec changes bump it.
    let st = widgets
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}, "spec": {"size": 9}})),
        )
        .await
        .expect("patch status");
    assert_eq!(st.data["status"]["ready"], true);
    assert_eq!(
        st.data["spec"]["size"], 2,
        "the status endpoint ignores spec"
    );
    assert_eq!(st.metadata.generation, Some(1));
    let sp = widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 3}, "status": {"ready": false}})),
        )
        .await
        .expect("patch");
    assert_eq!(sp.metadata.generation, Some(2));
    assert_eq!(
        sp.data["status"]["ready"], true,
        "the main endpoint ignores status"
    );

    // Server-side apply with two managers.
    let applied = widgets
        .patch("w2", &PatchParams::apply("alice"), &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w2", "labels": {"a": "1"}}, "spec": {"size": 1}})))
        .await
        .expect("apply creates");
    assert_eq!(applied.data["spec"]["size"], 1);
    let conflict = api_status(
        widgets
            .patch("w2", &PatchParams::apply("bob"), &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w2"}, "spec": {"size": 5}})))
            .await
            .expect_err("conflict"),
    );
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    assert!(
        conflict.message.contains("conflict with \"alice\""),
        "{}",
        conflict.message
    );
    let forced = widgets
        .patch("w2", &PatchParams::apply("bob").force(), &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w2", "labels": {"b": "2"}}, "spec": {"size": 5}})))
        .await
        .expect("forced apply");
    assert_eq!(forced.data["spec"]["size"], 5);
    assert_eq!(forced.labels().len(), 2, "both managers' labels stay");

    crds.delete("widgets.example.com", &DeleteParams::default())
        .await
        .expect("delete CRD");
    let gone = api_status(
        widgets
            .list(&ListParams::default())
            .await
            .expect_err("resource gone"),
    );
    assert_eq!(gone.code, 404);
    sim.shutdown().await;
}

#[tokio::test]
async fn pagination_and_deletecollection() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..25 {
        cms.create(
            &PostParams::default(),
            &cm(
                &format!("p{i:02}"),
                json!({"batch": if i % 2 == 0 { "even" } else { "odd" }}),
            ),
        )
        .await
        .expect("create");
    }
    let mut seen = vec![];
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut lp = ListParams::default().limit(10);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = cms.list(&lp).await.expect("page");
        pages += 1;
        seen.extend(page.items.iter().map(|c| c.name_any()));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => {
                assert!(page.metadata.remaining_item_count.is_some());
                token = Some(t);
            }
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        seen,
        (0..25).map(|i| format!("p{i:02}")).collect::<Vec<_>>()
    );
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("batch=even"),
    )
    .await
    .expect("deletecollection");
    let left = cms.list(&ListParams::default()).await.expect("list");
    assert_eq!(left.items.len(), 12);
    assert!(
        left.items
            .iter()
            .all(|c| c.labels().get("batch").map(String::as_str) == Some("odd"))
    );
    let by_field = cms
        .list(&ListParams::default().fields("metadata.name=p01"))
        .await
        .expect("field selector");
    assert_eq!(by_field.items.len(), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn built_in_kinds_are_defaulted_and_scaled() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::default_namespaced(client.clone());
    let d: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx:1.25", "ports": [{"containerPort": 80}]}]}}}
    }))
    .expect("valid");
    let created = deployments
        .create(&PostParams::default(), &d)
        .await
        .expect("create");
    let spec = created.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.revision_history_limit, Some(10));
    let c = &spec.template.spec.as_ref().expect("pod spec").containers[0];
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(
        c.ports.as_ref().expect("ports")[0].protocol.as_deref(),
        Some("TCP")
    );
    // Re-sending the object without the defaults is not a change.
    let same = deployments.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:1.25", "ports": [{"containerPort": 80}]}]}}}}))).await.expect("patch");
    assert_eq!(same.resource_version(), created.resource_version());
    assert_eq!(same.metadata.generation, Some(1));
    // The scale subresource.
    let scale = deployments.get_scale("web").await.expect("get scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(1));
    deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .expect("patch scale");
    let scaled = deployments.get("web").await.expect("get");
    assert_eq!(scaled.spec.and_then(|s| s.replicas), Some(4));
    assert_eq!(scaled.metadata.generation, Some(2));

    let services: Api<k8s_openapi::api::core::v1::Service> = Api::default_namespaced(client);
    let s: k8s_openapi::api::core::v1::Service = serde_json::from_value(
        json!({"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .expect("valid");
    let svc = services
        .create(&PostParams::default(), &s)
        .await
        .expect("create service");
    let spec = svc.spec.expect("spec");
    assert!(
        spec.cluster_ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("10.96.")),
        "{:?}",
        spec.cluster_ip
    );
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    sim.shutdown().await;
}
