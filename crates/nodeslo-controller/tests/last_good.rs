//! The last good value of each config key survives a restart of the real controller: a typo'd key
//! keeps its last good value, with a `SLOCfgUnmarshalFailed` Event, and after a restart a NodeSLO
//! recreated meanwhile still gets that value (the reference would fall back to the defaults). The
//! user's ConfigMap is never written; the values live in `slo-controller-config-last-good`.

mod common;

use std::time::Duration;

use capstan_apis::slo::NodeSlo;
use capstan_testkit::eventually;
use capstan_testkit::objects::{config_map, node};
use common::Cluster;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "koordinator-system";
const WAIT: u64 = 30;

async fn spec_field(slos: &Api<NodeSlo>, node: &str, pointer: &str) -> Option<Value> {
    let slo = slos.get_opt(node).await.ok()??;
    serde_json::to_value(&slo.spec)
        .ok()?
        .pointer(pointer)
        .cloned()
}

async fn wait_field(slos: &Api<NodeSlo>, node: &str, pointer: &str, want: Value) {
    let what = format!("{node} {pointer} == {want}");
    eventually(&what, Duration::from_secs(WAIT), || async {
        (spec_field(slos, node, pointer).await.as_ref() == Some(&want)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typo_plus_a_restart_keeps_the_last_good_value_of_that_key() {
    let cluster = Cluster::start().await;
    let pp = PostParams::default();
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let slos: Api<NodeSlo> = Api::all(cluster.client.clone());
    let configs: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), NS);
    nodes
        .create(&pp, &node("n1", &[]))
        .await
        .expect("node created");
    let good_system = r#"{"clusterStrategy":{"totalNetworkBandwidth":"10G"}}"#;
    let good_threshold = r#"{"clusterStrategy":{"cpuSuppressThresholdPercent":55}}"#;
    let cm = config_map(
        NS,
        "slo-controller-config",
        &[
            ("system-config", good_system),
            ("resource-threshold-config", good_threshold),
        ],
    );
    configs.create(&pp, &cm).await.expect("configmap created");

    let mut controller = cluster.spawn_controller(&[]).await;
    wait_field(
        &slos,
        "n1",
        "/systemStrategy/totalNetworkBandwidth",
        json!("10G"),
    )
    .await;
    wait_field(
        &slos,
        "n1",
        "/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent",
        json!(55),
    )
    .await;

    // A quantity that does not parse and a percentage out of the CRD's range.
    let typo = json!({"data": {
        "system-config": r#"{"clusterStrategy":{"totalNetworkBandwidth":"lots"}}"#,
        "resource-threshold-config": r#"{"clusterStrategy":{"cpuSuppressThresholdPercent":150}}"#
    }});
    let edited = configs
        .patch(
            "slo-controller-config",
            &PatchParams::default(),
            &Patch::Merge(&typo),
        )
        .await
        .expect("edit");
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), NS);
    let unmarshal_notes = || async {
        events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("SLOCfgUnmarshalFailed"))
            .filter_map(|e| e.note)
            .collect::<Vec<_>>()
    };
    // One Event per ConfigMap version at least (Events of one reason on one object are
    // aggregated, so only the first key's note is certain to be seen).
    eventually(
        "a SLOCfgUnmarshalFailed Event",
        Duration::from_secs(WAIT),
        || async {
            let notes = unmarshal_notes().await;
            notes
                .iter()
                .any(|n| {
                    n.contains("resource-threshold-config")
                        && n.contains("cpuSuppressThresholdPercent: 150 is above the maximum 100")
                })
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        spec_field(&slos, "n1", "/systemStrategy/totalNetworkBandwidth").await,
        Some(json!("10G"))
    );

    // The last good texts are in the controller's own ConfigMap.
    let stored = eventually(
        "the last-good ConfigMap",
        Duration::from_secs(WAIT),
        || async {
            configs
                .get_opt("slo-controller-config-last-good")
                .await
                .ok()?
        },
    )
    .await;
    let data = stored.data.unwrap_or_default();
    assert_eq!(
        data.get("system-config").map(String::as_str),
        Some(good_system)
    );
    assert_eq!(
        data.get("resource-threshold-config").map(String::as_str),
        Some(good_threshold)
    );

    // Restart; meanwhile the NodeSLO is deleted, so the new process must write it from scratch.
    controller.sigterm().expect("sigterm");
    controller
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("exits");
    slos.delete("n1", &DeleteParams::default())
        .await
        .expect("nodeslo deleted");
    let _controller = cluster.spawn_controller(&[]).await;
    wait_field(
        &slos,
        "n1",
        "/systemStrategy/totalNetworkBandwidth",
        json!("10G"),
    )
    .await;
    assert_eq!(
        spec_field(
            &slos,
            "n1",
            "/resourceUsedThresholdWithBE/cpuSuppressThresholdPercent"
        )
        .await,
        Some(json!(55)),
        "the typo'd key kept its last good value across the restart"
    );
    assert!(!unmarshal_notes().await.is_empty());

    // The user's ConfigMap was never written by the controller.
    let user = configs
        .get("slo-controller-config")
        .await
        .expect("user's ConfigMap");
    assert_eq!(user.resource_version(), edited.resource_version());
}
