//! Status writes batched while an object is busy.
//!
//! A controller that reports counts of other objects (a MachineDeployment's available Machines)
//! sees those counts move one by one while a step is under way: ten Machines starting are ten
//! status writes, each a round trip and a watch event for every watcher, where a reader learns
//! nothing from the eight in the middle. [`StatusBatches`] lets a changed status wait while more
//! changes are known to be coming (the object is *busy*), for at most one window after the first
//! change it held back; at rest a change is written at once. A reader therefore sees a status
//! at most one window old, and the settled status as soon as the object settles.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::lock;

/// What to do with a changed status now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    /// Write it (then call [`StatusBatches::written`]).
    WriteNow,
    /// Hold it; look again after this long (the window's end), or sooner if woken.
    WriteIn(Duration),
}

/// Per object key (a uid): when its oldest unwritten status change was first held back.
#[derive(Debug)]
pub struct StatusBatches {
    window: Duration,
    held_since: Mutex<HashMap<String, Instant>>,
}

impl StatusBatches {
    /// `window` zero writes every change at once.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            held_since: Mutex::new(HashMap::new()),
        }
    }

    /// A pass found the status of `key` changed; `busy` says more changes are coming.
    pub fn changed(&self, key: &str, busy: bool, now: Instant) -> Batch {
        if !busy || self.window.is_zero() {
            return Batch::WriteNow;
        }
        let mut held = lock(&self.held_since);
        let since = *held.entry(key.to_owned()).or_insert(now);
        let due = since + self.window;
        if now >= due {
            Batch::WriteNow
        } else {
            Batch::WriteIn(due - now)
        }
    }

    /// The status of `key` was written (or its object is gone): the next change starts afresh.
    pub fn written(&self, key: &str) {
        lock(&self.held_since).remove(key);
    }

    /// Keys holding back a change (for tests and metrics).
    pub fn held(&self) -> usize {
        lock(&self.held_since).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(1);

    #[test]
    fn at_rest_a_change_is_written_at_once() {
        let batches = StatusBatches::new(WINDOW);
        assert_eq!(batches.changed("a", false, Instant::now()), Batch::WriteNow);
        assert_eq!(batches.held(), 0);
    }

    #[test]
    fn while_busy_changes_wait_at_most_one_window_after_the_first() {
        let batches = StatusBatches::new(WINDOW);
        let t0 = Instant::now();
        assert_eq!(batches.changed("a", true, t0), Batch::WriteIn(WINDOW));
        let later = t0 + Duration::from_millis(600);
        assert_eq!(
            batches.changed("a", true, later),
            Batch::WriteIn(Duration::from_millis(400)),
            "a later change does not push the write back"
        );
        assert_eq!(batches.changed("a", true, t0 + WINDOW), Batch::WriteNow);
        batches.written("a");
        let next = t0 + WINDOW + Duration::from_millis(10);
        assert_eq!(
            batches.changed("a", true, next),
            Batch::WriteIn(WINDOW),
            "after a write the next change starts a new window"
        );
    }

    #[test]
    fn settling_writes_a_held_change_at_once_and_keys_are_apart() {
        let batches = StatusBatches::new(WINDOW);
        let t0 = Instant::now();
        assert!(matches!(batches.changed("a", true, t0), Batch::WriteIn(_)));
        assert!(matches!(batches.changed("b", true, t0), Batch::WriteIn(_)));
        assert_eq!(batches.changed("a", false, t0), Batch::WriteNow);
        batches.written("a");
        assert_eq!(batches.held(), 1, "b still holds its change");
    }

    #[test]
    fn a_zero_window_writes_every_change() {
        let batches = StatusBatches::new(Duration::ZERO);
        assert_eq!(batches.changed("a", true, Instant::now()), Batch::WriteNow);
    }
}
