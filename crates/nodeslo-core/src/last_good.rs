//! The text of each config key that is in force, kept in a ConfigMap of the controller's own so
//! that a restart does not reset a key whose current value is bad (the reference falls back to
//! defaults there: a typo plus a restart changed QoS cluster-wide).

use std::collections::BTreeMap;

use crate::config::{ConfigKey, ConfigProblem, MergedConfig};

/// Name of the controller's own ConfigMap beside the user's `config_name`.
pub fn last_good_name(config_name: &str) -> String {
    format!("{config_name}-last-good")
}

/// The key texts in force after reading `data`: a key that parsed is in force as written, an
/// absent key is not stored (its default is in force), a key that failed keeps its previous text.
/// Keys this controller does not read are never stored.
pub fn texts_in_force(
    data: Option<&BTreeMap<String, String>>,
    problems: &[ConfigProblem],
    previous: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut texts = BTreeMap::new();
    for key in ConfigKey::ALL {
        let name = key.data_key();
        let failed = problems
            .iter()
            .any(|p| matches!(p, ConfigProblem::Unmarshal { key: k, .. } if *k == key));
        let text = if failed {
            previous.get(name)
        } else {
            data.and_then(|d| d.get(name))
        };
        if let Some(text) = text {
            texts.insert(name.to_owned(), text.clone());
        }
    }
    texts
}

/// The merged config the stored texts stand for (at start, before the user's ConfigMap is read).
pub fn restore(stored: &BTreeMap<String, String>) -> MergedConfig {
    MergedConfig::from_config_map(Some(stored), &MergedConfig::default()).config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const GOOD: &str = r#"{"clusterStrategy":{"cpuBurstPercent":500}}"#;

    #[test]
    fn a_bad_key_survives_a_restart_through_the_stored_text() {
        // First run: a good value is in force and stored.
        let first = map(&[("cpu-burst-config", GOOD), ("unrelated", "x")]);
        let outcome = MergedConfig::from_config_map(Some(&first), &MergedConfig::default());
        let stored = texts_in_force(Some(&first), &outcome.problems, &BTreeMap::new());
        assert_eq!(stored, map(&[("cpu-burst-config", GOOD)]));

        // The key gets a typo, then the controller restarts.
        let typo = map(&[(
            "cpu-burst-config",
            r#"{"clusterStrategy":{"cpuBurstPercent":"lots"}}"#,
        )]);
        let last_good = restore(&stored);
        let outcome = MergedConfig::from_config_map(Some(&typo), &last_good);
        assert_eq!(outcome.problems.len(), 1);
        assert_eq!(
            outcome.config.burst.cluster["cpuBurstPercent"],
            serde_json::json!(500),
            "the last good value is in force after the restart"
        );
        assert_eq!(
            texts_in_force(Some(&typo), &outcome.problems, &stored),
            stored,
            "nothing new to store"
        );
    }

    #[test]
    fn an_absent_key_is_forgotten() {
        let stored = map(&[("cpu-burst-config", GOOD)]);
        assert!(texts_in_force(Some(&BTreeMap::new()), &[], &stored).is_empty());
        assert!(texts_in_force(None, &[], &stored).is_empty());
        assert_eq!(restore(&BTreeMap::new()), MergedConfig::default());
    }

    #[test]
    fn the_name_sits_beside_the_users() {
        assert_eq!(
            last_good_name("slo-controller-config"),
            "slo-controller-config-last-good"
        );
    }
}
