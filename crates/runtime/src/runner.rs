//! A controller loop on a [`WorkQueue`]: the part of kube-runtime's `Controller` that a
//! latency-bound controller uses (one reconcile per object at a time; triggers from the object's
//! own watch, from mapped watches and from channels; a requeue after a delay; everything again
//! when the [`Gates`] open; a graceful stop), without its scheduler's clock tick.
//!
//! Why: kube-runtime's scheduler is a tokio-util `DelayQueue`, which rounds a request made now up
//! to the next millisecond of its own clock and then of tokio's timer, so every hand-off waits 1
//! to 2 ms (measured: 2.1 ms median, against 31 µs through a channel). A throughput-bound
//! controller does not notice; a gateway recycle crosses a dozen hand-offs between its two
//! processes and spent a third of its time there. Here a trigger is handed to an idle worker at
//! once, and only requeues wait, for the delay asked.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::controller::{Gates, turned_true};
use crate::shutdown::Shutdown;
use crate::workqueue::WorkQueue;

/// What a reconcile (or its error policy) asks next of its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing until a trigger names the object again.
    AwaitChange,
    /// Reconcile again after this delay, unless a trigger comes first.
    Requeue(Duration),
}

impl Next {
    /// This, or a requeue after `other` if that comes sooner (`None`: no other deadline), e.g.
    /// a pass's own next look and a status write held back (`status_batch`).
    pub fn sooner(self, other: Option<Duration>) -> Self {
        match (self, other) {
            (_, None) => self,
            (Self::Requeue(after), Some(other)) => Self::Requeue(after.min(other)),
            (Self::AwaitChange, Some(other)) => Self::Requeue(other),
        }
    }

    fn delay(self) -> Option<Duration> {
        match self {
            Self::AwaitChange => None,
            Self::Requeue(after) => Some(after),
        }
    }
}

/// When a trigger's reconcile runs.
///
/// A controller that counts many objects of another kind (a MachineDeployment counting its
/// Machines) is woken once per change of each: ten Machines turning Running within 80 ms would be
/// ten passes and ten status writes where one pass after the last sees them all. `Within(window)`
/// runs the object's reconcile `window` after the first trigger of a burst, the later ones folded
/// in; the wait is bounded by `window` (a later trigger does not push it back, unlike a debounce
/// that restarts, which a steady stream of changes could starve). A trigger queued `Now` meanwhile
/// runs at once. Use it for triggers from other kinds, where a pass only recounts; keep an
/// object's own changes `Now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    Now,
    Within(Duration),
}

/// The objects of one cached kind, reconciled off a [`WorkQueue`] of their keys. Build it with
/// the trigger methods, then [`Runner::run`] it.
pub struct Runner<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    queue: WorkQueue<ObjectRef<K>>,
    feeds: Vec<BoxFuture<'static, ()>>,
    stop: Option<Shutdown>,
}

impl<K> Runner<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// A runner reconciling the objects of `store` (a key not in it is skipped: the object is gone).
    pub fn new(store: Store<K>) -> Self {
        Self {
            store,
            queue: WorkQueue::new(),
            feeds: Vec::new(),
            stop: None,
        }
    }

    /// Queues each key `keys` yields, at once or after the settle window (see [`Settle`]).
    fn feed<S>(mut self, keys: S, settle: Settle) -> Self
    where
        S: Stream<Item = ObjectRef<K>> + Send + 'static,
    {
        let queue = self.queue.clone();
        self.feeds.push(
            keys.for_each(move |key| {
                match settle {
                    Settle::Now => queue.add(key),
                    Settle::Within(window) => queue.add_after(key, window),
                }
                futures::future::ready(())
            })
            .boxed(),
        );
        self
    }

    /// Reconciles each object the stream yields (the kind's own reflector stream: its watch
    /// errors are already retried there, so they are skipped here).
    pub fn for_stream<S, E>(self, objects: S) -> Self
    where
        S: Stream<Item = Result<K, E>> + Send + 'static,
    {
        self.feed(
            objects.filter_map(|object| {
                futures::future::ready(object.ok().map(|o| ObjectRef::from_obj(&o)))
            }),
            Settle::Now,
        )
    }

    /// Reconciles each object named.
    pub fn reconcile_on<S>(self, keys: S) -> Self
    where
        S: Stream<Item = ObjectRef<K>> + Send + 'static,
    {
        self.feed(keys, Settle::Now)
    }

    /// Reconciles each object named, `settle` after the first of a burst (see [`Settle`]).
    pub fn reconcile_settled_on<S>(self, keys: S, settle: Settle) -> Self
    where
        S: Stream<Item = ObjectRef<K>> + Send + 'static,
    {
        self.feed(keys, settle)
    }

    /// Reconciles the objects `mapper` names for each object of another kind's stream.
    pub fn watches_stream<T, S, E, I>(
        self,
        related: S,
        mapper: impl Fn(T) -> I + Send + 'static,
    ) -> Self
    where
        S: Stream<Item = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send + 'static,
    {
        self.watches_stream_settled(related, mapper, Settle::Now)
    }

    /// [`Runner::watches_stream`], each named object reconciled `settle` after the first of a
    /// burst of related changes (see [`Settle`]).
    pub fn watches_stream_settled<T, S, E, I>(
        self,
        related: S,
        mapper: impl Fn(T) -> I + Send + 'static,
        settle: Settle,
    ) -> Self
    where
        S: Stream<Item = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send + 'static,
    {
        let keys = related
            .filter_map(|object| futures::future::ready(object.ok()))
            .flat_map(move |object| futures::stream::iter(mapper(object)));
        self.feed(keys, settle)
    }

    /// Reconciles every cached object each time `all` yields.
    pub fn reconcile_all_on<S>(mut self, all: S) -> Self
    where
        S: Stream<Item = ()> + Send + 'static,
    {
        let (store, queue) = (self.store.clone(), self.queue.clone());
        self.feeds.push(
            all.for_each(move |()| {
                for object in store.state() {
                    queue.add(ObjectRef::from_obj(&*object));
                }
                futures::future::ready(())
            })
            .boxed(),
        );
        self
    }

    /// Everything again each time leadership is gained or the caches have synced (reconciles
    /// park while either is missing); stops on shutdown.
    pub fn gated(mut self, gates: &Gates) -> Self {
        self.stop = Some(gates.shutdown.clone());
        self.reconcile_all_on(futures::stream::select(
            turned_true(gates.work_allowed.clone()),
            turned_true(gates.caches_synced.clone()),
        ))
    }

    /// Runs `reconcile` on `workers` concurrent workers (one object at a time each) until
    /// shutdown; returns once the reconciles in flight have finished. A failed reconcile is
    /// requeued as `error_policy` says.
    pub async fn run<Ctx, E, Fut>(
        self,
        workers: usize,
        reconcile: impl Fn(Arc<K>, Arc<Ctx>) -> Fut,
        error_policy: impl Fn(Arc<K>, &E, Arc<Ctx>) -> Next,
        ctx: Arc<Ctx>,
    ) where
        Fut: Future<Output = Result<Next, E>>,
    {
        let Self {
            store,
            queue,
            feeds,
            stop,
        } = self;
        let work = queue.run(workers, |key| {
            let object = store.get(&key);
            let ctx = ctx.clone();
            let (reconcile, error_policy) = (&reconcile, &error_policy);
            async move {
                let object = object?;
                let next = match reconcile(object.clone(), ctx.clone()).await {
                    Ok(next) => next,
                    Err(error) => error_policy(object, &error, ctx),
                };
                next.delay()
            }
        });
        let feeds = async {
            futures::future::join_all(feeds).await;
            futures::future::pending::<()>().await;
        };
        let stop = async {
            match stop {
                Some(shutdown) => shutdown.cancelled().await,
                None => futures::future::pending().await,
            }
            // Workers finish the key they hold, then `work` ends.
            queue.shutdown();
            futures::future::pending::<()>().await;
        };
        tokio::select! {
            () = work => {}
            () = feeds => {}
            () = stop => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher::Event;
    use tokio::sync::{Notify, mpsc};
    use tokio::time::Instant;

    fn config_map(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm
    }

    fn key(name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within("ns")
    }

    fn cached(names: &[&str]) -> (Store<ConfigMap>, Writer<ConfigMap>) {
        let (store, mut writer) = reflector::store();
        // A whole list, so the store is ready (kube-runtime's applier holds reconciles until then).
        writer.apply_watcher_event(&Event::Init);
        for name in names {
            writer.apply_watcher_event(&Event::InitApply(config_map(name)));
        }
        writer.apply_watcher_event(&Event::InitDone);
        (store, writer)
    }

    /// Records each reconcile (name, when) and answers what `next` says for that name.
    #[derive(Default)]
    struct Recorder {
        seen: Mutex<Vec<(String, Instant)>>,
        next: Mutex<HashMap<String, Next>>,
        seen_one: Notify,
    }

    impl Recorder {
        /// A recorder answering `next` for each name (an error for any other).
        fn answering(next: &[(&str, Next)]) -> Arc<Self> {
            let rec = Self::default();
            *rec.next.lock().expect("lock") = next
                .iter()
                .map(|(n, next)| ((*n).to_owned(), *next))
                .collect();
            Arc::new(rec)
        }
        fn names(&self) -> Vec<String> {
            self.seen
                .lock()
                .expect("lock")
                .iter()
                .map(|(n, _)| n.clone())
                .collect()
        }
        async fn wait_for(&self, count: usize) {
            while self.seen.lock().expect("lock").len() < count {
                self.seen_one.notified().await;
            }
        }
    }

    async fn record(cm: Arc<ConfigMap>, rec: Arc<Recorder>) -> Result<Next, std::io::Error> {
        let name = cm.metadata.name.clone().unwrap_or_default();
        rec.seen
            .lock()
            .expect("lock")
            .push((name.clone(), Instant::now()));
        rec.seen_one.notify_waiters();
        let next = rec.next.lock().expect("lock").get(&name).copied();
        match next {
            Some(next) => Ok(next),
            None => Err(std::io::Error::other("no answer")),
        }
    }

    fn never_retry(_: Arc<ConfigMap>, _: &std::io::Error, _: Arc<Recorder>) -> Next {
        Next::AwaitChange
    }

    /// The runner on `store`, fed by a channel of keys, in a task; the channel's sender.
    fn spawn(
        store: Store<ConfigMap>,
        rec: Arc<Recorder>,
        error_policy: fn(Arc<ConfigMap>, &std::io::Error, Arc<Recorder>) -> Next,
    ) -> mpsc::UnboundedSender<ObjectRef<ConfigMap>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let runner = Runner::new(store)
            .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
        tokio::spawn(runner.run(4, record, error_policy, rec));
        tx
    }

    /// With the clock paused off the millisecond grid (where a timer-wheel scheduler rounds up),
    /// how far the clock moved between sending `a` and its first reconcile: the paused clock moves
    /// only when every task waits on a timer.
    async fn clock_moved_before_reconcile(
        tx: &mpsc::UnboundedSender<ObjectRef<ConfigMap>>,
        rec: &Recorder,
    ) -> Duration {
        tokio::time::advance(Duration::from_micros(300)).await;
        let sent = Instant::now();
        tx.send(key("a")).expect("open");
        rec.wait_for(1).await;
        let (_, at) = rec.seen.lock().expect("lock")[0];
        at - sent
    }

    #[tokio::test(start_paused = true)]
    async fn a_trigger_is_reconciled_without_waiting_for_a_clock_tick() {
        let (store, _writer) = cached(&["a"]);
        let rec = Recorder::answering(&[("a", Next::AwaitChange)]);
        let tx = spawn(store, rec.clone(), never_retry);
        assert_eq!(
            clock_moved_before_reconcile(&tx, &rec).await,
            Duration::ZERO,
            "reconciled at the very instant it was asked for"
        );
    }

    /// Why this runner exists: the same trigger through kube-runtime's `Controller` waits for
    /// its scheduler's next millisecond tick.
    #[tokio::test(start_paused = true)]
    async fn kube_runtimes_controller_waits_for_a_clock_tick() {
        let (store, _writer) = cached(&["a"]);
        let rec = Recorder::answering(&[("a", Next::AwaitChange)]);
        let (tx, rx) = mpsc::unbounded_channel();
        let triggers = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
            .map(Ok::<_, std::convert::Infallible>);
        let controller = kube::runtime::controller::applier(
            |cm, rec| {
                Box::pin(async move {
                    record(cm, rec)
                        .await
                        .map(|_| kube::runtime::controller::Action::await_change())
                })
            },
            |_, _, _| kube::runtime::controller::Action::await_change(),
            rec.clone(),
            store,
            triggers,
            kube::runtime::controller::Config::default(),
        );
        tokio::spawn(controller.for_each(|_| futures::future::ready(())));
        assert!(
            clock_moved_before_reconcile(&tx, &rec).await > Duration::ZERO,
            "kube-runtime's scheduler reconciled at once: drop this runner?"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_comes_after_its_delay_and_await_change_never() {
        let (store, _writer) = cached(&["a", "b"]);
        let rec = Recorder::answering(&[
            ("a", Next::Requeue(Duration::from_secs(5))),
            ("b", Next::AwaitChange),
        ]);
        let tx = spawn(store, rec.clone(), never_retry);
        let start = Instant::now();
        tx.send(key("a")).expect("open");
        tx.send(key("b")).expect("open");
        rec.wait_for(3).await;
        tokio::time::sleep(Duration::from_secs(7)).await;
        let seen = rec.seen.lock().expect("lock").clone();
        let a: Vec<Duration> = seen
            .iter()
            .filter(|(n, _)| n == "a")
            .map(|(_, at)| *at - start)
            .collect();
        assert_eq!(
            a,
            [
                Duration::ZERO,
                Duration::from_secs(5),
                Duration::from_secs(10)
            ]
        );
        assert_eq!(seen.iter().filter(|(n, _)| n == "b").count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_reconcile_is_requeued_as_the_error_policy_says() {
        let (store, _writer) = cached(&["a"]);
        let rec = Recorder::answering(&[]);
        fn retry_soon(_: Arc<ConfigMap>, _: &std::io::Error, _: Arc<Recorder>) -> Next {
            Next::Requeue(Duration::from_millis(100))
        }
        let tx = spawn(store, rec.clone(), retry_soon);
        tx.send(key("a")).expect("open");
        rec.wait_for(1).await;
        rec.next
            .lock()
            .expect("lock")
            .insert("a".into(), Next::AwaitChange);
        rec.wait_for(2).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(rec.names(), ["a", "a"], "retried once, then it succeeded");
    }

    #[tokio::test]
    async fn a_key_not_cached_is_skipped_and_triggers_meanwhile_make_one_more_pass() {
        let (store, _writer) = cached(&["a"]);
        let rec = Recorder::answering(&[("a", Next::AwaitChange)]);
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (tx, rx) = mpsc::unbounded_channel();
        let runner = Runner::new(store)
            .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
        let held = gate.clone();
        let reconcile = move |cm: Arc<ConfigMap>, rec: Arc<Recorder>| {
            let held = held.clone();
            async move {
                let result = record(cm, rec).await;
                held.acquire().await.expect("open").forget();
                result
            }
        };
        tokio::spawn(runner.run(4, reconcile, never_retry, rec.clone()));
        tx.send(key("gone")).expect("open");
        tx.send(key("a")).expect("open");
        rec.wait_for(1).await;
        // While `a` is held in its reconcile, three more triggers: one more pass, after it.
        for _ in 0..3 {
            tx.send(key("a")).expect("open");
        }
        tokio::task::yield_now().await;
        assert_eq!(
            rec.names(),
            ["a"],
            "never two reconciles of one object at once"
        );
        gate.add_permits(2);
        rec.wait_for(2).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(rec.names(), ["a", "a"]);
    }

    #[test]
    fn sooner_takes_the_earlier_deadline() {
        let (one, two) = (Duration::from_secs(1), Duration::from_secs(2));
        assert_eq!(Next::Requeue(two).sooner(Some(one)), Next::Requeue(one));
        assert_eq!(Next::Requeue(one).sooner(Some(two)), Next::Requeue(one));
        assert_eq!(Next::AwaitChange.sooner(Some(two)), Next::Requeue(two));
        assert_eq!(Next::AwaitChange.sooner(None), Next::AwaitChange);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_settled_triggers_is_one_reconcile_a_window_after_the_first() {
        let (store, _writer) = cached(&["a"]);
        let rec = Recorder::answering(&[("a", Next::AwaitChange)]);
        let (tx, rx) = mpsc::unbounded_channel();
        let window = Duration::from_millis(100);
        let runner = Runner::new(store).reconcile_settled_on(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            Settle::Within(window),
        );
        tokio::spawn(runner.run(2, record, never_retry, rec.clone()));
        let start = Instant::now();
        // Two bursts of five triggers 20 ms apart (0..80 ms, 150..230 ms): the later triggers
        // of a burst do not push its window back.
        for burst in [0, 150] {
            tokio::time::sleep_until(start + Duration::from_millis(burst)).await;
            for _ in 0..5 {
                tx.send(key("a")).expect("open");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let seen = rec.seen.lock().expect("lock").clone();
        let at: Vec<Duration> = seen.iter().map(|(_, at)| *at - start).collect();
        assert_eq!(
            at,
            [window, Duration::from_millis(150) + window],
            "each burst folded into one pass, a window after its first trigger"
        );
    }

    #[tokio::test]
    async fn opening_gates_reconcile_everything_and_shutdown_ends_the_run() {
        let (store, _writer) = cached(&["a", "b", "c"]);
        let rec = Recorder::answering(&[
            ("a", Next::AwaitChange),
            ("b", Next::AwaitChange),
            ("c", Next::AwaitChange),
        ]);
        let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
        let shutdown = Shutdown::new();
        let gates = Gates {
            work_allowed: crate::leader::LeaderHandle::always_leader(shutdown.clone()).subscribe(),
            caches_synced: synced_rx,
            shutdown,
        };
        let run = tokio::spawn(Runner::new(store).gated(&gates).run(
            2,
            record,
            never_retry,
            rec.clone(),
        ));
        synced_tx.send(true).expect("open");
        rec.wait_for(3).await;
        let mut names = rec.names();
        names.sort();
        assert_eq!(names, ["a", "b", "c"]);
        gates.shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect("the run ends on shutdown")
            .expect("ok");
    }
}
