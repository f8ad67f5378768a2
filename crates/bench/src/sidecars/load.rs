//! The load of one case: `concurrency` tasks issuing one method's unary calls back to back over
//! one HTTP/2 connection, bounded in time and count. Only calls that succeed count as throughput
//! and latency; failed calls are counted apart (with the first error), never as work done.

use std::time::{Duration, Instant};

use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_proto::router::{SliceGwConContext, VerifyRouteAddRequest};
use capstan_proto::sidecar::gw_sidecar_service_client::GwSidecarServiceClient;
use tonic::Status;
use tonic::transport::Channel;

use crate::report::{median, median_value};

/// The measured methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    GetStatus,
    GetRouteInKernel,
    UpdateSliceGwConnectionContext,
}

impl Method {
    pub const ALL: [Method; 3] = [
        Method::GetStatus,
        Method::GetRouteInKernel,
        Method::UpdateSliceGwConnectionContext,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::GetStatus => "GetStatus",
            Method::GetRouteInKernel => "GetRouteInKernel",
            Method::UpdateSliceGwConnectionContext => "UpdateSliceGwConnectionContext",
        }
    }
}

/// How long and how much one case runs.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub duration: Duration,
    pub warmup: Duration,
    /// Upper bound of calls per case, whatever the duration.
    pub max_requests: usize,
}

/// Throughput and latency of the calls that succeeded in one run, and the calls that failed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measurement {
    /// Calls answered with OK.
    pub ok: usize,
    /// Calls answered with an error status (not in `requests_per_sec` nor the latencies).
    pub failed: usize,
    /// The first failure's status, to say why.
    pub first_error: Option<String>,
    pub requests_per_sec: f64,
    pub p50: Duration,
    pub p99: Duration,
}

impl Measurement {
    /// Rounds of one case as one measurement: the median rate and latencies (a burst of host
    /// noise moves one round, not the figure), every call counted, the first error kept.
    pub fn median_of(rounds: &[Measurement]) -> Measurement {
        let durations =
            |of: fn(&Measurement) -> Duration| -> Vec<Duration> { rounds.iter().map(of).collect() };
        let rates: Vec<f64> = rounds.iter().map(|r| r.requests_per_sec).collect();
        Measurement {
            ok: rounds.iter().map(|r| r.ok).sum(),
            failed: rounds.iter().map(|r| r.failed).sum(),
            first_error: rounds.iter().find_map(|r| r.first_error.clone()),
            requests_per_sec: median_value(&rates),
            p50: median(&durations(|r| r.p50)),
            p99: median(&durations(|r| r.p99)),
        }
    }
}

/// Alternating next-hop sets for one remote subnet, so that every update really replaces one
/// kernel route and the table never grows.
pub fn context(i: usize) -> SliceGwConContext {
    let hops = if i.is_multiple_of(2) {
        vec!["10.1.1.2".to_owned(), "10.1.1.3".to_owned()]
    } else {
        vec!["10.1.1.2".to_owned()]
    };
    SliceGwConContext {
        remote_slice_gw_nsm_subnet: "10.2.0.0/16".into(),
        local_nsm_gw_peer_ip_list: hops,
        ..Default::default()
    }
}

async fn one_call(method: Method, channel: &Channel, i: usize) -> Result<(), Status> {
    match method {
        Method::GetStatus => {
            GwSidecarServiceClient::new(channel.clone())
                .get_status(())
                .await?;
        }
        Method::GetRouteInKernel => {
            let request = VerifyRouteAddRequest {
                dst_ip: "10.2.0.0/16".into(),
                nsm_ip: "10.1.1.2".into(),
            };
            SliceRouterSidecarServiceClient::new(channel.clone())
                .get_route_in_kernel(request)
                .await?;
        }
        Method::UpdateSliceGwConnectionContext => {
            SliceRouterSidecarServiceClient::new(channel.clone())
                .update_slice_gw_connection_context(context(i))
                .await?;
        }
    }
    Ok(())
}

/// What one worker task saw.
#[derive(Default)]
struct WorkerTally {
    latencies: Vec<Duration>,
    failed: usize,
    first_error: Option<String>,
}

pub async fn measure(
    method: Method,
    concurrency: usize,
    channel: Channel,
    bounds: Bounds,
) -> Measurement {
    let concurrency = concurrency.max(1);
    // Warm-up: connections, allocator, caches.
    let warmup_end = Instant::now() + bounds.warmup;
    let mut i = 0;
    while Instant::now() < warmup_end && i < bounds.max_requests {
        let _ = one_call(method, &channel, i).await;
        i += 1;
    }

    let per_worker = bounds.max_requests.div_ceil(concurrency);
    let start = Instant::now();
    let end = start + bounds.duration;
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..concurrency {
        let channel = channel.clone();
        workers.spawn(async move {
            let mut tally = WorkerTally::default();
            let mut n = 0;
            while n < per_worker && Instant::now() < end {
                let started = Instant::now();
                match one_call(method, &channel, worker + n).await {
                    Ok(()) => tally.latencies.push(started.elapsed()),
                    Err(status) => {
                        tally.failed += 1;
                        tally.first_error.get_or_insert_with(|| {
                            format!("{:?}: {}", status.code(), status.message())
                        });
                    }
                }
                n += 1;
            }
            tally
        });
    }
    let mut all = WorkerTally::default();
    while let Some(joined) = workers.join_next().await {
        // A worker cannot panic short of a bug in tonic; count its loss rather than hide it.
        let Ok(mut tally) = joined else {
            all.failed += 1;
            continue;
        };
        all.latencies.append(&mut tally.latencies);
        all.failed += tally.failed;
        if all.first_error.is_none() {
            all.first_error = tally.first_error;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.latencies.sort_unstable();
    let ok = all.latencies.len();
    Measurement {
        ok,
        failed: all.failed,
        first_error: all.first_error,
        requests_per_sec: if elapsed > 0.0 {
            ok as f64 / elapsed
        } else {
            0.0
        },
        p50: percentile(&all.latencies, 50),
        p99: percentile(&all.latencies, 99),
    }
}

/// The `pct`-th percentile of sorted samples (nearest rank).
fn percentile(sorted: &[Duration], pct: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (pct * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_combine_into_medians_and_sums() {
        let round = |rate: f64, ms: u64, failed: usize, error: Option<&str>| Measurement {
            ok: 10,
            failed,
            first_error: error.map(String::from),
            requests_per_sec: rate,
            p50: Duration::from_millis(ms),
            p99: Duration::from_millis(ms * 10),
        };
        let combined = Measurement::median_of(&[
            round(100.0, 3, 0, None),
            round(900.0, 1, 2, Some("unavailable")),
            round(300.0, 2, 1, Some("later")),
        ]);
        assert_eq!(
            combined.requests_per_sec, 300.0,
            "a burst moves one round only"
        );
        assert_eq!(combined.p50, Duration::from_millis(2));
        assert_eq!(combined.p99, Duration::from_millis(20));
        assert_eq!((combined.ok, combined.failed), (30, 3));
        assert_eq!(combined.first_error.as_deref(), Some("unavailable"));
        assert_eq!(Measurement::median_of(&[]), Measurement::default());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50), Duration::from_millis(50));
        assert_eq!(percentile(&samples, 99), Duration::from_millis(99));
        assert_eq!(percentile(&samples[..1], 99), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }
}
