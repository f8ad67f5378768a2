//! The Secret finalizer decision: a Secret keeps `machine.sapcloud.io/machine-controller` while a
//! MachineClass references it by `secretRef` or `credentialsSecretRef`.

use capstan_apis::machine::MachineClass;
use k8s_openapi::api::core::v1::SecretReference;

/// True when `reference`, written in a class of namespace `class_namespace`, names the Secret
/// `namespace/name`. **Decision**: namespace and name must both match; a reference without a
/// namespace means the class's own namespace.
pub fn reference_matches(
    reference: &SecretReference,
    class_namespace: &str,
    namespace: &str,
    name: &str,
) -> bool {
    let ref_ns = reference
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .unwrap_or(class_namespace);
    reference.name.as_deref() == Some(name) && ref_ns == namespace
}

/// True when `class` references the Secret `namespace/name` through either reference field.
pub fn class_references_secret(class: &MachineClass, namespace: &str, name: &str) -> bool {
    let class_ns = class.metadata.namespace.as_deref().unwrap_or_default();
    class
        .secret_refs()
        .any(|r| reference_matches(r, class_ns, namespace, name))
}

/// The `namespace/name` keys of every Secret a class references.
pub fn referenced_secret_keys(class: &MachineClass) -> Vec<(String, String)> {
    let class_ns = class.metadata.namespace.clone().unwrap_or_default();
    class
        .secret_refs()
        .filter_map(|r| {
            let name = r.name.clone().filter(|n| !n.is_empty())?;
            let ns = r
                .namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| class_ns.clone());
            Some((ns, name))
        })
        .collect()
}

/// What to do with a Secret's finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretAction {
    AddFinalizer,
    RemoveFinalizer,
    Unchanged,
}

/// Decides the Secret finalizer from whether it carries it and whether some class references it.
pub fn decide_secret(has_finalizer: bool, referenced: bool) -> SecretAction {
    match (has_finalizer, referenced) {
        (false, true) => SecretAction::AddFinalizer,
        (true, false) => SecretAction::RemoveFinalizer,
        _ => SecretAction::Unchanged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_apis::machine::MachineClassSpec;

    fn sref(name: &str, ns: Option<&str>) -> SecretReference {
        SecretReference {
            name: Some(name.into()),
            namespace: ns.map(Into::into),
        }
    }

    fn class(secret: Option<SecretReference>, creds: Option<SecretReference>) -> MachineClass {
        let mut c = MachineClass::new(
            "mc",
            MachineClassSpec {
                provider_spec: serde_json::json!({}),
                provider: None,
                secret_ref: secret,
                credentials_secret_ref: creds,
                node_template: None,
            },
        );
        c.metadata.namespace = Some("default".into());
        c
    }

    #[test]
    fn both_reference_fields_count() {
        let only_creds = class(None, Some(sref("creds", Some("default"))));
        assert!(class_references_secret(&only_creds, "default", "creds"));
        let only_secret = class(Some(sref("cloud", Some("default"))), None);
        assert!(class_references_secret(&only_secret, "default", "cloud"));
        assert!(!class_references_secret(&only_secret, "default", "creds"));
        let both = class(
            Some(sref("cloud", None)),
            Some(sref("creds", Some("default"))),
        );
        assert_eq!(
            referenced_secret_keys(&both),
            [
                ("default".to_owned(), "cloud".to_owned()),
                ("default".to_owned(), "creds".to_owned())
            ]
        );
    }

    #[test]
    fn namespace_and_name_must_both_match() {
        let c = class(Some(sref("cloud", Some("infra"))), None);
        assert!(class_references_secret(&c, "infra", "cloud"));
        assert!(
            !class_references_secret(&c, "default", "cloud"),
            "same name in another namespace"
        );
        // No namespace on the reference: the class's namespace.
        let c = class(Some(sref("cloud", None)), None);
        assert!(class_references_secret(&c, "default", "cloud"));
        assert!(!class_references_secret(&c, "infra", "cloud"));
    }

    #[test]
    fn finalizer_follows_references() {
        assert_eq!(decide_secret(false, true), SecretAction::AddFinalizer);
        assert_eq!(decide_secret(true, false), SecretAction::RemoveFinalizer);
        assert_eq!(decide_secret(true, true), SecretAction::Unchanged);
        assert_eq!(decide_secret(false, false), SecretAction::Unchanged);
    }
}
