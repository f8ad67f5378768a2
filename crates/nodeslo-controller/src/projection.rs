//! A watch-fed map from object name to the few facts a reconcile reads.
//!
//! Fed by kube-runtime's `watcher` events; reports which names changed in a way that matters, so
//! the caller can queue exactly those. A re-list (after a 410 or a reconnect) is buffered and
//! swapped in at its end, and names that vanished meanwhile are reported as changed too: a
//! deletion missed while disconnected still gets its reconcile.

use std::collections::HashMap;

use kube::runtime::watcher;

#[derive(Debug)]
pub struct Projection<T> {
    items: HashMap<String, T>,
    relisting: Option<HashMap<String, T>>,
    /// True once the first full list has been seen.
    synced: bool,
    /// Counts the watch events applied; `changed_at[name]` is the count at the last event that
    /// touched `name`, a deletion included (kept after the item is gone), so a writer can tell
    /// whether the watch moved on since it read (see [`Projection::stamp`]).
    events: u64,
    changed_at: HashMap<String, u64>,
}

/// Where the watch stood for one name when a reconcile read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp(u64);

impl<T> Default for Projection<T> {
    fn default() -> Self {
        Self {
            items: HashMap::new(),
            relisting: None,
            synced: false,
            events: 0,
            changed_at: HashMap::new(),
        }
    }
}

impl<T> Projection<T> {
    pub fn get(&self, name: &str) -> Option<&T> {
        self.items.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.items.keys()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Where the watch stands for `name` now: read it with the facts a decision is made from.
    pub fn stamp(&self, name: &str) -> Stamp {
        Stamp(self.changed_at.get(name).copied().unwrap_or(0))
    }

    /// Stores `facts` (what our own write left on the server) only if no watch event touched
    /// `name` since `stamp`: an event since then (an update, or a deletion that already removed
    /// the object again) is newer than the write and must not be overwritten by it.
    pub fn record_own_write(&mut self, name: &str, stamp: Stamp, facts: T) {
        if self.stamp(name) == stamp {
            self.items.insert(name.to_owned(), facts);
        }
    }

    fn touch(&mut self, name: &str) {
        self.events += 1;
        self.changed_at.insert(name.to_owned(), self.events);
    }

    /// Applies one watcher event (objects already projected to `(name, facts)`) and returns the
    /// names to reconcile. `same` says whether two facts need no reconcile between them.
    pub fn apply(
        &mut self,
        event: watcher::Event<(String, T)>,
        same: impl Fn(&T, &T) -> bool,
    ) -> Vec<String> {
        match event {
            watcher::Event::Apply((name, facts)) => {
                self.touch(&name);
                let changed = self.items.get(&name).is_none_or(|old| !same(old, &facts));
                self.items.insert(name.clone(), facts);
                if changed { vec![name] } else { Vec::new() }
            }
            watcher::Event::Delete((name, _)) => {
                self.touch(&name);
                if self.items.remove(&name).is_some() {
                    vec![name]
                } else {
                    Vec::new()
                }
            }
            watcher::Event::Init => {
                self.relisting = Some(HashMap::new());
                Vec::new()
            }
            watcher::Event::InitApply((name, facts)) => {
                self.relisting
                    .get_or_insert_with(HashMap::new)
                    .insert(name, facts);
                Vec::new()
            }
            watcher::Event::InitDone => {
                let fresh = self.relisting.take().unwrap_or_default();
                let mut changed: Vec<String> = fresh
                    .iter()
                    .filter(|(name, facts)| {
                        self.items.get(*name).is_none_or(|old| !same(old, facts))
                    })
                    .map(|(name, _)| name.clone())
                    .collect();
                changed.extend(
                    self.items
                        .keys()
                        .filter(|name| !fresh.contains_key(*name))
                        .cloned(),
                );
                // A re-list replaces everything: every name it or the old items held moved on.
                let touched: Vec<String> = fresh.keys().chain(self.items.keys()).cloned().collect();
                for name in &touched {
                    self.touch(name);
                }
                // Names in neither need no stamp any more (bounded by the live names).
                self.changed_at.retain(|name, _| fresh.contains_key(name));
                self.items = fresh;
                self.synced = true;
                changed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev_apply(name: &str, v: u32) -> watcher::Event<(String, u32)> {
        watcher::Event::Apply((name.to_string(), v))
    }

    fn sorted(mut names: Vec<String>) -> Vec<String> {
        names.sort();
        names
    }

    #[test]
    fn an_own_write_is_recorded_only_if_the_watch_did_not_move_on() {
        let same = |a: &u32, b: &u32| a == b;
        let mut p = Projection::default();
        // Read while absent, write (create) 1: recorded.
        let stamp = p.stamp("a");
        p.record_own_write("a", stamp, 1);
        assert_eq!(p.get("a"), Some(&1));

        // Read at 1; meanwhile the watch sees our write and then a deletion: the projection is
        // empty again, and the late record of our write must not bring the object back.
        let stamp = p.stamp("a");
        p.apply(ev_apply("a", 2), same);
        p.apply(watcher::Event::Delete(("a".into(), 2)), same);
        p.record_own_write("a", stamp, 2);
        assert_eq!(
            p.get("a"),
            None,
            "a deleted object came back from a stale write"
        );

        // Read at 3; the watch delivers an update before our write's record: the watch wins.
        p.apply(ev_apply("a", 3), same);
        let stamp = p.stamp("a");
        p.apply(ev_apply("a", 4), same);
        p.record_own_write("a", stamp, 5);
        assert_eq!(p.get("a"), Some(&4));

        // Another name's events do not block this one's record.
        let stamp = p.stamp("a");
        p.apply(ev_apply("b", 1), same);
        p.record_own_write("a", stamp, 6);
        assert_eq!(p.get("a"), Some(&6));
    }

    #[test]
    fn apply_reports_only_relevant_changes() {
        let mut p = Projection::default();
        // "same" ignores the tens digit, like a heartbeat that changes nothing that matters.
        let same = |a: &u32, b: &u32| a % 10 == b % 10;
        assert_eq!(p.apply(ev_apply("a", 1), same), vec!["a"]);
        assert_eq!(p.apply(ev_apply("a", 11), same), Vec::<String>::new());
        assert_eq!(
            p.get("a"),
            Some(&11),
            "the latest facts are stored even when not reported"
        );
        assert_eq!(p.apply(ev_apply("a", 12), same), vec!["a"]);
        assert_eq!(
            p.apply(watcher::Event::Delete(("a".into(), 12)), same),
            vec!["a"]
        );
        assert_eq!(
            p.apply(watcher::Event::Delete(("a".into(), 12)), same),
            Vec::<String>::new()
        );
    }

    #[test]
    fn relist_swaps_atomically_and_reports_vanished_names() {
        let mut p = Projection::default();
        let same = |a: &u32, b: &u32| a == b;
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(("a".into(), 1)),
            watcher::Event::InitApply(("b".into(), 1)),
        ] {
            assert!(p.apply(event, same).is_empty());
        }
        assert!(!p.is_synced());
        assert_eq!(
            sorted(p.apply(watcher::Event::InitDone, same)),
            vec!["a", "b"]
        );
        assert!(p.is_synced());

        // Re-list after a disconnect: b vanished, a unchanged, c is new.
        p.apply(watcher::Event::Init, same);
        p.apply(watcher::Event::InitApply(("a".into(), 1)), same);
        p.apply(watcher::Event::InitApply(("c".into(), 1)), same);
        assert_eq!(
            p.len(),
            2,
            "the old items stay visible until the re-list is complete"
        );
        assert_eq!(
            sorted(p.apply(watcher::Event::InitDone, same)),
            vec!["b", "c"]
        );
        assert_eq!(p.get("b"), None);
    }
}
