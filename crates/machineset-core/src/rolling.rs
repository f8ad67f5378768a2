//! The arithmetic of a rolling update over a deployment's MachineSets (MCM's
//! `deployment_rolling.go`, Kubernetes' deployment controller): how far the new set may grow
//! and how far the old ones may shrink, given the Machines that are available.

use crate::Timestamp;
use crate::bounds::Bounds;

/// One MachineSet as the rolling arithmetic sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetCounts {
    pub name: String,
    pub created: Timestamp,
    /// `spec.replicas`.
    pub replicas: i32,
    /// Machines of the set that exist, Terminating included (MCM's `status.replicas`). A set
    /// scaled down still holds its surplus until the VM is gone, so growth is bounded by what
    /// exists too.
    pub existing: i32,
    /// Machines of the set available now (Running for `minReadySeconds`, not being deleted).
    ///
    /// **Decision:** counted from the Machines in the controller's cache, not read from the set's
    /// `status.availableReplicas` as MCM does: a set's status lags its Machines, and a stale
    /// count of an old set would let a second scale-down through before the first was seen.
    pub available: i32,
}

/// One set scaled to `replicas`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scale {
    pub name: String,
    pub replicas: i32,
}

fn total(sets: &[&SetCounts], field: impl Fn(&SetCounts) -> i32) -> i32 {
    sets.iter().map(|s| field(s)).sum()
}

/// The new set's replicas this pass (`NewMSNewReplicas`): grow while every set together stays
/// within `desired + maxSurge` (each set counted at its replicas or its existing Machines,
/// whichever is more), never past `desired`; a new set above `desired` comes down to it.
pub fn new_set_replicas(desired: i32, bounds: Bounds, new: &SetCounts, old: &[SetCounts]) -> i32 {
    if new.replicas >= desired {
        return desired.min(new.replicas);
    }
    let all: Vec<&SetCounts> = old.iter().chain(std::iter::once(new)).collect();
    // MCM sums `status.replicas` (the Machines that exist, Terminating included). **Decision:**
    // each set counts as the larger of that and `spec.replicas`, so a set just created (status 0)
    // is not raised a second time in the same pass (docs/machineset.md MD-6).
    let current = total(&all, |s| s.replicas.max(s.existing));
    let max_total = desired + bounds.max_surge;
    if current >= max_total {
        return new.replicas;
    }
    let scale_up = (max_total - current).min(desired - new.replicas);
    new.replicas + scale_up
}

/// Old sets scaled down this pass (`reconcileOldMachineSets`): first unhealthy Machines (replicas
/// beyond what is available) of the oldest sets, then available ones, never taking the
/// deployment below `desired - maxUnavailable` available Machines and never counting the new
/// set's unavailable ones as headroom.
pub fn old_sets_scale_down(
    desired: i32,
    bounds: Bounds,
    new: &SetCounts,
    old: &[SetCounts],
) -> Vec<Scale> {
    let mut old: Vec<SetCounts> = old.to_vec();
    old.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.name.cmp(&b.name)));
    if old.iter().all(|s| s.replicas == 0) {
        return Vec::new();
    }
    let min_available = desired - bounds.max_unavailable;
    let all_replicas: i32 = old.iter().map(|s| s.replicas).sum::<i32>() + new.replicas;
    let new_unavailable = (new.replicas - new.available).max(0);
    let max_scaled_down = all_replicas - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return Vec::new();
    }
    let mut targets: Vec<i32> = old.iter().map(|s| s.replicas).collect();

    // Unhealthy replicas go first: they cost no availability.
    let mut cleaned = 0;
    for (set, target) in old.iter().zip(targets.iter_mut()) {
        if cleaned >= max_scaled_down {
            break;
        }
        let unhealthy = (set.replicas - set.available).max(0);
        let take = unhealthy.min(max_scaled_down - cleaned);
        *target -= take;
        cleaned += take;
    }

    // Then available ones, down to the deployment's minimum available.
    let available: i32 = old.iter().map(|s| s.available.min(s.replicas)).sum::<i32>()
        + new.available.min(new.replicas);
    let mut to_scale_down = (available - min_available).max(0);
    for target in &mut targets {
        if to_scale_down == 0 {
            break;
        }
        // Which Machines go is the set's choice (unavailable ones first, `machines`).
        let take = (*target).min(to_scale_down);
        *target -= take;
        to_scale_down -= take;
    }

    old.iter()
        .zip(targets)
        .filter(|(set, target)| *target != set.replicas)
        .map(|(set, replicas)| Scale {
            name: set.name.clone(),
            replicas,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid")
    }

    fn set(name: &str, created: i64, replicas: i32, available: i32) -> SetCounts {
        SetCounts {
            name: name.into(),
            created: at(created),
            replicas,
            existing: replicas,
            available,
        }
    }

    fn scale(name: &str, replicas: i32) -> Scale {
        Scale {
            name: name.into(),
            replicas,
        }
    }

    const SURGE_1: Bounds = Bounds {
        max_surge: 1,
        max_unavailable: 0,
    };

    #[test]
    fn three_replicas_surge_one_unavailable_zero_steps_one_machine_at_a_time() {
        // Start: the old set holds 3 available Machines, the new set none.
        let old = [set("old", 0, 3, 3)];
        let new = set("new", 10, 0, 0);
        assert_eq!(new_set_replicas(3, SURGE_1, &new, &old), 1);
        // The new Machine is not available yet: nothing old may go.
        let new = set("new", 10, 1, 0);
        assert_eq!(old_sets_scale_down(3, SURGE_1, &new, &old), []);
        assert_eq!(new_set_replicas(3, SURGE_1, &new, &old), 1, "total is at 4");
        // Once it is available, one old Machine goes.
        let new = set("new", 10, 1, 1);
        assert_eq!(
            old_sets_scale_down(3, SURGE_1, &new, &old),
            [scale("old", 2)]
        );
        // And the new set grows by one again.
        let old = [set("old", 0, 2, 2)];
        assert_eq!(new_set_replicas(3, SURGE_1, &new, &old), 2);
    }

    #[test]
    fn unavailable_bound_lets_old_go_first() {
        let bounds = Bounds {
            max_surge: 0,
            max_unavailable: 1,
        };
        let old = [set("old", 0, 3, 3)];
        let new = set("new", 10, 0, 0);
        assert_eq!(new_set_replicas(3, bounds, &new, &old), 0);
        assert_eq!(
            old_sets_scale_down(3, bounds, &new, &old),
            [scale("old", 2)]
        );
        let old = [set("old", 0, 2, 2)];
        assert_eq!(new_set_replicas(3, bounds, &new, &old), 1);
    }

    #[test]
    fn unhealthy_old_machines_are_cleaned_up_before_available_ones() {
        // 10 desired, 25%/25% -> surge 3, unavailable 2. Old sets: one with 2 unhealthy.
        let bounds = Bounds {
            max_surge: 3,
            max_unavailable: 2,
        };
        let old = [set("older", 0, 4, 2), set("old", 5, 6, 6)];
        let new = set("new", 10, 3, 0);
        // all = 13, min available = 8, new unavailable = 3 -> at most 2 scaled down, both of
        // them the unhealthy ones of the oldest set; available is 8 = min, so no more.
        assert_eq!(
            old_sets_scale_down(10, bounds, &new, &old),
            [scale("older", 2)]
        );
    }

    #[test]
    fn an_old_set_still_holding_its_surplus_blocks_growth() {
        // Old scaled 3 -> 2 but its third Machine is not deleted yet: 3 + 1 exist already.
        let old = [SetCounts {
            existing: 3,
            ..set("old", 0, 2, 3)
        }];
        let new = set("new", 10, 1, 1);
        assert_eq!(new_set_replicas(3, SURGE_1, &new, &old), 1);
        let old = [set("old", 0, 2, 2)];
        assert_eq!(new_set_replicas(3, SURGE_1, &new, &old), 2);
    }

    #[test]
    fn a_new_set_above_desired_comes_down() {
        let new = set("new", 10, 5, 5);
        assert_eq!(new_set_replicas(3, SURGE_1, &new, &[]), 3);
    }

    #[test]
    fn plain_scale_up_of_a_finished_roll_reaches_desired_at_once() {
        let new = set("new", 10, 2, 2);
        assert_eq!(new_set_replicas(5, SURGE_1, &new, &[]), 5);
    }

    #[test]
    fn old_sets_at_zero_need_nothing() {
        let old = [set("old", 0, 0, 0)];
        let new = set("new", 10, 3, 3);
        assert_eq!(old_sets_scale_down(3, SURGE_1, &new, &old), []);
    }

    /// docs/machineset.md MD-5: replicas 5, maxSurge 2; old holds 4 Machines.
    #[test]
    fn md_5_new_set_growth() {
        let bounds = Bounds {
            max_surge: 2,
            max_unavailable: 0,
        };
        let old = [set("old", 0, 4, 4)];
        assert_eq!(new_set_replicas(5, bounds, &set("new", 1, 2, 2), &old), 3);
        assert_eq!(new_set_replicas(5, bounds, &set("new", 1, 3, 3), &old), 3);
    }

    /// MD-7: 3 replicas, surge 1, unavailable 0; the new Machine must be available before an
    /// old one goes, and an old one still Terminating holds the new set back.
    #[test]
    fn md_7_one_machine_at_a_time() {
        let old = [set("old", 0, 3, 3)];
        let new = set("new", 1, 1, 0);
        assert_eq!(new_set_replicas(3, SURGE_1, &new, &old), 1);
        assert_eq!(old_sets_scale_down(3, SURGE_1, &new, &old), []);
        let new = set("new", 1, 1, 1);
        assert_eq!(
            old_sets_scale_down(3, SURGE_1, &new, &old),
            [scale("old", 2)]
        );
        let terminating = [SetCounts {
            existing: 3,
            ..set("old", 0, 2, 2)
        }];
        assert_eq!(new_set_replicas(3, SURGE_1, &new, &terminating), 1);
    }

    /// MD-8: replicas 10, unavailable 2, surge 3; old 8, new 5 with none available.
    #[test]
    fn md_8_no_headroom_no_scale_down() {
        let bounds = Bounds {
            max_surge: 3,
            max_unavailable: 2,
        };
        let old = [set("old", 0, 8, 8)];
        assert_eq!(
            old_sets_scale_down(10, bounds, &set("new", 1, 5, 0), &old),
            []
        );
    }

    /// MD-9: unhealthy Machines of an old set go first: 5 with 3 available, budget 4 -> 3.
    #[test]
    fn md_9_cleanup_of_unhealthy() {
        let bounds = Bounds {
            max_surge: 1,
            max_unavailable: 1,
        };
        // desired 5: all 5 + new 3 = 8, min available 4, new unavailable 0 -> budget 4; the two
        // unhealthy go first; available 3 + 3 = 6 > 4 then takes 2 more.
        let old = [set("old", 0, 5, 3)];
        let new = set("new", 1, 3, 3);
        assert_eq!(
            old_sets_scale_down(5, bounds, &new, &old),
            [scale("old", 1)]
        );
        // With the new set's Machines not yet available the budget is what cleanup may take.
        let new = set("new", 1, 3, 0);
        assert_eq!(
            old_sets_scale_down(5, bounds, &new, &old),
            [scale("old", 4)]
        );
    }

    /// MD-11: scaled to 0, both sets go to 0.
    #[test]
    fn md_11_scale_to_zero() {
        let bounds = Bounds {
            max_surge: 1,
            max_unavailable: 0,
        };
        let old = [set("old", 0, 2, 2)];
        let new = set("new", 1, 2, 2);
        assert_eq!(new_set_replicas(0, bounds, &new, &old), 0);
        assert_eq!(
            old_sets_scale_down(0, bounds, &set("new", 1, 0, 0), &old),
            [scale("old", 0)]
        );
    }
}

/// One active set as proportional scaling sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaledSet {
    pub name: String,
    pub created: Timestamp,
    pub replicas: i32,
    /// Its `deployment.kubernetes.io/max-replicas` annotation, if it parses.
    pub max_replicas: Option<i32>,
}

/// Proportional scaling of a deployment's active sets when its replicas change mid-roll (MCM's
/// `scale`): every active set grows or shrinks in proportion to its share of the last
/// `replicas + maxSurge` it was scaled for, so a roll keeps its ratio. `fallback` stands for a
/// missing `max-replicas` annotation (MCM uses the deployment's `status.replicas`). The leftover of
/// the rounding goes to the first set in the order (largest first; newer first when growing, older
/// first when shrinking), never below 0.
pub fn proportional(desired: i32, max_surge: i32, fallback: i32, sets: &[ScaledSet]) -> Vec<Scale> {
    let allowed = if desired == 0 { 0 } else { desired + max_surge };
    let current: i32 = sets.iter().map(|s| s.replicas).sum();
    let to_add = allowed - current;
    if to_add == 0 || sets.is_empty() {
        return Vec::new();
    }
    let mut order: Vec<&ScaledSet> = sets.iter().collect();
    order.sort_by(|a, b| {
        let by_age = if to_add > 0 {
            b.created.cmp(&a.created)
        } else {
            a.created.cmp(&b.created)
        };
        b.replicas
            .cmp(&a.replicas)
            .then(by_age)
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut added = 0;
    let mut targets: Vec<(String, i32, i32)> = Vec::new();
    for set in &order {
        let fraction = if desired == 0 {
            -set.replicas
        } else {
            let of = set
                .max_replicas
                .filter(|m| *m > 0)
                .unwrap_or(fallback.max(1));
            let scaled = f64::from(set.replicas) * f64::from(desired + max_surge) / f64::from(of);
            // Go's math.Round: halves away from zero.
            (scaled.round() as i32) - set.replicas
        };
        let left = to_add - added;
        let proportion = if to_add > 0 {
            fraction.min(left)
        } else {
            fraction.max(left)
        };
        added += proportion;
        targets.push((set.name.clone(), set.replicas, set.replicas + proportion));
    }
    if let Some(first) = targets.first_mut() {
        first.2 = (first.2 + to_add - added).max(0);
    }
    targets
        .into_iter()
        .filter(|(_, from, to)| from != to)
        .map(|(name, _, replicas)| Scale { name, replicas })
        .collect()
}

#[cfg(test)]
mod proportional_tests {
    use super::*;

    fn set(name: &str, created: i64, replicas: i32, max: Option<i32>) -> ScaledSet {
        ScaledSet {
            name: name.into(),
            created: Timestamp::from_second(created).expect("valid"),
            replicas,
            max_replicas: max,
        }
    }

    /// docs/machineset.md MD-10: 10 -> 20 with maxSurge 3, old 8 and new 5 both at max 13.
    #[test]
    fn md_10_proportional_scale_up() {
        let sets = [set("old", 0, 8, Some(13)), set("new", 1, 5, Some(13))];
        let scaled = proportional(20, 3, 13, &sets);
        let got: Vec<(&str, i32)> = scaled
            .iter()
            .map(|s| (s.name.as_str(), s.replicas))
            .collect();
        assert_eq!(got, [("old", 14), ("new", 9)]);
    }

    /// MD-11: to 0, every set goes to 0.
    #[test]
    fn md_11_proportional_scale_to_zero() {
        let sets = [set("old", 0, 8, Some(13)), set("new", 1, 5, Some(13))];
        let scaled = proportional(0, 3, 13, &sets);
        assert!(scaled.iter().all(|s| s.replicas == 0) && scaled.len() == 2);
    }

    #[test]
    fn scaling_down_takes_from_the_older_on_ties_and_never_goes_negative() {
        // 10 -> 4 (surge 1): allowed 5, current 10 (5 + 5, max 11 each).
        let sets = [set("old", 0, 5, Some(11)), set("new", 1, 5, Some(11))];
        let scaled = proportional(4, 1, 11, &sets);
        let total: i32 = scaled.iter().map(|s| s.replicas).sum();
        assert_eq!(total, 5);
        assert!(scaled.iter().all(|s| s.replicas >= 0));
        // Nothing to do when the sets already add up.
        assert!(proportional(4, 1, 5, &[set("a", 0, 3, None), set("b", 1, 2, None)]).is_empty());
    }
}
