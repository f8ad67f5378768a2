//! kube-sim as a testbed: request accounting, fault injection (errors, cut watches, forced 410,
//! partitions), seen through real kube-rs clients.

mod common;

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

mod workloads {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::EvictParams;
    use std::collections::HashSet;

    async fn running_pods(pods: &Api<Pod>, want: usize) -> Vec<Pod> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let list = pods.list(&ListParams::default()).await.expect("list pods");
            let live: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let running = live
                .iter()
                .filter(|p| {
                    let s = p.status.as_ref();
                    s.and_then(|s| s.phase.as_deref()) == Some("Running")
                        && s.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                            c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .count();
            if live.len() == want && running == want {
                return live;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "wanted {want} running pods, have {} ({running} running)",
                live.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn deployment_ready(deploys: &Api<Deployment>, want: i32) -> Deployment {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let d = deploys.get("web").await.expect("get");
            let s = d.status.clone().unwrap_or_default();
            if s.ready_replicas.unwrap_or(0) == want
                && s.available_replicas.unwrap_or(0) == want
                && s.updated_replicas.unwrap_or(0) == want
                && s.replicas.unwrap_or(0) == want
                && s.observed_generation == d.metadata.generation
            {
                return d;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "deployment status did not follow: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn ips(pods: &[Pod]) -> HashSet<String> {
        pods.iter()
            .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
            .collect()
    }

    #[tokio::test]
    async fn deployments_get_running_pods_that_follow_scaling_eviction_and_deletion() {
        let sim = common::start_with(kube_sim::Config {
            simulate_workloads: true,
            ..Default::default()
        })
        .await;
        sim.add_node("node-a", &BTreeMap::from([("zone".into(), "z1".into())]))
            .expect("node");
        let client = sim.client().expect("client");
        let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let d: Deployment = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
        }))
        .expect("valid Deployment");
        deploys
            .create(&PostParams::default(), &d)
            .await
            .expect("create");

        let three = running_pods(&pods, 3).await;
        assert_eq!(ips(&three).len(), 3, "distinct pod IPs");
        for p in &three {
            let ip: std::net::Ipv4Addr = p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .expect("pod IP")
                .parse()
                .expect("IPv4");
            assert!(ip.is_loopback(), "{ip}");
            assert_eq!(
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                Some("node-a")
            );
            let owner = &p.metadata.owner_references.as_ref().expect("owned")[0];
            assert_eq!(owner.kind, "ReplicaSet");
            let hash = &p.labels()["pod-template-hash"];
            assert_eq!(owner.name, format!("web-{hash}"));
        }
        deployment_ready(&deploys, 3).await;

        deploys
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await
            .expect("scale up");
        let five = running_pods(&pods, 5).await;
        assert_eq!(ips(&five).len(), 5);
        deployment_ready(&deploys, 5).await;

        // Eviction deletes the pod; the ReplicaSet replaces it.
        let victim = five[0].name_any();
        pods.evict(&victim, &EvictParams::default())
            .await
            .expect("evict");
        let replaced = running_pods(&pods, 5).await;
        assert!(replaced.iter().all(|p| p.name_any() != victim));

        deploys
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 1}})),
            )
            .await
            .expect("scale down");
        running_pods(&pods, 1).await;
        deployment_ready(&deploys, 1).await;

        // A new pod template rolls out: a new ReplicaSet, the old one scaled to zero.
        let old_hash = running_pods(&pods, 1).await[0].labels()["pod-template-hash"].clone();
        deploys
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx:2"}]}}}})),
            )
            .await
            .expect("new template");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = running_pods(&pods, 1).await;
            if now[0].labels()["pod-template-hash"] != old_hash {
                let image = now[0].spec.as_ref().map(|s| s.containers[0].image.clone());
                assert_eq!(image, Some(Some("nginx:2".into())));
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "no rollout");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        deployment_ready(&deploys, 1).await;
        let replicasets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
            Api::namespaced(client.clone(), "default");
        let old = replicasets
            .get(&format!("web-{old_hash}"))
            .await
            .expect("old ReplicaSet kept");
        assert_eq!(old.spec.and_then(|s| s.replicas), Some(0));

        deploys
            .delete("web", &DeleteParams::default())
            .await
            .expect("delete");
        running_pods(&pods, 0).await;

        // A node that stops heartbeating goes NotReady (here through the admin endpoint).
        let (code, body) = common::raw(
            &sim,
            "PUT",
            "/_sim/nodes/node-a",
            "application/json",
            r#"{"ready": false}"#,
        )
        .await;
        assert_eq!(code, 200, "{body}");
        let (code, body) = common::raw(
            &sim,
            "POST",
            "/_sim/nodes",
            "application/json",
            r#"{"name": "node-b", "labels": {"zone": "z2"}}"#,
        )
        .await;
        assert_eq!(code, 201, "{body}");
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        let node = nodes.get("node-a").await.expect("node");
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
            .expect("Ready condition");
        assert_eq!(ready.status, "Unknown");
        assert_eq!(node.metadata.labels.expect("labels")["zone"], "z1");
        let b = nodes.get("node-b").await.expect("node-b");
        assert!(
            b.status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        );
        sim.shutdown().await;
    }
}

mod persistence {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::{AsyncBufReadExt, BufReader};

    struct Served {
        child: tokio::process::Child,
        client: kube::Client,
    }

    async fn serve(dir: &std::path::Path) -> Served {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("kube-sim starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .expect("banner");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .expect("URL in the banner")
            .trim_end_matches(';')
            .to_string();
        let mut config = kube::Config::new(url.parse().expect("URL"));
        config.default_namespace = "default".into();
        Served {
            child,
            client: kube::Client::try_from(config).expect("client"),
        }
    }

    fn rv_of(c: &ConfigMap) -> u64 {
        c.metadata
            .resource_version
            .as_deref()
            .and_then(|r| r.parse().ok())
            .expect("numeric resourceVersion")
    }

    #[tokio::test]
    async fn acknowledged_writes_survive_kill_9_and_versions_continue() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = serve(dir.path()).await;
        let cms: Api<ConfigMap> = Api::namespaced(first.client.clone(), "default");
        cms.create(&PostParams::default(), &cm("counter", "0"))
            .await
            .expect("counter");
        // Acknowledged creates (name, rv) and the last acknowledged counter value.
        let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let counter_acked = Arc::new(AtomicUsize::new(0));
        let mut writers = Vec::new();
        for w in 0..3 {
            let (cms, acked, counter_acked) = (cms.clone(), acked.clone(), counter_acked.clone());
            writers.push(tokio::spawn(async move {
                for i in 0.. {
                    let name = format!("w{w}-{i}");
                    match cms.create(&PostParams::default(), &cm(&name, "v")).await {
                        Ok(c) => acked.lock().expect("not poisoned").push((name, rv_of(&c))),
                        Err(_) => return,
                    }
                    if w == 0 {
                        let patch = Patch::Merge(json!({"data": {"k": i.to_string()}}));
                        match cms.patch("counter", &PatchParams::default(), &patch).await {
                            Ok(_) => counter_acked.store(i, Ordering::SeqCst),
                            Err(_) => return,
                        }
                    }
                }
            }));
        }
        // Kill -9 in the middle of the burst.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while acked.lock().expect("not poisoned").len() < 150 {
            assert!(tokio::time::Instant::now() < deadline, "writes too slow");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut child = first.child;
        child.start_kill().expect("SIGKILL");
        child.wait().await.expect("reaped");
        for w in writers {
            w.await.expect("writer ends on the first error");
        }
        let acked = acked.lock().expect("not poisoned").clone();
        let max_rv = acked.iter().map(|(_, rv)| *rv).max().expect("some writes");

        let second = serve(dir.path()).await;
        let cms: Api<ConfigMap> = Api::namespaced(second.client.clone(), "default");
        let list = cms.list(&ListParams::default()).await.expect("list");
        let stored: BTreeMap<String, u64> = list
            .items
            .iter()
            .map(|c| (c.name_any(), rv_of(c)))
            .collect();
        for (name, rv) in &acked {
            assert!(
                stored.get(name).is_some_and(|s| s >= rv),
                "acknowledged {name} at {rv} is missing after the restart"
            );
        }
        let counter = stored_counter(&list.items);
        assert!(
            counter >= counter_acked.load(Ordering::SeqCst),
            "the counter went back"
        );
        let list_rv: u64 = list
            .metadata
            .resource_version
            .as_deref()
            .and_then(|r| r.parse().ok())
            .expect("list RV");
        assert!(list_rv >= max_rv);
        let after = cms
            .create(&PostParams::default(), &cm("after-restart", "v"))
            .await
            .expect("write after restart");
        assert!(rv_of(&after) > list_rv, "resourceVersions continue upwards");
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> =
            Api::all(second.client.clone());
        namespaces
            .get("kube-system")
            .await
            .expect("built-ins survive");
        // A watch from a version before the crash resumes from the replayed history.
        let (first_name, first_rv) = acked[0].clone();
        let events = cms
            .watch(
                &kube::api::WatchParams::default().timeout(1),
                &first_rv.to_string(),
            )
            .await
            .expect("watch");
        futures::pin_mut!(events);
        match events.next().await.expect("an event").expect("decodes") {
            kube::api::WatchEvent::Added(c) | kube::api::WatchEvent::Modified(c) => {
                assert!(rv_of(&c) > first_rv);
                assert_ne!(c.name_any(), first_name);
            }
            kube::api::WatchEvent::Error(e) => assert_eq!(e.code, 410),
            other => panic!("unexpected {other:?}"),
        }
        drop(second);
    }

    fn stored_counter(items: &[ConfigMap]) -> usize {
        items
            .iter()
            .find(|c| c.name_any() == "counter")
            .and_then(|c| c.data.as_ref()?.get("k")?.parse().ok())
            .expect("counter value")
    }
}

mod rbac {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

    fn status(e: kube::Error) -> kube::core::Status {
        match e {
            kube::Error::Api(s) => *s,
            other => panic!("expected an API error, got {other:?}"),
        }
    }

    async fn setup(sim: &kube_sim::KubeSim) {
        let admin = sim.client().expect("admin client");
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": "team"}})).expect("ns");
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace");
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": "bot"}})).expect("sa");
        Api::<ServiceAccount>::namespaced(admin.clone(), "team")
            .create(&PostParams::default(), &sa)
            .await
            .expect("service account");
        let role: Role = serde_json::from_value(json!({
            "metadata": {"name": "bot"},
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"], "resourceNames": ["web"]},
                {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
            ]
        }))
        .expect("role");
        Api::<Role>::namespaced(admin.clone(), "team")
            .create(&PostParams::default(), &role)
            .await
            .expect("role");
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "bot"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bot"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "team"}]
        }))
        .expect("binding");
        Api::<RoleBinding>::namespaced(admin.clone(), "team")
            .create(&PostParams::default(), &binding)
            .await
            .expect("binding");
        Api::<ConfigMap>::namespaced(admin, "team")
            .create(&PostParams::default(), &cm("visible", "v"))
            .await
            .expect("configmap");
    }

    #[tokio::test]
    async fn a_service_account_can_do_exactly_what_its_role_grants() {
        let sim = common::start_with(kube_sim::Config {
            auth: kube_sim::auth::AuthConfig {
                rbac: true,
                ..Default::default()
            },
            ..Default::default()
        })
        .await;
        setup(&sim).await;
        let bot = sim
            .client_with_token(&sim.service_account_token("team", "bot"))
            .expect("bot client");
        let cms: Api<ConfigMap> = Api::namespaced(bot.clone(), "team");
        assert_eq!(
            cms.list(&ListParams::default())
                .await
                .expect("list")
                .items
                .len(),
            1
        );
        cms.get("visible").await.expect("get");
        let denied = status(
            cms.create(&PostParams::default(), &cm("new", "v"))
                .await
                .expect_err("create is not granted"),
        );
        assert_eq!((denied.code, denied.reason.as_str()), (403, "Forbidden"));
        assert_eq!(
            denied.message,
            "configmaps is forbidden: User \"system:serviceaccount:team:bot\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"team\""
        );
        let denied = status(
            cms.delete("visible", &DeleteParams::default())
                .await
                .expect_err("delete is not granted"),
        );
        assert_eq!(
            denied.message,
            "configmaps \"visible\" is forbidden: User \"system:serviceaccount:team:bot\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"team\""
        );
        let other: Api<ConfigMap> = Api::namespaced(bot.clone(), "default");
        assert_eq!(
            status(
                other
                    .list(&ListParams::default())
                    .await
                    .expect_err("other ns")
            )
            .code,
            403
        );
        let nodes: Api<Node> = Api::all(bot.clone());
        assert_eq!(
            status(
                nodes
                    .list(&ListParams::default())
                    .await
                    .expect_err("cluster scope")
            )
            .message,
            "nodes is forbidden: User \"system:serviceaccount:team:bot\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        );
        // resourceNames: the patch reaches the store only for "web" (which does not exist: 404).
        let deploys: Api<Deployment> = Api::namespaced(bot.clone(), "team");
        let patch = Patch::Merge(json!({"spec": {"replicas": 2}}));
        assert_eq!(
            status(
                deploys
                    .patch("web", &PatchParams::default(), &patch)
                    .await
                    .expect_err("absent")
            )
            .code,
            404
        );
        assert_eq!(
            status(
                deploys
                    .patch("api", &PatchParams::default(), &patch)
                    .await
                    .expect_err("not named")
            )
            .code,
            403
        );
        // A token for a ServiceAccount that does not exist, and a made-up token: 401.
        let ghost = sim
            .client_with_token(&sim.service_account_token("team", "ghost"))
            .expect("client");
        let e = status(
            Api::<ConfigMap>::namespaced(ghost, "team")
                .list(&ListParams::default())
                .await
                .expect_err("unknown service account"),
        );
        assert_eq!(e.code, 401);
        // The generated kubeconfig's admin may do anything, and the counters name the users.
        Api::<ConfigMap>::namespaced(sim.client().expect("admin"), "team")
            .create(&PostParams::default(), &cm("by-admin", "v"))
            .await
            .expect("admin creates");
        let stats = sim.requests();
        assert_eq!(
            stats.count_where(|k| k.user == "system:serviceaccount:team:bot" && k.code == 403),
            5
        );
        assert!(stats.count_where(|k| k.user == "kube-sim-admin" && k.verb == "create") >= 5);

        // kubectl auth can-i agrees, through SelfSubjectAccessReview.
        if !capstan_testkit::require(
            "kubectl (for its kubectl part)",
            capstan_testkit::on_path("kubectl"),
        ) {
            sim.shutdown().await;
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        // client-go sends no bearer token over plain HTTP: kubectl is the admin and asks as the
        // ServiceAccount by impersonation.
        let kubeconfig = dir.path().join("admin.yaml");
        sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let cases: [(&[&str], bool); 8] = [
            (&["list", "configmaps"], true),
            (&["get", "configmaps/visible"], true),
            (&["create", "configmaps"], false),
            (&["delete", "configmaps"], false),
            (&["patch", "deployments.apps/web"], true),
            (&["patch", "deployments.apps/api"], false),
            (&["create", "pods", "--subresource=eviction"], true),
            (&["create", "pods"], false),
        ];
        for (args, want) in cases {
            let out = tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args([
                    "auth",
                    "can-i",
                    "--as",
                    "system:serviceaccount:team:bot",
                    "-n",
                    "team",
                ])
                .args(args)
                .output()
                .await
                .expect("kubectl runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                (stdout.trim(), out.status.success()),
                (if want { "yes" } else { "no" }, want),
                "kubectl auth can-i {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["auth", "can-i", "list", "configmaps", "-n", "default"])
            .args(["--as", "system:serviceaccount:team:bot"])
            .output()
            .await
            .expect("kubectl runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
        // The admin itself may do anything.
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["auth", "can-i", "delete", "nodes"])
            .output()
            .await
            .expect("kubectl runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "yes");
        // The bot may not impersonate anyone.
        let token = sim.service_account_token("team", "bot");
        let addr = sim.addr();
        let body = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            write!(
                s,
                "GET /api/v1/namespaces/team/configmaps HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nImpersonate-User: alice\r\n\r\n"
            )
            .expect("request");
            let mut out = String::new();
            s.read_to_string(&mut out).expect("response");
            out
        })
        .await
        .expect("raw request");
        let json_start = body.find("\r\n\r\n").expect("headers end") + 4;
        let e: kube::core::Status =
            serde_json::from_str(&body[json_start..]).expect("a Status body");
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "users \"alice\" is forbidden: User \"system:serviceaccount:team:bot\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
        );
        sim.shutdown().await;
    }
}

mod flags {
    use super::*;
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use tokio::io::{AsyncBufReadExt, BufReader};

    #[tokio::test]
    async fn the_binary_takes_every_testbed_feature_from_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(&tokens, "alice-token,alice,1001,\"viewers,dev\"\n").expect("tokens");
        let kubeconfig = dir.path().join("kubeconfig");
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
            .args(["serve", "--addr", "127.0.0.1:0", "--kubeconfig-out"])
            .arg(&kubeconfig)
            .arg("--token-file")
            .arg(&tokens)
            .args(["--authorization-mode", "RBAC", "--simulate-workloads"])
            .args(["--pod-cidr", "127.42.0.0/24", "--faults"])
            .arg(r#"{"seed":5,"errors":[{"verbs":["delete"],"resources":["secrets"],"rate":1.0,"code":500}]}"#)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("kube-sim starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .await
            .expect("banner");
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig"),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("config");
        let url = config.cluster_url.to_string();
        let admin = kube::Client::try_from(config).expect("admin client");

        // The admin of the written kubeconfig may do anything.
        let role: ClusterRole = serde_json::from_value(json!({"metadata": {"name": "cm-viewer"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}))
        .expect("role");
        Api::<ClusterRole>::all(admin.clone())
            .create(&PostParams::default(), &role)
            .await
            .expect("role");
        let binding: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": "viewers"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cm-viewer"},
            "subjects": [{"kind": "Group", "name": "viewers", "apiGroup": "rbac.authorization.k8s.io"}]}))
        .expect("binding");
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("binding");

        // alice (token file) gets what her group is bound to.
        let mut alice_config = kube::Config::new(url.parse().expect("url"));
        alice_config.auth_info =
            serde_json::from_value(json!({"token": "alice-token"})).expect("auth info");
        let alice = kube::Client::try_from(alice_config).expect("alice");
        let cms: Api<ConfigMap> = Api::namespaced(alice.clone(), "default");
        cms.list(&ListParams::default()).await.expect("alice lists");
        let denied = cms
            .create(&PostParams::default(), &cm("x", "v"))
            .await
            .expect_err("alice may not create");
        assert!(
            matches!(denied, kube::Error::Api(s) if s.code == 403 && s.message.contains("User \"alice\" cannot create"))
        );

        // --faults: deleting secrets always fails with 500.
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
        let secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": "s"}})).expect("secret");
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("create");
        let e = secrets
            .delete("s", &DeleteParams::default())
            .await
            .expect_err("injected");
        assert!(matches!(e, kube::Error::Api(s) if s.code == 500 && s.reason == "InternalError"));

        // --simulate-workloads with --pod-cidr: a bare Pod runs with an IP from the pool.
        let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
        .expect("pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("pod");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let ip = loop {
            let p = pods.get("p").await.expect("get");
            if let Some(ip) = p.status.and_then(|s| s.pod_ip) {
                break ip;
            }
            assert!(tokio::time::Instant::now() < deadline, "pod never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(ip, "127.42.0.1");

        // /metrics names the users.
        let metrics = admin
            .request_text(
                http::Request::get("/metrics")
                    .body(Vec::new())
                    .expect("request"),
            )
            .await
            .expect("metrics");
        assert!(
            metrics.contains("user=\"alice\",code=\"403\"} 1"),
            "{metrics}"
        );
        child.start_kill().expect("kill");
        child.wait().await.expect("reaped");
    }
}

mod rbac_over_tls {
    use super::*;

    /// Over HTTPS kubectl does send bearer tokens: a ServiceAccount's own kubeconfig works.
    #[tokio::test]
    async fn kubectl_with_a_service_account_token_over_https() {
        if !capstan_testkit::require("kubectl", capstan_testkit::on_path("kubectl")) {
            return;
        }
        let sim = common::start_with(kube_sim::Config {
            tls: true,
            auth: kube_sim::auth::AuthConfig {
                rbac: true,
                anonymous_requests: true,
                ..Default::default()
            },
            ..Default::default()
        })
        .await;
        let admin = sim.client().expect("admin");
        let apply = |v: serde_json::Value| {
            let admin = admin.clone();
            async move {
                let obj: kube::api::DynamicObject = serde_json::from_value(v).expect("object");
                let gvk = kube::api::GroupVersionKind::try_from(obj.types.as_ref().expect("types"))
                    .expect("gvk");
                let (ar, _) = kube::discovery::pinned_kind(&admin, &gvk)
                    .await
                    .expect("discovered");
                let api: Api<kube::api::DynamicObject> = match obj.metadata.namespace.as_deref() {
                    Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
                    None => Api::all_with(admin.clone(), &ar),
                };
                api.create(&PostParams::default(), &obj)
                    .await
                    .expect("created");
            }
        };
        apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "reader", "namespace": "default"}}))
        .await;
        apply(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "reader", "namespace": "default"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]}),
        )
        .await;
        apply(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "reader", "namespace": "default"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]}),
        )
        .await;
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("reader.yaml");
        std::fs::write(
            &kubeconfig,
            sim.kubeconfig_yaml_with_token(&sim.service_account_token("default", "reader")),
        )
        .expect("kubeconfig");
        let kubectl = |args: &'static [&'static str]| {
            let kubeconfig = kubeconfig.clone();
            async move {
                tokio::process::Command::new("kubectl")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(args)
                    .output()
                    .await
                    .expect("kubectl runs")
            }
        };
        let out = kubectl(&["auth", "can-i", "list", "configmaps"]).await;
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "yes");
        let out = kubectl(&["auth", "can-i", "delete", "configmaps"]).await;
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
        let out = kubectl(&["get", "configmaps"]).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = kubectl(&["get", "secrets"]).await;
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(
                "secrets is forbidden: User \"system:serviceaccount:default:reader\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\""
            ),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        sim.shutdown().await;
    }
}
