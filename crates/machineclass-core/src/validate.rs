//! Validation of a Machine's class reference and of a MachineClass, and secret data merging.

use std::collections::BTreeMap;
use std::time::Duration;

use capstan_apis::machine::{
    DurationParseError, KIND_MACHINE_CLASS, MachineClass, MachineSpec, REQUIRED_CAPACITY_KEYS,
};
use k8s_openapi::ByteString;

/// Why a Machine or its class is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("spec.class.kind is required")]
    MissingClassKind,
    #[error("spec.class.name is required")]
    MissingClassName,
    #[error("spec.class.kind {0:?} is not supported, only MachineClass")]
    UnsupportedClassKind(String),
    #[error("machine class nodeTemplate.capacity is missing {0:?}")]
    MissingCapacity(&'static str),
    #[error("machine class nodeTemplate.{0} is empty")]
    EmptyNodeTemplateField(&'static str),
    #[error("invalid {field}: {source}")]
    InvalidTimeout {
        field: &'static str,
        source: DurationParseError,
    },
}

impl ValidationError {
    /// Short stable label for metrics and Event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Self::MissingClassKind | Self::MissingClassName | Self::UnsupportedClassKind(_) => {
                "invalid_class_ref"
            }
            Self::MissingCapacity(_) | Self::EmptyNodeTemplateField(_) => "invalid_node_template",
            Self::InvalidTimeout { .. } => "invalid_timeout",
        }
    }
}

/// The class name a Machine refers to, or why its reference is invalid.
pub fn validate_class_ref(spec: &MachineSpec) -> Result<&str, ValidationError> {
    let class = spec.class.as_ref();
    let kind = class
        .and_then(|c| c.kind.as_deref())
        .filter(|k| !k.is_empty());
    let name = class
        .and_then(|c| c.name.as_deref())
        .filter(|n| !n.is_empty());
    match (kind, name) {
        (None, _) => Err(ValidationError::MissingClassKind),
        (_, None) => Err(ValidationError::MissingClassName),
        (Some(KIND_MACHINE_CLASS), Some(name)) => Ok(name),
        (Some(other), _) => Err(ValidationError::UnsupportedClassKind(other.to_owned())),
    }
}

/// Checks a class's `nodeTemplate` (when present): capacity holds cpu, gpu and memory, and
/// instanceType, region and zone are non-empty. Returns every problem found.
pub fn validate_class(class: &MachineClass) -> Vec<ValidationError> {
    let Some(template) = class.spec.node_template.as_ref() else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    for key in REQUIRED_CAPACITY_KEYS {
        if !template
            .capacity
            .as_ref()
            .is_some_and(|c| c.contains_key(key))
        {
            problems.push(ValidationError::MissingCapacity(key));
        }
    }
    for (field, value) in [
        ("instanceType", &template.instance_type),
        ("region", &template.region),
        ("zone", &template.zone),
    ] {
        if value.as_deref().is_none_or(str::is_empty) {
            problems.push(ValidationError::EmptyNodeTemplateField(field));
        }
    }
    problems
}

/// A Machine's timeouts, parsed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineTimeouts {
    pub creation: Duration,
    pub health: Duration,
    pub drain: Duration,
    pub disable_health_timeout: bool,
}

impl Default for MachineTimeouts {
    /// MCM's defaults: creation 20m, health 10m, drain 2h.
    fn default() -> Self {
        Self {
            creation: capstan_apis::machine::DEFAULT_CREATION_TIMEOUT,
            health: capstan_apis::machine::DEFAULT_HEALTH_TIMEOUT,
            drain: capstan_apis::machine::DEFAULT_DRAIN_TIMEOUT,
            disable_health_timeout: false,
        }
    }
}

impl MachineTimeouts {
    /// Parses the spec's timeouts (MCM's defaults for unset ones).
    pub fn from_spec(spec: &MachineSpec) -> Result<Self, ValidationError> {
        Self::from_spec_or(spec, &Self::default())
    }

    /// Parses the spec's timeouts; unset ones come from `defaults` (the controller's flags).
    pub fn from_spec_or(spec: &MachineSpec, defaults: &Self) -> Result<Self, ValidationError> {
        let parse = |field: &'static str,
                     value: Option<&capstan_apis::machine::GoDuration>,
                     default: Duration| {
            value.map_or(Ok(default), |v| {
                v.to_std()
                    .map_err(|source| ValidationError::InvalidTimeout { field, source })
            })
        };
        Ok(Self {
            creation: parse(
                "creationTimeout",
                spec.creation_timeout.as_ref(),
                defaults.creation,
            )?,
            health: parse(
                "healthTimeout",
                spec.health_timeout.as_ref(),
                defaults.health,
            )?,
            drain: parse("drainTimeout", spec.drain_timeout.as_ref(), defaults.drain)?,
            disable_health_timeout: spec
                .disable_health_timeout
                .unwrap_or(defaults.disable_health_timeout),
        })
    }
}

/// Merges `secretRef` data with `credentialsSecretRef` data; credentials win on equal keys.
pub fn merge_secret_data(
    secret: Option<&BTreeMap<String, ByteString>>,
    credentials: Option<&BTreeMap<String, ByteString>>,
) -> BTreeMap<String, Vec<u8>> {
    secret
        .into_iter()
        .chain(credentials)
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_apis::machine::{ClassSpec, GoDuration, MachineClassSpec, NodeTemplate};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn spec_with(kind: Option<&str>, name: Option<&str>) -> MachineSpec {
        MachineSpec {
            class: Some(ClassSpec {
                api_group: None,
                kind: kind.map(Into::into),
                name: name.map(Into::into),
            }),
            ..MachineSpec::default()
        }
    }

    #[test]
    fn class_reference_needs_kind_and_name() {
        assert_eq!(
            validate_class_ref(&spec_with(Some("MachineClass"), Some("mc"))),
            Ok("mc")
        );
        assert_eq!(
            validate_class_ref(&spec_with(Some("MachineClass"), None)),
            Err(ValidationError::MissingClassName)
        );
        assert_eq!(
            validate_class_ref(&spec_with(Some("MachineClass"), Some(""))),
            Err(ValidationError::MissingClassName)
        );
        assert_eq!(
            validate_class_ref(&spec_with(None, Some("mc"))),
            Err(ValidationError::MissingClassKind)
        );
        assert_eq!(
            validate_class_ref(&MachineSpec::default()),
            Err(ValidationError::MissingClassKind)
        );
        assert_eq!(
            validate_class_ref(&spec_with(Some("AWSMachineClass"), Some("mc"))),
            Err(ValidationError::UnsupportedClassKind(
                "AWSMachineClass".into()
            ))
        );
    }

    fn class(template: Option<NodeTemplate>) -> MachineClass {
        MachineClass::new(
            "mc",
            MachineClassSpec {
                provider_spec: serde_json::json!({}),
                provider: None,
                secret_ref: None,
                credentials_secret_ref: None,
                node_template: template,
            },
        )
    }

    fn full_template() -> NodeTemplate {
        NodeTemplate {
            capacity: Some(
                [("cpu", "2"), ("gpu", "0"), ("memory", "8Gi")]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
                    .collect(),
            ),
            virtual_capacity: None,
            instance_type: Some("m5.large".into()),
            region: Some("eu-west-1".into()),
            zone: Some("eu-west-1a".into()),
            architecture: None,
        }
    }

    #[test]
    fn node_template_is_optional_but_complete_when_present() {
        assert!(validate_class(&class(None)).is_empty());
        assert!(validate_class(&class(Some(full_template()))).is_empty());
        let mut t = full_template();
        t.capacity.as_mut().expect("set").remove("gpu");
        t.zone = Some(String::new());
        t.region = None;
        assert_eq!(
            validate_class(&class(Some(t))),
            [
                ValidationError::MissingCapacity("gpu"),
                ValidationError::EmptyNodeTemplateField("region"),
                ValidationError::EmptyNodeTemplateField("zone"),
            ]
        );
        let empty = validate_class(&class(Some(NodeTemplate::default())));
        assert_eq!(empty.len(), 6);
        assert!(empty.iter().all(|e| e.label() == "invalid_node_template"));
    }

    #[test]
    fn timeouts_parse_with_defaults_and_reject_garbage() {
        let mut spec = MachineSpec {
            creation_timeout: Some(GoDuration::new("5s")),
            ..MachineSpec::default()
        };
        let t = MachineTimeouts::from_spec(&spec).expect("valid");
        assert_eq!(t.creation, Duration::from_secs(5));
        assert_eq!(t.health, Duration::from_secs(600));
        assert!(!t.disable_health_timeout);
        let flags = MachineTimeouts {
            creation: Duration::from_secs(60),
            ..MachineTimeouts::default()
        };
        let unset = MachineTimeouts::from_spec_or(&MachineSpec::default(), &flags).expect("valid");
        assert_eq!(unset.creation, Duration::from_secs(60), "flag default used");
        assert_eq!(
            MachineTimeouts::from_spec_or(&spec, &flags)
                .expect("valid")
                .creation,
            Duration::from_secs(5)
        );
        spec.health_timeout = Some(GoDuration::new("ten minutes"));
        let err = MachineTimeouts::from_spec(&spec).expect_err("invalid");
        assert_eq!(err.label(), "invalid_timeout");
        assert!(err.to_string().starts_with("invalid healthTimeout"));
    }

    #[test]
    fn credentials_win_when_merging_secret_data() {
        let s = |pairs: &[(&str, &str)]| -> BTreeMap<String, ByteString> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect()
        };
        let secret = s(&[("userData", "cloud-init"), ("token", "old")]);
        let creds = s(&[("token", "new")]);
        let merged = merge_secret_data(Some(&secret), Some(&creds));
        assert_eq!(
            merged.get("token").map(Vec::as_slice),
            Some(b"new".as_slice())
        );
        assert_eq!(
            merged.get("userData").map(Vec::as_slice),
            Some(b"cloud-init".as_slice())
        );
        assert!(merge_secret_data(None, None).is_empty());
        assert_eq!(merge_secret_data(None, Some(&creds)).len(), 1);
    }
}
