//! Watch semantics through kube-rs: watcher and reflector in sync, bookmarks, initial events, 410 Gone
//! and a forced relist.

use super::*;

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
