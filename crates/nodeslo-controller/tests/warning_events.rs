//! The controllers' Events (published through `capstan_runtime::events`) on a real API server:
//! a repeated Warning is counted into one Event's series, and a different message is a new
//! Event, so the newest Warning about an object always says what went wrong last (issue 15: an
//! aggregated Warning used to keep its first message).

use capstan_runtime::events::{Event, EventPublisher};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Api;
use kube::api::ListParams;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_error_message_is_a_new_warning_and_repeats_are_counted() {
    let sim = kube_sim::KubeSim::start(kube_sim::Config::default())
        .await
        .expect("kube-sim starts");
    let client = sim.client().expect("client");
    let publisher = EventPublisher::new(client.clone(), "nodeslo-controller");
    let config_map = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        namespace: Some("default".into()),
        name: Some("slo-controller-config".into()),
        ..ObjectReference::default()
    };
    let first = Event::warning("InvalidConfig", "ParseSLOConfig", "cpu: not a number");
    let second = Event::warning("InvalidConfig", "ParseSLOConfig", "memory: out of range");
    publisher.publish(&first, &config_map).await.expect("first");
    publisher
        .publish(&first, &config_map)
        .await
        .expect("repeat");
    publisher
        .publish(&second, &config_map)
        .await
        .expect("second");

    let events: Api<K8sEvent> = Api::namespaced(client, "default");
    let mut listed = events
        .list(&ListParams::default())
        .await
        .expect("list")
        .items;
    listed.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    let notes: Vec<_> = listed
        .iter()
        .map(|e| {
            (
                e.note.clone().unwrap_or_default(),
                e.series.as_ref().map_or(1, |s| s.count),
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        notes,
        [
            (
                "cpu: not a number".to_owned(),
                2,
                "Warning".to_owned(),
                "InvalidConfig".to_owned()
            ),
            (
                "memory: out of range".to_owned(),
                1,
                "Warning".to_owned(),
                "InvalidConfig".to_owned()
            ),
        ]
    );
    let latest = listed.last().expect("an event");
    assert_eq!(
        latest.reporting_controller.as_deref(),
        Some("nodeslo-controller")
    );
    assert_eq!(
        latest.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("slo-controller-config")
    );
}
