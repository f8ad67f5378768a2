//! Volume behaviour: 10,000 small objects are stored, listed whole and in pages, and watched.
//! Timings are printed, not asserted (the benchmark proper is `cargo xtask bench kube-sim`).

mod common;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_objects_list_quickly_and_watchers_keep_up() {
    // Room for every event, so that watchers that only read at the end are never dropped as laggards.
    let sim = common::start_with(kube_sim::Config {
        history_size: 20_000,
        ..Default::default()
    })
    .await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let list_rv = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let wp = WatchParams::default();
    let watchers: Vec<_> = futures::future::join_all((0..20).map(|_| cms.watch(&wp, &list_rv)))
        .await
        .into_iter()
        .map(|w| w.expect("watch").boxed())
        .collect();

    let started = Instant::now();
    futures::stream::iter(0..10_000)
        .map(|i| {
            let cms = cms.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": format!("cm-{i:05}"), "labels": {"n": (i % 10).to_string()}}, "data": {"k": "v"}}))
                    .expect("valid");
                cms.create(&PostParams::default(), &cm).await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("creates");
    let create_time = started.elapsed();

    let started = Instant::now();
    let all = cms.list(&ListParams::default()).await.expect("list all");
    let list_time = started.elapsed();
    assert_eq!(all.items.len(), 10_000);
    let tenth = cms
        .list(&ListParams::default().labels("n=3"))
        .await
        .expect("selector list");
    assert_eq!(tenth.items.len(), 1_000);
    // Timings are reported, never asserted: speed is measured by `cargo xtask bench kube-sim`.
    println!("10,000 creates: {create_time:?}; list of 10,000: {list_time:?}");

    // Every watcher sees every write, in order: resourceVersions strictly increase up to the later
    // list's, and every watcher sees the same sequence (the creates ran 16 at a time, so
    // names alone say nothing about order).
    let list_rv: u64 = all
        .metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .expect("numeric list resourceVersion");
    let started = Instant::now();
    let mut first_sequence: Option<Vec<String>> = None;
    for (watcher, mut w) in watchers.into_iter().enumerate() {
        let mut sequence = Vec::with_capacity(10_000);
        let mut last_rv = 0_u64;
        while sequence.len() < 10_000 {
            match tokio::time::timeout(Duration::from_secs(30), w.try_next())
                .await
                .expect("watch keeps up")
                .expect("event")
            {
                Some(WatchEvent::Added(cm)) => {
                    let rv: u64 = cm
                        .metadata
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse().ok())
                        .expect("numeric resourceVersion");
                    assert!(
                        rv > last_rv,
                        "watcher {watcher}: event {} has rv {rv} after {last_rv}",
                        sequence.len()
                    );
                    last_rv = rv;
                    sequence.push(cm.metadata.name.expect("name"));
                }
                Some(WatchEvent::Bookmark(_)) => {}
                other => panic!("unexpected event {other:?}"),
            }
        }
        assert!(
            last_rv <= list_rv,
            "watcher {watcher} saw rv {last_rv}, newer than the later list's {list_rv}"
        );
        match &first_sequence {
            None => {
                let distinct: std::collections::BTreeSet<&String> = sequence.iter().collect();
                assert_eq!(distinct.len(), 10_000, "every object once");
                first_sequence = Some(sequence);
            }
            Some(first) => assert!(
                *first == sequence,
                "watcher {watcher} saw another order than watcher 0"
            ),
        }
    }
    println!(
        "20 watchers drained 10,000 events each in {:?}",
        started.elapsed()
    );
    sim.shutdown().await;
}
