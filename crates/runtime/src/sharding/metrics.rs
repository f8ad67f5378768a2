//! Sharding's metric families, for a binary to register once and hand to its sharder and its
//! shard side ([`super::release_object`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::lease::Membership;
use super::{RingName, ShardState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RingLabels {
    pub ring: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    pub ring: String,
    pub shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub ring: String,
    pub state: &'static str,
}

crate::metric_families! {
    #[derive(Clone, Debug, Default)]
    pub struct ShardingMetrics {
        /// Objects carrying each shard's label, as of the sharder's last pass over its cache
        objects: Family<ShardLabels, Gauge> = "capstan_sharding_objects",
        /// Shards by Lease state (ready, expired, uncertain, dead, orphaned), as the sharder
        /// sees them
        shards: Family<StateLabels, Gauge> = "capstan_sharding_shards",
        /// Unowned objects the sharder gave a shard
        assignments: Family<RingLabels, Counter> = "capstan_sharding_assignments",
        /// Handovers started: drain labels the sharder added to objects of a live shard
        drains_started: Family<RingLabels, Counter> = "capstan_sharding_drains_started",
        /// Handovers completed: drained objects a shard released
        drains_completed: Family<RingLabels, Counter> = "capstan_sharding_drains_completed",
        /// Objects of a dead shard (released, confirmed dead, or without a Lease) given to
        /// another shard directly
        dead_reassignments: Family<RingLabels, Counter> = "capstan_sharding_dead_reassignments",
        /// Leases of shards the sharder acquired to confirm their death
        deaths_confirmed: Family<RingLabels, Counter> = "capstan_sharding_deaths_confirmed",
        /// Reconciles a shard skipped because the object was not (or no longer) its own
        reconciles_refused: Family<ShardLabels, Counter> = "capstan_sharding_reconciles_refused",
    }
}

fn ring_labels(ring: &RingName) -> RingLabels {
    RingLabels {
        ring: ring.as_str().to_owned(),
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl ShardingMetrics {
    pub fn assigned(&self, ring: &RingName) {
        self.assignments.get_or_create(&ring_labels(ring)).inc();
    }

    pub fn drain_started(&self, ring: &RingName) {
        self.drains_started.get_or_create(&ring_labels(ring)).inc();
    }

    pub fn drain_completed(&self, ring: &RingName) {
        self.drains_completed
            .get_or_create(&ring_labels(ring))
            .inc();
    }

    pub fn dead_reassigned(&self, ring: &RingName) {
        self.dead_reassignments
            .get_or_create(&ring_labels(ring))
            .inc();
    }

    pub fn death_confirmed(&self, ring: &RingName) {
        self.deaths_confirmed
            .get_or_create(&ring_labels(ring))
            .inc();
    }

    pub fn reconcile_refused(&self, ring: &RingName, shard: &str) {
        self.reconciles_refused
            .get_or_create(&ShardLabels {
                ring: ring.as_str().to_owned(),
                shard: shard.to_owned(),
            })
            .inc();
    }

    /// The objects per shard, replacing the last pass's (a shard gone since has no series).
    pub fn set_objects<'a, I>(&self, ring: &RingName, counts: I)
    where
        I: IntoIterator<Item = (&'a str, usize)>,
    {
        self.objects.clear();
        for (shard, count) in counts {
            self.objects
                .get_or_create(&ShardLabels {
                    ring: ring.as_str().to_owned(),
                    shard: shard.to_owned(),
                })
                .set(gauge_value(count));
        }
    }

    pub fn set_shards(&self, ring: &RingName, membership: &Membership) {
        for state in ShardState::ALL {
            let count = membership.shards().filter(|(_, s)| *s == state).count();
            self.shards
                .get_or_create(&StateLabels {
                    ring: ring.as_str().to_owned(),
                    state: state.as_str(),
                })
                .set(gauge_value(count));
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn the_families_are_exported_under_their_names() {
        let mut registry = Registry::default();
        let metrics = ShardingMetrics::register(&mut registry);
        let ring = RingName::new("nodeslo").expect("valid");
        metrics.drain_started(&ring);
        metrics.reconcile_refused(&ring, "a");
        metrics.set_objects(&ring, [("a", 3)]);
        metrics.set_shards(
            &ring,
            &Membership::from_states([("a".to_owned(), ShardState::Ready)]),
        );
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        for line in [
            r#"capstan_sharding_drains_started_total{ring="nodeslo"} 1"#,
            r#"capstan_sharding_objects{ring="nodeslo",shard="a"} 3"#,
            r#"capstan_sharding_reconciles_refused_total{ring="nodeslo",shard="a"} 1"#,
            r#"capstan_sharding_shards{ring="nodeslo",state="ready"} 1"#,
            r#"capstan_sharding_shards{ring="nodeslo",state="dead"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
