//! The `slo-controller-config` ConfigMap: its five keys, their defaults, and merging.
//!
//! The merged config is computed once per ConfigMap version (not per node). Each key is handled on
//! its own: absent means its default, unparsable means its last good value (reported as a
//! [`ConfigProblem`]), otherwise cluster strategy and every node strategy are pre-merged.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use thiserror::Error;

use capstan_apis::slo;

use crate::bounds::check_bounds;
use crate::merge::{deep_merge, strip_nulls};
use crate::selector::{Selector, SelectorError};

/// The ConfigMap keys this controller reads; other keys are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConfigKey {
    ResourceThreshold,
    ResourceQos,
    CpuBurst,
    System,
    HostApplication,
}

impl ConfigKey {
    pub const ALL: [ConfigKey; 5] = [
        ConfigKey::ResourceThreshold,
        ConfigKey::ResourceQos,
        ConfigKey::CpuBurst,
        ConfigKey::System,
        ConfigKey::HostApplication,
    ];

    /// The key in the ConfigMap's `data`.
    pub fn data_key(self) -> &'static str {
        match self {
            ConfigKey::ResourceThreshold => "resource-threshold-config",
            ConfigKey::ResourceQos => "resource-qos-config",
            ConfigKey::CpuBurst => "cpu-burst-config",
            ConfigKey::System => "system-config",
            ConfigKey::HostApplication => "host-application-config",
        }
    }

    /// The NodeSLO spec field the key feeds.
    pub fn spec_field(self) -> &'static str {
        match self {
            ConfigKey::ResourceThreshold => "resourceUsedThresholdWithBE",
            ConfigKey::ResourceQos => "resourceQOSStrategy",
            ConfigKey::CpuBurst => "cpuBurstStrategy",
            ConfigKey::System => "systemStrategy",
            ConfigKey::HostApplication => "hostApplications",
        }
    }

    /// The cluster default of a strategy key (the reference's `Default*Strategy()`).
    fn default_strategy(self) -> Value {
        match self {
            ConfigKey::ResourceThreshold => json!({
                "enable": false,
                "cpuSuppressThresholdPercent": 65,
                "cpuSuppressPolicy": "cpuset",
                "memoryEvictThresholdPercent": 70,
                "cpuEvictPolicy": "evictByRealLimit"
            }),
            ConfigKey::ResourceQos => json!({}),
            ConfigKey::CpuBurst => json!({
                "policy": "none",
                "cpuBurstPercent": 1000,
                "cfsQuotaBurstPercent": 300,
                "cfsQuotaBurstPeriodSeconds": -1,
                "sharePoolThresholdPercent": 50
            }),
            ConfigKey::System => json!({"totalNetworkBandwidth": "0"}),
            ConfigKey::HostApplication => Value::Null,
        }
    }
}

impl std::fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.data_key())
    }
}

/// Something wrong in the ConfigMap. None of them stops the others keys from applying.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigProblem {
    /// The key's value is not valid for its shape: its last good value is kept.
    #[error("failed to parse {key}, keeping its last good value: {error}")]
    Unmarshal { key: ConfigKey, error: String },
    /// A node strategy's selector is invalid: that strategy is skipped.
    #[error("{key}: node strategy {strategy:?} skipped: {error}")]
    InvalidSelector {
        key: ConfigKey,
        strategy: String,
        error: SelectorError,
    },
}

impl ConfigProblem {
    /// Short stable label for metrics and Event reasons.
    pub fn metric_reason(&self) -> &'static str {
        match self {
            ConfigProblem::Unmarshal { .. } => "SLOCfgUnmarshalFailed",
            ConfigProblem::InvalidSelector { .. } => "SLOCfgInvalidNodeSelector",
        }
    }
}

/// One node strategy (or node config), pre-merged onto the cluster strategy.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeScoped<T> {
    pub name: String,
    /// `None` when the strategy has no selector: it matches no node.
    pub selector: Option<Selector>,
    pub value: T,
}

/// The merged form of one strategy key.
#[derive(Debug, Clone, PartialEq)]
pub struct MergedStrategy {
    pub cluster: Value,
    /// In ConfigMap order; the first match wins.
    pub nodes: Vec<NodeScoped<Value>>,
}

/// The merged form of `host-application-config`, taken verbatim.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostApplications {
    pub applications: Vec<Value>,
    pub node_configs: Vec<NodeScoped<Vec<Value>>>,
}

/// The whole config, as every node's spec is computed from it.
#[derive(Debug, Clone, PartialEq)]
pub struct MergedConfig {
    pub threshold: MergedStrategy,
    pub qos: MergedStrategy,
    pub burst: MergedStrategy,
    pub system: MergedStrategy,
    pub host_applications: HostApplications,
}

impl Default for MergedConfig {
    fn default() -> Self {
        let default_of = |key: ConfigKey| MergedStrategy {
            cluster: key.default_strategy(),
            nodes: Vec::new(),
        };
        Self {
            threshold: default_of(ConfigKey::ResourceThreshold),
            qos: default_of(ConfigKey::ResourceQos),
            burst: default_of(ConfigKey::CpuBurst),
            system: default_of(ConfigKey::System),
            host_applications: HostApplications::default(),
        }
    }
}

/// The result of reading a ConfigMap: the merged config and what was wrong with it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigOutcome {
    pub config: MergedConfig,
    pub problems: Vec<ConfigProblem>,
}

impl MergedConfig {
    /// Merges the ConfigMap's `data` (`None` when the ConfigMap does not exist: all defaults).
    /// A key that does not parse keeps its value from `last_good`.
    pub fn from_config_map(
        data: Option<&BTreeMap<String, String>>,
        last_good: &MergedConfig,
    ) -> ConfigOutcome {
        let mut problems = Vec::new();
        let raw = |key: ConfigKey| data.and_then(|d| d.get(key.data_key()));
        let mut strategy = |key: ConfigKey, last: &MergedStrategy| match raw(key) {
            None => MergedStrategy {
                cluster: key.default_strategy(),
                nodes: Vec::new(),
            },
            Some(text) => match parse_strategy(key, text) {
                Ok((merged, selector_problems)) => {
                    problems.extend(selector_problems);
                    merged
                }
                Err(error) => {
                    problems.push(ConfigProblem::Unmarshal { key, error });
                    last.clone()
                }
            },
        };
        let threshold = strategy(ConfigKey::ResourceThreshold, &last_good.threshold);
        let qos = strategy(ConfigKey::ResourceQos, &last_good.qos);
        let burst = strategy(ConfigKey::CpuBurst, &last_good.burst);
        let system = strategy(ConfigKey::System, &last_good.system);
        let host_applications = match raw(ConfigKey::HostApplication) {
            None => HostApplications::default(),
            Some(text) => match parse_host_applications(text) {
                Ok((apps, selector_problems)) => {
                    problems.extend(selector_problems);
                    apps
                }
                Err(error) => {
                    problems.push(ConfigProblem::Unmarshal {
                        key: ConfigKey::HostApplication,
                        error,
                    });
                    last_good.host_applications.clone()
                }
            },
        };
        ConfigOutcome {
            config: MergedConfig {
                threshold,
                qos,
                burst,
                system,
                host_applications,
            },
            problems,
        }
    }
}

/// `{"clusterStrategy": {...}, "nodeStrategies": [{"name", "nodeSelector", <fields>}]}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StrategyDocument {
    #[serde(default)]
    cluster_strategy: Option<Map<String, Value>>,
    #[serde(default)]
    node_strategies: Option<Vec<NodeStrategyDocument>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeStrategyDocument {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    node_selector: Option<LabelSelector>,
    #[serde(flatten)]
    fields: Map<String, Value>,
}

/// `{"applications": [...], "nodeConfigs": [{"name", "nodeSelector", "applications"}]}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HostApplicationDocument {
    #[serde(default)]
    applications: Option<Vec<Value>>,
    #[serde(default)]
    node_configs: Option<Vec<HostApplicationNodeDocument>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HostApplicationNodeDocument {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    node_selector: Option<LabelSelector>,
    #[serde(default)]
    applications: Option<Vec<Value>>,
}

/// Parses a JSON object into `T`. Serde would also accept an array for a struct; Go's decoder, whose
/// behaviour the reference has, does not.
fn parse_object<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    match serde_json::from_str(text).map_err(|e| e.to_string())? {
        object @ Value::Object(_) => serde_json::from_value(object).map_err(|e| e.to_string()),
        other => Err(format!(
            "expected a JSON object, found {}",
            json_type(&other)
        )),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parse_strategy(
    key: ConfigKey,
    text: &str,
) -> Result<(MergedStrategy, Vec<ConfigProblem>), String> {
    let document: StrategyDocument = parse_object(text)?;
    let cluster_overlay = document
        .cluster_strategy
        .map(Value::Object)
        .unwrap_or(Value::Null);
    let cluster = deep_merge(&key.default_strategy(), &cluster_overlay);
    check_shape(key, &cluster).map_err(|e| format!("clusterStrategy: {e}"))?;
    let mut problems = Vec::new();
    let mut nodes = Vec::new();
    for (index, node) in document
        .node_strategies
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let name = node.name.unwrap_or_else(|| format!("#{index}"));
        let selector = match node.node_selector.as_ref().map(Selector::parse).transpose() {
            Ok(selector) => selector,
            Err(error) => {
                problems.push(ConfigProblem::InvalidSelector {
                    key,
                    strategy: name,
                    error,
                });
                continue;
            }
        };
        let value = deep_merge(&cluster, &Value::Object(node.fields));
        check_shape(key, &value).map_err(|e| format!("nodeStrategies[{index}]: {e}"))?;
        nodes.push(NodeScoped {
            name,
            selector,
            value,
        });
    }
    Ok((
        MergedStrategy {
            cluster: strip_nulls(&cluster),
            nodes,
        },
        problems,
    ))
}

/// A merged strategy must deserialize into the NodeSLO type its key feeds, as the reference
/// unmarshals into Go structs: a string where a number belongs makes the whole key invalid. Its
/// numbers must be within the CRD's bounds and its quantities must parse.
fn check_shape(key: ConfigKey, value: &Value) -> Result<(), String> {
    fn check<T: serde::de::DeserializeOwned>(value: &Value) -> Result<(), String> {
        T::deserialize(value).map(drop).map_err(|e| e.to_string())
    }
    match key {
        ConfigKey::ResourceThreshold => check::<slo::ResourceThresholdStrategy>(value),
        ConfigKey::ResourceQos => check::<slo::ResourceQosStrategy>(value),
        ConfigKey::CpuBurst => check::<slo::CpuBurstStrategy>(value),
        ConfigKey::System => check::<slo::SystemStrategy>(value),
        ConfigKey::HostApplication => check::<Vec<slo::HostApplicationSpec>>(value),
    }?;
    // Bounds and quantities too, so a bad value is refused here, not by the API server per node.
    check_bounds(key.spec_field(), value)
}

fn parse_host_applications(text: &str) -> Result<(HostApplications, Vec<ConfigProblem>), String> {
    let document: HostApplicationDocument = parse_object(text)?;
    let mut problems = Vec::new();
    let mut node_configs = Vec::new();
    for (index, node) in document
        .node_configs
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let name = node.name.unwrap_or_else(|| format!("#{index}"));
        match node.node_selector.as_ref().map(Selector::parse).transpose() {
            Ok(selector) => node_configs.push(NodeScoped {
                name,
                selector,
                value: node.applications.unwrap_or_default(),
            }),
            Err(error) => problems.push(ConfigProblem::InvalidSelector {
                key: ConfigKey::HostApplication,
                strategy: name,
                error,
            }),
        }
    }
    let applications = document.applications.unwrap_or_default();
    check_shape(
        ConfigKey::HostApplication,
        &Value::Array(applications.clone()),
    )
    .map_err(|e| format!("applications: {e}"))?;
    for (index, node) in node_configs.iter().enumerate() {
        check_shape(
            ConfigKey::HostApplication,
            &Value::Array(node.value.clone()),
        )
        .map_err(|e| format!("nodeConfigs[{index}].applications: {e}"))?;
    }
    Ok((
        HostApplications {
            applications,
            node_configs,
        },
        problems,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(ConfigKey, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.data_key().to_string(), v.to_string()))
            .collect()
    }

    fn merged(pairs: &[(ConfigKey, &str)]) -> ConfigOutcome {
        MergedConfig::from_config_map(Some(&data(pairs)), &MergedConfig::default())
    }

    #[test]
    fn each_default() {
        let outcome = MergedConfig::from_config_map(None, &MergedConfig::default());
        assert!(outcome.problems.is_empty());
        let c = outcome.config;
        assert_eq!(
            c.threshold.cluster,
            json!({"enable": false, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": "cpuset",
                   "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"})
        );
        assert_eq!(c.qos.cluster, json!({}));
        assert_eq!(
            c.burst.cluster,
            json!({"policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                   "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 50})
        );
        assert_eq!(c.system.cluster, json!({"totalNetworkBandwidth": "0"}));
        assert!(c.host_applications.applications.is_empty());
        // An empty ConfigMap is the same as none.
        assert_eq!(merged(&[]).config, c);
    }

    #[test]
    fn cluster_strategy_merges_onto_defaults() {
        let outcome = merged(&[(
            ConfigKey::ResourceThreshold,
            r#"{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60}}"#,
        )]);
        assert_eq!(
            outcome.config.threshold.cluster,
            json!({"enable": true, "cpuSuppressThresholdPercent": 60, "cpuSuppressPolicy": "cpuset",
                   "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"})
        );
    }

    #[test]
    fn node_strategies_merge_onto_the_cluster_strategy_and_drop_name_and_selector() {
        let outcome = merged(&[(
            ConfigKey::ResourceThreshold,
            r#"{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60},
                "nodeStrategies":[{"name":"a","nodeSelector":{"matchLabels":{"xxx":"yyy"}},"cpuSuppressThresholdPercent":40}]}"#,
        )]);
        let node = &outcome.config.threshold.nodes[0];
        assert_eq!(node.name, "a");
        assert_eq!(node.value["cpuSuppressThresholdPercent"], json!(40));
        assert_eq!(node.value["enable"], json!(true));
        assert_eq!(node.value["memoryEvictThresholdPercent"], json!(70));
        assert!(node.value.get("name").is_none() && node.value.get("nodeSelector").is_none());
    }

    #[test]
    fn node_strategy_inherits_cluster_bandwidth() {
        // Decision: the reference resets totalNetworkBandwidth to "0" for node strategies.
        let outcome = merged(&[(
            ConfigKey::System,
            r#"{"clusterStrategy":{"totalNetworkBandwidth":"10G"},
                "nodeStrategies":[{"name":"n","nodeSelector":{},"minFreeKbytesFactor":200}]}"#,
        )]);
        assert_eq!(
            outcome.config.system.nodes[0].value,
            json!({"totalNetworkBandwidth": "10G", "minFreeKbytesFactor": 200})
        );
    }

    #[test]
    fn invalid_key_keeps_its_last_good_value_and_others_apply() {
        let good = merged(&[
            (
                ConfigKey::ResourceThreshold,
                r#"{"clusterStrategy":{"cpuSuppressThresholdPercent":55}}"#,
            ),
            (
                ConfigKey::CpuBurst,
                r#"{"clusterStrategy":{"cpuBurstPercent":500}}"#,
            ),
        ])
        .config;
        let next = MergedConfig::from_config_map(
            Some(&data(&[
                (ConfigKey::ResourceThreshold, "invalid_content"),
                (
                    ConfigKey::CpuBurst,
                    r#"{"clusterStrategy":{"cpuBurstPercent":700}}"#,
                ),
            ])),
            &good,
        );
        assert_eq!(
            next.config.threshold, good.threshold,
            "the invalid key keeps its last good value"
        );
        assert_eq!(
            next.config.burst.cluster["cpuBurstPercent"],
            json!(700),
            "the other key applies"
        );
        assert_eq!(next.problems.len(), 1);
        assert!(matches!(
            &next.problems[0],
            ConfigProblem::Unmarshal {
                key: ConfigKey::ResourceThreshold,
                ..
            }
        ));
        assert_eq!(next.problems[0].metric_reason(), "SLOCfgUnmarshalFailed");
    }

    #[test]
    fn wrong_shape_is_a_parse_error() {
        for text in [
            r#"[]"#,
            r#"{"clusterStrategy":[1]}"#,
            r#"{"nodeStrategies":{}}"#,
            r#""text""#,
            r#"{"clusterStrategy":{"cpuBurstPercent":"lots"}}"#,
            r#"{"nodeStrategies":[{"name":"n","nodeSelector":{},"cfsQuotaBurstPercent":true}]}"#,
        ] {
            let outcome = merged(&[(ConfigKey::CpuBurst, text)]);
            assert!(
                matches!(
                    outcome.problems.as_slice(),
                    [ConfigProblem::Unmarshal {
                        key: ConfigKey::CpuBurst,
                        ..
                    }]
                ),
                "{text} must not parse"
            );
        }
    }

    #[test]
    fn absent_key_means_default_not_previous_value() {
        let previous = merged(&[(
            ConfigKey::CpuBurst,
            r#"{"clusterStrategy":{"cpuBurstPercent":500}}"#,
        )])
        .config;
        let next = MergedConfig::from_config_map(Some(&BTreeMap::new()), &previous);
        assert_eq!(next.config, MergedConfig::default());
    }

    #[test]
    fn invalid_selector_skips_only_that_strategy() {
        let outcome = merged(&[(
            ConfigKey::ResourceThreshold,
            r#"{"nodeStrategies":[
                {"name":"bad","nodeSelector":{"matchExpressions":[{"key":"a","operator":"Near","values":["x"]}]},"enable":true},
                {"name":"good","nodeSelector":{"matchLabels":{"a":"b"}},"enable":true}]}"#,
        )]);
        assert_eq!(outcome.config.threshold.nodes.len(), 1);
        assert_eq!(outcome.config.threshold.nodes[0].name, "good");
        assert!(matches!(
            outcome.problems.as_slice(),
            [ConfigProblem::InvalidSelector { strategy, .. }] if strategy == "bad"
        ));
    }

    #[test]
    fn host_applications_are_taken_verbatim() {
        let outcome = merged(&[(
            ConfigKey::HostApplication,
            r#"{"applications":[{"name":"test-app-default"}],
                "nodeConfigs":[{"name":"a","nodeSelector":{"matchLabels":{"A":"a"}},"applications":[{"name":"test-app-ls","qos":"LS"}]}]}"#,
        )]);
        let apps = outcome.config.host_applications;
        assert_eq!(apps.applications, vec![json!({"name": "test-app-default"})]);
        assert_eq!(
            apps.node_configs[0].value,
            vec![json!({"name": "test-app-ls", "qos": "LS"})]
        );
    }
}
