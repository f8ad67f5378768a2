//! Object lifecycle: garbage collection by owner references, namespace deletion, discovery.

use super::*;

#[tokio::test]
async fn garbage_collection_follows_owner_references() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner_ref = |o: &ConfigMap| json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": o.name_any(), "uid": o.uid().expect("uid"), "blockOwnerDeletion": true}]);
    let with_owner = |name: &str, refs: serde_json::Value| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": refs}}))
            .expect("valid")
    };

    // Background (the default): dependents go once the owner is gone.
    let owner = cms
        .create(&PostParams::default(), &cm("owner", json!({})))
        .await
        .expect("owner");
    cms.create(
        &PostParams::default(),
        &with_owner("dep1", owner_ref(&owner)),
    )
    .await
    .expect("dep1");
    let dep1 = cms.get("dep1").await.expect("dep1");
    cms.create(
        &PostParams::default(),
        &with_owner("dep1-child", owner_ref(&dep1)),
    )
    .await
    .expect("grandchild");
    cms.delete("owner", &DeleteParams::background())
        .await
        .expect("delete owner");
    for name in ["owner", "dep1", "dep1-child"] {
        assert!(
            cms.get_opt(name).await.expect("get_opt").is_none(),
            "{name} should be collected"
        );
    }

    // Orphan: dependents stay, without the owner reference.
    let owner = cms
        .create(&PostParams::default(), &cm("owner2", json!({})))
        .await
        .expect("owner2");
    cms.create(
        &PostParams::default(),
        &with_owner("dep2", owner_ref(&owner)),
    )
    .await
    .expect("dep2");
    cms.delete("owner2", &DeleteParams::orphan())
        .await
        .expect("delete owner2");
    let dep2 = cms.get("dep2").await.expect("orphan survives");
    assert!(dep2.metadata.owner_references.is_none_or(|r| r.is_empty()));
    assert!(cms.get_opt("owner2").await.expect("get_opt").is_none());

    // Foreground: the owner waits (with its foregroundDeletion finalizer) for a blocked dependent.
    let owner = cms
        .create(&PostParams::default(), &cm("owner3", json!({})))
        .await
        .expect("owner3");
    let blocked: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dep3", "finalizers": ["example.com/hold"], "ownerReferences": owner_ref(&owner)}})).expect("valid");
    cms.create(&PostParams::default(), &blocked)
        .await
        .expect("dep3");
    cms.delete("owner3", &DeleteParams::foreground())
        .await
        .expect("delete owner3");
    let waiting = cms
        .get("owner3")
        .await
        .expect("owner waits for its dependents");
    assert_eq!(waiting.finalizers(), ["foregroundDeletion"]);
    assert!(
        cms.get("dep3")
            .await
            .expect("dep3 is terminating")
            .metadata
            .deletion_timestamp
            .is_some()
    );
    cms.patch(
        "dep3",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release dep3");
    assert!(cms.get_opt("dep3").await.expect("get_opt").is_none());
    assert!(
        cms.get_opt("owner3").await.expect("get_opt").is_none(),
        "owner goes after its last dependent"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn namespaces_delete_their_contents_and_discovery_lists_everything() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "scratch"}})).expect("valid");
    let created = namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create ns");
    assert_eq!(
        created.status.and_then(|s| s.phase).as_deref(),
        Some("Active")
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "scratch");
    cms.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .expect("create in ns");
    let held: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}),
    )
    .expect("valid");
    cms.create(&PostParams::default(), &held)
        .await
        .expect("create held");
    namespaces
        .delete("scratch", &DeleteParams::default())
        .await
        .expect("delete ns");
    let terminating = namespaces
        .get("scratch")
        .await
        .expect("terminating while content remains");
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    let refused = api_status(
        cms.create(&PostParams::default(), &cm("b", json!({})))
            .await
            .expect_err("terminating"),
    );
    assert_eq!((refused.code, refused.reason.as_str()), (403, "Forbidden"));
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release");
    assert!(
        namespaces
            .get_opt("scratch")
            .await
            .expect("get_opt")
            .is_none(),
        "namespace removed once empty"
    );

    let discovery = kube::Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let kinds: Vec<String> = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .map(|(ar, _)| format!("{}/{}", ar.api_version, ar.kind))
        .collect();
    for want in [
        "v1/Pod",
        "apps/v1/Deployment",
        "coordination.k8s.io/v1/Lease",
        "events.k8s.io/v1/Event",
        "rbac.authorization.k8s.io/v1/ClusterRole",
        "storage.k8s.io/v1/VolumeAttachment",
        "apiextensions.k8s.io/v1/CustomResourceDefinition",
    ] {
        assert!(
            kinds.contains(&want.to_string()),
            "{want} missing from {kinds:?}"
        );
    }
    let version = client.apiserver_version().await.expect("version");
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "33")
    );
    sim.shutdown().await;
}
