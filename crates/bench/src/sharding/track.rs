//! Following NodeSLOs on a watch until a goal holds: every NodeSLO at a value, on a live shard,
//! each shard owning its share.

use super::*;

/// What a watch of NodeSLOs tracks of each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct SloState {
    pub(super) percent: Option<i64>,
    pub(super) shard: Option<String>,
    pub(super) draining: bool,
}

impl SloState {
    pub(super) fn of(slo: &NodeSlo) -> Self {
        let labels = slo.metadata.labels.as_ref();
        Self {
            percent: slo
                .spec
                .resource_used_threshold_with_be
                .as_ref()
                .and_then(|t| t.cpu_suppress_threshold_percent),
            shard: labels.and_then(|l| l.get(RING_LABEL)).cloned(),
            draining: labels.is_some_and(|l| l.contains_key(DRAIN_LABEL)),
        }
    }
}

/// Which NodeSLOs a goal counts, and how many there are to reach.
#[derive(Clone, Debug)]
pub(super) enum Scope {
    /// Every NodeSLO; this many.
    All(usize),
    Only(Arc<HashSet<String>>),
    /// Every NodeSLO but these, of this many in all.
    Except(Arc<HashSet<String>>, usize),
}

impl Scope {
    pub(super) fn contains(&self, name: &str) -> bool {
        match self {
            Scope::All(_) => true,
            Scope::Only(names) => names.contains(name),
            Scope::Except(names, _) => !names.contains(name),
        }
    }

    pub(super) fn size(&self) -> usize {
        match self {
            Scope::All(n) => *n,
            Scope::Only(names) => names.len(),
            Scope::Except(names, n) => n.saturating_sub(names.len()),
        }
    }
}

/// A state every NodeSLO of `scope` must be in at once.
#[derive(Clone, Debug)]
pub(super) struct Goal {
    /// `cpuSuppressThresholdPercent`; `None`: any.
    pub(super) percent: Option<i64>,
    /// The shards a NodeSLO may be labelled with (and not draining); `None`: unsharded, labels
    /// not looked at.
    pub(super) shards: Option<Vec<String>>,
    pub(super) scope: Scope,
    /// Also each of `shards` owns its share of the scope ([`share_tolerance`]).
    pub(super) fair_shares: bool,
}

impl Goal {
    pub(super) fn holds(&self, state: &SloState) -> bool {
        let percent = self.percent.is_none_or(|p| state.percent == Some(p));
        let shard = match &self.shards {
            None => true,
            Some(shards) => {
                !state.draining && state.shard.as_ref().is_some_and(|s| shards.contains(s))
            }
        };
        percent && shard
    }

    /// Whether `good` NodeSLOs of the scope holding it, `per_shard` of them by shard, reach it.
    pub(super) fn reached(&self, good: usize, per_shard: &HashMap<String, usize>) -> bool {
        let n = self.scope.size();
        if good < n {
            return false;
        }
        match (&self.shards, self.fair_shares) {
            (Some(shards), true) if !shards.is_empty() => {
                let fair = n / shards.len();
                let tolerance = share_tolerance(n, shards.len());
                shards.iter().all(|shard| {
                    let got = per_shard.get(shard).copied().unwrap_or(0);
                    got.abs_diff(fair) <= tolerance
                })
            }
            _ => true,
        }
    }
}

/// How far a shard's count may be from `n / shards`: 15 % (the sharding scenarios' bound), or
/// four standard deviations of a random split when that is wider (at tiny sizes).
pub(super) fn share_tolerance(n: usize, shards: usize) -> usize {
    let p = 1.0 / shards.max(1) as f64;
    let sigma = (n as f64 * p * (1.0 - p)).sqrt();
    let fair = n / shards.max(1);
    (fair * 15 / 100).max((4.0 * sigma).ceil() as usize)
}

/// What a tracker saw: when each goal was first reached, samples of the first goal's count, and
/// the shards' counts when the first goal was reached.
pub(super) struct Reached {
    pub(super) at: Vec<Instant>,
    pub(super) samples: Vec<(Instant, usize)>,
    pub(super) shares: BTreeMap<String, usize>,
}

/// A watch of NodeSLOs evaluating goals as events come, so a phase's end is seen when it
/// happens (no poll period in the figure), with one list and watch for every goal of a phase.
pub(super) struct Tracker {
    pub(super) handle: tokio::task::JoinHandle<Result<Reached>>,
}

/// The counts of one goal as events come.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) good: usize,
    pub(super) per_shard: HashMap<String, usize>,
    pub(super) at: Option<Instant>,
}

impl Progress {
    pub(super) fn add(&mut self, goal: &Goal, state: &SloState, sign: i64) {
        if !goal.holds(state) {
            return;
        }
        let step = |count: &mut usize| {
            *count = if sign > 0 {
                *count + 1
            } else {
                count.saturating_sub(1)
            }
        };
        step(&mut self.good);
        if let Some(shard) = &state.shard {
            step(self.per_shard.entry(shard.clone()).or_default());
        }
    }
}

impl Tracker {
    /// Starts the watch and returns once its first list is in, so what is done next is seen.
    pub(super) async fn start(client: kube::Client, goals: Vec<Goal>) -> Result<Self> {
        let (listed, ready) = tokio::sync::oneshot::channel();
        let handle = tokio::spawn(track(client, goals, listed));
        if ready.await.is_err() {
            // The task ended before its list: its error says why.
            return Err(match handle.await {
                Ok(Err(error)) => error,
                Ok(Ok(_)) => anyhow::anyhow!("the tracker ended before listing"),
                Err(error) => error.into(),
            });
        }
        Ok(Self { handle })
    }

    pub(super) async fn wait(self) -> Result<Reached> {
        self.handle.await.context("tracker task")?
    }
}

pub(super) async fn track(
    client: kube::Client,
    goals: Vec<Goal>,
    listed: tokio::sync::oneshot::Sender<()>,
) -> Result<Reached> {
    let api: Api<NodeSlo> = Api::all(client);
    let mut listed = Some(listed);
    let mut states: HashMap<String, SloState> = HashMap::new();
    let mut progress: Vec<Progress> = goals.iter().map(|_| Progress::default()).collect();
    let mut samples = crate::report::Samples::new(goals.first().map_or(1, |g| g.scope.size()));
    let mut shares = BTreeMap::new();
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if listed.is_none() && progress.iter().all(|p| p.at.is_some()) {
            break;
        }
        let next = tokio::time::timeout_at(deadline, events.next()).await;
        let Ok(next) = next else {
            let wanted: Vec<String> = goals
                .iter()
                .zip(&progress)
                .map(|(goal, p)| {
                    format!(
                        "{} of {} at {:?} on {:?} (per shard {:?})",
                        p.good,
                        goal.scope.size(),
                        goal.percent,
                        goal.shards,
                        p.per_shard
                    )
                })
                .collect();
            let unlike: Vec<_> = states
                .iter()
                .filter(|(name, state)| {
                    goals
                        .iter()
                        .any(|g| g.scope.contains(name) && !g.holds(state))
                })
                .take(3)
                .collect();
            bail!(
                "NodeSLOs not there within {TIMEOUT:?}: {}; e.g. {unlike:?}",
                wanted.join("; ")
            );
        };
        let Some(event) = next.transpose()? else {
            bail!("NodeSLO watch ended")
        };
        let (name, new) = match event {
            watcher::Event::Init => {
                states.clear();
                for p in &mut progress {
                    p.good = 0;
                    p.per_shard.clear();
                }
                continue;
            }
            watcher::Event::InitDone => {
                if let Some(listed) = listed.take() {
                    let _ = listed.send(());
                }
                // A goal over no NodeSLO at all (a shard that owned none) holds from the start.
                note_reached(&goals, &mut progress, &mut shares);
                continue;
            }
            watcher::Event::Apply(slo) | watcher::Event::InitApply(slo) => {
                let state = SloState::of(&slo);
                (slo.metadata.name.unwrap_or_default(), Some(state))
            }
            watcher::Event::Delete(slo) => (slo.metadata.name.unwrap_or_default(), None),
        };
        let old = match &new {
            Some(state) => states.insert(name.clone(), state.clone()),
            None => states.remove(&name),
        };
        for (index, (goal, p)) in goals.iter().zip(&mut progress).enumerate() {
            if !goal.scope.contains(&name) {
                continue;
            }
            let before = p.good;
            if let Some(old) = &old {
                p.add(goal, old, -1);
            }
            if let Some(new) = &new {
                p.add(goal, new, 1);
            }
            if index == 0 && p.good > before && p.at.is_none() {
                samples.record(p.good);
            }
        }
        note_reached(&goals, &mut progress, &mut shares);
    }
    Ok(Reached {
        at: progress.iter().filter_map(|p| p.at).collect(),
        samples: samples.points,
        shares,
    })
}

/// Marks the goals reached now, and keeps the shards' counts when the first one is.
pub(super) fn note_reached(
    goals: &[Goal],
    progress: &mut [Progress],
    shares: &mut BTreeMap<String, usize>,
) {
    let now = Instant::now();
    for (index, (goal, p)) in goals.iter().zip(progress.iter_mut()).enumerate() {
        if p.at.is_none() && goal.reached(p.good, &p.per_shard) {
            p.at = Some(now);
            if index == 0 {
                *shares = p.per_shard.iter().map(|(k, v)| (k.clone(), *v)).collect();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(percent: i64, shard: Option<&str>, draining: bool) -> SloState {
        SloState {
            percent: Some(percent),
            shard: shard.map(str::to_string),
            draining,
        }
    }

    #[test]
    fn a_goal_holds_for_the_value_on_a_live_shard_without_a_drain() {
        let goal = Goal {
            percent: Some(42),
            shards: Some(vec!["a".into(), "b".into()]),
            scope: Scope::All(2),
            fair_shares: false,
        };
        assert!(goal.holds(&state(42, Some("a"), false)));
        assert!(!goal.holds(&state(42, Some("a"), true)));
        assert!(!goal.holds(&state(42, Some("dead"), false)));
        assert!(!goal.holds(&state(42, None, false)));
        assert!(!goal.holds(&state(65, Some("b"), false)));
        let unsharded = Goal {
            shards: None,
            ..goal.clone()
        };
        assert!(unsharded.holds(&state(42, None, false)));
        let any_value = Goal {
            percent: None,
            ..goal
        };
        assert!(any_value.holds(&state(65, Some("b"), false)));
    }

    #[test]
    fn fair_shares_wait_for_every_shard_to_own_about_its_share() {
        let goal = Goal {
            percent: None,
            shards: Some(vec!["a".into(), "b".into()]),
            scope: Scope::All(10_000),
            fair_shares: true,
        };
        let shares = |a: usize, b: usize| HashMap::from([("a".into(), a), ("b".into(), b)]);
        assert!(goal.reached(10_000, &shares(5_100, 4_900)));
        assert!(!goal.reached(10_000, &shares(10_000, 0)));
        assert!(!goal.reached(9_999, &shares(5_000, 4_999)));
        // 15 % at scale, four sigmas of a random split at tiny sizes.
        assert_eq!(share_tolerance(50_000, 4), 1875);
        assert_eq!(share_tolerance(30, 2), 11);
        let scope = Scope::Except(Arc::new(HashSet::from(["x".to_string()])), 3);
        assert_eq!(scope.size(), 2);
        assert!(!scope.contains("x") && scope.contains("y"));
    }

    #[test]
    fn progress_follows_a_nodeslo_moving_between_shards() {
        let goal = Goal {
            percent: Some(1),
            shards: Some(vec!["a".into(), "b".into()]),
            scope: Scope::All(1),
            fair_shares: false,
        };
        let mut p = Progress::default();
        p.add(&goal, &state(1, Some("a"), false), 1);
        assert_eq!((p.good, p.per_shard["a"]), (1, 1));
        p.add(&goal, &state(1, Some("a"), false), -1);
        p.add(&goal, &state(1, Some("a"), true), 1);
        assert_eq!((p.good, p.per_shard["a"]), (0, 0));
    }
}
