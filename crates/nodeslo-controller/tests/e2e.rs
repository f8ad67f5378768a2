//! End to end: kube-sim, Capstan's CRDs and the real `nodeslo-controller` binary, driven and
//! checked through the kube client as a user would.

use std::time::Duration;

use capstan_apis::slo::NodeSlo;
use capstan_testkit::objects::{config_map, node};
use capstan_testkit::process::http_get;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

mod common;
use capstan_testkit::eventually;
use common::Cluster;

const WAIT: Duration = Duration::from_secs(20);

fn slo_config(data: &[(&str, &str)]) -> ConfigMap {
    config_map("koordinator-system", "slo-controller-config", data)
}

struct Apis {
    nodes: Api<Node>,
    slos: Api<NodeSlo>,
    config: Api<ConfigMap>,
}

impl Apis {
    fn new(cluster: &Cluster) -> Self {
        Self {
            nodes: Api::all(cluster.client.clone()),
            slos: Api::all(cluster.client.clone()),
            config: Api::namespaced(cluster.client.clone(), "koordinator-system"),
        }
    }

    async fn spec(&self, name: &str) -> Option<Value> {
        let slo = self.slos.get_opt(name).await.expect("get NodeSLO")?;
        Some(serde_json::to_value(&slo.spec).expect("spec json"))
    }

    /// Waits until the NodeSLO `name` has exactly `expected` as spec.
    async fn wait_spec(&self, name: &str, expected: &Value) {
        let mut last = None;
        let found = tokio::time::timeout(WAIT, async {
            loop {
                last = self.spec(name).await;
                if last.as_ref() == Some(expected) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(
            found.is_ok(),
            "NodeSLO {name}: expected {expected:#}, last seen {last:#?}"
        );
    }

    async fn wait_field(&self, name: &str, pointer: &str, expected: Value) {
        let what = format!("NodeSLO {name} {pointer} == {expected}");
        eventually(&what, WAIT, || async {
            let spec = self.spec(name).await?;
            (spec.pointer(pointer) == Some(&expected)).then_some(())
        })
        .await;
    }
}

fn default_spec() -> Value {
    json!({
        "resourceUsedThresholdWithBE": {"enable": false, "cpuSuppressThresholdPercent": 65,
            "cpuSuppressPolicy": "cpuset", "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"},
        "resourceQOSStrategy": {},
        "cpuBurstStrategy": {"policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
            "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 50},
        "systemStrategy": {"totalNetworkBandwidth": "0"}
    })
}

const THRESHOLD_WITH_NODE_STRATEGIES: &str = r#"{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60},
  "nodeStrategies":[{"name":"xxx","nodeSelector":{"matchLabels":{"xxx":"yyy"}},"cpuSuppressThresholdPercent":40},
                    {"name":"zzz","nodeSelector":{"matchLabels":{"zzz":"zzz"}},"cpuSuppressThresholdPercent":50}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_exact_specs_and_follow_config_labels_edits_and_deletions() {
    let cluster = Cluster::start().await;
    let apis = Apis::new(&cluster);
    let pp = PostParams::default();
    apis.nodes
        .create(&pp, &node("plain", &[]))
        .await
        .expect("node");
    apis.nodes
        .create(&pp, &node("labelled", &[("xxx", "yyy")]))
        .await
        .expect("node");
    let mut controller = cluster.spawn_controller(&[]).await;

    // No ConfigMap: every node gets the defaults.
    apis.wait_spec("plain", &default_spec()).await;
    apis.wait_spec("labelled", &default_spec()).await;

    // The full ConfigMap example of the spec.
    let full = slo_config(&[
        (
            "resource-threshold-config",
            r#"{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60}}"#,
        ),
        (
            "resource-qos-config",
            r#"{"clusterStrategy":{"beClass":{"cpuQOS":{"groupIdentity":0}}}}"#,
        ),
        (
            "cpu-burst-config",
            r#"{"clusterStrategy":{"cfsQuotaBurstPeriodSeconds":60}}"#,
        ),
        (
            "system-config",
            r#"{"clusterStrategy":{"minFreeKbytesFactor":150,"watermarkScaleFactor":150,"schedFeatures":{"ID_ABSOLUTE_EXPEL":true,"ID_EXPELLER_SHARE_CORE":false}}}"#,
        ),
        (
            "host-application-config",
            r#"{"applications":[{"name":"test-app"}]}"#,
        ),
    ]);
    apis.config.create(&pp, &full).await.expect("configmap");
    let expected = json!({
        "resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressThresholdPercent": 60,
            "cpuSuppressPolicy": "cpuset", "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"},
        "resourceQOSStrategy": {"beClass": {"cpuQOS": {"groupIdentity": 0}}},
        "cpuBurstStrategy": {"policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
            "cfsQuotaBurstPeriodSeconds": 60, "sharePoolThresholdPercent": 50},
        "systemStrategy": {"minFreeKbytesFactor": 150, "watermarkScaleFactor": 150,
            "schedFeatures": {"ID_ABSOLUTE_EXPEL": true, "ID_EXPELLER_SHARE_CORE": false},
            "totalNetworkBandwidth": "0"},
        "hostApplications": [{"name": "test-app"}]
    });
    // A config change reaches every NodeSLO.
    apis.wait_spec("plain", &expected).await;
    apis.wait_spec("labelled", &expected).await;

    // Node strategies: the labelled node gets 40, the plain one the cluster's 60.
    let mut data = full.data.clone().expect("data");
    data.insert(
        "resource-threshold-config".into(),
        THRESHOLD_WITH_NODE_STRATEGIES.into(),
    );
    let edit = json!({"data": data});
    apis.config
        .patch(
            "slo-controller-config",
            &PatchParams::default(),
            &Patch::Merge(&edit),
        )
        .await
        .expect("edit");
    apis.wait_field(
        "labelled",
        "/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent",
        json!(40),
    )
    .await;
    apis.wait_field(
        "plain",
        "/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent",
        json!(60),
    )
    .await;

    // A node label change: that NodeSLO follows.
    let relabel = json!({"metadata": {"labels": {"zzz": "zzz"}}});
    apis.nodes
        .patch("plain", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .expect("relabel");
    apis.wait_field(
        "plain",
        "/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent",
        json!(50),
    )
    .await;

    // A manual edit of a NodeSLO is reverted.
    let manual = json!({"spec": {"cpuBurstStrategy": {"cpuBurstPercent": 1}}});
    apis.slos
        .patch("plain", &PatchParams::default(), &Patch::Merge(&manual))
        .await
        .expect("manual edit");
    apis.wait_field("plain", "/cpuBurstStrategy/cpuBurstPercent", json!(1000))
        .await;

    // A deleted NodeSLO is recreated.
    apis.slos
        .delete("labelled", &DeleteParams::default())
        .await
        .expect("delete NodeSLO");
    apis.wait_field(
        "labelled",
        "/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent",
        json!(40),
    )
    .await;

    // A deleted Node takes its NodeSLO with it.
    apis.nodes
        .delete("plain", &DeleteParams::default())
        .await
        .expect("delete node");
    eventually("NodeSLO plain deleted", WAIT, || async {
        apis.slos
            .get_opt("plain")
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;

    // A deleted ConfigMap means defaults again (Decision: not the old config until restart).
    apis.config
        .delete("slo-controller-config", &DeleteParams::default())
        .await
        .expect("delete config");
    apis.wait_spec("labelled", &default_spec()).await;

    controller.sigterm().expect("sigterm");
    let status = controller
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("exit");
    assert_eq!(status.code(), Some(0), "{}", controller.output().join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_key_keeps_last_good_value_with_a_warning_event() {
    let cluster = Cluster::start().await;
    let apis = Apis::new(&cluster);
    let pp = PostParams::default();
    apis.nodes
        .create(&pp, &node("n1", &[]))
        .await
        .expect("node");
    let good = slo_config(&[
        (
            "resource-threshold-config",
            r#"{"clusterStrategy":{"cpuSuppressThresholdPercent":55}}"#,
        ),
        (
            "cpu-burst-config",
            r#"{"clusterStrategy":{"cpuBurstPercent":500}}"#,
        ),
    ]);
    apis.config.create(&pp, &good).await.expect("configmap");
    let _controller = cluster.spawn_controller(&[]).await;
    apis.wait_field(
        "n1",
        "/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent",
        json!(55),
    )
    .await;

    let broken = json!({"data": {"resource-threshold-config": "invalid_content", "cpu-burst-config": r#"{"clusterStrategy":{"cpuBurstPercent":700}}"#}});
    apis.config
        .patch(
            "slo-controller-config",
            &PatchParams::default(),
            &Patch::Merge(&broken),
        )
        .await
        .expect("edit");
    // The other key applies; the broken one keeps its last good value.
    apis.wait_field("n1", "/cpuBurstStrategy/cpuBurstPercent", json!(700))
        .await;
    apis.wait_field(
        "n1",
        "/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent",
        json!(55),
    )
    .await;

    let events: Api<Event> = Api::namespaced(cluster.client.clone(), "koordinator-system");
    let event = eventually("a SLOCfgUnmarshalFailed Event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .expect("list events");
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("SLOCfgUnmarshalFailed"))
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let regarding = event.regarding.expect("regarding");
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("ConfigMap"), Some("slo-controller-config"))
    );
    let note = event.note.expect("note");
    assert!(
        note.contains("resource-threshold-config"),
        "the Event names the key: {note}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_makes_no_writes_and_heartbeats_do_not_trigger() {
    let cluster = Cluster::start().await;
    let apis = Apis::new(&cluster);
    let pp = PostParams::default();
    for i in 0..5 {
        apis.nodes
            .create(&pp, &node(&format!("n{i}"), &[]))
            .await
            .expect("node");
    }
    let controller = cluster.spawn_controller(&[]).await;
    for i in 0..5 {
        apis.wait_spec(&format!("n{i}"), &default_spec()).await;
    }
    // Settled: the NodeSLO creations' own watch events have been reconciled too.
    let before = eventually("the reconcile count to settle", WAIT, || async {
        let first = reconciles(&controller).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        (reconciles(&controller).await == first).then_some(first)
    })
    .await;
    assert!(before >= 5, "every node was reconciled: {before}");

    // Every write anywhere bumps the one cluster-wide resourceVersion: heartbeats are our 5 writes,
    // so anything more is the controller writing.
    let writes_before = cluster.sim.resource_version();
    for i in 0..5 {
        let heartbeat = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
            "lastHeartbeatTime": "2026-11-29T10:00:00Z", "reason": "KubeletReady"}]}});
        apis.nodes
            .patch_status(
                &format!("n{i}"),
                &PatchParams::default(),
                &Patch::Merge(&heartbeat),
            )
            .await
            .expect("heartbeat");
    }
    // An absence can only be observed over some time; the heartbeats' watch events arrive in
    // milliseconds. A reconcile that writes nothing still counts here.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let output = || controller.output().join("\n");
    assert_eq!(
        reconciles(&controller).await,
        before,
        "heartbeats triggered reconciles; controller output:\n{}",
        output()
    );
    let writes = cluster.sim.resource_version() - writes_before;
    assert_eq!(
        writes,
        5,
        "only the heartbeats wrote; output:\n{}",
        output()
    );
}

/// `capstan_controller_reconciles_total` summed over its labels, read from the admin server.
async fn reconciles(controller: &capstan_testkit::process::BinaryUnderTest) -> u64 {
    let metrics = http_get(controller.admin_addr(), "/metrics")
        .await
        .expect("metrics");
    metrics
        .body
        .lines()
        .filter(|line| line.starts_with("capstan_controller_reconciles_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_restart_converges() {
    let cluster = Cluster::start().await;
    let apis = Apis::new(&cluster);
    let pp = PostParams::default();
    for i in 0..30 {
        let labels: &[(&str, &str)] = if i % 2 == 0 { &[("xxx", "yyy")] } else { &[] };
        apis.nodes
            .create(&pp, &node(&format!("n{i}"), labels))
            .await
            .expect("node");
    }
    let config = slo_config(&[("resource-threshold-config", THRESHOLD_WITH_NODE_STRATEGIES)]);
    apis.config.create(&pp, &config).await.expect("configmap");

    let first = cluster.spawn_controller(&["--workers", "1"]).await;
    // Kill it mid-way: as soon as the first NodeSLO exists.
    eventually("a first NodeSLO", WAIT, || async {
        let list = apis.slos.list(&ListParams::default()).await.expect("list");
        (!list.items.is_empty()).then_some(())
    })
    .await;
    first.signal(nix_kill()).expect("kill -9");
    // While it is down: a node goes, its NodeSLO must still go after the restart.
    apis.nodes
        .delete("n1", &DeleteParams::default())
        .await
        .expect("delete node");

    let _second = cluster.spawn_controller(&[]).await;
    for i in (0..30).filter(|i| *i != 1) {
        let expected = if i % 2 == 0 { 40 } else { 60 };
        apis.wait_field(
            &format!("n{i}"),
            "/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent",
            json!(expected),
        )
        .await;
    }
    eventually("NodeSLO n1 deleted", WAIT, || async {
        apis.slos
            .get_opt("n1")
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    let count = apis
        .slos
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .len();
    assert_eq!(count, 29, "exactly one NodeSLO per Node");
}

fn nix_kill() -> nix::sys::signal::Signal {
    nix::sys::signal::Signal::SIGKILL
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bandwidth_annotation_overrides_and_an_invalid_one_is_reported_on_the_node() {
    let cluster = Cluster::start().await;
    let apis = Apis::new(&cluster);
    let pp = PostParams::default();
    let config = slo_config(&[(
        "system-config",
        r#"{"clusterStrategy":{"minFreeKbytesFactor":150,"totalNetworkBandwidth":"10G"}}"#,
    )]);
    apis.config.create(&pp, &config).await.expect("configmap");
    let mut annotated = node("fast", &[]);
    annotated.metadata.annotations = Some(
        [(
            "node.koordinator.sh/network-bandwidth".to_string(),
            "99M".to_string(),
        )]
        .into(),
    );
    apis.nodes.create(&pp, &annotated).await.expect("node");
    let mut broken = node("broken", &[]);
    broken.metadata.annotations = Some(
        [(
            "node.koordinator.sh/network-bandwidth".to_string(),
            "lots".to_string(),
        )]
        .into(),
    );
    apis.nodes.create(&pp, &broken).await.expect("node");
    let controller = cluster.spawn_controller(&[]).await;

    apis.wait_field(
        "fast",
        "/systemStrategy",
        json!({"minFreeKbytesFactor": 150, "totalNetworkBandwidth": "99M"}),
    )
    .await;
    // Decision: an invalid annotation keeps the strategy value (the reference drops systemStrategy).
    apis.wait_field(
        "broken",
        "/systemStrategy",
        json!({"minFreeKbytesFactor": 150, "totalNetworkBandwidth": "10G"}),
    )
    .await;
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), "default");
    let event = eventually("an InvalidNetworkBandwidth Event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .expect("list events");
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("InvalidNetworkBandwidth"))
    })
    .await;
    let regarding = event.regarding.expect("regarding");
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("Node"), Some("broken"))
    );

    // The reference metric names, next to the runtime's controller metrics.
    let metrics = http_get(controller.admin_addr(), "/metrics")
        .await
        .expect("metrics")
        .body;
    for line in [
        r#"slo_controller_nodeslo_reconcile_count_total{status="succeeded",reason="createNodeSLO"} 2"#,
        r#"slo_controller_nodeslo_spec_parse_count_total{status="succeeded",reason="system-config"} 1"#,
        r#"capstan_controller_reconciles_total{controller="nodeslo-controller",kind="NodeSLO"}"#,
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    // Both caches hold both: the chart's NodeSLOsMissing alert compares these two gauges.
    eventually("both caches counted", WAIT, || async {
        let metrics = http_get(controller.admin_addr(), "/metrics")
            .await
            .ok()?
            .body;
        let lines: Vec<&str> = metrics.lines().collect();
        (lines.contains(&"capstan_nodeslo_nodes_cached 2")
            && lines.contains(&"slo_controller_nodeslo_cached 2"))
        .then_some(())
    })
    .await;
}
