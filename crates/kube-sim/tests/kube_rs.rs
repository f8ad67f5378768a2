//! kube-sim through kube-rs: Api CRUD on built-ins and CRDs, watcher + reflector, finalizer helper,
//! events Recorder, a Controller run, and watch semantics.

mod common;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::runtime::events::{Event as KEvent, EventType, Recorder, Reporter};
use kube::runtime::{
    Controller, WatchStreamExt, controller::Action, finalizer, reflector, watcher,
};
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}))
    .expect("valid ConfigMap")
}

fn api_status(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

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

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "shortNames": ["wd"]},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "required": ["size"], "properties": {
                        "size": {"type": "integer", "minimum": 1},
                        "color": {"type": "string", "enum": ["red", "blue"], "default": "red"}}},
                    "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}}}}]}
    }))
    .expect("valid CRD")
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
async fn watcher_and_reflector_stay_in_sync() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..5 {
        cms.create(
            &PostParams::default(),
            &cm(&format!("pre{i}"), json!({"w": "1"})),
        )
        .await
        .expect("create");
    }
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(
        writer,
        watcher(cms.clone(), watcher::Config::default().labels("w=1")),
    )
    .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.try_next().await.is_ok_and(|o| o.is_some()) {}
    });
    reader.wait_until_ready().await.expect("ready");
    for i in 0..20 {
        cms.create(
            &PostParams::default(),
            &cm(&format!("live{i}"), json!({"w": "1"})),
        )
        .await
        .expect("create");
    }
    for i in 0..5 {
        cms.delete(&format!("pre{i}"), &DeleteParams::default())
            .await
            .expect("delete");
    }
    // Leaving the selector is a deletion for the watcher.
    cms.patch(
        "live0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"w": "2"}}})),
    )
    .await
    .expect("relabel");
    cms.patch(
        "live1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "changed"}})),
    )
    .await
    .expect("update");
    let want: Vec<String> = cms
        .list(&ListParams::default().labels("w=1"))
        .await
        .expect("list")
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut have: Vec<String> = reader.state().iter().map(|c| c.name_any()).collect();
        have.sort();
        let changed = reader.state().iter().any(|c| {
            c.data.as_ref().and_then(|d| d.get("k")).map(String::as_str) == Some("changed")
        });
        if have == want && changed {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "reflector out of sync: {have:?} vs {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(want.len(), 19);
    task.abort();
    sim.shutdown().await;
}

#[tokio::test]
async fn watch_semantics_bookmarks_initial_events_and_gone() {
    let sim = common::start_with(kube_sim::Config {
        history_size: 8,
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("x", json!({"sel": "yes"})))
        .await
        .expect("create");
    let start_rv = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");

    // Streaming list: initial ADDED then a BOOKMARK marking the end of initial events.
    let mut s = cms
        .watch(&WatchParams::streaming_lists().labels("sel=yes"), "0")
        .await
        .expect("watch")
        .boxed();
    match s.try_next().await.expect("event") {
        Some(WatchEvent::Added(o)) => assert_eq!(o.name_any(), "x"),
        other => panic!("expected ADDED, got {other:?}"),
    }
    match s.try_next().await.expect("event") {
        Some(WatchEvent::Bookmark(b)) => assert_eq!(
            b.metadata
                .annotations
                .get("k8s.io/initial-events-end")
                .map(String::as_str),
            Some("true")
        ),
        other => panic!("expected BOOKMARK, got {other:?}"),
    }
    // Leaving the selector is a DELETED for this watcher.
    cms.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"sel": "no"}}})),
    )
    .await
    .expect("relabel");
    match tokio::time::timeout(Duration::from_secs(5), s.try_next())
        .await
        .expect("in time")
        .expect("event")
    {
        Some(WatchEvent::Deleted(o)) => assert_eq!(o.name_any(), "x"),
        other => panic!("expected DELETED, got {other:?}"),
    }
    // Periodic bookmarks.
    let mut b = cms
        .watch(&WatchParams::default(), &start_rv)
        .await
        .expect("watch")
        .boxed();
    let mut saw_bookmark = false;
    for _ in 0..3 {
        if let Ok(Ok(Some(WatchEvent::Bookmark(_)))) =
            tokio::time::timeout(Duration::from_secs(3), b.try_next()).await
        {
            saw_bookmark = true;
            break;
        }
    }
    assert!(saw_bookmark);
    // Too old a resourceVersion: 410 Expired in an ERROR event.
    for i in 0..20 {
        cms.create(&PostParams::default(), &cm(&format!("f{i}"), json!({})))
            .await
            .expect("create");
    }
    let mut old = cms
        .watch(&WatchParams::default(), &start_rv)
        .await
        .expect("watch")
        .boxed();
    match old.try_next().await.expect("event") {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected ERROR 410, got {other:?}"),
    }
    // timeoutSeconds ends the stream.
    let mut t = cms
        .watch(&WatchParams::default().timeout(1), "")
        .await
        .expect("watch")
        .boxed();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = t.try_next().await {}
    })
    .await;
    assert!(ended.is_ok(), "watch did not end after timeoutSeconds");
    sim.shutdown().await;
}

#[derive(Debug, thiserror::Error)]
#[error("reconcile failed: {0}")]
struct ReconcileError(#[from] kube::Error);

#[tokio::test]
async fn finalizer_helper_adds_and_removes_its_finalizer() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("guarded", json!({})))
        .await
        .expect("create");
    let cleaned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let run = |obj: Arc<ConfigMap>| {
        let cms = cms.clone();
        let cleaned = cleaned.clone();
        async move {
            finalizer(&cms, "example.com/cleanup", obj, |ev| async move {
                match ev {
                    finalizer::Event::Apply(_) => Ok::<_, ReconcileError>(Action::await_change()),
                    finalizer::Event::Cleanup(_) => {
                        cleaned.store(true, std::sync::atomic::Ordering::SeqCst);
                        Ok(Action::await_change())
                    }
                }
            })
            .await
        }
    };
    run(Arc::new(cms.get("guarded").await.expect("get")))
        .await
        .expect("adds finalizer");
    let with = cms.get("guarded").await.expect("get");
    assert_eq!(with.finalizers(), ["example.com/cleanup"]);
    run(Arc::new(with)).await.expect("apply");
    cms.delete("guarded", &DeleteParams::default())
        .await
        .expect("delete");
    let deleting = cms
        .get("guarded")
        .await
        .expect("still there while the finalizer is set");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    run(Arc::new(deleting)).await.expect("cleanup");
    assert!(cleaned.load(std::sync::atomic::Ordering::SeqCst));
    assert!(
        cms.get_opt("guarded").await.expect("get_opt").is_none(),
        "removed once the finalizer is gone"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn recorder_publishes_events() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let target = cms
        .create(&PostParams::default(), &cm("target", json!({})))
        .await
        .expect("create");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "test-controller".into(),
            instance: None,
        },
    );
    let ev = KEvent {
        type_: EventType::Normal,
        reason: "Tested".into(),
        note: Some("hello".into()),
        action: "Test".into(),
        secondary: None,
    };
    recorder
        .publish(&ev, &target.object_ref(&()))
        .await
        .expect("publish");
    recorder
        .publish(&ev, &target.object_ref(&()))
        .await
        .expect("publish again");
    let events: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource {
            group: "events.k8s.io".into(),
            version: "v1".into(),
            api_version: "events.k8s.io/v1".into(),
            kind: "Event".into(),
            plural: "events".into(),
        },
    );
    let list = events
        .list(&ListParams::default())
        .await
        .expect("list events");
    assert_eq!(list.items.len(), 1, "the second publish updates the series");
    let e = &list.items[0];
    assert_eq!(e.data["reason"], "Tested");
    assert_eq!(e.data["regarding"]["name"], "target");
    assert_eq!(e.data["series"]["count"], 2);
    // One storage with core/v1 Events, as kube-apiserver: `kubectl describe` finds it there.
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let described = core
        .list(
            &ListParams::default()
                .fields("involvedObject.name=target,involvedObject.kind=ConfigMap"),
        )
        .await
        .expect("core events");
    assert_eq!(described.items.len(), 1);
    assert_eq!(described.items[0].message.as_deref(), Some("hello"));
    assert_eq!(
        described.items[0].reporting_component.as_deref(),
        Some("test-controller")
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn controller_reconciles_every_object() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..5 {
        cms.create(
            &PostParams::default(),
            &cm(&format!("c{i}"), json!({"managed": "yes"})),
        )
        .await
        .expect("create");
    }
    let ctx = Arc::new(cms.clone());
    let controller = Controller::new(
        cms.clone(),
        watcher::Config::default().labels("managed=yes"),
    )
    .shutdown_on_signal()
    .run(
        |obj: Arc<ConfigMap>, ctx: Arc<Api<ConfigMap>>| async move {
            if obj.annotations().get("reconciled").is_none() {
                ctx.patch(
                    &obj.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {"reconciled": "true"}}})),
                )
                .await?;
            }
            Ok::<_, ReconcileError>(Action::await_change())
        },
        |_, _, _| Action::requeue(Duration::from_millis(100)),
        ctx,
    )
    .for_each(|_| async {});
    let task = tokio::spawn(controller);
    cms.create(
        &PostParams::default(),
        &cm("late", json!({"managed": "yes"})),
    )
    .await
    .expect("create");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let list = cms
            .list(&ListParams::default().labels("managed=yes"))
            .await
            .expect("list");
        if list
            .items
            .iter()
            .all(|c| c.annotations().get("reconciled").is_some())
            && list.items.len() == 6
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "controller did not reconcile all objects"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    task.abort();
    sim.shutdown().await;
}

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

#[tokio::test]
async fn reflector_recovers_from_a_forced_relist() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..5 {
        cms.create(&PostParams::default(), &cm(&format!("r{i}"), json!({})))
            .await
            .expect("create");
    }
    let inits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = inits.clone();
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(
        writer,
        watcher(cms.clone(), watcher::Config::default()).default_backoff(),
    )
    .inspect(move |e| {
        if let Ok(watcher::Event::Init) = e {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    reader.wait_until_ready().await.expect("ready");
    // History gone and watches closed with 410 Gone: the watcher must re-list. Repeated until
    // it has, since the watch that follows the initial list may not have reached the server yet.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while inits.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        sim.expire_watches();
        assert!(
            tokio::time::Instant::now() < deadline,
            "no re-list after expiring watches"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..3 {
        cms.delete(&format!("r{i}"), &DeleteParams::default())
            .await
            .expect("delete");
    }
    for i in 0..4 {
        cms.create(&PostParams::default(), &cm(&format!("n{i}"), json!({})))
            .await
            .expect("create");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut have: Vec<String> = reader.state().iter().map(|c| c.name_any()).collect();
        have.sort();
        if have == ["n0", "n1", "n2", "n3", "r3", "r4"]
            && inits.load(std::sync::atomic::Ordering::SeqCst) >= 2
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "reflector did not recover: {have:?}, inits {inits:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
    sim.shutdown().await;
}
