//! Recycler metrics: state transitions by from/to, recycle duration, recycles by outcome.

use capstan_apis::worker::WorkerSliceGwRecycler;
use gw_recycler_core::{State, Timestamp};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    from: String,
    to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

capstan_runtime::metric_families! {
    #[derive(Clone)]
    pub struct RecyclerMetrics {
        /// Recycler state transitions written, by from/to state
        transitions: Family<TransitionLabels, Counter> = "capstan_gw_recycler_transitions",
        /// Recycles finished, by outcome (end, error)
        outcomes: Family<OutcomeLabels, Counter> = "capstan_gw_recycler_recycles",
        /// Time from a recycle's creation to its end or error state
        duration: Histogram = "capstan_gw_recycler_recycle_duration" in Seconds
            // 0.25 s .. ~17 min
            => Histogram::new(exponential_buckets(0.25, 2.0, 13)),
    }
}

impl RecyclerMetrics {
    pub fn transition(&self, from: &State, to: &State) {
        self.transitions
            .get_or_create(&TransitionLabels {
                from: from.to_string(),
                to: to.to_string(),
            })
            .inc();
    }

    pub fn finished(&self, cr: &WorkerSliceGwRecycler, outcome: &str, now: Timestamp) {
        self.outcomes
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
        if let Some(created) = &cr.metadata.creation_timestamp {
            let seconds = now.duration_since(created.0).as_secs_f64();
            self.duration.observe(seconds.max(0.0));
        }
    }
}
