//! One node's NodeSLO spec, chosen from the merged config, and the semantic comparison that decides
//! whether a stored NodeSLO needs a write.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::config::{ConfigKey, MergedConfig, MergedStrategy, NodeScoped};
use crate::quantity::is_valid_quantity;

/// Node annotation that overrides `systemStrategy.totalNetworkBandwidth`.
pub const NETWORK_BANDWIDTH_ANNOTATION: &str = "node.koordinator.sh/network-bandwidth";

/// What a node contributes to its spec.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeInput<'a> {
    pub labels: Option<&'a BTreeMap<String, String>>,
    /// The value of [`NETWORK_BANDWIDTH_ANNOTATION`], if present.
    pub bandwidth_annotation: Option<&'a str>,
    /// `spec.extensions` of the existing NodeSLO, carried over unchanged.
    pub existing_extensions: Option<&'a Value>,
}

/// The computed spec (JSON, in the NodeSLO wire shape) and what was wrong with the node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpecOutcome {
    pub spec: Value,
    /// Set when the bandwidth annotation is not a valid quantity: it was ignored.
    pub invalid_bandwidth: Option<String>,
}

/// Chooses each key's strategy for the node independently (first matching node strategy, else the
/// cluster strategy), applies the bandwidth annotation, and carries `extensions` over.
pub fn compute_node_spec(config: &MergedConfig, node: NodeInput<'_>) -> NodeSpecOutcome {
    let empty = BTreeMap::new();
    let labels = node.labels.unwrap_or(&empty);
    let mut spec = Map::new();
    for (key, strategy) in [
        (ConfigKey::ResourceThreshold, &config.threshold),
        (ConfigKey::ResourceQos, &config.qos),
        (ConfigKey::CpuBurst, &config.burst),
        (ConfigKey::System, &config.system),
    ] {
        spec.insert(
            key.spec_field().to_string(),
            choose_strategy(strategy, labels).clone(),
        );
    }

    let mut invalid_bandwidth = None;
    if let Some(bandwidth) = node.bandwidth_annotation {
        if is_valid_quantity(bandwidth) {
            if let Some(Value::Object(system)) = spec.get_mut(ConfigKey::System.spec_field()) {
                system.insert(
                    "totalNetworkBandwidth".into(),
                    Value::String(bandwidth.to_string()),
                );
            }
        } else {
            invalid_bandwidth = Some(bandwidth.to_string());
        }
    }

    let apps = &config.host_applications;
    let applications = first_match(&apps.node_configs, labels).unwrap_or(&apps.applications);
    if !applications.is_empty() {
        spec.insert(
            ConfigKey::HostApplication.spec_field().to_string(),
            Value::Array(applications.clone()),
        );
    }
    if let Some(extensions) = node.existing_extensions.filter(|e| !e.is_null()) {
        spec.insert("extensions".into(), extensions.clone());
    }
    NodeSpecOutcome {
        spec: Value::Object(spec),
        invalid_bandwidth,
    }
}

fn choose_strategy<'a>(
    strategy: &'a MergedStrategy,
    labels: &BTreeMap<String, String>,
) -> &'a Value {
    first_match(&strategy.nodes, labels).unwrap_or(&strategy.cluster)
}

fn first_match<'a, T>(
    scoped: &'a [NodeScoped<T>],
    labels: &BTreeMap<String, String>,
) -> Option<&'a T> {
    scoped
        .iter()
        .find(|s| {
            s.selector
                .as_ref()
                .is_some_and(|selector| selector.matches(labels))
        })
        .map(|s| &s.value)
}

/// Whether two specs mean the same: `null` fields and empty lists count as absent.
pub fn semantically_equal(a: &Value, b: &Value) -> bool {
    canonical(a) == canonical(b)
}

/// Whether [`canonical`] keeps an object member with this value: `null` and empty lists count
/// as absent.
pub(crate) fn kept_member(value: &Value) -> bool {
    !value.is_null() && !matches!(value, Value::Array(items) if items.is_empty())
}

pub(crate) fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| kept_member(v))
                .map(|(k, v)| (k.clone(), canonical(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    //! The acceptance examples of the NodeSLO spec (from the reference's own tests).
    use super::*;
    use serde_json::json;

    fn config(pairs: &[(ConfigKey, &str)]) -> MergedConfig {
        let data = pairs
            .iter()
            .map(|(k, v)| (k.data_key().to_string(), v.to_string()))
            .collect();
        let outcome = MergedConfig::from_config_map(Some(&data), &MergedConfig::default());
        assert!(outcome.problems.is_empty(), "{:?}", outcome.problems);
        outcome.config
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn spec_for(config: &MergedConfig, node_labels: &BTreeMap<String, String>) -> Value {
        compute_node_spec(
            config,
            NodeInput {
                labels: Some(node_labels),
                ..NodeInput::default()
            },
        )
        .spec
    }

    #[test]
    fn node_without_labels_and_no_config_map() {
        let outcome = MergedConfig::from_config_map(None, &MergedConfig::default());
        assert_eq!(
            spec_for(&outcome.config, &labels(&[])),
            json!({
                "resourceUsedThresholdWithBE": {"enable": false, "cpuSuppressThresholdPercent": 65,
                    "cpuSuppressPolicy": "cpuset", "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"},
                "resourceQOSStrategy": {},
                "cpuBurstStrategy": {"policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                    "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 50},
                "systemStrategy": {"totalNetworkBandwidth": "0"}
            })
        );
    }

    #[test]
    fn full_config_map_example() {
        let config = config(&[
            (
                ConfigKey::ResourceThreshold,
                r#"{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60}}"#,
            ),
            (
                ConfigKey::ResourceQos,
                r#"{"clusterStrategy":{"beClass":{"cpuQOS":{"groupIdentity":0}}}}"#,
            ),
            (
                ConfigKey::CpuBurst,
                r#"{"clusterStrategy":{"cfsQuotaBurstPeriodSeconds":60}}"#,
            ),
            (
                ConfigKey::System,
                r#"{"clusterStrategy":{"minFreeKbytesFactor":150,"watermarkScaleFactor":150,"schedFeatures":{"ID_ABSOLUTE_EXPEL":true,"ID_EXPELLER_SHARE_CORE":false}}}"#,
            ),
            (
                ConfigKey::HostApplication,
                r#"{"applications":[{"name":"test-app"}]}"#,
            ),
        ]);
        assert_eq!(
            spec_for(&config, &labels(&[])),
            json!({
                "resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressThresholdPercent": 60,
                    "cpuSuppressPolicy": "cpuset", "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"},
                "resourceQOSStrategy": {"beClass": {"cpuQOS": {"groupIdentity": 0}}},
                "cpuBurstStrategy": {"policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                    "cfsQuotaBurstPeriodSeconds": 60, "sharePoolThresholdPercent": 50},
                "systemStrategy": {"minFreeKbytesFactor": 150, "watermarkScaleFactor": 150,
                    "schedFeatures": {"ID_ABSOLUTE_EXPEL": true, "ID_EXPELLER_SHARE_CORE": false},
                    "totalNetworkBandwidth": "0"},
                "hostApplications": [{"name": "test-app"}]
            })
        );
    }

    #[test]
    fn node_strategies_first_match_wins() {
        let config = config(&[(
            ConfigKey::ResourceThreshold,
            r#"{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60},
                "nodeStrategies":[
                  {"name":"xxx","nodeSelector":{"matchLabels":{"xxx":"yyy"}},"cpuSuppressThresholdPercent":40},
                  {"name":"zzz","nodeSelector":{"matchLabels":{"zzz":"zzz"}},"cpuSuppressThresholdPercent":50}]}"#,
        )]);
        let threshold = |node: &[(&str, &str)]| {
            spec_for(&config, &labels(node))["resourceUsedThresholdWithBE"].clone()
        };
        let expected = |percent: i64| {
            json!({"enable": true, "cpuSuppressThresholdPercent": percent, "cpuSuppressPolicy": "cpuset",
                   "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"})
        };
        assert_eq!(threshold(&[("xxx", "yyy")]), expected(40));
        assert_eq!(threshold(&[("zzz", "zzz")]), expected(50));
        assert_eq!(threshold(&[("xxx", "yyy"), ("zzz", "zzz")]), expected(40));
        assert_eq!(threshold(&[]), expected(60));
    }

    #[test]
    fn missing_selector_matches_no_node_and_empty_selector_every_node() {
        let config = config(&[(
            ConfigKey::CpuBurst,
            r#"{"nodeStrategies":[{"name":"none","cpuBurstPercent":1},{"name":"all","nodeSelector":{},"cpuBurstPercent":2}]}"#,
        )]);
        assert_eq!(
            spec_for(&config, &labels(&[("a", "b")]))["cpuBurstStrategy"]["cpuBurstPercent"],
            json!(2)
        );
    }

    #[test]
    fn bandwidth_annotation_overrides_the_strategy() {
        let config = config(&[(
            ConfigKey::System,
            r#"{"clusterStrategy":{"minFreeKbytesFactor":150,"totalNetworkBandwidth":"10G"}}"#,
        )]);
        let outcome = compute_node_spec(
            &config,
            NodeInput {
                bandwidth_annotation: Some("99M"),
                ..NodeInput::default()
            },
        );
        assert_eq!(
            outcome.spec["systemStrategy"],
            json!({"minFreeKbytesFactor": 150, "totalNetworkBandwidth": "99M"})
        );
        assert_eq!(outcome.invalid_bandwidth, None);
        let without = compute_node_spec(&config, NodeInput::default());
        assert_eq!(
            without.spec["systemStrategy"],
            json!({"minFreeKbytesFactor": 150, "totalNetworkBandwidth": "10G"})
        );
    }

    #[test]
    fn invalid_bandwidth_annotation_is_ignored_and_reported() {
        // Decision: the reference drops the whole systemStrategy; Capstan keeps the strategy value.
        let config = config(&[(
            ConfigKey::System,
            r#"{"clusterStrategy":{"totalNetworkBandwidth":"10G"}}"#,
        )]);
        let outcome = compute_node_spec(
            &config,
            NodeInput {
                bandwidth_annotation: Some("fast"),
                ..NodeInput::default()
            },
        );
        assert_eq!(
            outcome.spec["systemStrategy"],
            json!({"totalNetworkBandwidth": "10G"})
        );
        assert_eq!(outcome.invalid_bandwidth.as_deref(), Some("fast"));
    }

    #[test]
    fn host_applications_first_matching_node_config() {
        let config = config(&[(
            ConfigKey::HostApplication,
            r#"{"applications":[{"name":"test-app-default"}],
                "nodeConfigs":[
                  {"name":"a","nodeSelector":{"matchLabels":{"A":"a"}},"applications":[{"name":"test-app-ls","qos":"LS"}]},
                  {"name":"b","nodeSelector":{"matchLabels":{"B":"b"}},"applications":[{"name":"test-app-lsr","qos":"LSR"}]}]}"#,
        )]);
        let apps =
            |node: &[(&str, &str)]| spec_for(&config, &labels(node))["hostApplications"].clone();
        assert_eq!(
            apps(&[("A", "a"), ("B", "b")]),
            json!([{"name": "test-app-ls", "qos": "LS"}])
        );
        assert_eq!(
            apps(&[("B", "b")]),
            json!([{"name": "test-app-lsr", "qos": "LSR"}])
        );
        assert_eq!(apps(&[]), json!([{"name": "test-app-default"}]));
    }

    #[test]
    fn extensions_are_carried_over() {
        let extensions = json!({"vendor": {"anything": [1, 2]}});
        let outcome = compute_node_spec(
            &MergedConfig::default(),
            NodeInput {
                existing_extensions: Some(&extensions),
                ..NodeInput::default()
            },
        );
        assert_eq!(outcome.spec["extensions"], extensions);
    }

    #[test]
    fn semantic_comparison_ignores_empty_lists_and_nulls() {
        assert!(semantically_equal(
            &json!({"a": 1, "hostApplications": []}),
            &json!({"a": 1})
        ));
        assert!(semantically_equal(
            &json!({"a": {"b": null}}),
            &json!({"a": {}})
        ));
        assert!(!semantically_equal(&json!({"a": 1}), &json!({"a": 2})));
        assert!(!semantically_equal(&json!({"a": false}), &json!({})));
        assert!(!semantically_equal(
            &json!({"resourceQOSStrategy": {}}),
            &json!({})
        ));
    }
}
