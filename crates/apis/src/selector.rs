//! Kubernetes `LabelSelector` semantics: validation and matching against an object's labels
//! (Nodes for nodeslo's strategies, Machines for MachineSets).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use thiserror::Error;

/// Why a selector cannot be used; the strategy carrying it is skipped (and reported).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SelectorError {
    #[error("invalid label key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("invalid label value {value:?} for key {key:?}: {reason}")]
    InvalidValue {
        key: String,
        value: String,
        reason: &'static str,
    },
    #[error("unknown operator {operator:?} for key {key:?}")]
    UnknownOperator { key: String, operator: String },
    #[error("operator {operator} for key {key:?} needs at least one value")]
    MissingValues { key: String, operator: &'static str },
    #[error("operator {operator} for key {key:?} takes no values")]
    UnexpectedValues { key: String, operator: &'static str },
}

/// A selector that passed validation, ready to match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// Validates a `LabelSelector` the way the API machinery does (`LabelSelectorAsSelector`).
    pub fn parse(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            validate_key(key)?;
            validate_value(key, value)?;
            requirements.push(Requirement::In(key.clone(), vec![value.clone()]));
        }
        for expr in selector.match_expressions.iter().flatten() {
            validate_key(&expr.key)?;
            let values = expr.values.clone().unwrap_or_default();
            let key = expr.key.clone();
            let requirement = match expr.operator.as_str() {
                "In" | "NotIn" => {
                    let operator = if expr.operator == "In" { "In" } else { "NotIn" };
                    if values.is_empty() {
                        return Err(SelectorError::MissingValues { key, operator });
                    }
                    for value in &values {
                        validate_value(&key, value)?;
                    }
                    if operator == "In" {
                        Requirement::In(key, values)
                    } else {
                        Requirement::NotIn(key, values)
                    }
                }
                "Exists" | "DoesNotExist" => {
                    let operator = if expr.operator == "Exists" {
                        "Exists"
                    } else {
                        "DoesNotExist"
                    };
                    if !values.is_empty() {
                        return Err(SelectorError::UnexpectedValues { key, operator });
                    }
                    if operator == "Exists" {
                        Requirement::Exists(key)
                    } else {
                        Requirement::DoesNotExist(key)
                    }
                }
                other => {
                    return Err(SelectorError::UnknownOperator {
                        key,
                        operator: other.to_string(),
                    });
                }
            };
            requirements.push(requirement);
        }
        Ok(Self { requirements })
    }

    /// All requirements hold; an empty selector matches everything.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
        })
    }
}

/// A qualified name: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters, alphanumeric at both ends with `-`, `_` and `.` inside.
fn validate_key(key: &str) -> Result<(), SelectorError> {
    let invalid = |reason| {
        Err(SelectorError::InvalidKey {
            key: key.to_string(),
            reason,
        })
    };
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && (prefix.is_empty() || prefix.len() > 253 || !is_dns_subdomain(prefix))
    {
        return invalid("prefix must be a DNS subdomain of at most 253 characters");
    }
    if name.is_empty() {
        return invalid("name part must not be empty");
    }
    if name.len() > 63 || !is_label_token(name) {
        return invalid(
            "name part must be at most 63 characters, alphanumeric at both ends, with '-', '_' or '.' inside",
        );
    }
    Ok(())
}

fn validate_value(key: &str, value: &str) -> Result<(), SelectorError> {
    if value.is_empty() || (value.len() <= 63 && is_label_token(value)) {
        return Ok(());
    }
    Err(SelectorError::InvalidValue {
        key: key.to_string(),
        value: value.to_string(),
        reason: "must be empty or at most 63 characters, alphanumeric at both ends, with '-', '_' or '.' inside",
    })
}

fn is_label_token(s: &str) -> bool {
    let bytes = s.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let bytes = label.as_bytes();
        let lower_alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        !bytes.is_empty()
            && bytes.len() <= 63
            && bytes.first().is_some_and(lower_alnum)
            && bytes.last().is_some_and(lower_alnum)
            && bytes.iter().all(|b| lower_alnum(b) || *b == b'-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: operator.into(),
                values: if values.is_empty() {
                    None
                } else {
                    Some(values.iter().map(|v| v.to_string()).collect())
                },
            }]),
        }
    }

    fn parse(selector: &LabelSelector) -> Selector {
        Selector::parse(selector).expect("valid selector")
    }

    #[test]
    fn empty_selector_matches_everything() {
        let selector = parse(&LabelSelector::default());
        assert!(selector.matches(&labels(&[])));
        assert!(selector.matches(&labels(&[("a", "b")])));
    }

    #[test]
    fn match_labels_needs_every_pair() {
        let selector = parse(&LabelSelector {
            match_labels: Some(labels(&[("xxx", "yyy"), ("zone", "a")])),
            match_expressions: None,
        });
        assert!(selector.matches(&labels(&[("xxx", "yyy"), ("zone", "a"), ("other", "x")])));
        assert!(!selector.matches(&labels(&[("xxx", "yyy")])));
        assert!(!selector.matches(&labels(&[("xxx", "zzz"), ("zone", "a")])));
    }

    #[test]
    fn each_operator() {
        let node = labels(&[("tier", "gold"), ("gpu", "")]);
        assert!(parse(&expr("tier", "In", &["gold", "silver"])).matches(&node));
        assert!(!parse(&expr("tier", "In", &["bronze"])).matches(&node));
        assert!(!parse(&expr("absent", "In", &["x"])).matches(&node));
        assert!(parse(&expr("tier", "NotIn", &["bronze"])).matches(&node));
        assert!(!parse(&expr("tier", "NotIn", &["gold"])).matches(&node));
        assert!(
            parse(&expr("absent", "NotIn", &["x"])).matches(&node),
            "NotIn holds for a missing key"
        );
        assert!(parse(&expr("gpu", "Exists", &[])).matches(&node));
        assert!(!parse(&expr("absent", "Exists", &[])).matches(&node));
        assert!(parse(&expr("absent", "DoesNotExist", &[])).matches(&node));
        assert!(!parse(&expr("tier", "DoesNotExist", &[])).matches(&node));
    }

    #[test]
    fn invalid_forms_are_rejected() {
        assert!(matches!(
            Selector::parse(&expr("a", "Near", &["x"])),
            Err(SelectorError::UnknownOperator { .. })
        ));
        assert!(matches!(
            Selector::parse(&expr("a", "In", &[])),
            Err(SelectorError::MissingValues { operator: "In", .. })
        ));
        assert!(matches!(
            Selector::parse(&expr("a", "NotIn", &[])),
            Err(SelectorError::MissingValues {
                operator: "NotIn",
                ..
            })
        ));
        assert!(matches!(
            Selector::parse(&expr("a", "Exists", &["x"])),
            Err(SelectorError::UnexpectedValues {
                operator: "Exists",
                ..
            })
        ));
        assert!(matches!(
            Selector::parse(&expr("a", "DoesNotExist", &["x"])),
            Err(SelectorError::UnexpectedValues { .. })
        ));
        for key in [
            "",
            "-a",
            "a-",
            "a b",
            "Example.com/x",
            "/x",
            "x/",
            &"k".repeat(64),
        ] {
            assert!(
                matches!(
                    Selector::parse(&expr(key, "Exists", &[])),
                    Err(SelectorError::InvalidKey { .. })
                ),
                "key {key:?} must be invalid"
            );
        }
        assert!(matches!(
            Selector::parse(&LabelSelector {
                match_labels: Some(labels(&[("a", "bad value")])),
                match_expressions: None
            }),
            Err(SelectorError::InvalidValue { .. })
        ));
    }

    #[test]
    fn qualified_keys_are_valid() {
        for key in [
            "node.koordinator.sh/pool",
            "kubernetes.io/hostname",
            "a_b.c-d",
            "x",
        ] {
            assert!(
                Selector::parse(&expr(key, "Exists", &[])).is_ok(),
                "key {key:?} must be valid"
            );
        }
    }
}
