//! The level-triggered NodeSLO decision: given what is known of a Node and its NodeSLO, what write
//! (if any) brings the NodeSLO in line.

use std::hash::{DefaultHasher, Hash, Hasher};

use capstan_apis::slo::NodeSloSpec;
use serde_json::Value;

use crate::config::MergedConfig;
use crate::labels::NodeLabels;
use crate::spec::{NodeInput, compute_node_spec};

/// What the decision needs of a Node; equal facts mean a Node change needs no reconcile, so
/// heartbeats and condition updates do not trigger one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeFacts {
    pub labels: NodeLabels,
    /// The `node.koordinator.sh/network-bandwidth` annotation.
    pub bandwidth: Option<String>,
    /// A digest of `status.allocatable`: it only triggers (the reference reconciles on it).
    pub allocatable_digest: u64,
}

/// What the decision needs of an existing NodeSLO: a digest of its normalized spec instead of
/// the spec itself keeps 10,000 NodeSLOs in a few hundred KiB.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SloFacts {
    pub spec_digest: u64,
    pub extensions: Option<serde_json::Map<String, Value>>,
    pub generation: Option<i64>,
    pub resource_version: Option<String>,
}

impl SloFacts {
    pub fn from_spec(
        spec: &NodeSloSpec,
        generation: Option<i64>,
        resource_version: Option<String>,
    ) -> Self {
        Self {
            spec_digest: spec_digest(spec),
            extensions: spec.extensions.clone(),
            generation,
            resource_version,
        }
    }

    /// A NodeSLO change worth a reconcile: created, or its spec changed (a manual edit to revert).
    /// Status and metadata-only writes are not.
    pub fn same_for_reconcile(&self, other: &Self) -> bool {
        self.spec_digest == other.spec_digest && self.generation == other.generation
    }
}

/// The write a reconcile makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Neither exists, or the NodeSLO already has the computed spec.
    Nothing,
    Create(NodeSloSpec),
    /// Replace the spec of the NodeSLO at `resource_version` (optimistic concurrency).
    Update {
        spec: NodeSloSpec,
        resource_version: Option<String>,
    },
    /// The Node is gone.
    Delete,
}

/// The decision and what to report about the node.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub decision: Decision,
    /// The node's bandwidth annotation when it is not a valid quantity (ignored).
    pub invalid_bandwidth: Option<String>,
}

/// The computed spec cannot be represented as a NodeSLO; a config that passed
/// [`MergedConfig::from_config_map`] always can, so this is a bug guard, not a user error.
#[derive(Debug, thiserror::Error)]
#[error("computed NodeSLO spec does not fit the NodeSLO type: {0}")]
pub struct SpecShapeError(#[from] serde_json::Error);

pub fn decide(
    node: Option<&NodeFacts>,
    slo: Option<&SloFacts>,
    config: &MergedConfig,
) -> Result<Outcome, SpecShapeError> {
    let Some(node) = node else {
        let decision = if slo.is_some() {
            Decision::Delete
        } else {
            Decision::Nothing
        };
        return Ok(Outcome {
            decision,
            invalid_bandwidth: None,
        });
    };
    let extensions = slo.and_then(|s| s.extensions.clone()).map(Value::Object);
    let labels = node.labels.to_map();
    let computed = compute_node_spec(
        config,
        NodeInput {
            labels: Some(&labels),
            bandwidth_annotation: node.bandwidth.as_deref(),
            existing_extensions: extensions.as_ref(),
        },
    );
    let spec: NodeSloSpec = serde_json::from_value(computed.spec)?;
    let decision = match slo {
        None => Decision::Create(spec),
        Some(existing) if existing.spec_digest == spec_digest(&spec) => Decision::Nothing,
        Some(existing) => Decision::Update {
            spec,
            resource_version: existing.resource_version.clone(),
        },
    };
    Ok(Outcome {
        decision,
        invalid_bandwidth: computed.invalid_bandwidth,
    })
}

/// Digest of a spec's canonical JSON (typed, so unknown fields are dropped as the API server
/// prunes them; `null` and empty lists count as absent; object keys in sorted order).
///
/// The controller takes one per NodeSLO it decides on and per watch event of one, so the
/// canonical form is hashed as it is walked (what `spec::canonical` would keep) rather than
/// built as a second tree first.
pub fn spec_digest(spec: &NodeSloSpec) -> u64 {
    let value = serde_json::to_value(spec).unwrap_or(Value::Null);
    let mut hasher = DefaultHasher::new();
    hash_canonical(&value, &mut hasher);
    hasher.finish()
}

fn hash_canonical(value: &Value, hasher: &mut DefaultHasher) {
    match value {
        Value::Null => 0u8.hash(hasher),
        Value::Bool(b) => (1u8, b).hash(hasher),
        Value::Number(n) => (2u8, n).hash(hasher),
        Value::String(s) => (3u8, s).hash(hasher),
        Value::Array(items) => {
            (4u8, items.len()).hash(hasher);
            items.iter().for_each(|item| hash_canonical(item, hasher));
        }
        Value::Object(map) => {
            let mut members: Vec<_> = map
                .iter()
                .filter(|(_, v)| crate::spec::kept_member(v))
                .collect();
            // serde_json's map is sorted already unless a dependency turns on `preserve_order`.
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            (5u8, members.len()).hash(hasher);
            for (key, item) in members {
                key.hash(hasher);
                hash_canonical(item, hasher);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    /// The digest as first written: the canonical tree built, then hashed (numbers by text).
    fn digest_of_built_tree(spec: &NodeSloSpec) -> u64 {
        fn hash(value: &Value, hasher: &mut DefaultHasher) {
            match value {
                Value::Null => 0u8.hash(hasher),
                Value::Bool(b) => (1u8, b).hash(hasher),
                Value::Number(n) => (2u8, n.to_string()).hash(hasher),
                Value::String(s) => (3u8, s).hash(hasher),
                Value::Array(items) => {
                    (4u8, items.len()).hash(hasher);
                    items.iter().for_each(|item| hash(item, hasher));
                }
                Value::Object(map) => {
                    (5u8, map.len()).hash(hasher);
                    for (key, item) in map {
                        key.hash(hasher);
                        hash(item, hasher);
                    }
                }
            }
        }
        let value = serde_json::to_value(spec).expect("spec");
        let mut hasher = DefaultHasher::new();
        hash(&crate::spec::canonical(&value), &mut hasher);
        hasher.finish()
    }

    #[test]
    fn the_walked_digest_tells_specs_apart_as_the_built_canonical_tree_does() {
        let specs: Vec<NodeSloSpec> = [
            json!({}),
            json!({"resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressThresholdPercent": 65}}),
            json!({"resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressThresholdPercent": 42}}),
            json!({"resourceUsedThresholdWithBE": {"enable": false, "cpuSuppressThresholdPercent": 65}}),
            json!({"resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressThresholdPercent": 65,
                   "cpuSuppressPolicy": null}}),
            json!({"extensions": {"a": [], "b": {"c": null, "d": [1, 2.5, -3]}}}),
            json!({"extensions": {"b": {"d": [1, 2.5, -3]}}}),
            json!({"extensions": {"b": {"d": [1, 2.5, -4]}}}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).expect("spec"))
        .collect();
        for a in &specs {
            for b in &specs {
                assert_eq!(
                    spec_digest(a) == spec_digest(b),
                    digest_of_built_tree(a) == digest_of_built_tree(b),
                    "{a:?} vs {b:?}"
                );
            }
        }
        // Null members and empty lists count as absent.
        assert_eq!(spec_digest(&specs[1]), spec_digest(&specs[4]));
        assert_eq!(spec_digest(&specs[5]), spec_digest(&specs[6]));
        assert_ne!(spec_digest(&specs[6]), spec_digest(&specs[7]));
    }

    fn node(labels: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..NodeFacts::default()
        }
    }

    fn config_with_burst(percent: i64) -> MergedConfig {
        let data: BTreeMap<String, String> = [(
            "cpu-burst-config".to_string(),
            format!(r#"{{"clusterStrategy":{{"cpuBurstPercent":{percent}}}}}"#),
        )]
        .into();
        MergedConfig::from_config_map(Some(&data), &MergedConfig::default()).config
    }

    fn created_spec(outcome: Outcome) -> NodeSloSpec {
        match outcome.decision {
            Decision::Create(spec) => spec,
            other => panic!("expected a create, got {other:?}"),
        }
    }

    #[test]
    fn neither_exists_nothing() {
        let outcome = decide(None, None, &MergedConfig::default()).expect("decide");
        assert_eq!(outcome.decision, Decision::Nothing);
    }

    #[test]
    fn node_gone_deletes_the_nodeslo() {
        let slo = SloFacts::default();
        assert_eq!(
            decide(None, Some(&slo), &MergedConfig::default())
                .expect("decide")
                .decision,
            Decision::Delete
        );
    }

    #[test]
    fn node_without_nodeslo_creates_it_with_the_computed_spec() {
        let spec =
            created_spec(decide(Some(&node(&[])), None, &config_with_burst(700)).expect("decide"));
        assert_eq!(
            spec.cpu_burst_strategy.and_then(|b| b.cpu_burst_percent),
            Some(700)
        );
    }

    #[test]
    fn unchanged_spec_makes_no_write_and_a_changed_one_an_update() {
        let config = config_with_burst(700);
        let spec = created_spec(decide(Some(&node(&[])), None, &config).expect("decide"));
        let stored = SloFacts::from_spec(&spec, Some(1), Some("42".into()));
        assert_eq!(
            decide(Some(&node(&[])), Some(&stored), &config)
                .expect("decide")
                .decision,
            Decision::Nothing
        );

        let changed =
            decide(Some(&node(&[])), Some(&stored), &config_with_burst(800)).expect("decide");
        match changed.decision {
            Decision::Update {
                spec,
                resource_version,
            } => {
                assert_eq!(
                    spec.cpu_burst_strategy.and_then(|b| b.cpu_burst_percent),
                    Some(800)
                );
                assert_eq!(resource_version.as_deref(), Some("42"));
            }
            other => panic!("expected an update, got {other:?}"),
        }
    }

    #[test]
    fn a_manual_edit_is_reverted() {
        let config = MergedConfig::default();
        let mut edited = created_spec(decide(Some(&node(&[])), None, &config).expect("decide"));
        edited
            .system_strategy
            .get_or_insert_default()
            .min_free_kbytes_factor = Some(1);
        let stored = SloFacts::from_spec(&edited, Some(2), None);
        assert!(matches!(
            decide(Some(&node(&[])), Some(&stored), &config)
                .expect("decide")
                .decision,
            Decision::Update { .. }
        ));
    }

    #[test]
    fn extensions_are_kept_and_do_not_cause_a_write() {
        let config = MergedConfig::default();
        let mut spec = created_spec(decide(Some(&node(&[])), None, &config).expect("decide"));
        spec.extensions = Some(
            serde_json::json!({"vendor": {"x": 1}})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        let stored = SloFacts::from_spec(&spec, Some(1), None);
        assert_eq!(
            decide(Some(&node(&[])), Some(&stored), &config)
                .expect("decide")
                .decision,
            Decision::Nothing
        );
    }

    #[test]
    fn empty_host_applications_equal_absent_ones() {
        let config = MergedConfig::default();
        let mut spec = created_spec(decide(Some(&node(&[])), None, &config).expect("decide"));
        spec.host_applications = Some(Vec::new());
        let stored = SloFacts::from_spec(&spec, Some(1), None);
        assert_eq!(
            decide(Some(&node(&[])), Some(&stored), &config)
                .expect("decide")
                .decision,
            Decision::Nothing
        );
    }

    #[test]
    fn slo_status_or_metadata_changes_do_not_trigger() {
        let a = SloFacts {
            spec_digest: 1,
            generation: Some(3),
            resource_version: Some("10".into()),
            ..SloFacts::default()
        };
        let b = SloFacts {
            resource_version: Some("11".into()),
            ..a.clone()
        };
        assert!(a.same_for_reconcile(&b));
        let c = SloFacts {
            generation: Some(4),
            ..a.clone()
        };
        assert!(!a.same_for_reconcile(&c));
    }

    #[test]
    fn invalid_bandwidth_is_reported() {
        let facts = NodeFacts {
            bandwidth: Some("fast".into()),
            ..NodeFacts::default()
        };
        let outcome = decide(Some(&facts), None, &MergedConfig::default()).expect("decide");
        assert_eq!(outcome.invalid_bandwidth.as_deref(), Some("fast"));
    }
}
