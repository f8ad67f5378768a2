//! kube-sim as a testbed: request accounting, fault injection (errors, cut watches, forced 410,
//! partitions), seen through real kube-rs clients.

#[path = "../common/mod.rs"]
mod common;
mod flags;
mod journal;
mod persistence;
mod rbac;
mod rbac_over_tls;
mod workloads;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube_sim::faults::{ErrorRule, FaultConfig};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": {"k": value}}))
    .expect("valid ConfigMap")
}

#[tokio::test]
async fn a_known_call_sequence_yields_exactly_the_expected_counters() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    sim.reset_requests();

    cms.create(&PostParams::default(), &cm("a", "1"))
        .await
        .expect("create");
    cms.create(&PostParams::default(), &cm("a", "1"))
        .await
        .expect_err("duplicate");
    let got = cms.get("a").await.expect("get");
    cms.list(&ListParams::default()).await.expect("list");
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .expect("patch");
    let mut fresh = cms.get("a").await.expect("get");
    fresh.data = Some(BTreeMap::from([("k".into(), "3".into())]));
    cms.replace("a", &PostParams::default(), &fresh)
        .await
        .expect("replace");
    cms.delete("a", &DeleteParams::default())
        .await
        .expect("delete");
    cms.get("a").await.expect_err("gone");
    assert_eq!(got.name_any(), "a");

    let stats = sim.requests();
    let expected: BTreeMap<String, u64> = [
        ("create configmaps 201", 1),
        ("create configmaps 409", 1),
        ("get configmaps 200", 2),
        ("get configmaps 404", 1),
        ("list configmaps 200", 1),
        ("patch configmaps 200", 1),
        ("update configmaps 200", 1),
        ("delete configmaps 200", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(stats.by_verb_resource_code(), expected);
    assert_eq!(stats.writes(), 5);
    assert_eq!(stats.total(), 9);
    let clients: Vec<&str> = stats.counts.keys().map(|k| k.client.as_str()).collect();
    assert!(
        clients.iter().all(|c| *c == clients[0] && !c.is_empty()),
        "{clients:?}"
    );

    // The same counters in Prometheus text at /metrics (reading them is not counted).
    let (code, text) = common::raw(&sim, "GET", "/metrics", "text/plain", "").await;
    assert_eq!(code, 200);
    assert!(
        text.contains(&format!(
            "apiserver_request_total{{verb=\"CREATE\",group=\"\",resource=\"configmaps\",subresource=\"\",path=\"\",client=\"{}\",user=\"\",code=\"409\"}} 1\n",
            clients[0]
        )),
        "{text}"
    );
    assert_eq!(sim.requests().total(), 9);

    // A steady state: a watcher that sees no change makes no writes.
    sim.reset_requests();
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(writer, watcher(cms.clone(), watcher::Config::default()));
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    reader.wait_until_ready().await.expect("ready");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let steady = sim.requests();
    assert_eq!(steady.writes(), 0);
    assert_eq!(steady.count("list", "configmaps"), 1);
    assert_eq!(steady.count("watch", "configmaps"), 1);
    task.abort();

    common::raw(&sim, "DELETE", "/_sim/requests", "application/json", "").await;
    assert_eq!(sim.requests().total(), 0);
    sim.shutdown().await;
}

/// Creates or deletes until the server acknowledges, whatever faults it injects.
async fn until_ok<T, F, Fut>(mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    for _ in 0..200 {
        match op().await {
            Ok(v) => return v,
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    panic!("200 attempts failed");
}

#[tokio::test]
async fn a_reflector_converges_under_injected_errors_and_cut_watches() {
    let sim = common::start_with(kube_sim::Config {
        faults: FaultConfig {
            seed: 42,
            errors: vec![
                ErrorRule {
                    verbs: vec![],
                    resources: vec![],
                    rate: 0.05,
                    code: 500,
                    retry_after_seconds: 1,
                },
                ErrorRule {
                    verbs: vec![],
                    resources: vec![],
                    rate: 0.05,
                    code: 429,
                    retry_after_seconds: 1,
                },
            ],
            watch_max_events: Some(7),
            watch_max_seconds: Some(0.7),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(
        writer,
        watcher(cms.clone(), watcher::Config::default()).default_backoff(),
    );
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    let (pp, patch_params) = (PostParams::default(), PatchParams::default());
    for i in 0..40 {
        let c = cm(&format!("c{i}"), "v");
        until_ok(|| cms.create(&pp, &c)).await;
        if i % 3 == 0 {
            let name = format!("c{}", i / 2);
            let patch = Patch::Merge(json!({"data": {"k": format!("p{i}")}}));
            // Patching a name deleted earlier is a 404: acknowledged as such.
            until_ok(|| async {
                match cms.patch(&name, &patch_params, &patch).await {
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(e),
                    Ok(_) => Ok(()),
                }
            })
            .await;
        }
        if i % 5 == 4 {
            let name = format!("c{}", i - 2);
            until_ok(|| async {
                match cms.delete(&name, &DeleteParams::default()).await {
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(e),
                    Ok(_) => Ok(()),
                }
            })
            .await;
        }
    }
    let stats = sim.requests();
    let injected = stats.count_where(|k| k.code == 500 || k.code == 429);
    assert!(injected > 5, "faults were injected: {stats:?}");
    assert!(stats.count("watch", "configmaps") > 2, "watches were cut");

    // The truth, read without faults.
    sim.clear_faults();
    let truth: BTreeMap<String, Option<BTreeMap<String, String>>> = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|c| (c.name_any(), c.data))
        .collect();
    assert_eq!(truth.len(), 32);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let have: BTreeMap<String, Option<BTreeMap<String, String>>> = reader
            .state()
            .iter()
            .map(|c| (c.name_any(), c.data.clone()))
            .collect();
        if have == truth {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "reflector did not converge: {} objects vs {}",
            have.len(),
            truth.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    task.abort();
    sim.shutdown().await;
}

/// The codes a fixed request sequence gets from a server with the given fault seed.
async fn fault_codes(seed: u64) -> Vec<u16> {
    let sim = common::start_with(kube_sim::Config {
        faults: FaultConfig::uniform_errors(seed, 0.3, 503),
        ..Default::default()
    })
    .await;
    let mut codes = Vec::new();
    for i in 0..40 {
        let (code, _) = if i % 2 == 0 {
            common::raw(
                &sim,
                "POST",
                "/api/v1/namespaces/default/configmaps",
                "application/json",
                &format!(
                    r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"c{i}"}}}}"#
                ),
            )
            .await
        } else {
            common::raw(&sim, "GET", "/api/v1/namespaces/default/configmaps", "", "").await
        };
        codes.push(code);
    }
    sim.shutdown().await;
    codes
}

#[tokio::test]
async fn the_same_seed_gives_the_same_faults_over_http() {
    let first = fault_codes(11).await;
    assert_eq!(first, fault_codes(11).await);
    assert_ne!(first, fault_codes(12).await);
    assert!(first.contains(&503) && first.contains(&200) && first.contains(&201));
}

#[tokio::test]
async fn a_forced_410_makes_the_watcher_relist() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("before", "v"))
        .await
        .expect("create");
    let inits = Arc::new(AtomicUsize::new(0));
    let counter = inits.clone();
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(
        writer,
        watcher(cms.clone(), watcher::Config::default()).default_backoff(),
    )
    .inspect(move |e| {
        if let Ok(watcher::Event::Init) = e {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    reader.wait_until_ready().await.expect("ready");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lists_before = sim.requests().count("list", "configmaps");
    assert_eq!(lists_before, 1);

    // The watch is cut; its resumption is answered 410 Gone, so the watcher must list again.
    sim.force_watch_gone(1);
    sim.cut_watches();
    cms.create(&PostParams::default(), &cm("after", "v"))
        .await
        .expect("create");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut have: Vec<String> = reader.state().iter().map(|c| c.name_any()).collect();
        have.sort();
        if have == ["after", "before"] && inits.load(Ordering::SeqCst) >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no re-list: {have:?}, inits {inits:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = sim.requests();
    assert_eq!(stats.count("list", "configmaps"), 2, "{stats:?}");
    task.abort();
    sim.shutdown().await;
}

#[tokio::test]
async fn faults_through_the_admin_endpoint_and_partitions() {
    let sim = common::start().await;
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (code, body) = common::raw(
        &sim,
        "POST",
        "/_sim/faults",
        "application/json",
        r#"{"seed":1,"errors":[{"verbs":["create"],"resources":["configmaps"],"rate":1.0,"code":429,"retryAfterSeconds":7}]}"#,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = common::raw(
        &sim,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#,
    )
    .await;
    assert_eq!(code, 429);
    let status: serde_json::Value = serde_json::from_str(&body).expect("Status JSON");
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["details"]["retryAfterSeconds"], 7);
    // Reads are not affected by a rule on creates.
    cms.list(&ListParams::default()).await.expect("list");
    let (code, _) = common::raw(&sim, "DELETE", "/_sim/faults", "application/json", "").await;
    assert_eq!(code, 200);
    cms.create(&PostParams::default(), &cm("x", "v"))
        .await
        .expect("create after clearing");

    let (code, body) = common::raw(
        &sim,
        "POST",
        "/_sim/faults",
        "application/json",
        r#"{"bogus": true}"#,
    )
    .await;
    assert_eq!(code, 400, "{body}");

    // Added latency.
    sim.set_faults(FaultConfig {
        latency_ms: 300,
        ..Default::default()
    });
    let started = std::time::Instant::now();
    cms.get("x").await.expect("slow get");
    assert!(started.elapsed() >= Duration::from_millis(300));
    sim.clear_faults();

    // A partition: requests fail at the transport level, then work again.
    sim.partition_for(Duration::from_millis(500));
    let err = cms.get("x").await.expect_err("partitioned");
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "a transport error, not a Status: {err:?}"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    cms.get("x").await.expect("healed");
    sim.shutdown().await;
}
