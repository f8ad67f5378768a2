//! The object store: one map per resource, one cluster-wide resourceVersion counter, a bounded
//! history of events for watch resumption, and a broadcast of new events to live watchers.
//! Objects are held as their serialized JSON (`Stored`), not as trees: memory follows the data,
//! lists and watch events copy bytes, and only a request that needs the tree decodes it. The
//! object map, the uid and owner indexes and the history share each object's key (`key`) and
//! JSON, so an object costs its JSON plus a few hundred bytes of pointers (tests/memory.rs).

mod decoded;
mod key;
mod stored;

pub use key::{ObjName, ResourceKey};
use stored::Identity;
pub use stored::Stored;

use crate::registry::StorageKey;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
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

/// One change, shared by every watcher; the object is serialized once, when it is stored.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub type_: EventType,
    pub key: ResourceKey,
    /// Namespace ("" for cluster-scoped) and name of the object.
    pub object_key: ObjName,
    pub object: Stored,
    /// The object before a modification (selectors: leaving the selector is a DELETED).
    pub prev: Option<Stored>,
}

impl Event {
    pub fn object_json(&self) -> &[u8] {
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

/// A hook that sees the store after each applied change (persistence compacts its log there).
pub type Compactor = Box<dyn FnMut(&Store) + Send>;

/// A hook that sees every event before it is applied and published (see `Store::set_sink`); an
/// error refuses the event.
pub type EventSink = Box<dyn FnMut(&Event) -> Result<(), String> + Send>;

/// Where an object lives, as the indexes hold it: two shared pointers.
type Location = (ResourceKey, ObjName);

/// The objects of one resource, in key order, with the resource's shared key.
struct Objects {
    key: ResourceKey,
    map: BTreeMap<ObjName, Stored>,
}

pub struct Store {
    rv: u64,
    // foldhash, not SipHash: these maps are read on every request (seeded per process, so
    // still no table an outsider can predict).
    objects: foldhash::HashMap<StorageKey, Objects>,
    history: VecDeque<Arc<Event>>,
    history_cap: usize,
    /// Every event after this resourceVersion is still in `history`.
    history_floor: u64,
    tx: broadcast::Sender<Arc<Event>>,
    /// Owner uid -> dependents, for garbage collection.
    dependents: foldhash::HashMap<Box<str>, BTreeSet<Location>>,
    /// uid -> location, to resolve owners.
    uids: foldhash::HashMap<Box<str>, Location>,
    /// Sees every event before it is applied (persistence makes it durable there).
    sink: Option<EventSink>,
    /// Why the sink last refused an event, until `take_failure`.
    failure: Option<String>,
    compactor: Option<Compactor>,
    /// Trees of the objects read through `list_values` (the workload simulation's kinds).
    decoded: decoded::DecodedCache,
    /// The object write journal, once a test journals a resource (see `crate::journal`).
    journal: Option<crate::journal::Journal>,
}

impl Store {
    pub fn new(history_cap: usize) -> Self {
        let (tx, _) = broadcast::channel(history_cap.max(1024));
        Self {
            rv: 1,
            objects: foldhash::HashMap::default(),
            history: VecDeque::new(),
            history_cap,
            history_floor: 1,
            tx,
            dependents: foldhash::HashMap::default(),
            uids: foldhash::HashMap::default(),
            sink: None,
            failure: None,
            compactor: None,
            decoded: decoded::DecodedCache::default(),
            journal: None,
        }
    }

    /// The write journal, started empty on first use.
    pub fn start_journal(&mut self) -> &mut crate::journal::Journal {
        self.journal.get_or_insert_with(Default::default)
    }

    /// The write journal, if one was started.
    pub fn journal(&self) -> Option<&crate::journal::Journal> {
        self.journal.as_ref()
    }

    /// The write journal, if one was started (a write request opens and closes its entry here).
    pub fn journal_mut(&mut self) -> Option<&mut crate::journal::Journal> {
        self.journal.as_mut()
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

    /// The shared keys of a resource and an object: the resource's entry is made on first use,
    /// the object's key is the stored one when the object exists, else a new one.
    fn locate(&mut self, key: &StorageKey, ok: &ObjKey) -> Location {
        self.locate_stored(key, ok).0
    }

    /// [`Self::locate`], with the object as stored now (one search of the map for both).
    fn locate_stored(&mut self, key: &StorageKey, ok: &ObjKey) -> (Location, Option<Stored>) {
        let objects = match self.objects.get(key) {
            Some(o) => o,
            None => self.objects.entry(key.clone()).or_insert_with(|| Objects {
                key: Arc::new(key.clone()),
                map: BTreeMap::new(),
            }),
        };
        let joined = ObjName::lookup(&ok.0, &ok.1);
        let (shared, stored) = match objects.map.get_key_value(joined.as_slice()) {
            Some((k, stored)) => (k.clone(), Some(stored.clone())),
            None => (ObjName::of(ok), None),
        };
        ((objects.key.clone(), shared), stored)
    }

    /// Puts an object back as a snapshot held it: no event, no new resourceVersion.
    pub fn restore(&mut self, key: &StorageKey, obj: Value) {
        let loc = self.locate(key, &obj_key(&obj));
        self.index(&loc, None, Some(&Identity::of(&obj)));
        self.insert(&loc, Stored::encode(&obj));
    }

    fn insert(&mut self, (key, ok): &Location, stored: Stored) {
        if let Some(objects) = self.objects.get_mut(&**key) {
            objects.map.insert(ok.clone(), stored);
        }
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
            .flat_map(|(k, o)| o.map.values().map(move |s| (k, s)))
    }

    /// Installs the hook that sees every later event before it is published.
    pub fn set_sink(&mut self, sink: EventSink) {
        self.sink = Some(sink);
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// The object decoded: the tree [`list_values`](Self::list_values) keeps while the stored
    /// JSON is unchanged (the workload simulation lists what it then updates), else decoded now.
    pub fn get(&self, key: &StorageKey, obj: &ObjKey) -> Option<Arc<Value>> {
        let objects = self.objects.get(key)?;
        let name = ObjName::lookup(&obj.0, &obj.1);
        let stored = objects.map.get(name.as_slice())?;
        Some(
            self.decoded
                .get(key, &name, stored)
                .unwrap_or_else(|| Arc::new(stored.value())),
        )
    }

    pub fn get_stored(&self, key: &StorageKey, obj: &ObjKey) -> Option<&Stored> {
        let objects = self.objects.get(key)?;
        objects.map.get(ObjName::lookup(&obj.0, &obj.1).as_slice())
    }

    pub fn contains(&self, key: &StorageKey, obj: &ObjKey) -> bool {
        self.get_stored(key, obj).is_some()
    }

    /// Objects of a resource in key order, decoded, optionally within one namespace. Each object
    /// is decoded once per change ([`decoded`]).
    pub fn list_values<'a>(
        &'a self,
        key: &StorageKey,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjName, Arc<Value>)> + 'a {
        let listed: Vec<(&ObjName, &Stored)> = self.list(key, namespace).collect();
        let values = self.decoded.values(key, namespace.is_none(), &listed);
        listed.into_iter().map(|(name, _)| name).zip(values)
    }

    /// Objects of a resource in key order, as stored, optionally within one namespace.
    pub fn list<'a>(
        &'a self,
        key: &StorageKey,
        namespace: Option<&'a str>,
    ) -> Box<dyn Iterator<Item = (&'a ObjName, &'a Stored)> + 'a> {
        let Some(objects) = self.objects.get(key) else {
            return Box::new(std::iter::empty());
        };
        match namespace {
            Some(ns) => {
                let prefix = ObjName::namespace_prefix(ns);
                Box::new(
                    objects
                        .map
                        .range::<[u8], _>((Bound::Included(prefix.as_slice()), Bound::Unbounded))
                        .take_while(move |(k, _)| k.namespace() == ns),
                )
            }
            None => Box::new(objects.map.iter()),
        }
    }

    pub fn count(&self, key: &StorageKey) -> usize {
        self.objects.get(key).map_or(0, |o| o.map.len())
    }

    pub fn keys_of(&self, key: &StorageKey) -> Vec<ObjKey> {
        self.objects
            .get(key)
            .map(|o| o.map.keys().map(ObjName::to_obj_key).collect())
            .unwrap_or_default()
    }

    pub fn storage_keys(&self) -> Vec<StorageKey> {
        self.objects.keys().cloned().collect()
    }

    pub fn locate_uid(&self, uid: &str) -> Option<(StorageKey, ObjKey)> {
        self.uids
            .get(uid)
            .map(|(k, ok)| ((**k).clone(), ok.to_obj_key()))
    }

    pub fn dependents_of(&self, uid: &str) -> Vec<(StorageKey, ObjKey)> {
        self.dependents
            .get(uid)
            .map(|s| {
                s.iter()
                    .map(|(k, ok)| ((**k).clone(), ok.to_obj_key()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn index(&mut self, loc: &Location, old: Option<&Identity>, new: Option<&Identity>) {
        if let Some(old) = old {
            for uid in old.owners() {
                if let Some(set) = self.dependents.get_mut(uid) {
                    set.remove(loc);
                    if set.is_empty() {
                        self.dependents.remove(uid);
                    }
                }
            }
            if let Some(uid) = &old.uid {
                self.uids.remove(uid.as_str());
            }
        }
        if let Some(new) = new {
            for uid in new.owners() {
                match self.dependents.get_mut(uid) {
                    Some(set) => {
                        set.insert(loc.clone());
                    }
                    None => {
                        self.dependents
                            .insert(uid.into(), BTreeSet::from([loc.clone()]));
                    }
                }
            }
            if let Some(uid) = &new.uid {
                self.uids.insert(uid.as_str().into(), loc.clone());
            }
        }
    }

    /// Offers the next event to the sink: on success the event is the new state (history,
    /// watchers); on failure nothing changes (not even the resourceVersion) and the failure is
    /// kept for `take_failure`, so the request that caused it is not acknowledged.
    fn record(
        &mut self,
        type_: EventType,
        (key, object_key): Location,
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
        if let Some(journal) = &mut self.journal {
            journal.observe(&event);
        }
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
    pub fn put(&mut self, key: &StorageKey, obj: Value) -> Arc<Value> {
        let (obj, _) = self.put_stored(key, obj);
        Arc::new(obj)
    }

    /// `put`, also answering the stored JSON (`None` when the sink refused the event), so a
    /// caller that answers with the object need not serialize it again.
    pub fn put_stored(&mut self, key: &StorageKey, mut obj: Value) -> (Value, Option<Stored>) {
        obj["metadata"]["resourceVersion"] = Value::String((self.rv + 1).to_string());
        let (loc, prev) = self.locate_stored(key, &obj_key(&obj));
        let stored = Stored::encode(&obj);
        let type_ = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        if !self.record(type_, loc.clone(), stored.clone(), prev.clone()) {
            return (obj, None);
        }
        self.insert(&loc, stored.clone());
        let old = prev.as_ref().map(Stored::identity);
        self.index(&loc, old.as_ref(), Some(&Identity::of(&obj)));
        self.after_change();
        (obj, Some(stored))
    }

    /// Removes an object; the DELETED event carries the deletion's resourceVersion. When the
    /// sink refuses the event, the object stays (see `take_failure`).
    pub fn remove(&mut self, key: &StorageKey, ok: &ObjKey) -> Option<Arc<Value>> {
        let objects = self.objects.get(key)?;
        let (shared, old) = objects
            .map
            .get_key_value(ObjName::lookup(&ok.0, &ok.1).as_slice())?;
        let loc = (objects.key.clone(), shared.clone());
        let old = old.clone();
        let mut last = old.value();
        last["metadata"]["resourceVersion"] = Value::String((self.rv + 1).to_string());
        if !self.record(
            EventType::Deleted,
            loc.clone(),
            Stored::encode(&last),
            Some(old.clone()),
        ) {
            return Some(Arc::new(last));
        }
        if let Some(objects) = self.objects.get_mut(key) {
            objects.map.remove(&loc.1);
        }
        self.index(&loc, Some(&Identity::of(&last)), None);
        self.after_change();
        Some(Arc::new(last))
    }

    /// The objects of a resource as they were at resourceVersion `rv`, in key order: the current
    /// state with every change after `rv` undone from the event history (the state before a
    /// key's first later event is that event's `prev`, or nothing for an ADDED). `Err(oldest)`
    /// when the history no longer reaches back to `rv`. Keys and objects are shared, not copied.
    pub fn list_at(
        &self,
        key: &StorageKey,
        namespace: Option<&str>,
        rv: u64,
    ) -> Result<Vec<(ObjName, Stored)>, u64> {
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
        let mut then: HashMap<&ObjName, Option<&Stored>> = HashMap::new();
        for ev in self.history.range(start..).filter(|e| *e.key == *key) {
            then.entry(&ev.object_key).or_insert(match ev.type_ {
                EventType::Added => None,
                EventType::Modified | EventType::Deleted => ev.prev.as_ref(),
            });
        }
        let mut at: BTreeMap<ObjName, Stored> = self
            .list(key, namespace)
            .filter(|(k, _)| !then.contains_key(k))
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        for (k, s) in then {
            if let Some(s) = s
                && namespace.is_none_or(|ns| k.namespace() == ns)
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

    #[test]
    fn listed_values_are_decoded_once_per_change_and_forgotten_when_gone() {
        let mut s = Store::new(10);
        for name in ["a", "b"] {
            s.put(
                &key(),
                json!({"metadata": {"namespace": "default", "name": name}, "data": {"v": "1"}}),
            );
        }
        let list = |s: &Store| -> Vec<Arc<Value>> {
            s.list_values(&key(), None).map(|(_, v)| v).collect()
        };
        let first = list(&s);
        let again = list(&s);
        assert!(Arc::ptr_eq(&first[0], &again[0]) && Arc::ptr_eq(&first[1], &again[1]));

        s.put(
            &key(),
            json!({"metadata": {"namespace": "default", "name": "a"}, "data": {"v": "2"}}),
        );
        let changed = list(&s);
        assert_eq!(
            changed[0]["data"]["v"], "2",
            "a changed object is decoded again"
        );
        assert!(
            Arc::ptr_eq(&changed[1], &first[1]),
            "the unchanged one is reused"
        );

        s.remove(&key(), &("default".into(), "b".into()));
        assert_eq!(list(&s).len(), 1);
        assert_eq!(
            s.decoded.len(&key()),
            1,
            "a removed object's tree is dropped"
        );
    }

    #[test]
    fn a_get_reuses_the_listed_tree_until_the_object_changes() {
        let mut s = Store::new(10);
        let obj =
            |v: &str| json!({"metadata": {"namespace": "default", "name": "a"}, "data": {"v": v}});
        let a: ObjKey = ("default".into(), "a".into());
        s.put(&key(), obj("1"));
        let before_listing = s.get(&key(), &a).expect("stored");
        let listed: Vec<Arc<Value>> = s.list_values(&key(), None).map(|(_, v)| v).collect();
        assert!(
            !Arc::ptr_eq(&before_listing, &listed[0]),
            "nothing kept before a list"
        );
        let got = s.get(&key(), &a).expect("stored");
        assert!(Arc::ptr_eq(&got, &listed[0]), "the listed tree is reused");

        s.put(&key(), obj("2"));
        let changed = s.get(&key(), &a).expect("stored");
        assert_eq!(
            changed["data"]["v"], "2",
            "a changed object is decoded again"
        );
        assert_eq!(
            s.get(&key(), &("default".into(), "b".into())),
            None,
            "no such object"
        );
    }
}
