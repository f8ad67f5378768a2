//! A Node's labels as the decision keeps them, between watch events: a sorted boxed slice.
//!
//! A `BTreeMap<String, String>` allocates a whole leaf (room for 11 pairs, about 550 bytes)
//! even for one label; at 50,000 Nodes that leaf was most of the controller's memory. The
//! slice costs the labels themselves plus 32 bytes a pair, and is turned back into a map only
//! for the moment a decision matches selectors.

use std::collections::BTreeMap;

/// Label pairs sorted by key, keys unique.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeLabels(Box<[(Box<str>, Box<str>)]>);

impl NodeLabels {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| self.0[i].1.as_ref())
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The map selectors match against.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

impl From<BTreeMap<String, String>> for NodeLabels {
    fn from(map: BTreeMap<String, String>) -> Self {
        // A map iterates in key order, unique keys: already the slice's invariant.
        Self(map.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

impl FromIterator<(String, String)> for NodeLabels {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Self {
        // Through a map: sorted, and a repeated key keeps its last value, as a map would.
        pairs.into_iter().collect::<BTreeMap<_, _>>().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> NodeLabels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn finds_every_key_whatever_the_order_they_came_in() {
        let set = labels(&[("zone", "b"), ("pool", "p1"), ("arch", "arm64")]);
        assert_eq!(set.get("arch"), Some("arm64"));
        assert_eq!(set.get("pool"), Some("p1"));
        assert_eq!(set.get("zone"), Some("b"));
        assert_eq!(set.get("missing"), None);
        assert!(set.contains_key("zone"));
        assert_eq!(set.len(), 3);
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value_and_the_map_round_trips() {
        let set = labels(&[("pool", "p1"), ("pool", "p2")]);
        assert_eq!(set.get("pool"), Some("p2"));
        let map = BTreeMap::from([("a".to_string(), "1".to_string()), ("b".into(), "2".into())]);
        assert_eq!(NodeLabels::from(map.clone()).to_map(), map);
        assert!(NodeLabels::default().is_empty());
    }

    #[test]
    fn equal_label_sets_compare_equal() {
        assert_eq!(
            labels(&[("a", "1"), ("b", "2")]),
            labels(&[("b", "2"), ("a", "1")])
        );
        assert_ne!(labels(&[("a", "1")]), labels(&[("a", "2")]));
    }
}
