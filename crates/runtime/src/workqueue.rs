//! A keyed work queue with client-go's workqueue semantics.
//!
//! kube-runtime's `Controller` only reconciles objects present in its cache, so it cannot act on a
//! key whose object is gone ("the Node was deleted, its NodeSLO is still there") and cannot key a
//! reconcile by anything but one object. Controllers that need that reconcile plain keys with
//! this queue instead. Guarantees:
//! - a key is processed by at most one worker at a time;
//! - a key added while queued is queued once; added while being processed, it is processed again
//!   right after;
//! - a delayed add fires at the earliest requested time, and an immediate add supersedes it;
//! - after [`WorkQueue::shutdown`] no new work starts; workers finish what they hold and return.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// A cloneable handle to one queue.
#[derive(Debug)]
pub struct WorkQueue<K> {
    state: Arc<Mutex<State<K>>>,
    wake: Arc<Notify>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            state: Arc::clone(&self.state),
            wake: Arc::clone(&self.wake),
        }
    }
}

#[derive(Debug)]
struct State<K> {
    queue: VecDeque<K>,
    /// Keys that need processing: in `queue`, or to be queued again when their processing ends.
    dirty: HashSet<K>,
    processing: HashSet<K>,
    delayed: HashMap<K, Instant>,
    shutting_down: bool,
}

impl<K: Hash + Eq + Clone> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq + Clone> WorkQueue<K> {
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
                delayed: HashMap::new(),
                shutting_down: false,
            })),
            wake: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        // Every method finishes its few field updates before anything can panic.
        crate::sync::lock(&self.state)
    }

    /// Queues `key` now.
    pub fn add(&self, key: K) {
        let mut state = self.lock();
        state.add(key);
        drop(state);
        self.wake_one();
    }

    /// Wakes one idle worker, or the next to look if none is idle: one key needs one worker, and
    /// waking them all cost every idle worker a pass over the lock per key. A worker always reads
    /// the queue before it waits, and a woken `Notified` that is dropped hands its wake-up on.
    fn wake_one(&self) {
        self.wake.notify_one();
    }

    /// Queues `key` after `delay`, unless it is queued sooner by another call.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let mut state = self.lock();
        if state.shutting_down {
            return;
        }
        let at = Instant::now() + delay;
        state
            .delayed
            .entry(key)
            .and_modify(|t| *t = (*t).min(at))
            .or_insert(at);
        drop(state);
        // One idle worker recomputes the earliest deadline.
        self.wake_one();
    }

    /// Waits for the next key; `None` once the queue is shut down. Call [`WorkQueue::done`] after.
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            // Registered before the state is read, so a wake-up between the read and the wait is not lost.
            notified.as_mut().enable();
            let next_deadline = {
                let mut state = self.lock();
                if state.shutting_down {
                    return None;
                }
                state.promote_due(Instant::now());
                if let Some(key) = state.queue.pop_front() {
                    state.dirty.remove(&key);
                    state.processing.insert(key.clone());
                    return Some(key);
                }
                state.delayed.values().min().copied()
            };
            match next_deadline {
                Some(deadline) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `key` processed; if it was added meanwhile, it is queued again.
    pub fn done(&self, key: &K) {
        let mut state = self.lock();
        state.processing.remove(key);
        let again = state.dirty.contains(key);
        if again {
            state.queue.push_back(key.clone());
        }
        drop(state);
        if again {
            self.wake_one();
        }
    }

    /// Stops handing out work: pending and delayed keys are dropped, [`WorkQueue::get`] returns `None`.
    pub fn shutdown(&self) {
        self.lock().shutting_down = true;
        self.wake.notify_waiters();
    }

    /// Keys queued now (not delayed, not in processing).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `workers` concurrent workers until shutdown. `process` returns when to see the key again
    /// (`None`: only when something adds it). Returns once every worker has finished its current key.
    pub async fn run<F, Fut>(&self, workers: usize, process: F)
    where
        F: Fn(K) -> Fut,
        Fut: Future<Output = Option<Duration>>,
    {
        let worker = |_| async {
            while let Some(key) = self.get().await {
                let requeue = process(key.clone()).await;
                self.done(&key);
                if let Some(delay) = requeue {
                    self.add_after(key, delay);
                }
            }
        };
        futures::future::join_all((0..workers.max(1)).map(worker)).await;
    }
}

impl<K: Hash + Eq + Clone> State<K> {
    fn add(&mut self, key: K) {
        if self.shutting_down {
            return;
        }
        self.delayed.remove(&key);
        if !self.dirty.insert(key.clone()) {
            return;
        }
        if !self.processing.contains(&key) {
            self.queue.push_back(key);
        }
    }

    fn promote_due(&mut self, now: Instant) {
        let due: Vec<K> = self
            .delayed
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.add(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_key_added_twice_is_queued_once() {
        let queue = WorkQueue::new();
        queue.add("a");
        queue.add("a");
        queue.add("b");
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.get().await, Some("a"));
        assert_eq!(queue.get().await, Some("b"));
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn a_key_added_while_processing_is_processed_again_after_done() {
        let queue = WorkQueue::new();
        queue.add("a");
        assert_eq!(queue.get().await, Some("a"));
        queue.add("a");
        assert!(queue.is_empty(), "not handed out while a worker holds it");
        queue.done(&"a");
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.get().await, Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_add_fires_at_the_earliest_time() {
        let queue = WorkQueue::new();
        let start = Instant::now();
        queue.add_after("a", Duration::from_secs(10));
        queue.add_after("a", Duration::from_secs(3));
        queue.add_after("a", Duration::from_secs(7));
        assert_eq!(queue.get().await, Some("a"));
        assert_eq!(start.elapsed().as_secs(), 3);
        queue.done(&"a");
        let second = tokio::time::timeout(Duration::from_secs(60), queue.get()).await;
        assert!(
            second.is_err(),
            "the later delays were merged into the first"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn immediate_add_supersedes_a_delayed_one() {
        let queue = WorkQueue::new();
        queue.add_after("a", Duration::from_secs(30));
        queue.add("a");
        let start = Instant::now();
        assert_eq!(queue.get().await, Some("a"));
        assert_eq!(start.elapsed(), Duration::ZERO);
        queue.done(&"a");
        assert!(
            tokio::time::timeout(Duration::from_secs(60), queue.get())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_waiting_worker_wakes_on_add() {
        let queue = WorkQueue::new();
        let waiter = tokio::spawn({
            let queue = queue.clone();
            async move { queue.get().await }
        });
        tokio::task::yield_now().await;
        queue.add(7);
        assert_eq!(waiter.await.expect("worker task"), Some(7));
    }

    /// How many reconciles ran at once, at most.
    #[derive(Clone, Default)]
    struct Overlap {
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    }

    impl Overlap {
        /// One reconcile's work: `took` long, counted while it runs.
        async fn during(&self, took: Duration) {
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(took).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
        }

        fn most(&self) -> usize {
            self.most.load(Ordering::SeqCst)
        }
    }

    /// Each add wakes one idle worker: a burst of keys still reaches every idle worker (they run
    /// side by side), and no key is left waiting for a wake-up that went to a busy worker.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bursts_of_keys_reach_every_idle_worker_and_none_is_stranded() {
        const KEYS: usize = 2_000;
        let queue = WorkQueue::new();
        let seen = Arc::new(Mutex::new(HashSet::new()));
        let overlap = Overlap::default();
        let runner = {
            let (queue, seen, overlap) = (queue.clone(), seen.clone(), overlap.clone());
            tokio::spawn(async move {
                queue
                    .run(8, |key: usize| {
                        let (seen, overlap) = (seen.clone(), overlap.clone());
                        async move {
                            overlap.during(Duration::from_micros(200)).await;
                            assert!(crate::sync::lock(&seen).insert(key), "{key} twice");
                            None
                        }
                    })
                    .await
            })
        };
        // Two producers, in bursts: adds race workers going idle. No delayed keys: their timers
        // would wake idle workers and hide a lost wake-up.
        let producers: Vec<_> = (0..2)
            .map(|p| {
                let queue = queue.clone();
                tokio::spawn(async move {
                    for key in (p..KEYS).step_by(2) {
                        queue.add(key);
                        if key % 50 == 0 {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.await.expect("producer");
        }
        let all_done = async {
            while crate::sync::lock(&seen).len() < KEYS {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), all_done)
            .await
            .unwrap_or_else(|_| {
                let done = crate::sync::lock(&seen).len();
                panic!("{done} of {KEYS} keys processed: a wake-up was lost");
            });
        queue.shutdown();
        runner.await.expect("runner");
        assert!(
            overlap.most() > 1,
            "one wake-up per key still puts several idle workers to work"
        );
    }

    #[tokio::test]
    async fn workers_never_process_one_key_concurrently() {
        let queue = WorkQueue::new();
        let overlap = Overlap::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let runner = {
            let (queue, overlap, runs) = (queue.clone(), overlap.clone(), runs.clone());
            tokio::spawn(async move {
                queue
                    .run(4, |_key: &str| {
                        let (overlap, runs) = (overlap.clone(), runs.clone());
                        async move {
                            overlap.during(Duration::from_millis(5)).await;
                            runs.fetch_add(1, Ordering::SeqCst);
                            None
                        }
                    })
                    .await
            })
        };
        for _ in 0..20 {
            queue.add("same");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        while !queue.is_empty() || runs.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        queue.shutdown();
        runner.await.expect("runner");
        assert_eq!(overlap.most(), 1);
        let runs = runs.load(Ordering::SeqCst);
        assert!(
            (2..20).contains(&runs),
            "re-adds while processing collapse into one more run, got {runs}"
        );
    }

    #[tokio::test]
    async fn shutdown_lets_the_current_key_finish_and_starts_nothing_new() {
        let queue = WorkQueue::new();
        let finished = Arc::new(AtomicUsize::new(0));
        queue.add(1);
        queue.add(2);
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let started_tx = Mutex::new(Some(started_tx));
        let runner = {
            let (queue, finished) = (queue.clone(), finished.clone());
            tokio::spawn(async move {
                queue
                    .run(1, |_key: i32| {
                        if let Some(tx) = started_tx.lock().expect("lock").take() {
                            let _ = tx.send(());
                        }
                        let finished = finished.clone();
                        async move {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            finished.fetch_add(1, Ordering::SeqCst);
                            None
                        }
                    })
                    .await
            })
        };
        started_rx.await.expect("first key started");
        queue.shutdown();
        runner.await.expect("runner");
        assert_eq!(
            finished.load(Ordering::SeqCst),
            1,
            "the in-flight key finished, the queued one never started"
        );
        assert_eq!(queue.get().await, None);
    }
}
