//! A two-way index "source object -> the objects it refers to" (Machine -> its MachineClass,
//! MachineClass -> its Secrets), fed from watch events. It answers "which machines use this
//! class" without scanning every Machine, and tells which targets an event affects (the old and
//! the new reference), which is what must be re-reconciled.

use std::collections::{BTreeSet, HashMap, HashSet};

/// Keys are `namespace/name` strings.
#[derive(Debug, Default)]
pub struct RefIndex {
    forward: HashMap<String, BTreeSet<String>>,
    reverse: HashMap<String, BTreeSet<String>>,
    /// Sources seen since a re-list started (`None` outside a re-list).
    relisting: Option<HashSet<String>>,
}

impl RefIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `source` now refers to `targets`; returns the targets whose set of referrers
    /// changed (old and new references), empty when nothing changed.
    pub fn upsert(&mut self, source: &str, targets: BTreeSet<String>) -> BTreeSet<String> {
        if let Some(seen) = self.relisting.as_mut() {
            seen.insert(source.to_owned());
        }
        let old = self.forward.get(source).cloned().unwrap_or_default();
        if old == targets && self.forward.contains_key(source) {
            return BTreeSet::new();
        }
        for gone in old.difference(&targets) {
            self.unlink(gone, source);
        }
        for added in targets.difference(&old) {
            self.reverse
                .entry(added.clone())
                .or_default()
                .insert(source.to_owned());
        }
        let affected = old.symmetric_difference(&targets).cloned().collect();
        self.forward.insert(source.to_owned(), targets);
        affected
    }

    /// Forgets `source`; returns the targets it referred to.
    pub fn remove(&mut self, source: &str) -> BTreeSet<String> {
        let old = self.forward.remove(source).unwrap_or_default();
        for target in &old {
            self.unlink(target, source);
        }
        old
    }

    fn unlink(&mut self, target: &str, source: &str) {
        if let Some(set) = self.reverse.get_mut(target) {
            set.remove(source);
            if set.is_empty() {
                self.reverse.remove(target);
            }
        }
    }

    /// The sources referring to `target`.
    pub fn referrers(&self, target: &str) -> impl Iterator<Item = &String> {
        self.reverse.get(target).into_iter().flatten()
    }

    /// How many sources refer to `target`.
    pub fn referrer_count(&self, target: &str) -> usize {
        self.reverse.get(target).map_or(0, BTreeSet::len)
    }

    /// A full re-list starts (watch `Init`).
    pub fn begin_relist(&mut self) {
        self.relisting = Some(HashSet::new());
    }

    /// The re-list is complete (watch `InitDone`): sources not seen again are dropped. Returns the
    /// targets they referred to.
    pub fn finish_relist(&mut self) -> BTreeSet<String> {
        let Some(seen) = self.relisting.take() else {
            return BTreeSet::new();
        };
        let stale: Vec<String> = self
            .forward
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        stale.iter().flat_map(|s| self.remove(s)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn create_change_and_delete_report_the_affected_targets() {
        let mut index = RefIndex::new();
        assert_eq!(
            index.upsert("ns/m1", set(&["ns/a"])),
            set(&["ns/a"]),
            "created"
        );
        assert_eq!(
            index.upsert("ns/m1", set(&["ns/a"])),
            set(&[]),
            "unchanged reference"
        );
        assert_eq!(index.upsert("ns/m2", set(&["ns/a"])), set(&["ns/a"]));
        assert_eq!(index.referrer_count("ns/a"), 2);
        assert_eq!(
            index.upsert("ns/m1", set(&["ns/b"])),
            set(&["ns/a", "ns/b"]),
            "class changed"
        );
        assert_eq!(index.referrers("ns/a").collect::<Vec<_>>(), ["ns/m2"]);
        assert_eq!(index.remove("ns/m2"), set(&["ns/a"]));
        assert_eq!(index.referrer_count("ns/a"), 0);
        assert_eq!(index.remove("ns/unknown"), set(&[]));
    }

    #[test]
    fn a_source_without_references_is_still_known() {
        let mut index = RefIndex::new();
        assert_eq!(index.upsert("ns/m", set(&[])), set(&[]));
        assert_eq!(index.upsert("ns/m", set(&["ns/a"])), set(&["ns/a"]));
    }

    #[test]
    fn relist_drops_sources_that_disappeared() {
        let mut index = RefIndex::new();
        index.upsert("ns/m1", set(&["ns/a"]));
        index.upsert("ns/m2", set(&["ns/b"]));
        index.begin_relist();
        index.upsert("ns/m1", set(&["ns/a"]));
        assert_eq!(index.finish_relist(), set(&["ns/b"]));
        assert_eq!(index.referrer_count("ns/b"), 0);
        assert_eq!(index.referrer_count("ns/a"), 1);
        assert_eq!(index.finish_relist(), set(&[]), "no re-list in progress");
    }
}
