//! When to look again at a condition that only a gRPC probe notices (a new gateway's sidecar
//! answering, a route present): every `base` while the wait is younger than `dense`, then on a
//! ladder of `dense`, 2·`dense`, 4·`dense`, ... after the wait began, the rungs at most `max`
//! apart. The dense start is where the answer usually comes: a new sidecar binds its port a few
//! milliseconds after its pod runs, and a ladder doubling from `base` noticed one bound at 9 ms
//! only at 16 ms (the floor the bench compares with probes every `base`). Watch events start
//! passes of their own meanwhile, and those probe too, but they do not climb the ladder: with a
//! per-attempt backoff, the events of a pod coming up used the short pauses, and the sidecar,
//! bound a few milliseconds later, was noticed only at the next long one.
//!
//! An object deleted while it waits is never reset; its entry goes in a sweep once it has not
//! been probed for [`IDLE_RUNGS`] rungs of `max`, since a waiting object is probed at least every
//! `max`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use capstan_runtime::sync::lock;

/// A wait not probed for this many `max` rungs has ended unseen (its object was deleted).
pub const IDLE_RUNGS: u32 = 10;

/// Sweeps start once this many objects wait, then each time the count doubles.
const FIRST_SWEEP: usize = 64;

/// The rungs of a wait: every `base` up to `dense`, then doubling, at most `max` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rungs {
    pub base: Duration,
    pub dense: Duration,
    pub max: Duration,
}

/// The pause from `elapsed` (time since the wait began) to the ladder's next rung.
/// Computed, not stepped: a wait may last the whole step timeout, and every pass asks.
pub fn delay_after(rungs: Rungs, elapsed: Duration) -> Duration {
    let base = rungs.base.max(Duration::from_micros(1));
    let spacing = rungs.max.max(base);
    // Every `base` while the wait is young ...
    let dense = rungs.dense.max(base);
    if elapsed < dense {
        let next = (elapsed.as_nanos() / base.as_nanos() + 1) * base.as_nanos();
        let rung = u64::try_from(next)
            .map_or(dense, Duration::from_nanos)
            .min(dense);
        return rung - elapsed;
    }
    // ... then doubling from `dense` while the step is below `max` ...
    let mut rung = dense;
    while rung < spacing && rung <= elapsed {
        rung += rung;
    }
    // ... then `max` apart: the first of those rungs after `elapsed`.
    if rung <= elapsed {
        let steps = (elapsed - rung).as_nanos() / spacing.as_nanos() + 1;
        let ahead = u32::try_from(steps).map_or(Duration::MAX, |n| spacing.saturating_mul(n));
        rung = rung.saturating_add(ahead);
    }
    rung.saturating_sub(elapsed)
}

/// One object's current wait.
#[derive(Debug, Clone, Copy)]
struct Wait {
    /// What it waits for: another condition is another wait, its ladder from the start.
    on: &'static str,
    since: Instant,
    /// The last time it was asked for: the sweep's measure of a wait that ended unseen.
    last: Instant,
}

#[derive(Debug)]
struct Waits {
    by_key: HashMap<String, Wait>,
    /// The count of waits at which the next sweep runs.
    sweep_at: usize,
}

/// The probe ladders of the objects waiting on a probe, by key.
#[derive(Debug)]
pub struct ProbeLadder {
    rungs: Rungs,
    waits: Mutex<Waits>,
}

impl ProbeLadder {
    pub fn new(rungs: Rungs) -> Self {
        Self {
            rungs,
            waits: Mutex::new(Waits {
                by_key: HashMap::new(),
                sweep_at: FIRST_SWEEP,
            }),
        }
    }

    /// The pause before the next timed probe of `key`, waiting for `on` at `now`.
    pub fn next_delay(&self, key: &str, on: &'static str, now: Instant) -> Duration {
        let since = {
            let mut waits = lock(&self.waits);
            if !waits.by_key.contains_key(key) && waits.by_key.len() >= waits.sweep_at {
                let idle = self.rungs.max * IDLE_RUNGS;
                waits
                    .by_key
                    .retain(|_, w| now.saturating_duration_since(w.last) < idle);
                waits.sweep_at = (waits.by_key.len() * 2).max(FIRST_SWEEP);
            }
            let fresh = Wait {
                on,
                since: now,
                last: now,
            };
            let wait = waits.by_key.entry(key.to_owned()).or_insert(fresh);
            if wait.on != on {
                *wait = fresh;
            }
            wait.last = now;
            wait.since
        };
        delay_after(self.rungs, now.saturating_duration_since(since))
    }

    /// `key` waits for nothing any more (it progressed, or waits for a watch event or a time).
    pub fn reset(&self, key: &str) {
        lock(&self.waits).by_key.remove(key);
    }

    /// How many objects are waiting.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.waits).by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn rungs(base: u64, dense: u64, max: u64) -> Rungs {
        Rungs {
            base: ms(base),
            dense: ms(dense),
            max: ms(max),
        }
    }

    /// The ladder the tests below climb: every 2 ms up to 8 ms, then doubling up to 1 s apart.
    const LADDER: Rungs = Rungs {
        base: Duration::from_millis(2),
        dense: Duration::from_millis(8),
        max: Duration::from_millis(1000),
    };

    /// Each `(elapsed, pause)`: at `elapsed` ms into a wait on `rungs`, the next rung is `pause`
    /// ms away.
    fn assert_pauses(rungs: Rungs, table: &[(u64, u64)]) {
        for &(elapsed, pause) in table {
            assert_eq!(
                delay_after(rungs, ms(elapsed)),
                ms(pause),
                "{elapsed} ms into a wait on {rungs:?}"
            );
        }
    }

    #[test]
    fn rungs_double_from_base_then_stay_max_apart() {
        // No dense start (dense = base): 2, 4, 8, ..., 128, then 100 apart: 228, 328, ...;
        // on a rung, the pause is to the next one; an hour in, rungs still fall on
        // 128 ms + k * 100 ms.
        let table = [
            (0, 2),
            (1, 1),
            (2, 2),
            (5, 3),
            (64, 64),
            (128, 100),
            (300, 28),
        ];
        assert_pauses(rungs(2, 2, 100), &table);
        assert_pauses(rungs(2, 2, 100), &[(3_600_000, 28)]);
        // `max` below `base`: `base` apart from the start.
        assert_pauses(rungs(10, 0, 1), &[(25, 5)]);
    }

    #[test]
    fn a_young_wait_is_probed_every_base_then_the_ladder_doubles_from_dense() {
        // 2, 4, 6, ..., 32: a sidecar bound at 9 ms is seen at 10, not at 16. Then 64, 128, ...,
        // 1024, then 1 s apart (an hour in: on 1024 ms + k * 1 s).
        let table = [
            (0, 2),
            (9, 1),
            (10, 2),
            (31, 1),
            (32, 32),
            (40, 24),
            (600, 424),
        ];
        assert_pauses(rungs(2, 32, 1000), &table);
        assert_pauses(rungs(2, 32, 1000), &[(1024, 1000), (3_600_000, 24)]);
    }

    #[test]
    fn passes_between_rungs_do_not_climb_the_ladder() {
        let ladder = ProbeLadder::new(LADDER);
        let start = Instant::now();
        assert_eq!(ladder.next_delay("cr", "new_nsm_ip", start), ms(2));
        // Three watch events within the first millisecond: each is told the same first rung.
        for _ in 0..3 {
            assert_eq!(ladder.next_delay("cr", "new_nsm_ip", start + ms(1)), ms(1));
        }
        assert_eq!(ladder.next_delay("cr", "new_nsm_ip", start + ms(9)), ms(7));
    }

    #[test]
    fn a_new_condition_or_a_reset_starts_a_new_ladder() {
        let ladder = ProbeLadder::new(LADDER);
        let start = Instant::now();
        ladder.next_delay("cr", "new_deployment_present", start);
        assert_eq!(ladder.next_delay("cr", "new_nsm_ip", start + ms(50)), ms(2));
        ladder.reset("cr");
        assert_eq!(ladder.next_delay("cr", "new_nsm_ip", start + ms(90)), ms(2));
        // Other objects have ladders of their own.
        assert_eq!(
            ladder.next_delay("other", "new_nsm_ip", start + ms(91)),
            ms(2)
        );
    }

    #[test]
    fn waits_of_objects_gone_unseen_are_swept_and_live_ones_kept() {
        let ladder = ProbeLadder::new(LADDER);
        let start = Instant::now();
        ladder.next_delay("alive", "route_via_new", start);
        for i in 1..FIRST_SWEEP {
            ladder.next_delay(&format!("deleted-{i}"), "new_nsm_ip", start);
        }
        // "alive" keeps being probed, at least once per `max`; the others are never asked again.
        for second in 1..=11 {
            ladder.next_delay("alive", "route_via_new", start + ms(1000 * second));
        }
        assert_eq!(ladder.len(), FIRST_SWEEP, "no sweep before a new key");
        ladder.next_delay("new", "new_nsm_ip", start + ms(11_000));
        assert_eq!(
            ladder.len(),
            2,
            "only the live waits and the new one remain"
        );
        assert_eq!(
            ladder.next_delay("alive", "route_via_new", start + ms(11_500)),
            delay_after(LADDER, ms(11_500)),
            "a kept wait keeps its ladder"
        );
    }
}
