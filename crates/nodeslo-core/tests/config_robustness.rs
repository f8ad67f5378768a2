//! The `slo-controller-config` parse under bad and generated input: quantities and percentages are
//! checked like the reference's decoding and the CRD's bounds, a bad key keeps its last good value,
//! and no input panics; every reported problem names its key.

use std::collections::BTreeMap;

use nodeslo_core::bounds::check_bounds;
use nodeslo_core::config::ConfigOutcome;
use nodeslo_core::{ConfigKey, ConfigProblem, MergedConfig, NodeInput, compute_node_spec};
use proptest::prelude::*;
use serde_json::{Value, json};

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn unmarshal_error(outcome: &ConfigOutcome, key: ConfigKey) -> String {
    match outcome.problems.as_slice() {
        [ConfigProblem::Unmarshal { key: k, error }] if *k == key => error.clone(),
        other => panic!("expected one unmarshal problem for {key}, got {other:?}"),
    }
}

#[test]
fn a_bandwidth_that_is_not_a_quantity_is_rejected_and_the_last_good_value_kept() {
    let good = MergedConfig::from_config_map(
        Some(&data(&[(
            "system-config",
            r#"{"clusterStrategy":{"totalNetworkBandwidth":"10G"}}"#,
        )])),
        &MergedConfig::default(),
    );
    assert!(good.problems.is_empty());
    let bad = MergedConfig::from_config_map(
        Some(&data(&[(
            "system-config",
            r#"{"clusterStrategy":{"totalNetworkBandwidth":"lots"}}"#,
        )])),
        &good.config,
    );
    let error = unmarshal_error(&bad, ConfigKey::System);
    assert!(error.contains("totalNetworkBandwidth"), "{error}");
    assert_eq!(bad.config.system, good.config.system);
    assert!(
        bad.problems[0]
            .to_string()
            .starts_with("failed to parse system-config"),
        "{}",
        bad.problems[0]
    );
    assert_eq!(bad.problems[0].metric_reason(), "SLOCfgUnmarshalFailed");
}

#[test]
fn an_out_of_range_percentage_is_rejected_at_config_time() {
    let outcome = MergedConfig::from_config_map(
        Some(&data(&[(
            "resource-threshold-config",
            r#"{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":150}}"#,
        )])),
        &MergedConfig::default(),
    );
    let error = unmarshal_error(&outcome, ConfigKey::ResourceThreshold);
    assert_eq!(
        error,
        "clusterStrategy: cpuSuppressThresholdPercent: 150 is above the maximum 100"
    );
    assert_eq!(outcome.config, MergedConfig::default());
}

#[test]
fn an_out_of_range_node_strategy_rejects_the_key() {
    let outcome = MergedConfig::from_config_map(
        Some(&data(&[(
            "resource-qos-config",
            r#"{"nodeStrategies":[{"name":"n","nodeSelector":{},"beClass":{"memoryQOS":{"wmarkScalePermill":0}}}]}"#,
        )])),
        &MergedConfig::default(),
    );
    let error = unmarshal_error(&outcome, ConfigKey::ResourceQos);
    assert_eq!(
        error,
        "nodeStrategies[0]: beClass.memoryQOS.wmarkScalePermill: 0 is below the minimum 1"
    );
}

/// Arbitrary JSON, a few levels deep, with the names the config uses so that generated documents
/// reach the interesting paths.
fn any_json() -> impl Strategy<Value = Value> {
    let name = prop_oneof![
        Just("clusterStrategy".to_owned()),
        Just("nodeStrategies".to_owned()),
        Just("nodeSelector".to_owned()),
        Just("matchLabels".to_owned()),
        Just("matchExpressions".to_owned()),
        Just("applications".to_owned()),
        Just("nodeConfigs".to_owned()),
        Just("cpuSuppressThresholdPercent".to_owned()),
        Just("totalNetworkBandwidth".to_owned()),
        Just("beClass".to_owned()),
        Just("memoryQOS".to_owned()),
        Just("wmarkRatio".to_owned()),
        Just("cpuBurstPercent".to_owned()),
        "[a-zA-Z]{1,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(name.clone(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn any_key() -> impl Strategy<Value = ConfigKey> {
    prop::sample::select(ConfigKey::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_config_text_panics_and_problems_name_their_key(key in any_key(), text in "\\PC{0,64}") {
        let outcome = MergedConfig::from_config_map(
            Some(&data(&[(key.data_key(), text.as_str())])),
            &MergedConfig::default(),
        );
        for problem in &outcome.problems {
            prop_assert!(problem.to_string().contains(key.data_key()), "{}", problem);
        }
    }

    #[test]
    fn no_config_document_panics_and_accepted_ones_are_in_bounds(key in any_key(), doc in any_json(),
            labels in prop::collection::btree_map("[a-z]{1,3}", "[a-z]{0,3}", 0..3),
            bandwidth in prop::option::of("[ -~]{0,8}")) {
        let text = doc.to_string();
        let outcome = MergedConfig::from_config_map(
            Some(&data(&[(key.data_key(), text.as_str())])),
            &MergedConfig::default(),
        );
        for problem in &outcome.problems {
            prop_assert!(problem.to_string().contains(key.data_key()), "{}", problem);
        }
        let accepted = !outcome.problems.iter().any(|p| matches!(p, ConfigProblem::Unmarshal { .. }));
        if accepted && key != ConfigKey::HostApplication {
            let merged = match key {
                ConfigKey::ResourceThreshold => &outcome.config.threshold,
                ConfigKey::ResourceQos => &outcome.config.qos,
                ConfigKey::CpuBurst => &outcome.config.burst,
                _ => &outcome.config.system,
            };
            prop_assert_eq!(check_bounds(key.spec_field(), &merged.cluster), Ok(()));
            for node in &merged.nodes {
                prop_assert_eq!(check_bounds(key.spec_field(), &node.value), Ok(()));
            }
        }
        // Any node's spec can be computed from whatever was accepted.
        let _ = compute_node_spec(&outcome.config, NodeInput {
            labels: Some(&labels),
            bandwidth_annotation: bandwidth.as_deref(),
            existing_extensions: Some(&json!({"x": doc})),
        });
    }

    #[test]
    fn out_of_range_percentages_are_always_rejected(percent in prop_oneof![i64::MIN..0i64, 101..i64::MAX]) {
        let text = json!({"clusterStrategy": {"cpuSuppressThresholdPercent": percent}}).to_string();
        let outcome = MergedConfig::from_config_map(
            Some(&data(&[("resource-threshold-config", text.as_str())])),
            &MergedConfig::default(),
        );
        let error = unmarshal_error(&outcome, ConfigKey::ResourceThreshold);
        prop_assert!(error.contains("cpuSuppressThresholdPercent"), "{}", error);
    }
}
