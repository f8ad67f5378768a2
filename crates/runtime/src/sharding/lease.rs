//! Membership: one `coordination.k8s.io/v1` Lease per shard, what a Lease says about its shard
//! (pure: [`classify`], [`Membership::from_leases`]), the shard's own renewal task
//! ([`ShardLease`]) and the watch of a ring's Leases ([`watch_membership`]).
//!
//! A shard's Lease is `<ring>-<shard>` in the shards' namespace, labelled
//! `sharding.capstan.dev/ring=<ring>`, holder `<shard>`, renewed every `renew_every` with
//! `leaseDurationSeconds = duration`. Its states, after the anchor's
//! (`pkg/sharding/leases/state.go`, `times.go`, `pkg/controller/shardlease/reconciler.go`):
//!
//! | state | the Lease | the shard's objects |
//! |---|---|---|
//! | `Ready` | held by the shard, renewed less than `duration` ago | its own; new ones may come |
//! | `Expired` | held, not renewed for `duration` to `duration + EXPIRED_GRACE` | untouched: may still work |
//! | `Uncertain` | held, not renewed for `duration + EXPIRED_GRACE` or more | untouched; Lease acquired |
//! | `Dead` | released by the shard, or acquired by the sharder | given to others directly |
//! | `Orphaned` | `Dead` for a minute | given to others; the sharder deletes the Lease |
//!
//! Fail-stop, as [`crate::leader`]: a shard counts its Lease as held only until `tolerated` after
//! sending its last successful renewal; past that it reports the Lease lost and triggers
//! shutdown. With `renew_every < tolerated < duration`, and `tolerated + clock skew + the longest
//! reconcile < duration`, a shard has stopped before anyone can see its Lease `Expired`, and the
//! sharder moves objects only [`EXPIRED_GRACE`] later, after its acquiring write succeeded
//! (a renewal in between makes that write conflict).
//!
//! **Decision**: the anchor waits a further whole `duration` (`uncertain` after 2 × duration)
//! before confirming a death; we wait [`EXPIRED_GRACE`] (500 ms), at most `duration`. The shard's
//! fail-stop window already ends before expiry with the clock skew counted in, so the second
//! duration bought only a margin, and it doubled a dead shard's takeover time (the issue asks
//! for a takeover within lease duration + 2 s).
//!
//! **Decision**: the Lease is named `<ring>-<shard>`, not the anchor's bare shard name, so one
//! pod can be a shard of two rings in one namespace; the holder is the shard id either way.
//!
//! **Decision**: only `Ready` shards receive objects (the anchor also gives new objects to
//! expired shards), and `Expired`/`Uncertain` owners are neither drained nor reassigned: they are
//! given no work that a dying shard would sit on, and no drain it would not acknowledge.
//!
//! **Decision**: the shard's renewal is our own loop (create, replace with the resourceVersion
//! read), not client-go's leader election as in the anchor, so that the fail-stop window is
//! measured from the send time of the last successful renewal.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{RING_LABEL, RingName, SHARDER_IDENTITY, ShardId, ShardingError};
use crate::cli::LeaderElectionArgs;
use crate::kube_errors::{is_conflict, is_not_found};
use crate::shutdown::Shutdown;

/// How long a released or sharder-acquired Lease stays before the sharder deletes it (the
/// anchor's `leaseTTL`).
pub const ORPHANED_AFTER: Duration = Duration::from_secs(60);

/// How long past its expiry a held Lease stays `Expired` before the sharder confirms the death
/// (at most the Lease's duration): a margin for a renewal in flight at expiry.
pub const EXPIRED_GRACE: Duration = Duration::from_millis(500);

/// What a shard's Lease says about the shard (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ShardState {
    Ready,
    Expired,
    Uncertain,
    Dead,
    Orphaned,
}

impl ShardState {
    /// Whether the shard receives objects.
    pub fn is_ready(self) -> bool {
        self == Self::Ready
    }

    /// Whether the shard may still be reconciling: its objects move only by a drain.
    pub fn may_be_working(self) -> bool {
        matches!(self, Self::Ready | Self::Expired | Self::Uncertain)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Expired => "expired",
            Self::Uncertain => "uncertain",
            Self::Dead => "dead",
            Self::Orphaned => "orphaned",
        }
    }

    pub const ALL: [Self; 5] = [
        Self::Ready,
        Self::Expired,
        Self::Uncertain,
        Self::Dead,
        Self::Orphaned,
    ];
}

/// A Lease's state at `now` and when it next changes by time alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classified {
    pub state: ShardState,
    pub next_change: Option<Timestamp>,
}

fn plus(at: Timestamp, duration: Duration) -> Timestamp {
    let span = SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX);
    at.checked_add(span).unwrap_or(Timestamp::MAX)
}

/// The state of `shard`'s Lease at `now`. A Lease held by its shard but missing its renew time
/// or duration is `Uncertain` (the sharder confirms by acquiring it); one held by nobody with no
/// times at all is `Orphaned`.
pub fn classify(lease: &Lease, shard: &str, now: Timestamp) -> Classified {
    let spec = lease.spec.as_ref();
    let holder = spec.and_then(|spec| spec.holder_identity.as_deref());
    let renewed = spec
        .and_then(|spec| spec.renew_time.as_ref().or(spec.acquire_time.as_ref()))
        .map(|time| time.0);
    if holder != Some(shard) {
        let Some(renewed) = renewed else {
            return Classified {
                state: ShardState::Orphaned,
                next_change: None,
            };
        };
        let orphaned_at = plus(renewed, ORPHANED_AFTER);
        return if now < orphaned_at {
            Classified {
                state: ShardState::Dead,
                next_change: Some(orphaned_at),
            }
        } else {
            Classified {
                state: ShardState::Orphaned,
                next_change: None,
            }
        };
    }
    let duration = spec
        .and_then(|spec| spec.lease_duration_seconds)
        .and_then(|seconds| u64::try_from(seconds).ok())
        .filter(|seconds| *seconds > 0)
        .map(Duration::from_secs);
    let renewed = spec.and_then(|spec| spec.renew_time.as_ref()).map(|t| t.0);
    let (Some(renewed), Some(duration)) = (renewed, duration) else {
        return Classified {
            state: ShardState::Uncertain,
            next_change: None,
        };
    };
    let expires = plus(renewed, duration);
    let uncertain = plus(expires, duration.min(EXPIRED_GRACE));
    if now < expires {
        Classified {
            state: ShardState::Ready,
            next_change: Some(expires),
        }
    } else if now < uncertain {
        Classified {
            state: ShardState::Expired,
            next_change: Some(uncertain),
        }
    } else {
        Classified {
            state: ShardState::Uncertain,
            next_change: None,
        }
    }
}

/// The shards of one ring and their states, as the sharder sees them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    synced: bool,
    shards: BTreeMap<String, ShardState>,
    next_change: Option<Timestamp>,
}

impl Membership {
    /// Not synced yet: every decision must wait (an owner missing here counts as dead).
    pub fn unsynced() -> Self {
        Self::default()
    }

    /// The membership of `ring` from its Leases at `now`. Leases not named `<ring>-<shard>`
    /// are ignored.
    pub fn from_leases<'a, I>(ring: &RingName, leases: I, now: Timestamp) -> Self
    where
        I: IntoIterator<Item = &'a Lease>,
    {
        let mut membership = Self {
            synced: true,
            ..Self::default()
        };
        for lease in leases {
            let Some(name) = lease.metadata.name.as_deref() else {
                continue;
            };
            let Some(shard) = ring.shard_of_lease(name) else {
                continue;
            };
            let classified = classify(lease, shard, now);
            membership.shards.insert(shard.to_owned(), classified.state);
            membership.next_change = match (membership.next_change, classified.next_change) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        membership
    }

    /// A synced membership of these states (tests, and callers with their own view).
    pub fn from_states<I: IntoIterator<Item = (String, ShardState)>>(states: I) -> Self {
        Self {
            synced: true,
            shards: states.into_iter().collect(),
            next_change: None,
        }
    }

    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// The state of `shard`; `None` when it has no Lease.
    pub fn state(&self, shard: &str) -> Option<ShardState> {
        self.shards.get(shard).copied()
    }

    /// Every shard with a Lease and its state.
    pub fn shards(&self) -> impl Iterator<Item = (&str, ShardState)> {
        self.shards
            .iter()
            .map(|(shard, state)| (shard.as_str(), *state))
    }

    /// The shards that receive objects.
    pub fn ready(&self) -> impl Iterator<Item = &str> + Clone {
        self.shards
            .iter()
            .filter(|(_, state)| state.is_ready())
            .map(|(shard, _)| shard.as_str())
    }

    /// The ring's choice for `key` among the ready shards ([`super::ring::choose`]).
    pub fn choose(&self, key: &str) -> Option<&str> {
        super::ring::choose(key, self.ready())
    }

    /// When some shard's state next changes by time alone (an expiry, an orphaning).
    pub fn next_change(&self) -> Option<Timestamp> {
        self.next_change
    }

    /// Whether both are synced alike with the same shards in the same states (the time of the
    /// next change aside: every renewal moves it).
    pub fn same_states(&self, other: &Self) -> bool {
        self.synced == other.synced && self.shards == other.shards
    }
}

/// Settings of one shard's Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLeaseConfig {
    pub ring: RingName,
    pub shard: ShardId,
    pub namespace: String,
    /// `leaseDurationSeconds`: whole seconds, at least one.
    pub duration: Duration,
    /// How often the shard renews.
    pub renew_every: Duration,
    /// How long after sending its last successful renewal the shard still counts the Lease as
    /// held; must be below `duration` by the tolerated clock skew plus the longest reconcile.
    pub tolerated: Duration,
}

impl ShardLeaseConfig {
    /// Defaults: 15 s Leases renewed every 3 s, held up to 10 s after the last renewal sent.
    pub fn new(ring: RingName, shard: ShardId, namespace: impl Into<String>) -> Self {
        Self {
            ring,
            shard,
            namespace: namespace.into(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(3),
            tolerated: Duration::from_secs(10),
        }
    }

    /// From the common leader election flags: identity (`POD_NAME`) as the shard id, the
    /// Lease namespace and duration, `tolerated = duration - grace`, renewing three times per
    /// tolerated window.
    pub fn from_leader_args(
        ring: RingName,
        args: &LeaderElectionArgs,
    ) -> Result<Self, ShardingError> {
        let shard = ShardId::new(args.holder_identity())?;
        let duration = Duration::from_secs(args.lease_duration_seconds);
        let tolerated = duration.saturating_sub(Duration::from_secs(args.lease_grace_seconds));
        let config = Self {
            ring,
            shard,
            namespace: args.lease_namespace.clone(),
            duration,
            renew_every: tolerated / 3,
            tolerated,
        };
        config.validate()?;
        Ok(config)
    }

    /// The name of this shard's Lease.
    pub fn lease_name(&self) -> String {
        self.ring.lease_name(&self.shard)
    }

    /// `0 < renew_every < tolerated < duration`, the duration in whole seconds.
    pub fn validate(&self) -> Result<(), ShardingError> {
        let problem = if self.duration.subsec_nanos() != 0 || self.duration.is_zero() {
            Some("the lease duration must be a whole number of seconds, at least one".to_owned())
        } else if i32::try_from(self.duration.as_secs()).is_err() {
            Some("the lease duration is too long".to_owned())
        } else if self.renew_every.is_zero() || self.renew_every >= self.tolerated {
            Some(format!(
                "renewals ({:?}) must come more often than the tolerated window ({:?})",
                self.renew_every, self.tolerated
            ))
        } else if self.tolerated >= self.duration {
            Some(format!(
                "the tolerated window ({:?}) must be shorter than the lease duration ({:?})",
                self.tolerated, self.duration
            ))
        } else if self.namespace.is_empty() {
            Some("the lease namespace must not be empty".to_owned())
        } else {
            None
        };
        problem.map_or(Ok(()), |problem| Err(ShardingError::LeaseConfig(problem)))
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// The Lease `config`'s shard writes to take its Lease: a new one, or `existing` taken over.
pub fn acquired(existing: Option<&Lease>, config: &ShardLeaseConfig, now: Timestamp) -> Lease {
    let mut lease = existing.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(config.lease_name()),
            namespace: Some(config.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    lease
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(RING_LABEL.to_owned(), config.ring.as_str().to_owned());
    let previous = lease.spec.take().unwrap_or_default();
    let held_before = previous.holder_identity.as_deref() == Some(config.shard.as_str());
    let transitions = previous.lease_transitions.unwrap_or(0);
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(config.shard.as_str().to_owned()),
        lease_duration_seconds: Some(config.duration_seconds()),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if held_before || existing.is_none() {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..previous
    });
    lease
}

/// `lease` renewed at `now`.
pub fn renewed(lease: &Lease, now: Timestamp) -> Lease {
    let mut lease = lease.clone();
    lease.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(MicroTime(now));
    lease
}

/// `lease` released at `now`: no holder, so the sharder sees the shard `Dead` at once.
pub fn released(lease: &Lease, now: Timestamp) -> Lease {
    let mut lease = lease.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.renew_time = Some(MicroTime(now));
    lease
}

/// `lease` acquired by the sharder at `now`, confirming its shard dead (the anchor's
/// shardlease controller does the same, doubling the duration).
pub fn confirmed_dead(lease: &Lease, now: Timestamp) -> Lease {
    let mut lease = lease.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(SHARDER_IDENTITY.to_owned());
    spec.acquire_time = Some(MicroTime(now));
    spec.renew_time = Some(MicroTime(now));
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    lease
}

fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

/// How a shard's Lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardEnd {
    /// Held and released: the sharder moves the shard's objects at once.
    Released,
    /// Never held (stopped before the first successful write).
    NeverHeld,
    /// Left to expire by [`ShardHandle::abandon`].
    Abandoned,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    End(ShardEnd),
    Lost,
}

/// Starts a shard's Lease.
pub struct ShardLease;

impl ShardLease {
    /// Creates or takes over `config`'s Lease and renews it in the background. A Lease lost
    /// while held (taken, deleted, or not renewed within `tolerated`) triggers `shutdown`.
    pub fn start(
        client: kube::Client,
        config: ShardLeaseConfig,
        shutdown: Shutdown,
    ) -> Result<ShardHandle, ShardingError> {
        config.validate()?;
        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let tx = Arc::new(watch::channel(false).0);
        let rx = tx.subscribe();
        let release = CancellationToken::new();
        let lost = Arc::new(AtomicBool::new(false));
        let lease = config.lease_name();
        let task = tokio::spawn(run_shard_lease(
            api,
            config,
            tx.clone(),
            shutdown.clone(),
            release.clone(),
            lost.clone(),
        ));
        Ok(ShardHandle {
            rx,
            tx,
            shutdown,
            lease,
            lost,
            abandoned: Arc::new(AtomicBool::new(false)),
            control: Arc::new(Mutex::new(Some((task, release)))),
        })
    }
}

type Control = (JoinHandle<Outcome>, CancellationToken);

/// A running shard Lease. Reconcile only while [`is_active`](Self::is_active); call
/// [`release`](Self::release) after in-flight reconciles are done.
#[derive(Clone, Debug)]
pub struct ShardHandle {
    rx: watch::Receiver<bool>,
    tx: Arc<watch::Sender<bool>>,
    shutdown: Shutdown,
    lease: String,
    lost: Arc<AtomicBool>,
    abandoned: Arc<AtomicBool>,
    control: Arc<Mutex<Option<Control>>>,
}

impl ShardHandle {
    /// Whether the Lease is held right now (false again from the end of the tolerated window).
    pub fn is_active(&self) -> bool {
        *self.rx.borrow()
    }

    /// A receiver of the held state (`true` while held).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// Waits until the Lease is held. Returns `false` if shutdown came first.
    pub async fn active(&self) -> bool {
        let mut rx = self.rx.clone();
        tokio::select! {
            result = rx.wait_for(|held| *held) => result.is_ok(),
            () = self.shutdown.cancelled() => self.is_active(),
        }
    }

    /// Whether a held Lease was lost (the process should exit non-zero).
    pub fn was_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Stops renewing and releases the Lease, so the sharder moves this shard's objects at
    /// once. Errors with [`ShardingError::LeaseLost`] if it was lost while held.
    pub async fn release(&self) -> Result<ShardEnd, ShardingError> {
        let control = crate::sync::lock(&self.control).take();
        let Some((task, release)) = control else {
            return if self.was_lost() {
                Err(self.lost_error())
            } else if self.abandoned.load(Ordering::Acquire) {
                Ok(ShardEnd::Abandoned)
            } else {
                Ok(ShardEnd::Released)
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

    /// Stops renewing without releasing, as a killed process would: the Lease expires and the
    /// sharder confirms the death. For tests, and for a process that must stop at once.
    pub fn abandon(&self) {
        if let Some((task, _)) = crate::sync::lock(&self.control).take() {
            task.abort();
            self.abandoned.store(true, Ordering::Release);
        }
        self.tx.send_replace(false);
    }

    fn lost_error(&self) -> ShardingError {
        ShardingError::LeaseLost {
            lease: self.lease.clone(),
        }
    }
}

/// What one renewal step found.
enum Step {
    Held(Box<Lease>),
    /// The Lease is gone or another holder has it.
    Taken(Option<String>),
}

const RETRY_MIN: Duration = Duration::from_millis(200);

async fn run_shard_lease(
    api: Api<Lease>,
    config: ShardLeaseConfig,
    tx: Arc<watch::Sender<bool>>,
    shutdown: Shutdown,
    release: CancellationToken,
    lost: Arc<AtomicBool>,
) -> Outcome {
    let name = config.lease_name();
    let mut current: Option<Lease> = None;
    // Send time of the last successful write: the tolerated window starts there.
    let mut last_ok: Option<Instant> = None;
    let mut retry = RETRY_MIN;
    loop {
        let sent = Instant::now();
        // A step that hangs must not outlive the window; before the first success it is bounded
        // by one window too.
        let deadline = last_ok.unwrap_or(sent) + config.tolerated;
        let result = tokio::select! {
            biased;
            () = release.cancelled() => break,
            () = tokio::time::sleep_until(deadline) => None,
            result = step(&api, &config, &name, current.as_ref()) => Some(result),
        };
        let next = match result {
            Some(Ok(Step::Held(lease))) => {
                current = Some(*lease);
                last_ok = Some(sent);
                retry = RETRY_MIN;
                if !tx.send_replace(true) {
                    tracing::info!(lease = %name, shard = %config.shard, "holding the shard lease");
                }
                sent + config.renew_every
            }
            Some(Ok(Step::Taken(holder))) if last_ok.is_some() => {
                tracing::error!(lease = %name, holder = ?holder,
                    "the shard lease was taken away, shutting down");
                return lose(&tx, &lost, &shutdown);
            }
            Some(Ok(Step::Taken(_))) => {
                // Not held yet: start over with a fresh read.
                current = None;
                Instant::now() + next_retry(&mut retry, config.renew_every)
            }
            Some(Err(error)) => {
                tracing::warn!(lease = %name, %error, "shard lease renewal failed");
                Instant::now() + next_retry(&mut retry, config.renew_every)
            }
            None => {
                tracing::warn!(lease = %name, "shard lease renewal timed out");
                Instant::now()
            }
        };
        if let Some(ok) = last_ok
            && Instant::now() >= ok + config.tolerated
        {
            tracing::error!(lease = %name, tolerated = ?config.tolerated,
                "shard lease not renewed in time, shutting down");
            return lose(&tx, &lost, &shutdown);
        }
        let wake = last_ok.map_or(next, |ok| next.min(ok + config.tolerated));
        tokio::select! {
            biased;
            () = release.cancelled() => break,
            () = tokio::time::sleep_until(wake) => {}
        }
    }

    tx.send_replace(false);
    let Some(lease) = current.filter(|_| last_ok.is_some()) else {
        return Outcome::End(ShardEnd::NeverHeld);
    };
    match release_lease(&api, &name, &config, &lease).await {
        Ok(()) => tracing::info!(lease = %name, "shard lease released"),
        // The Lease expires by itself; a failed release only delays the takeover.
        Err(error) => tracing::warn!(lease = %name, %error, "shard lease release failed"),
    }
    Outcome::End(ShardEnd::Released)
}

fn lose(tx: &watch::Sender<bool>, lost: &AtomicBool, shutdown: &Shutdown) -> Outcome {
    tx.send_replace(false);
    lost.store(true, Ordering::Release);
    shutdown.trigger();
    Outcome::Lost
}

fn next_retry(retry: &mut Duration, cap: Duration) -> Duration {
    let delay = (*retry).min(cap);
    *retry = (*retry * 2).min(cap);
    delay
}

/// One write: renew the held Lease, or create or take it over.
async fn step(
    api: &Api<Lease>,
    config: &ShardLeaseConfig,
    name: &str,
    current: Option<&Lease>,
) -> Result<Step, kube::Error> {
    let now = Timestamp::now();
    let pp = PostParams::default();
    if let Some(lease) = current {
        match api.replace(name, &pp, &renewed(lease, now)).await {
            Ok(lease) => return Ok(Step::Held(Box::new(lease))),
            Err(error) if is_conflict(&error) || is_not_found(&error) => {}
            Err(error) => return Err(error),
        }
        // Someone else wrote the Lease: still ours (labels edited), or taken?
        return match api.get_opt(name).await? {
            None => Ok(Step::Taken(None)),
            Some(fresh) if holder(&fresh) == Some(config.shard.as_str()) => api
                .replace(name, &pp, &renewed(&fresh, Timestamp::now()))
                .await
                .map(|lease| Step::Held(Box::new(lease))),
            Some(fresh) => Ok(Step::Taken(holder(&fresh).map(str::to_owned))),
        };
    }
    match api.get_opt(name).await? {
        None => api
            .create(&pp, &acquired(None, config, now))
            .await
            .map(|lease| Step::Held(Box::new(lease))),
        // Not held by this process: a previous incarnation's, released, or confirmed dead.
        Some(existing) => api
            .replace(name, &pp, &acquired(Some(&existing), config, now))
            .await
            .map(|lease| Step::Held(Box::new(lease))),
    }
}

async fn release_lease(
    api: &Api<Lease>,
    name: &str,
    config: &ShardLeaseConfig,
    lease: &Lease,
) -> Result<(), kube::Error> {
    let pp = PostParams::default();
    match api
        .replace(name, &pp, &released(lease, Timestamp::now()))
        .await
    {
        Ok(_) => return Ok(()),
        Err(error) if is_conflict(&error) => {}
        Err(error) if is_not_found(&error) => return Ok(()),
        Err(error) => return Err(error),
    }
    match api.get_opt(name).await? {
        Some(fresh) if holder(&fresh) == Some(config.shard.as_str()) => api
            .replace(name, &pp, &released(&fresh, Timestamp::now()))
            .await
            .map(drop),
        _ => Ok(()),
    }
}

/// Watches `ring`'s Leases in `leases` and publishes the membership whenever a shard's state
/// changes: on a Lease event, or by time alone (an expiry). Renewals that change no state
/// publish nothing. It stays [`Membership::unsynced`] until the first list is in; the task ends
/// when `stop` is cancelled.
pub fn watch_membership(
    leases: Api<Lease>,
    ring: RingName,
    stop: CancellationToken,
) -> (watch::Receiver<Membership>, JoinHandle<()>) {
    let (tx, rx) = watch::channel(Membership::unsynced());
    let task = tokio::spawn(async move {
        let config = kube::runtime::watcher::Config::default().labels(&ring.lease_selector());
        let (store, stream) = crate::controller::reflect(leases, config);
        let mut stream = std::pin::pin!(stream);
        let ready = store.wait_until_ready();
        let mut ready = std::pin::pin!(ready);
        let mut synced = false;
        let mut next_change: Option<Timestamp> = None;
        loop {
            let wake = next_change.map(|at| {
                let until = Timestamp::now().duration_until(at);
                let until = Duration::try_from(until).unwrap_or(Duration::ZERO);
                // Past the boundary, not on it (MicroTime has microseconds).
                Instant::now() + until + Duration::from_millis(5)
            });
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                result = &mut ready, if !synced => {
                    if result.is_err() {
                        break;
                    }
                    synced = true;
                }
                item = stream.next() => match item {
                    None => break,
                    Some(Err(error)) => {
                        tracing::warn!(ring = %ring, %error, "shard lease watch failed");
                        continue;
                    }
                    Some(Ok(_)) => {}
                },
                () = sleep_until_some(wake) => {}
            }
            if synced {
                let state = store.state();
                let membership = Membership::from_leases(
                    &ring,
                    state.iter().map(AsRef::as_ref),
                    Timestamp::now(),
                );
                next_change = membership.next_change();
                tx.send_if_modified(|current| {
                    let changed = !current.same_states(&membership);
                    if changed {
                        *current = membership;
                    }
                    changed
                });
            }
        }
    });
    (rx, task)
}

pub(super) async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).expect("valid")
    }

    fn lease(name: &str, holder: Option<&str>, renewed: Option<i64>, duration: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(duration),
                renew_time: renewed.map(|s| MicroTime(at(s))),
                acquire_time: renewed.map(|s| MicroTime(at(s))),
                ..LeaseSpec::default()
            }),
        }
    }

    fn ring() -> RingName {
        RingName::new("ring").expect("valid")
    }

    fn config() -> ShardLeaseConfig {
        ShardLeaseConfig::new(ring(), ShardId::new("a").expect("valid"), "default")
    }

    #[test]
    fn a_held_lease_is_ready_then_expired_then_uncertain() {
        let held = lease("ring-a", Some("a"), Some(0), 10);
        let state = |s| classify(&held, "a", at(s));
        assert_eq!(
            state(0),
            Classified {
                state: ShardState::Ready,
                next_change: Some(at(10))
            }
        );
        assert_eq!(state(9).state, ShardState::Ready);
        assert_eq!(
            state(10),
            Classified {
                state: ShardState::Expired,
                next_change: Some(plus(at(10), EXPIRED_GRACE))
            }
        );
        let uncertain_at = plus(at(10), EXPIRED_GRACE);
        assert_eq!(
            classify(&held, "a", uncertain_at).state,
            ShardState::Uncertain
        );
        assert_eq!(classify(&held, "a", uncertain_at).next_change, None);
        assert_eq!(state(11).state, ShardState::Uncertain);
    }

    #[test]
    fn a_released_or_acquired_lease_is_dead_then_orphaned() {
        let released = lease("ring-a", None, Some(0), 10);
        assert_eq!(
            classify(&released, "a", at(1)),
            Classified {
                state: ShardState::Dead,
                next_change: Some(at(60))
            }
        );
        assert_eq!(classify(&released, "a", at(60)).state, ShardState::Orphaned);
        let confirmed = confirmed_dead(&lease("ring-a", Some("a"), Some(0), 10), at(20));
        assert_eq!(classify(&confirmed, "a", at(21)).state, ShardState::Dead);
        assert_eq!(holder(&confirmed), Some(SHARDER_IDENTITY));
        assert_eq!(
            classify(&lease("ring-a", None, None, 10), "a", at(0)).state,
            ShardState::Orphaned
        );
    }

    #[test]
    fn a_held_lease_without_times_is_uncertain_so_the_sharder_confirms_it() {
        assert_eq!(
            classify(&lease("ring-a", Some("a"), None, 10), "a", at(0)).state,
            ShardState::Uncertain
        );
        assert_eq!(
            classify(&lease("ring-a", Some("a"), Some(0), 0), "a", at(0)).state,
            ShardState::Uncertain
        );
    }

    #[test]
    fn membership_holds_the_rings_shards_and_the_next_change() {
        let leases = [
            lease("ring-a", Some("a"), Some(0), 10),
            lease("ring-b", Some("b"), Some(5), 10),
            lease("ring-c", None, Some(0), 10),
            lease("other-d", Some("d"), Some(0), 10),
        ];
        let membership = Membership::from_leases(&ring(), &leases, at(12));
        assert!(membership.is_synced());
        assert_eq!(
            membership.shards().collect::<Vec<_>>(),
            [
                ("a", ShardState::Uncertain),
                ("b", ShardState::Ready),
                ("c", ShardState::Dead)
            ]
        );
        assert_eq!(membership.ready().collect::<Vec<_>>(), ["b"]);
        assert_eq!(membership.choose("any/key"), Some("b"));
        assert_eq!(membership.next_change(), Some(at(15)), "b expires first");
        assert!(!Membership::unsynced().is_synced());
    }

    #[test]
    fn acquiring_writes_holder_times_and_ring_label_and_counts_transitions() {
        let config = config();
        let new = acquired(None, &config, at(0));
        assert_eq!(new.metadata.name.as_deref(), Some("ring-a"));
        assert_eq!(
            new.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(RING_LABEL))
                .map(String::as_str),
            Some("ring")
        );
        let spec = new.spec.clone().expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(classify(&new, "a", at(1)).state, ShardState::Ready);

        let confirmed = confirmed_dead(&new, at(40));
        let retaken = acquired(Some(&confirmed), &config, at(50));
        let spec = retaken.spec.clone().expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_transitions, Some(2));
        assert_eq!(classify(&retaken, "a", at(51)).state, ShardState::Ready);

        let gone = released(&renewed(&retaken, at(55)), at(56));
        assert_eq!(classify(&gone, "a", at(56)).state, ShardState::Dead);
    }

    #[test]
    fn settings_keep_renewals_inside_the_window_inside_the_duration() {
        assert!(config().validate().is_ok());
        let broken = [
            ShardLeaseConfig {
                tolerated: Duration::from_secs(15),
                ..config()
            },
            ShardLeaseConfig {
                renew_every: Duration::from_secs(10),
                ..config()
            },
            ShardLeaseConfig {
                duration: Duration::from_millis(1500),
                ..config()
            },
            ShardLeaseConfig {
                namespace: String::new(),
                ..config()
            },
        ];
        for config in broken {
            assert!(
                matches!(config.validate(), Err(ShardingError::LeaseConfig(_))),
                "{config:?}"
            );
        }
        let args = LeaderElectionArgs {
            identity: Some("pod-0".into()),
            ..LeaderElectionArgs::default()
        };
        let from_args = ShardLeaseConfig::from_leader_args(ring(), &args).expect("valid");
        assert_eq!(from_args.tolerated, Duration::from_secs(10));
        assert_eq!(from_args.shard.as_str(), "pod-0");
        assert!(from_args.renew_every < from_args.tolerated);
    }
}
