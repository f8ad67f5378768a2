//! kube-runtime's helpers against kube-sim: the finalizer helper, the events Recorder and a Controller
//! run.

use super::*;

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
