//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager), linkerd2
//! policy-controller style: every replica watches and computes, only the leader writes.
//!
//! Fail-stop: a leader that loses its lease (another holder, or renewals failing for longer than
//! the grace period) triggers shutdown and [`LeaderHandle::release`] returns
//! [`RuntimeError::LeaseLost`], so the binary exits non-zero and restarts as a clean standby
//! instead of writing on stale authority.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
use crate::cli::LeaderElectionArgs;
use crate::shutdown::Shutdown;

/// What one lease check told us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseObservation {
    /// The manager reports whether this replica holds the lease.
    Holder(bool),
    /// The API call failed; we do not know.
    Error,
}

/// What to do about an observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseVerdict {
    Unchanged,
    Acquired,
    /// A held lease is gone (or can no longer be trusted): stop writing, shut down.
    Lost,
}

/// Pure leadership bookkeeping, separated from the API calls so it can be tested.
#[derive(Debug)]
pub struct LeadershipTracker {
    is_leader: bool,
    failing_since: Option<Instant>,
    /// How long renewals may fail before the lease must be assumed taken: the grace period,
    /// because renewal starts `grace` before expiry.
    tolerated_failure: Duration,
}

impl LeadershipTracker {
    pub fn new(tolerated_failure: Duration) -> Self {
        Self {
            is_leader: false,
            failing_since: None,
            tolerated_failure,
        }
    }

    pub fn is_leader(&self) -> bool {
        self.is_leader
    }

    pub fn observe(&mut self, observation: LeaseObservation, now: Instant) -> LeaseVerdict {
        match observation {
            LeaseObservation::Holder(holder) => {
                self.failing_since = None;
                let verdict = match (self.is_leader, holder) {
                    (false, true) => LeaseVerdict::Acquired,
                    (true, false) => LeaseVerdict::Lost,
                    _ => LeaseVerdict::Unchanged,
                };
                self.is_leader = holder;
                verdict
            }
            LeaseObservation::Error => {
                let since = *self.failing_since.get_or_insert(now);
                if self.is_leader && now.duration_since(since) >= self.tolerated_failure {
                    self.is_leader = false;
                    LeaseVerdict::Lost
                } else {
                    LeaseVerdict::Unchanged
                }
            }
        }
    }
}

/// A write was refused because this replica is not the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this replica is not the leader")]
pub struct NotLeader;

impl crate::ErrorLabel for NotLeader {
    fn metric_label(&self) -> &'static str {
        "not_leader"
    }
}

/// How leader election ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeadershipEnd {
    /// Leader election was off: nothing to release.
    Disabled,
    /// The lease was held and has been released for the next replica.
    Released,
    /// This replica never held the lease (a standby).
    Standby,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    End(LeadershipEnd),
    Lost,
}

/// Starts leader election.
pub struct LeaderElection;

impl LeaderElection {
    /// Starts competing for the Lease `args.lease_name_or(default_lease_name)` in the background.
    /// With `--leader-elect` off the handle is always leader and no client call is made.
    /// Errors only on invalid settings; API errors are retried.
    pub fn start(
        client: Option<kube::Client>,
        args: &LeaderElectionArgs,
        default_lease_name: &str,
        shutdown: Shutdown,
    ) -> Result<LeaderHandle, RuntimeError> {
        if !args.leader_elect {
            return Ok(LeaderHandle::always_leader(shutdown));
        }
        args.validate()?;
        let client = client.ok_or_else(|| {
            RuntimeError::LeaderConfig("leader election needs a Kubernetes client".into())
        })?;
        let settings = LeaseSettings {
            name: args.lease_name_or(default_lease_name).to_owned(),
            namespace: args.lease_namespace.clone(),
            identity: args.holder_identity(),
            duration: args.lease_duration_seconds,
            grace: args.lease_grace_seconds,
        };
        let (tx, rx) = watch::channel(false);
        let release = CancellationToken::new();
        let lost = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(run_election(
            client,
            settings.clone(),
            tx,
            shutdown.clone(),
            release.clone(),
            lost.clone(),
        ));
        Ok(LeaderHandle {
            rx,
            shutdown,
            lease: settings.name,
            lost,
            control: Arc::new(Mutex::new(Some(Control { task, release }))),
            _always: None,
        })
    }
}

#[derive(Clone, Debug)]
struct LeaseSettings {
    name: String,
    namespace: String,
    identity: String,
    duration: u64,
    grace: u64,
}

#[derive(Debug)]
struct Control {
    task: JoinHandle<Outcome>,
    release: CancellationToken,
}

/// Leadership state of this replica. Cloneable; gate every write on [`is_leader`](Self::is_leader)
/// (or wait for [`acquired`](Self::acquired) before starting writers).
#[derive(Clone, Debug)]
pub struct LeaderHandle {
    rx: watch::Receiver<bool>,
    shutdown: Shutdown,
    lease: String,
    lost: Arc<AtomicBool>,
    control: Arc<Mutex<Option<Control>>>,
    // Keeps the channel open when election is disabled.
    _always: Option<Arc<watch::Sender<bool>>>,
}

impl LeaderHandle {
    /// A handle that is leader from the start (leader election disabled).
    pub fn always_leader(shutdown: Shutdown) -> Self {
        let (tx, rx) = watch::channel(true);
        Self {
            rx,
            shutdown,
            lease: String::new(),
            lost: Arc::new(AtomicBool::new(false)),
            control: Arc::new(Mutex::new(None)),
            _always: Some(Arc::new(tx)),
        }
    }

    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// For the top of a write path: `Err(NotLeader)` unless this replica leads right now.
    pub fn ensure_leader(&self) -> Result<(), NotLeader> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }

    /// A receiver of leadership changes (`true` while leader).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// Waits until this replica leads. Returns `false` if shutdown came first.
    pub async fn acquired(&self) -> bool {
        let mut rx = self.rx.clone();
        tokio::select! {
            result = rx.wait_for(|leader| *leader) => result.is_ok(),
            () = self.shutdown.cancelled() => self.is_leader(),
        }
    }

    /// Whether a held lease was lost (the process should exit non-zero).
    pub fn was_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Stops renewing and releases the lease (shutdown step 3: call after in-flight work is done).
    /// Errors with [`RuntimeError::LeaseLost`] if leadership was lost while held.
    pub async fn release(&self) -> Result<LeadershipEnd, RuntimeError> {
        let control = crate::sync::lock(&self.control).take();
        let Some(Control { task, release }) = control else {
            return if self.was_lost() {
                Err(self.lost_error())
            } else if self.lease.is_empty() {
                Ok(LeadershipEnd::Disabled)
            } else {
                Ok(LeadershipEnd::Released)
            };
        };
        release.cancel();
        match task.await? {
            Outcome::End(end) => Ok(end),
            Outcome::Lost => {
                self.lost.store(true, Ordering::Release);
                Err(self.lost_error())
            }
        }
    }

    fn lost_error(&self) -> RuntimeError {
        RuntimeError::LeaseLost {
            lease: self.lease.clone(),
        }
    }
}

const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(5);

async fn run_election(
    client: kube::Client,
    settings: LeaseSettings,
    tx: watch::Sender<bool>,
    shutdown: Shutdown,
    release: CancellationToken,
    lost: Arc<AtomicBool>,
) -> Outcome {
    let mut retry = RETRY_MIN;
    let manager = loop {
        let built = tokio::select! {
            () = release.cancelled() => return Outcome::End(LeadershipEnd::Standby),
            built = build_manager(client.clone(), &settings) => built,
        };
        match built {
            Ok(manager) => break manager,
            Err(error) => {
                tracing::warn!(lease = %settings.name, %error, "cannot set up the lease, retrying");
                if sleep_or_release(&release, &mut retry).await {
                    return Outcome::End(LeadershipEnd::Standby);
                }
            }
        }
    };
    tracing::info!(lease = %settings.name, namespace = %settings.namespace,
        identity = %settings.identity, "competing for leadership");

    let mut tracker = LeadershipTracker::new(Duration::from_secs(settings.grace));
    retry = RETRY_MIN;
    loop {
        let observation = tokio::select! {
            biased;
            () = release.cancelled() => break,
            changed = manager.changed() => match changed {
                Ok(holder) => LeaseObservation::Holder(holder),
                Err(error) => {
                    tracing::warn!(lease = %settings.name, %error, "lease check failed");
                    LeaseObservation::Error
                }
            },
        };
        match tracker.observe(observation, Instant::now()) {
            LeaseVerdict::Acquired => {
                tracing::info!(lease = %settings.name, "became leader");
                tx.send_replace(true);
                if shutdown.is_triggered() {
                    // Won the lease while draining: hand it back instead of starting work.
                    break;
                }
            }
            LeaseVerdict::Lost => {
                lost.store(true, Ordering::Release);
                tx.send_replace(false);
                tracing::error!(lease = %settings.name, "leadership lost, shutting down");
                shutdown.trigger();
                return Outcome::Lost;
            }
            LeaseVerdict::Unchanged => {}
        }
        if observation == LeaseObservation::Error {
            if sleep_or_release(&release, &mut retry).await {
                break;
            }
        } else {
            retry = RETRY_MIN;
        }
    }

    tx.send_replace(false);
    if !tracker.is_leader() {
        return Outcome::End(LeadershipEnd::Standby);
    }
    match manager.release().await {
        Ok(()) => tracing::info!(lease = %settings.name, "lease released"),
        // The lease expires by itself; a failed release only delays the next leader.
        Err(error) => tracing::warn!(lease = %settings.name, %error, "lease release failed"),
    }
    Outcome::End(LeadershipEnd::Released)
}

async fn build_manager(
    client: kube::Client,
    settings: &LeaseSettings,
) -> Result<LeaseManager, kube_lease_manager::LeaseManagerError> {
    LeaseManagerBuilder::new(client, settings.name.clone())
        .with_namespace(settings.namespace.clone())
        .with_identity(settings.identity.clone())
        .with_duration(settings.duration)
        .with_grace(settings.grace)
        .build()
        .await
}

/// Sleeps for the current retry delay (doubling it); returns true if release was requested.
async fn sleep_or_release(release: &CancellationToken, retry: &mut Duration) -> bool {
    let delay = *retry;
    *retry = (*retry * 2).min(RETRY_MAX);
    tokio::select! {
        () = release.cancelled() => true,
        () = tokio::time::sleep(delay) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(5);

    #[test]
    fn acquiring_and_losing_the_lease() {
        let start = Instant::now();
        let mut tracker = LeadershipTracker::new(GRACE);
        let holder = |b| LeaseObservation::Holder(b);
        assert_eq!(
            tracker.observe(holder(false), start),
            LeaseVerdict::Unchanged
        );
        assert_eq!(tracker.observe(holder(true), start), LeaseVerdict::Acquired);
        assert!(tracker.is_leader());
        assert_eq!(
            tracker.observe(holder(true), start),
            LeaseVerdict::Unchanged
        );
        assert_eq!(tracker.observe(holder(false), start), LeaseVerdict::Lost);
        assert!(!tracker.is_leader());
    }

    #[test]
    fn short_api_outage_keeps_leadership_long_one_loses_it() {
        let start = Instant::now();
        let mut tracker = LeadershipTracker::new(GRACE);
        tracker.observe(LeaseObservation::Holder(true), start);
        let at = |s| start + Duration::from_secs(s);
        assert_eq!(
            tracker.observe(LeaseObservation::Error, at(10)),
            LeaseVerdict::Unchanged
        );
        assert_eq!(
            tracker.observe(LeaseObservation::Error, at(14)),
            LeaseVerdict::Unchanged
        );
        // A success in between restarts the failure window.
        assert_eq!(
            tracker.observe(LeaseObservation::Holder(true), at(14)),
            LeaseVerdict::Unchanged
        );
        assert_eq!(
            tracker.observe(LeaseObservation::Error, at(16)),
            LeaseVerdict::Unchanged
        );
        assert_eq!(
            tracker.observe(LeaseObservation::Error, at(20)),
            LeaseVerdict::Unchanged
        );
        assert_eq!(
            tracker.observe(LeaseObservation::Error, at(21)),
            LeaseVerdict::Lost
        );
        assert!(!tracker.is_leader());
    }

    #[test]
    fn errors_as_standby_are_not_a_loss() {
        let start = Instant::now();
        let mut tracker = LeadershipTracker::new(GRACE);
        for s in [0, 10, 100] {
            let verdict = tracker.observe(LeaseObservation::Error, start + Duration::from_secs(s));
            assert_eq!(verdict, LeaseVerdict::Unchanged);
        }
        assert_eq!(
            tracker.observe(
                LeaseObservation::Holder(true),
                start + Duration::from_secs(101)
            ),
            LeaseVerdict::Acquired
        );
    }

    #[tokio::test]
    async fn disabled_election_is_always_leader() {
        let shutdown = Shutdown::new();
        let args = LeaderElectionArgs {
            leader_elect: false,
            lease_name: None,
            lease_namespace: "default".into(),
            lease_duration_seconds: 15,
            lease_grace_seconds: 5,
            identity: None,
        };
        let handle = LeaderElection::start(None, &args, "test", shutdown).expect("starts");
        assert!(handle.is_leader());
        assert!(handle.acquired().await);
        assert!(*handle.subscribe().borrow());
        assert_eq!(
            handle.release().await.expect("releases"),
            LeadershipEnd::Disabled
        );
        assert!(!handle.was_lost());
    }

    #[tokio::test]
    async fn writes_are_gated_on_current_leadership() {
        use crate::ErrorLabel;
        let (tx, rx) = watch::channel(false);
        let handle = LeaderHandle {
            rx,
            shutdown: Shutdown::new(),
            lease: "gate".into(),
            lost: Arc::new(AtomicBool::new(false)),
            control: Arc::new(Mutex::new(None)),
            _always: None,
        };
        assert_eq!(handle.ensure_leader(), Err(NotLeader));
        assert_eq!(NotLeader.metric_label(), "not_leader");
        tx.send_replace(true);
        assert_eq!(handle.ensure_leader(), Ok(()));
        assert!(handle.acquired().await);
        tx.send_replace(false);
        assert_eq!(
            handle.ensure_leader(),
            Err(NotLeader),
            "a lost lease stops writes at once"
        );
    }

    #[tokio::test]
    async fn enabled_election_validates_settings_before_any_call() {
        let mut args = LeaderElectionArgs {
            leader_elect: true,
            lease_name: None,
            lease_namespace: "default".into(),
            lease_duration_seconds: 5,
            lease_grace_seconds: 5,
            identity: None,
        };
        let error = LeaderElection::start(None, &args, "test", Shutdown::new())
            .expect_err("grace must be below duration");
        assert!(matches!(error, RuntimeError::LeaderConfig(_)), "{error}");
        args.lease_duration_seconds = 15;
        let error = LeaderElection::start(None, &args, "test", Shutdown::new())
            .expect_err("needs a client");
        assert!(matches!(error, RuntimeError::LeaderConfig(_)), "{error}");
    }
}
