//! Decoded trees of the objects read through [`Store::list_values`](super::Store::list_values),
//! reused while an object's stored JSON is the same allocation.
//!
//! The workload simulation reads every Pod, Node, ReplicaSet and Deployment on each pass, under
//! the cluster lock; decoding them all again on every pass was kube-sim's largest CPU cost in the
//! recycler benchmark (perf: `serde_json` parsing), and it held up every API request meanwhile.
//! Only kinds listed this way are kept decoded, so a kind that is only served to clients costs
//! nothing extra.

use super::{ObjName, Stored};
use crate::registry::StorageKey;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

/// A decoded tree and the stored JSON it came from. Holding the `Stored` keeps that allocation
/// alive, so a pointer match always means the same bytes (no reuse of a freed address).
type Entry = (Stored, Arc<Value>);

#[derive(Debug, Default)]
pub(super) struct DecodedCache(Mutex<HashMap<StorageKey, HashMap<ObjName, Entry>>>);

impl DecodedCache {
    /// The trees of `listed` (objects of `key`), decoding only those new or changed since they
    /// were last listed. `complete` says `listed` is every object of `key`: entries of objects
    /// gone since are dropped then.
    pub(super) fn values(
        &self,
        key: &StorageKey,
        complete: bool,
        listed: &[(&ObjName, &Stored)],
    ) -> Vec<Arc<Value>> {
        let mut kinds = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let cached = kinds.entry(key.clone()).or_default();
        let values = listed
            .iter()
            .map(|&(name, stored)| match cached.get(name) {
                Some((bytes, value)) if bytes.same_allocation(stored) => value.clone(),
                _ => {
                    let value = Arc::new(stored.value());
                    cached.insert(name.clone(), (stored.clone(), value.clone()));
                    value
                }
            })
            .collect();
        // Every listed object is cached now: anything more is an object that is gone.
        if complete && cached.len() > listed.len() {
            let live: HashSet<&ObjName> = listed.iter().map(|(name, _)| *name).collect();
            cached.retain(|name, _| live.contains(name));
        }
        values
    }

    /// The tree of `name` (of `key`) if it is kept and `stored` is what it came from. Only
    /// reads: a kind no one lists is never kept.
    pub(super) fn get(&self, key: &StorageKey, name: &[u8], stored: &Stored) -> Option<Arc<Value>> {
        let kinds = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (bytes, value) = kinds.get(key)?.get(name)?;
        bytes.same_allocation(stored).then(|| value.clone())
    }

    #[cfg(test)]
    pub(super) fn len(&self, key: &StorageKey) -> usize {
        let kinds = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kinds.get(key).map_or(0, HashMap::len)
    }
}
