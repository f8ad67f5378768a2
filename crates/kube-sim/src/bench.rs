//! A benchmark of the spec's performance targets, for `cargo xtask bench kube-sim`: creates per
//! second through kube-rs, a full list of many small objects, and watch fan-out (every watcher
//! sees every write). Request accounting provides the request counts.

use crate::{Config, KubeSim};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use std::fmt;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Objects created, then listed.
    pub objects: usize,
    /// Concurrent writers.
    pub writers: usize,
    /// Watchers that must each see every write of the fan-out phase.
    pub watchers: usize,
    /// Writes during the fan-out phase.
    pub fanout_writes: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            objects: 10_000,
            writers: 8,
            watchers: 20,
            fanout_writes: 5_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Sim(#[from] crate::Error),
    #[error("kube client: {0}")]
    Kube(#[from] kube::Error),
    #[error("a watcher ended early after {0} events")]
    WatchEnded(usize),
}

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub options: BenchOptions,
    pub create_elapsed: Duration,
    pub list_elapsed: Duration,
    pub listed: usize,
    pub fanout_elapsed: Duration,
    /// Requests the server answered during the whole run (from request accounting).
    pub requests: u64,
}

impl BenchReport {
    pub fn creates_per_sec(&self) -> f64 {
        self.options.objects as f64 / self.create_elapsed.as_secs_f64().max(f64::EPSILON)
    }

    pub fn fanout_writes_per_sec(&self) -> f64 {
        self.options.fanout_writes as f64 / self.fanout_elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        writeln!(f, "kube-sim benchmark")?;
        writeln!(
            f,
            "  create {} ConfigMaps ({} writers): {:.2?} ({:.0}/s, {:.1?} per create per writer)",
            o.objects,
            o.writers,
            self.create_elapsed,
            self.creates_per_sec(),
            self.create_elapsed * o.writers as u32 / o.objects.max(1) as u32
        )?;
        writeln!(
            f,
            "  list {} objects: {:.2?} (target: well under 1 s for 10,000)",
            self.listed, self.list_elapsed
        )?;
        writeln!(
            f,
            "  watch fan-out: {} writes seen by each of {} watchers in {:.2?} ({:.0} writes/s; target 5,000/s)",
            o.fanout_writes,
            o.watchers,
            self.fanout_elapsed,
            self.fanout_writes_per_sec()
        )?;
        write!(f, "  requests answered: {}", self.requests)
    }
}

fn configmap(name: String) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"bench": "1"}},
        "data": {"k": "v"}}))
    .unwrap_or_default()
}

async fn create_many(
    api: &Api<ConfigMap>,
    prefix: &str,
    n: usize,
    writers: usize,
) -> Result<(), kube::Error> {
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let name = format!("{prefix}-{i}");
            async move { api.create(&PostParams::default(), &configmap(name)).await }
        })
        .buffer_unordered(writers.max(1))
        .try_for_each(|_| async { Ok(()) })
        .await
}

/// Runs the benchmark against a fresh in-process server.
pub async fn run(options: BenchOptions) -> Result<BenchReport, BenchError> {
    let sim = KubeSim::start(Config {
        history_size: options.fanout_writes.max(10_000) * 2,
        ..Config::default()
    })
    .await?;
    let client = sim.client()?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    let started = Instant::now();
    create_many(&api, "obj", options.objects, options.writers).await?;
    let create_elapsed = started.elapsed();

    let started = Instant::now();
    let list = api.list(&ListParams::default()).await?;
    let list_elapsed = started.elapsed();
    let rv = list.metadata.resource_version.unwrap_or_default();

    let mut watchers = Vec::new();
    for _ in 0..options.watchers {
        let stream = api.watch(&WatchParams::default(), &rv).await?;
        let want = options.fanout_writes;
        watchers.push(tokio::spawn(async move {
            futures::pin_mut!(stream);
            let mut seen = 0;
            while seen < want {
                match stream.next().await {
                    Some(Ok(WatchEvent::Added(_))) => seen += 1,
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => return Err(BenchError::WatchEnded(seen)),
                }
            }
            Ok(())
        }));
    }
    let started = Instant::now();
    create_many(&api, "fan", options.fanout_writes, options.writers).await?;
    for w in watchers {
        w.await.map_err(|_| BenchError::WatchEnded(0))??;
    }
    let fanout_elapsed = started.elapsed();
    let requests = sim.requests().total();
    sim.shutdown().await;
    Ok(BenchReport {
        listed: list.items.len(),
        options,
        create_elapsed,
        list_elapsed,
        fanout_elapsed,
        requests,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_small_run_reports_every_phase() {
        let report = run(BenchOptions {
            objects: 50,
            writers: 4,
            watchers: 3,
            fanout_writes: 40,
        })
        .await
        .expect("bench runs");
        assert_eq!(report.listed, 50);
        // 50 + 40 creates, 1 list, 3 watches.
        assert_eq!(report.requests, 94);
        let text = report.to_string();
        assert!(text.contains("list 50 objects"), "{text}");
    }

    /// The full-size run, by hand: `cargo test -p kube-sim --release --lib bench -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "takes tens of seconds; a benchmark, not a test"]
    async fn full_size() {
        let report = run(BenchOptions::default()).await.expect("bench runs");
        println!("{report}");
        assert_eq!(report.listed, 10_000);
    }
}
