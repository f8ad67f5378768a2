//! Read-your-own-writes over a reflector's store. A reconcile started by another object's event
//! reads its object from the cache, and the cache may not yet hold what this process wrote a
//! moment ago: a write guarded by that older version is then a certain conflict and a retry. The
//! object a write returned stands in for the cached one until the watch brings it back.
//!
//! The rule needs only equality of resourceVersions (the API promises nothing about their order)
//! and the watch's promise to deliver an object's versions in order. While a write is in flight
//! the versions the watch delivers for that object are noted. If the written version is among
//! them, the cache already has it (or later ones) and nothing stands in. Otherwise everything the
//! cache holds is older than ours, and ours stands in until its version arrives. A relist, a
//! deletion, a failed write or the `ttl` also end a stand-in.
//!
//! A delete this process made hides the object the same way, until the watch's Delete arrives,
//! an object of that name with another uid appears (created again), a relist, or the `ttl`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::sync::lock;

/// An object's `namespace/name` (neither may contain a `/`): one string, so a scan can look
/// objects up through one reused buffer instead of allocating a key per cached object.
type Key = String;

struct StandIn<K> {
    written: Arc<K>,
    at: Instant,
}

/// The versions the watch delivered for an object while writes to it were in flight.
#[derive(Default)]
struct InFlight {
    writes: usize,
    delivered: Vec<String>,
}

/// An object this process deleted, hidden until the watch says it is gone.
struct Deleted {
    uid: Option<String>,
    at: Instant,
}

struct State<K> {
    stand_ins: HashMap<Key, StandIn<K>>,
    in_flight: HashMap<Key, InFlight>,
    deleted: HashMap<Key, Deleted>,
}

/// How long a write stands in for the cached object at most, for the controllers that have no
/// reason to choose otherwise: the watch brings the written version back in milliseconds, and a
/// stand-in that outlives a lost event only delays seeing a newer version by this long.
pub const DEFAULT_TTL: Duration = Duration::from_secs(2);

/// A [`Store`] that also returns this process's own last writes until the watch brings them.
pub struct OwnWrites<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    ttl: Duration,
    /// Applied to what a write returns, as the reflector applies it to watched objects: a
    /// stand-in holds what the cache would.
    trim: fn(&mut K),
    state: Mutex<State<K>>,
}

fn key<K: Resource>(obj: &K) -> Key {
    let mut k = String::new();
    key_into(&mut k, obj);
    k
}

/// Writes `obj`'s key into `buffer` (cleared first).
fn key_into<K: Resource>(buffer: &mut String, obj: &K) {
    let meta = obj.meta();
    named_key_into(
        buffer,
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or_default(),
    );
}

fn named_key_into(buffer: &mut String, namespace: Option<&str>, name: &str) {
    buffer.clear();
    buffer.push_str(namespace.unwrap_or_default());
    buffer.push('/');
    buffer.push_str(name);
}

fn version<K: Resource>(obj: &K) -> Option<&str> {
    obj.meta().resource_version.as_deref()
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> OwnWrites<K> {
    /// `store`: the reflector's; `ttl`: how long a stand-in may last at most (the watch brings a
    /// write back in milliseconds; this bounds the damage of anything unforeseen).
    pub fn new(store: Store<K>, ttl: Duration) -> Self {
        Self::trimmed(store, ttl, |_| {})
    }

    /// [`OwnWrites::new`] over a store whose reflector applies `trim` to each object: what a write
    /// returns is trimmed alike before it stands in (and before the writer gets it back).
    pub fn trimmed(store: Store<K>, ttl: Duration, trim: fn(&mut K)) -> Self {
        Self {
            store,
            ttl,
            trim,
            state: Mutex::new(State {
                stand_ins: HashMap::new(),
                in_flight: HashMap::new(),
                deleted: HashMap::new(),
            }),
        }
    }

    /// The reflector's store itself, without stand-ins (for listing).
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// Runs `write`, a write of `target` that returns the object written, and keeps what it
    /// returned as the stand-in for `target` (see the module's rule). A failed write ends any
    /// stand-in: someone wrote after us, or the request's fate is unknown.
    pub async fn write<E>(
        &self,
        target: &K,
        write: impl Future<Output = Result<K, E>>,
    ) -> Result<Arc<K>, E> {
        let k = key(target);
        let _in_flight = InFlightGuard::enter(&self.state, k.clone());
        let result = write.await;
        let mut state = lock(&self.state);
        match result {
            Ok(mut written) => {
                (self.trim)(&mut written);
                let written = Arc::new(written);
                let echoed = state.in_flight.get(&k).is_some_and(|f| {
                    f.delivered
                        .iter()
                        .any(|v| Some(v.as_str()) == version(&*written))
                });
                if echoed {
                    state.stand_ins.remove(&k);
                } else {
                    let stand_in = StandIn {
                        written: written.clone(),
                        at: Instant::now(),
                    };
                    state.stand_ins.insert(k, stand_in);
                }
                Ok(written)
            }
            Err(error) => {
                state.stand_ins.remove(&k);
                Err(error)
            }
        }
    }

    /// Runs `delete`, a delete of `target`; once it succeeded, `target` is hidden from
    /// [`get`](Self::get) and [`state`](Self::state) until the watch brings its deletion.
    pub async fn delete<T, E>(
        &self,
        target: &K,
        delete: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let deleted = delete.await?;
        let k = key(target);
        let mut state = lock(&self.state);
        state.stand_ins.remove(&k);
        // A Delete event that came before the answer left nothing to end this tombstone.
        let ttl = self.ttl;
        state.deleted.retain(|_, d| d.at.elapsed() < ttl);
        let tombstone = Deleted {
            uid: target.meta().uid.clone(),
            at: Instant::now(),
        };
        state.deleted.insert(k, tombstone);
        Ok(deleted)
    }

    /// The object of that name: our last write until the watch brings it, else the cache's;
    /// nothing once we deleted it.
    pub fn get(&self, reference: &ObjectRef<K>) -> Option<Arc<K>> {
        let mut k = Key::new();
        named_key_into(&mut k, reference.namespace.as_deref(), &reference.name);
        {
            let mut state = lock(&self.state);
            if self.hidden(&state, &k) {
                return None;
            }
            if let Some(written) = self.choose_in(&mut state, &k) {
                return Some(written);
            }
        }
        self.store.get(reference)
    }

    /// Whether `k` is an object we deleted whose deletion the watch has not brought yet.
    fn hidden(&self, state: &State<K>, k: &str) -> bool {
        state
            .deleted
            .get(k)
            .is_some_and(|d| d.at.elapsed() < self.ttl)
    }

    /// [`get`](Self::get) for an object the cache handed over (a controller's trigger).
    pub fn freshest(&self, cached: Arc<K>) -> Arc<K> {
        self.choose(&key(&*cached)).unwrap_or(cached)
    }

    /// Every cached object, our own writes standing in for theirs, and the objects this process
    /// created that the watch has not brought yet: the scans' view.
    pub fn state(&self) -> Vec<Arc<K>> {
        let cached = self.store.state();
        let state = lock(&self.state);
        if state.stand_ins.is_empty() && state.deleted.is_empty() {
            return cached;
        }
        let live = |stand_in: &StandIn<K>| stand_in.at.elapsed() < self.ttl;
        // The stand-ins that replaced a cached object; the others are creates not cached yet.
        let mut replaced = std::collections::HashSet::with_capacity(state.stand_ins.len());
        let mut k = Key::new();
        let mut scan: Vec<Arc<K>> = cached
            .into_iter()
            .filter_map(|obj| {
                key_into(&mut k, &*obj);
                if self.hidden(&state, &k) {
                    return None;
                }
                match state.stand_ins.get_key_value(k.as_str()) {
                    Some((key, stand_in)) if live(stand_in) => {
                        replaced.insert(key.as_str());
                        Some(stand_in.written.clone())
                    }
                    _ => Some(obj),
                }
            })
            .collect();
        // A create of ours stands in before the cache has any version of the object.
        scan.extend(
            state
                .stand_ins
                .iter()
                .filter(|(k, stand_in)| !replaced.contains(k.as_str()) && live(stand_in))
                .map(|(_, stand_in)| stand_in.written.clone()),
        );
        scan
    }

    fn choose(&self, k: &str) -> Option<Arc<K>> {
        self.choose_in(&mut lock(&self.state), k)
    }

    /// [`choose`](Self::choose) under a lock the caller holds.
    fn choose_in(&self, state: &mut State<K>, k: &str) -> Option<Arc<K>> {
        let stand_in = state.stand_ins.get(k)?;
        if stand_in.at.elapsed() < self.ttl {
            return Some(stand_in.written.clone());
        }
        state.stand_ins.remove(k);
        None
    }

    /// Follows the watch (call it once the store has the event): our own version coming back,
    /// a deletion or a relist ends stand-ins; versions delivered during a write are noted.
    pub fn observe(&self, event: &watcher::Event<K>) {
        let mut state = lock(&self.state);
        match event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                let k = key(obj);
                if let Some(in_flight) = state.in_flight.get_mut(&k)
                    && let Some(v) = version(obj)
                {
                    in_flight.delivered.push(v.to_owned());
                }
                if state
                    .stand_ins
                    .get(&k)
                    .is_some_and(|s| version(&*s.written) == version(obj))
                {
                    state.stand_ins.remove(&k);
                }
                if state
                    .deleted
                    .get(&k)
                    .is_some_and(|d| d.uid != obj.meta().uid)
                {
                    state.deleted.remove(&k);
                }
            }
            watcher::Event::Delete(obj) => {
                let k = key(obj);
                state.stand_ins.remove(&k);
                state.deleted.remove(&k);
            }
            watcher::Event::Init => {
                state.stand_ins.clear();
                state.deleted.clear();
            }
            watcher::Event::InitDone => {}
        }
    }
}

/// Marks a write to `key` in flight for as long as it lives (also when the write is cancelled).
struct InFlightGuard<'a, K> {
    state: &'a Mutex<State<K>>,
    key: Key,
}

impl<'a, K> InFlightGuard<'a, K> {
    fn enter(state: &'a Mutex<State<K>>, key: Key) -> Self {
        lock(state).in_flight.entry(key.clone()).or_default().writes += 1;
        Self { state, key }
    }
}

impl<K> Drop for InFlightGuard<'_, K> {
    fn drop(&mut self) {
        let mut state = lock(self.state);
        if let Some(in_flight) = state.in_flight.get_mut(&self.key) {
            in_flight.writes -= 1;
            if in_flight.writes == 0 {
                state.in_flight.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector::store::Writer;

    use super::*;

    fn cm(name: &str, rv: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.resource_version = Some(rv.into());
        cm
    }

    fn rv(obj: Option<Arc<ConfigMap>>) -> String {
        obj.and_then(|o| o.metadata.resource_version.clone())
            .unwrap_or_else(|| "absent".into())
    }

    /// A store fed by hand as a reflector feeds it, and the stand-ins over it.
    struct Cache {
        writer: Mutex<Writer<ConfigMap>>,
        own: OwnWrites<ConfigMap>,
    }

    impl Cache {
        fn new(ttl: Duration) -> Self {
            let writer = Writer::default();
            let own = OwnWrites::new(writer.as_reader(), ttl);
            Self {
                writer: Mutex::new(writer),
                own,
            }
        }

        /// The watch delivers `event`: the store first, then the stand-ins.
        fn deliver(&self, event: watcher::Event<ConfigMap>) {
            lock(&self.writer).apply_watcher_event(&event);
            self.own.observe(&event);
        }

        fn apply(&self, name: &str, rv: &str) {
            self.deliver(watcher::Event::Apply(cm(name, rv)));
        }

        /// A write of `a` answered with version `rv`, the watch delivering `meanwhile` (name,
        /// version) while the request is in flight.
        async fn write(&self, rv: &str, meanwhile: &[&str]) {
            let written = self
                .own
                .write(&cm("a", "any"), async {
                    for v in meanwhile {
                        self.apply("a", v);
                    }
                    Ok::<_, Infallible>(cm("a", rv))
                })
                .await;
            assert!(written.is_ok());
        }

        /// A delete of `obj` that the server accepted.
        async fn delete(&self, obj: &ConfigMap) {
            let deleted = self
                .own
                .delete(obj, async { Ok::<_, Infallible>(()) })
                .await;
            assert!(deleted.is_ok());
        }

        fn a(&self) -> String {
            rv(self.own.get(&ObjectRef::new("a").within("ns")))
        }
    }

    #[tokio::test]
    async fn a_create_is_in_the_scans_until_the_watch_brings_it() {
        let cache = Cache::new(Duration::from_secs(60));
        cache.apply("b", "3");
        let names = |cache: &Cache| -> Vec<String> {
            let mut names: Vec<String> = cache
                .own
                .state()
                .iter()
                .map(|o| {
                    format!(
                        "{}@{}",
                        o.metadata.name.clone().unwrap_or_default(),
                        rv(Some(o.clone()))
                    )
                })
                .collect();
            names.sort();
            names
        };
        // `a` is created by this process: not cached yet, in the scans all the same.
        cache.write("7", &[]).await;
        assert_eq!(names(&cache), ["a@7", "b@3"]);
        cache.apply("a", "7");
        assert_eq!(
            names(&cache),
            ["a@7", "b@3"],
            "listed once when the watch brings it"
        );
        let short = Cache::new(Duration::from_millis(1));
        short.write("7", &[]).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(
            names(&short).is_empty(),
            "a create the watch never brought expires"
        );
    }

    #[tokio::test]
    async fn a_write_stands_in_until_the_watch_brings_its_version() {
        let cache = Cache::new(Duration::from_secs(60));
        cache.apply("a", "5");
        cache.write("7", &[]).await;
        assert_eq!(cache.a(), "7");
        assert_eq!(rv(Some(cache.own.freshest(Arc::new(cm("a", "5"))))), "7");
        // Someone else's older write, still in flight when ours was answered, does not end it.
        cache.apply("a", "6");
        assert_eq!(cache.a(), "7");
        cache.apply("a", "7");
        cache.apply("a", "8");
        assert_eq!(cache.a(), "8", "ours came back, and the cache leads again");
        // Other objects are untouched.
        assert_eq!(
            rv(cache.own.get(&ObjectRef::new("b").within("ns"))),
            "absent"
        );
    }

    #[tokio::test]
    async fn a_stand_in_is_trimmed_as_the_cache_trims_watched_objects() {
        fn drop_data(cm: &mut ConfigMap) {
            cm.data = None;
        }
        let own = OwnWrites::trimmed(
            Writer::default().as_reader(),
            Duration::from_secs(60),
            drop_data,
        );
        let mut answer = cm("a", "7");
        answer.data = Some([("big".to_string(), "value".to_string())].into());
        let written = own
            .write(&cm("a", "6"), async { Ok::<_, Infallible>(answer) })
            .await
            .expect("written");
        assert_eq!(written.data, None, "the writer gets what the cache holds");
        let stand_in = own
            .get(&ObjectRef::new("a").within("ns"))
            .expect("stands in");
        assert_eq!(rv(Some(stand_in.clone())), "7");
        assert_eq!(stand_in.data, None);
    }

    #[tokio::test]
    async fn scans_see_the_stand_ins_in_place_of_the_cached_objects() {
        let cache = Cache::new(Duration::from_secs(60));
        cache.apply("a", "5");
        cache.apply("b", "3");
        let versions = |cache: &Cache| {
            let mut all: Vec<String> = cache.own.state().into_iter().map(|o| rv(Some(o))).collect();
            all.sort();
            all
        };
        assert_eq!(versions(&cache), ["3", "5"]);
        cache.write("7", &[]).await;
        assert_eq!(
            versions(&cache),
            ["3", "7"],
            "ours in place of a's cached 5"
        );
        cache.apply("a", "7");
        cache.apply("a", "9");
        assert_eq!(versions(&cache), ["3", "9"], "the cache leads again");
    }

    fn with_uid(mut cm: ConfigMap, uid: &str) -> ConfigMap {
        cm.metadata.uid = Some(uid.into());
        cm
    }

    #[tokio::test]
    async fn a_delete_hides_the_object_until_the_watch_brings_the_deletion() {
        let cache = Cache::new(Duration::from_secs(60));
        let a = with_uid(cm("a", "5"), "u1");
        cache.deliver(watcher::Event::Apply(a.clone()));
        cache.apply("b", "3");
        let failed = cache
            .own
            .delete(&a, async { Err::<(), _>("refused") })
            .await;
        assert!(failed.is_err());
        assert_eq!(cache.a(), "5", "a failed delete hides nothing");
        cache.delete(&a).await;
        assert_eq!(cache.a(), "absent");
        assert_eq!(cache.own.state().len(), 1, "scans skip it too");
        // Its own last update (same uid) arriving late does not bring it back ...
        cache.deliver(watcher::Event::Apply(with_uid(cm("a", "6"), "u1")));
        assert_eq!(cache.a(), "absent");
        // ... the Delete ends the tombstone, and a new object of that name is seen.
        cache.deliver(watcher::Event::Delete(with_uid(cm("a", "6"), "u1")));
        cache.deliver(watcher::Event::Apply(with_uid(cm("a", "9"), "u2")));
        assert_eq!(cache.a(), "9");
    }

    #[tokio::test]
    async fn an_object_created_again_or_the_ttl_end_a_tombstone() {
        let cache = Cache::new(Duration::from_secs(60));
        let a = with_uid(cm("a", "5"), "u1");
        cache.deliver(watcher::Event::Apply(a.clone()));
        cache.delete(&a).await;
        // The Delete came before our answer (so it ended nothing); the name is created again.
        cache.deliver(watcher::Event::Apply(with_uid(cm("a", "7"), "u2")));
        assert_eq!(cache.a(), "7");

        let short = Cache::new(Duration::from_millis(1));
        short.deliver(watcher::Event::Apply(a.clone()));
        short.delete(&a).await;
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(short.a(), "5", "past the ttl the cache speaks again");
    }

    #[tokio::test]
    async fn an_echo_that_came_before_the_answer_never_hides_later_versions() {
        let cache = Cache::new(Duration::from_secs(60));
        cache.apply("a", "5");
        // Ours (7) and then another writer's (8) arrive before our request is answered.
        cache.write("7", &["7", "8"]).await;
        assert_eq!(cache.a(), "8");
        // Only an older version arrived meanwhile: ours stands in.
        cache.write("10", &["9"]).await;
        assert_eq!(cache.a(), "10");
    }

    #[tokio::test]
    async fn a_failed_write_a_deletion_a_relist_or_the_ttl_give_the_cache_back() {
        let cache = Cache::new(Duration::from_secs(60));
        cache.apply("a", "5");
        cache.write("7", &[]).await;
        let failed = cache
            .own
            .write(&cm("a", "7"), async { Err::<ConfigMap, _>("409") })
            .await;
        assert!(failed.is_err());
        assert_eq!(cache.a(), "5", "failed write");

        cache.write("8", &[]).await;
        cache.deliver(watcher::Event::Delete(cm("a", "9")));
        assert_eq!(cache.a(), "absent", "deleted");

        cache.write("10", &[]).await;
        assert_eq!(cache.a(), "10", "created by us, not cached yet");
        cache.deliver(watcher::Event::Init);
        assert_eq!(cache.a(), "absent", "relisted");

        let expired = Cache::new(Duration::ZERO);
        expired.apply("a", "5");
        expired.write("7", &[]).await;
        assert_eq!(expired.a(), "5");
    }

    #[tokio::test]
    async fn a_cancelled_write_leaves_nothing_in_flight() {
        let cache = Cache::new(Duration::from_secs(60));
        let target = cm("a", "5");
        let never = cache.own.write(
            &target,
            std::future::pending::<Result<ConfigMap, Infallible>>(),
        );
        let cancelled = tokio::time::timeout(Duration::from_millis(1), never).await;
        assert!(cancelled.is_err());
        assert!(lock(&cache.own.state).in_flight.is_empty());
    }
}
