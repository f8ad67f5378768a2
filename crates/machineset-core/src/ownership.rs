//! Which Machines (or MachineSets) an owner claims: MCM's `ControllerRefManager`, the same rules
//! as Kubernetes' ReplicaSet controller. A controller reference decides; the selector only adopts
//! orphans and releases owned objects that no longer match.

use std::collections::BTreeMap;

use capstan_apis::selector::Selector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The owner as claims see it.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub uid: &'a str,
    /// An owner being deleted adopts nothing and releases nothing.
    pub deleting: bool,
    pub selector: &'a Selector,
}

/// What to do with one candidate object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Ours and matching: it counts.
    Owned,
    /// An orphan that matches: add our controller reference, then it counts.
    Adopt,
    /// Ours but no longer matching: drop our reference; it does not count.
    Release,
    /// Someone else's, or an orphan that does not match.
    Ignore,
}

/// The controller reference of an object, if it has one.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// The claim `owner` makes on an object with `meta`.
pub fn claim(owner: Owner<'_>, meta: &ObjectMeta) -> Claim {
    let empty = BTreeMap::new();
    let matches = owner
        .selector
        .matches(meta.labels.as_ref().unwrap_or(&empty));
    match controller_of(meta) {
        Some(r) if r.uid == owner.uid => {
            if matches || owner.deleting {
                Claim::Owned
            } else {
                Claim::Release
            }
        }
        Some(_) => Claim::Ignore,
        None if matches && !owner.deleting && meta.deletion_timestamp.is_none() => Claim::Adopt,
        None => Claim::Ignore,
    }
}

/// The controller reference an owner of `kind` writes on what it creates or adopts.
pub fn controller_ref(kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: format!(
            "{}/{}",
            capstan_apis::machine::GROUP,
            capstan_apis::machine::VERSION
        ),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

    use super::*;
    use crate::Timestamp;

    fn selector() -> Selector {
        Selector::parse(&LabelSelector {
            match_labels: Some(BTreeMap::from([("name".into(), "pool-a".into())])),
            match_expressions: None,
        })
        .expect("valid")
    }

    fn meta(labels: &[(&str, &str)], controller_uid: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            owner_references: controller_uid
                .map(|uid| vec![controller_ref("MachineSet", "owner", uid)]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn claims_follow_the_controller_reference_then_the_selector() {
        let sel = selector();
        let owner = Owner {
            uid: "u1",
            deleting: false,
            selector: &sel,
        };
        let matching = [("name", "pool-a")];
        let other = [("name", "pool-b")];
        assert_eq!(claim(owner, &meta(&matching, Some("u1"))), Claim::Owned);
        assert_eq!(claim(owner, &meta(&other, Some("u1"))), Claim::Release);
        assert_eq!(claim(owner, &meta(&matching, Some("u2"))), Claim::Ignore);
        assert_eq!(claim(owner, &meta(&matching, None)), Claim::Adopt);
        assert_eq!(claim(owner, &meta(&other, None)), Claim::Ignore);
        let mut deleting_orphan = meta(&matching, None);
        deleting_orphan.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(claim(owner, &deleting_orphan), Claim::Ignore);
    }

    #[test]
    fn a_deleting_owner_keeps_what_it_has_and_adopts_nothing() {
        let sel = selector();
        let owner = Owner {
            uid: "u1",
            deleting: true,
            selector: &sel,
        };
        assert_eq!(
            claim(owner, &meta(&[("name", "x")], Some("u1"))),
            Claim::Owned
        );
        assert_eq!(
            claim(owner, &meta(&[("name", "pool-a")], None)),
            Claim::Ignore
        );
    }

    #[test]
    fn the_reference_is_a_blocking_controller_reference() {
        let r = controller_ref("MachineSet", "pool-a-1", "u1");
        assert_eq!(r.api_version, "machine.sapcloud.io/v1alpha1");
        assert_eq!(
            (r.controller, r.block_owner_deletion),
            (Some(true), Some(true))
        );
    }
}
