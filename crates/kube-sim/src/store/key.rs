//! The keys the store shares between its object map, its uid and owner indexes and its event
//! history: one allocation per object for its namespace and name, one per resource for the
//! resource's storage key, so an index entry or an event costs pointers, not strings.

use super::ObjKey;
use crate::registry::StorageKey;
use std::borrow::Borrow;
use std::sync::Arc;

/// A resource's storage key, held once per resource and shared by its events and index entries.
pub type ResourceKey = Arc<StorageKey>;

/// The separator between namespace and name: below every character a name may hold, so the
/// joined bytes order exactly as the `(namespace, name)` pair does.
const SEP: u8 = 0;

/// An object's namespace ("" for cluster-scoped) and name in one shared allocation, ordered as
/// the `(namespace, name)` pair. Map lookups borrow it as the joined bytes (`ObjName::lookup`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjName(Arc<[u8]>);

impl ObjName {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self(Self::lookup(namespace, name).into())
    }

    pub fn of(key: &ObjKey) -> Self {
        Self::new(&key.0, &key.1)
    }

    /// The joined bytes a map of `ObjName`s is searched with.
    pub fn lookup(namespace: &str, name: &str) -> Vec<u8> {
        let mut joined = Vec::with_capacity(namespace.len() + 1 + name.len());
        joined.extend_from_slice(namespace.as_bytes());
        joined.push(SEP);
        joined.extend_from_slice(name.as_bytes());
        joined
    }

    /// The bytes every key of one namespace starts with.
    pub fn namespace_prefix(namespace: &str) -> Vec<u8> {
        let mut prefix = namespace.as_bytes().to_vec();
        prefix.push(SEP);
        prefix
    }

    fn split(&self) -> (&str, &str) {
        let at = self.0.iter().position(|b| *b == SEP).unwrap_or(0);
        // Built from two `&str`s around an ASCII separator: both halves are UTF-8.
        (
            std::str::from_utf8(&self.0[..at]).unwrap_or_default(),
            std::str::from_utf8(&self.0[at + 1..]).unwrap_or_default(),
        )
    }

    pub fn namespace(&self) -> &str {
        self.split().0
    }

    pub fn name(&self) -> &str {
        self.split().1
    }

    pub fn to_obj_key(&self) -> ObjKey {
        let (namespace, name) = self.split();
        (namespace.to_string(), name.to_string())
    }
}

impl Borrow<[u8]> for ObjName {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_order_as_namespace_name_pairs() {
        let pairs = [
            ("", "z"),
            ("a", "b"),
            ("a", "bc"),
            ("ab", ""),
            ("ab", "a"),
            ("b", "a"),
        ];
        let mut names: Vec<ObjName> = pairs
            .iter()
            .rev()
            .map(|(n, m)| ObjName::new(n, m))
            .collect();
        names.sort();
        let back: Vec<(&str, &str)> = names.iter().map(|n| (n.namespace(), n.name())).collect();
        assert_eq!(back, pairs);
    }
}
