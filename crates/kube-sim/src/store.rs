//! The object store: one map per resource, one cluster-wide resourceVersion counter, a bounded
//! history of events for watch resumption, and a broadcast of new events to live watchers.
//! Objects are held as their serialized JSON (`Stored`), not as trees: memory follows the data,
//! lists and watch events copy bytes, and only a request that needs the tree decodes it.

use crate::registry::StorageKey;
use bytes::Bytes;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::broadcast;

/// Namespace ("" for cluster-scoped) and name.
pub type ObjKey = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One object as the store holds it: its JSON, serialized once and shared by the object map,
/// the event history, lists and watch streams.
#[derive(Debug, Clone)]
pub struct Stored(Bytes);

impl Stored {
    pub fn encode(obj: &Value) -> Self {
        let json = serde_json::to_vec(obj).unwrap_or_default();
        // `Bytes::from(Vec)` keeps the Vec's spare capacity (up to as much again): copy it exact.
        Self(Bytes::copy_from_slice(&json))
    }

    pub fn json(&self) -> &Bytes {
        &self.0
    }

    /// The object as a tree. The bytes were written by `encode`, so they decode.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.0).unwrap_or_default()
    }

    /// `apiVersion` without decoding when it is the first key (as serde_json writes a Map in
    /// key order, it is for every kind whose top-level keys all sort after it); else decodes.
    pub fn api_version(&self) -> Option<String> {
        const LEAD: &[u8] = b"{\"apiVersion\":\"";
        if let Some(rest) = self.0.strip_prefix(LEAD)
            && let Some(end) = rest.iter().position(|b| *b == b'"' || *b == b'\\')
            && rest[end] == b'"'
        {
            return std::str::from_utf8(&rest[..end]).ok().map(String::from);
        }
        self.value()["apiVersion"].as_str().map(String::from)
    }
}

/// One change, shared by every watcher; the object is serialized once, when it is stored.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub type_: EventType,
    pub key: StorageKey,
    /// Namespace ("" for cluster-scoped) and name of the object.
    pub object_key: ObjKey,
    pub object: Stored,
    /// The object before a modification (selectors: leaving the selector is a DELETED).
    pub prev: Option<Stored>,
}

impl Event {
    pub fn object_json(&self) -> &Bytes {
        self.object.json()
    }
}

pub fn obj_key(obj: &Value) -> ObjKey {
    let m = &obj["metadata"];
    (
        m["namespace"].as_str().unwrap_or_default().to_string(),
        m["name"].as_str().unwrap_or_default().to_string(),
    )
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["uid"].as_str().map(String::from))
        .collect()
}

/// A hook that sees the store after each applied change (persistence compacts its log there).
pub type Compactor = Box<dyn FnMut(&Store) + Send>;

/// A hook that sees every event before it is applied and published (see `Store::set_sink`); an
/// error refuses the event.
pub type EventSink = Box<dyn FnMut(&Event) -> Result<(), String> + Send>;

pub struct Store {
    rv: u64,
    objects: HashMap<StorageKey, BTreeMap<ObjKey, Stored>>,
    history: VecDeque<Arc<Event>>,
    history_cap: usize,
    /// Every event after this resourceVersion is still in `history`.
    history_floor: u64,
    tx: broadcast::Sender<Arc<Event>>,
    /// Owner uid -> dependents, for garbage collection.
    dependents: HashMap<String, BTreeSet<(StorageKey, ObjKey)>>,
    /// uid -> location, to resolve owners.
    uids: HashMap<String, (StorageKey, ObjKey)>,
    /// Sees every event before it is applied (persistence makes it durable there).
    sink: Option<EventSink>,
    /// Why the sink last refused an event, until `take_failure`.
    failure: Option<String>,
    compactor: Option<Compactor>,
}

impl Store {
    pub fn new(history_cap: usize) -> Self {
        let (tx, _) = broadcast::channel(history_cap.max(1024));
        Self {
            rv: 1,
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_cap,
            history_floor: 1,
            tx,
            dependents: HashMap::new(),
            uids: HashMap::new(),
            sink: None,
            failure: None,
            compactor: None,
        }
    }

    /// Installs the hook that sees the store after every later change.
    pub fn set_compactor(&mut self, compactor: Compactor) {
        self.compactor = Some(compactor);
    }

    fn after_change(&mut self) {
        if let Some(mut compact) = self.compactor.take() {
            compact(self);
            self.compactor = Some(compact);
        }
    }

    /// Puts an object back as a snapshot held it: no event, no new resourceVersion.
    pub fn restore(&mut self, key: &StorageKey, obj: Value) {
        let ok = obj_key(&obj);
        self.index(key, &ok, None, Some(&obj));
        self.objects
            .entry(key.clone())
            .or_default()
            .insert(ok, Stored::encode(&obj));
    }

    /// After `restore`: the snapshot's resourceVersion; history starts there (older resumes
    /// get `410 Gone`, as after an etcd compaction).
    pub fn restored_at(&mut self, rv: u64) {
        self.rv = rv;
        self.history.clear();
        self.history_floor = rv;
    }

    /// Every stored object with its storage key (snapshots).
    pub fn all(&self) -> impl Iterator<Item = (&StorageKey, &Stored)> {
        self.objects
            .iter()
            .flat_map(|(k, m)| m.values().map(move |s| (k, s)))
    }

    /// Installs the hook that sees every later event before it is published.
    pub fn set_sink(&mut self, sink: EventSink) {
        self.sink = Some(sink);
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// An object, decoded.
    pub fn get(&self, key: &StorageKey, obj: &ObjKey) -> Option<Arc<Value>> {
        self.get_stored(key, obj).map(|s| Arc::new(s.value()))
    }

    pub fn get_stored(&self, key: &StorageKey, obj: &ObjKey) -> Option<&Stored> {
        self.objects.get(key)?.get(obj)
    }

    /// Objects of a resource in key order, decoded, optionally within one namespace.
    pub fn list_values<'a>(
        &'a self,
        key: &StorageKey,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjKey, Arc<Value>)> + 'a {
        self.list(key, namespace)
            .map(|(k, s)| (k, Arc::new(s.value())))
    }

    /// Objects of a resource in key order, as stored, optionally within one namespace.
    pub fn list<'a>(
        &'a self,
        key: &StorageKey,
        namespace: Option<&'a str>,
    ) -> Box<dyn Iterator<Item = (&'a ObjKey, &'a Stored)> + 'a> {
        let Some(map) = self.objects.get(key) else {
            return Box::new(std::iter::empty());
        };
        match namespace {
            Some(ns) => Box::new(
                map.range((ns.to_string(), String::new())..)
                    .take_while(move |((n, _), _)| n == ns),
            ),
            None => Box::new(map.iter()),
        }
    }

    pub fn count(&self, key: &StorageKey) -> usize {
        self.objects.get(key).map_or(0, BTreeMap::len)
    }

    pub fn keys_of(&self, key: &StorageKey) -> Vec<ObjKey> {
        self.objects
            .get(key)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub fn storage_keys(&self) -> Vec<StorageKey> {
        self.objects.keys().cloned().collect()
    }

    pub fn locate_uid(&self, uid: &str) -> Option<&(StorageKey, ObjKey)> {
        self.uids.get(uid)
    }

    pub fn dependents_of(&self, uid: &str) -> Vec<(StorageKey, ObjKey)> {
        self.dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn index(&mut self, key: &StorageKey, ok: &ObjKey, old: Option<&Value>, new: Option<&Value>) {
        let loc = (key.clone(), ok.clone());
        if let Some(old) = old {
            for uid in owner_uids(old) {
                if let Some(set) = self.dependents.get_mut(&uid) {
                    set.remove(&loc);
                    if set.is_empty() {
                        self.dependents.remove(&uid);
                    }
                }
            }
            if let Some(uid) = old["metadata"]["uid"].as_str() {
                self.uids.remove(uid);
            }
        }
        if let Some(new) = new {
            for uid in owner_uids(new) {
                self.dependents.entry(uid).or_default().insert(loc.clone());
            }
            if let Some(uid) = new["metadata"]["uid"].as_str() {
                self.uids.insert(uid.to_string(), loc);
            }
        }
    }

    /// Offers the next event to the sink: on success the event is the new state (history,
    /// watchers); on failure nothing changes (not even the resourceVersion) and the failure is
    /// kept for `take_failure`, so the request that caused it is not acknowledged.
    fn record(
        &mut self,
        type_: EventType,
        key: StorageKey,
        object_key: ObjKey,
        object: Stored,
        prev: Option<Stored>,
    ) -> bool {
        let event = Arc::new(Event {
            rv: self.rv + 1,
            type_,
            key,
            object_key,
            object,
            prev,
        });
        if let Some(sink) = self.sink.as_mut()
            && let Err(why) = sink(&event)
        {
            self.failure.get_or_insert(why);
            return false;
        }
        self.rv = event.rv;
        if self.history.len() >= self.history_cap
            && let Some(old) = self.history.pop_front()
        {
            self.history_floor = old.rv;
        }
        self.history.push_back(event.clone());
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(event);
        true
    }

    /// The first write the sink refused since the last call, if any (the request that made it
    /// must fail).
    pub fn take_failure(&mut self) -> Option<String> {
        self.failure.take()
    }

    /// Stores an object under a new resourceVersion and emits ADDED or MODIFIED. When the sink
    /// refuses the event, nothing is stored (see `take_failure`).
    pub fn put(&mut self, key: &StorageKey, mut obj: Value) -> Arc<Value> {
        obj["metadata"]["resourceVersion"] = Value::String((self.rv + 1).to_string());
        let ok = obj_key(&obj);
        let stored = Stored::encode(&obj);
        let prev = self.objects.get(key).and_then(|m| m.get(&ok)).cloned();
        let type_ = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        if !self.record(type_, key.clone(), ok.clone(), stored.clone(), prev.clone()) {
            return Arc::new(obj);
        }
        self.objects
            .entry(key.clone())
            .or_default()
            .insert(ok.clone(), stored);
        let old = prev.as_ref().map(Stored::value);
        self.index(key, &ok, old.as_ref(), Some(&obj));
        self.after_change();
        Arc::new(obj)
    }

    /// Removes an object; the DELETED event carries the deletion's resourceVersion. When the
    /// sink refuses the event, the object stays (see `take_failure`).
    pub fn remove(&mut self, key: &StorageKey, ok: &ObjKey) -> Option<Arc<Value>> {
        let old = self.objects.get(key)?.get(ok)?.clone();
        let mut last = old.value();
        last["metadata"]["resourceVersion"] = Value::String((self.rv + 1).to_string());
        if !self.record(
            EventType::Deleted,
            key.clone(),
            ok.clone(),
            Stored::encode(&last),
            Some(old.clone()),
        ) {
            return Some(Arc::new(last));
        }
        if let Some(map) = self.objects.get_mut(key) {
            map.remove(ok);
        }
        self.index(key, ok, Some(&old.value()), None);
        self.after_change();
        Some(Arc::new(last))
    }

    /// The objects of a resource as they were at resourceVersion `rv`, in key order: the current
    /// state with every change after `rv` undone from the event history (the state before a
    /// key's first later event is that event's `prev`, or nothing for an ADDED). `Err(oldest)`
    /// when the history no longer reaches back to `rv`.
    pub fn list_at(
        &self,
        key: &StorageKey,
        namespace: Option<&str>,
        rv: u64,
    ) -> Result<Vec<(ObjKey, Stored)>, u64> {
        if rv >= self.rv {
            return Ok(self
                .list(key, namespace)
                .map(|(k, s)| (k.clone(), s.clone()))
                .collect());
        }
        if rv < self.history_floor {
            return Err(self.history_floor + 1);
        }
        let start = self.history.partition_point(|e| e.rv <= rv);
        let mut then: HashMap<&ObjKey, Option<&Stored>> = HashMap::new();
        for ev in self.history.range(start..).filter(|e| e.key == *key) {
            then.entry(&ev.object_key).or_insert(match ev.type_ {
                EventType::Added => None,
                EventType::Modified | EventType::Deleted => ev.prev.as_ref(),
            });
        }
        let mut at: BTreeMap<ObjKey, Stored> = self
            .list(key, namespace)
            .filter(|(k, _)| !then.contains_key(k))
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        for (k, s) in then {
            if let Some(s) = s
                && namespace.is_none_or(|ns| k.0 == ns)
            {
                at.insert(k.clone(), s.clone());
            }
        }
        Ok(at.into_iter().collect())
    }

    /// Forgets the event history (like an etcd compaction): resuming from any earlier
    /// resourceVersion then gets `410 Gone`.
    pub fn compact(&mut self) {
        self.history.clear();
        self.history_floor = self.rv;
    }

    /// Subscribes to live events; all events up to the returned resourceVersion are in the past.
    pub fn subscribe(&self) -> (broadcast::Receiver<Arc<Event>>, u64) {
        (self.tx.subscribe(), self.rv)
    }

    /// The retained events after `rv`, or `Err(oldest)` when some were already dropped.
    pub fn events_since(&self, rv: u64) -> Result<Vec<Arc<Event>>, u64> {
        if rv < self.history_floor {
            return Err(self.history_floor + 1);
        }
        let start = self.history.partition_point(|e| e.rv <= rv);
        Ok(self.history.range(start..).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> StorageKey {
        (String::new(), "configmaps".into())
    }

    #[test]
    fn resource_versions_increase_and_history_is_bounded() {
        let mut s = Store::new(3);
        let (mut rx, start) = s.subscribe();
        for i in 0..5 {
            s.put(
                &key(),
                json!({"metadata": {"namespace": "default", "name": format!("c{i}")}}),
            );
        }
        assert_eq!(s.resource_version(), start + 5);
        assert!(s.events_since(start).is_err(), "oldest events were dropped");
        let recent = s.events_since(start + 3).expect("retained");
        assert_eq!(recent.len(), 2);
        assert_eq!(rx.try_recv().map(|e| e.rv).ok(), Some(start + 1));
        let gone = s
            .remove(&key(), &("default".into(), "c0".into()))
            .expect("existed");
        assert_eq!(gone["metadata"]["resourceVersion"], (start + 6).to_string());
        assert_eq!(s.list(&key(), Some("default")).count(), 4);
        assert_eq!(s.list(&key(), Some("other")).count(), 0);
    }
}
