//! kube-sim's cost per request, against a floor served by the same HTTP stack in the same run.
//!
//! The floor is an axum server on loopback that answers each request with kube-sim's own response
//! bytes (captured in the same run), driven by the same typed kube-rs calls, so `kube-sim / floor`
//! is what the API-server logic (validation, storage, resourceVersions, serialization) adds to
//! transport and client costs.
//! Reported: creates/s, a list of N objects, watch fan-out to W watchers under a write rate,
//! resident memory per stored object, and creates/s with `--data-dir` against the in-memory rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use crate::cluster::for_each_concurrent;
use crate::report::{Report, median};

#[derive(clap::Args)]
pub struct Args {
    /// Objects created and listed.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Concurrent creates.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Watchers for the fan-out measurement.
    #[arg(long, default_value_t = 20)]
    watchers: usize,
    /// Target write rate during fan-out (writes/s).
    #[arg(long, default_value_t = 5_000)]
    write_rate: u64,
    /// Seconds of writes during fan-out.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
}

pub async fn run(args: &Args) -> Result<Report> {
    let n = args.objects;
    let mut report = Report::new(format!(
        "kube-sim, {n} ConfigMaps, concurrency {}",
        args.concurrency
    ));

    // Memory first, in a fresh process (this binary re-executed): nothing else has allocated
    // there, so no memory freed earlier is reused and flatters the figure.
    let memory = memory_in_fresh_process(n, args.concurrency).await?;

    let sim = kube_sim::KubeSim::start(config()).await?;
    let client = sim.client()?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // A warm-up batch of creates, untimed: it gives the floor the bytes of a created object.
    let mut ranges = batches(n, CREATE_TURNS + 1);
    let warm_up = ranges.remove(0);
    create_config_maps(&api, warm_up.clone(), args.concurrency).await?;

    // Floor: axum on loopback answering the same requests with kube-sim's own response bytes (one
    // created object, the list), driven by the same typed calls: what is left is kube-sim's work
    // between reading a request and writing its response. kube-sim and the floor take turns, batch
    // by batch and list by list, so a machine that speeds up or slows down during the run moves
    // both figures alike; each is the median of its turns.
    let one = raw_get(
        &client,
        &format!(
            "/api/v1/namespaces/default/configmaps/{}",
            config_map_name(warm_up.start)
        ),
    )
    .await?;
    let create_floor = Floor::start(one.clone(), bytes::Bytes::new()).await?;
    let floor_api: Api<ConfigMap> = Api::namespaced(create_floor.client()?, "default");
    let (mut creates, mut floor_creates) = (Vec::new(), Vec::new());
    for range in ranges {
        let per_item = |took: Duration| took / u32::try_from(range.len().max(1)).unwrap_or(1);
        creates.push(per_item(
            timed(create_config_maps(&api, range.clone(), args.concurrency)).await?,
        ));
        floor_creates.push(per_item(
            timed(create_config_maps(
                &floor_api,
                range.clone(),
                args.concurrency,
            ))
            .await?,
        ));
    }
    let (create, floor_create) = (median(&creates), median(&floor_creates));

    let listed = raw_get(&client, "/api/v1/namespaces/default/configmaps").await?;
    let list_floor = Floor::start(one, listed).await?;
    let floor_api: Api<ConfigMap> = Api::namespaced(list_floor.client()?, "default");
    let (mut lists, mut floor_lists) = (Vec::new(), Vec::new());
    for _ in 0..SAMPLES {
        lists.push(timed_list(&api, n).await?);
        floor_lists.push(timed_list(&floor_api, n).await?);
    }
    let (list_time, floor_list) = (median(&lists), median(&floor_lists));

    report.row(
        "creates/s",
        format!("{:.0}", 1.0 / create.as_secs_f64()),
        format!(
            "absolute, this machine; median batch of {} creates",
            n.div_ceil(CREATE_TURNS + 1)
        ),
    );
    report.ratio("create (per request)", create, floor_create, "<= 1.5x");
    // The spread between turns, so a reader can tell a ratio near its target from noise.
    let (low, high) = quartiles(
        creates
            .iter()
            .zip(&floor_creates)
            .map(|(sim, floor)| sim.as_secs_f64() / floor.as_secs_f64().max(f64::EPSILON))
            .collect(),
    );
    let turns = format!("of the {CREATE_TURNS} turns' kube-sim / floor ratios");
    report.row(
        "create (per request): lower quartile of the turns",
        format!("{low:.2}x"),
        format!("first quartile {turns}"),
    );
    report.row(
        "create (per request): upper quartile of the turns",
        format!("{high:.2}x"),
        format!("third quartile {turns}"),
    );
    report.ratio(&format!("list of {n}"), list_time, floor_list, "<= 2x");
    report.row(
        format!("list of {n}, absolute"),
        format!("{list_time:.2?}"),
        format!("target well under 1 s; median of {SAMPLES}, in turns with the floor's"),
    );
    let per_object =
        memory.rss_after.saturating_sub(memory.rss_before) as f64 / memory.objects.max(1) as f64;
    report.row(
        "resident memory per stored object",
        format!("{per_object:.0} B"),
        format!(
            "{:.1}x its {} B of stored JSON ({} B as sent); RSS growth over the last {} creates in a \
             fresh process, after a warm-up; target <= 2x",
            per_object / memory.stored_json as f64,
            memory.stored_json,
            serde_json::to_vec(&config_map(0, 0))?.len(),
            memory.objects
        ),
    );

    // Watch fan-out, FAN_OUT_ROUNDS times: times are the medians of the rounds.
    let mut rounds = Vec::new();
    for round in 0..FAN_OUT_ROUNDS {
        rounds.push(fan_out(&sim, &api, args, round).await?);
    }
    let (got, expected) = rounds
        .iter()
        .fold((0, 0), |(g, e), r| (g + r.got, e + r.expected));
    let write_time = median(&rounds.iter().map(|r| r.write_time).collect::<Vec<_>>());
    let drained = median(&rounds.iter().map(|r| r.drained).collect::<Vec<_>>());
    let mut keeps_up: Vec<f64> = rounds
        .iter()
        .map(|r| r.drained.as_secs_f64() / r.write_time.as_secs_f64())
        .collect();
    keeps_up.sort_by(f64::total_cmp);
    report.row(
        "achieved write rate",
        format!(
            "{:.0}/s",
            rounds[0].written as f64 / write_time.as_secs_f64()
        ),
        // A paced writer's last write is due at (n-1)/rate: exactly the rate is not reachable, so
        // the target is 99% of it.
        format!(
            "target >= {}/s (99% of the paced {}/s); median write time of {FAN_OUT_ROUNDS} rounds",
            args.write_rate * 99 / 100,
            args.write_rate
        ),
    );
    report.row(
        format!("events delivered to {} watchers", args.watchers),
        format!("{:.3}", got as f64 / expected as f64),
        format!(
            "{got} of {expected} over {FAN_OUT_ROUNDS} rounds; all delivered {drained:.2?} after \
             the first write (median)",
        ),
    );
    report.row(
        "fan-out keeps up (drain time / write time)",
        format!("{:.2}x", keeps_up[keeps_up.len() / 2]),
        format!(
            "median of {FAN_OUT_ROUNDS} rounds; 1.0x means every watcher had every event when \
             the writer stopped"
        ),
    );
    sim.shutdown().await;

    // The same creates with `--data-dir`: every response waits for its record's fsync.
    let durable = creates_with_data_dir(n, args.concurrency).await?;
    let in_memory = 1.0 / create.as_secs_f64();
    report.row(
        "creates/s with --data-dir",
        format!("{durable:.0}"),
        format!(
            "{:.2}x the in-memory {in_memory:.0}/s above; target >= 0.5x",
            durable / in_memory
        ),
    );
    Ok(report)
}

/// Rounds of the watch fan-out measurement.
const FAN_OUT_ROUNDS: usize = 3;

/// One fan-out round: what was written, and what the watchers got, when.
struct FanOut {
    written: usize,
    write_time: Duration,
    expected: u64,
    got: u64,
    drained: Duration,
}

/// W watchers from now on, a paced writer updating the objects for `args.seconds`.
async fn fan_out(
    sim: &kube_sim::KubeSim,
    api: &Api<ConfigMap>,
    args: &Args,
    round: usize,
) -> Result<FanOut> {
    let n = args.objects;
    let delivered = Arc::new(AtomicU64::new(0));
    let from = sim.resource_version().to_string();
    let mut watchers = Vec::new();
    for _ in 0..args.watchers {
        let api = api.clone();
        let delivered = delivered.clone();
        let from = from.clone();
        watchers.push(tokio::spawn(async move {
            // kube-sim closes a watch that falls too far behind, as kube-apiserver does; the
            // watcher then resumes from the last version it saw, as a client's does.
            let mut from = from;
            loop {
                let params = WatchParams::default().timeout(290);
                let mut events = api.watch(&params, &from).await?.boxed();
                while let Some(event) = events.try_next().await? {
                    match event {
                        WatchEvent::Modified(cm) => {
                            delivered.fetch_add(1, Ordering::Relaxed);
                            from = cm.metadata.resource_version.unwrap_or(from);
                        }
                        // Resuming is impossible (410): what was missed stays missed.
                        WatchEvent::Error(_) => return Ok::<_, kube::Error>(()),
                        _ => {}
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writes = (args.write_rate * args.seconds) as usize;
    let interval = Duration::from_secs_f64(1.0 / args.write_rate as f64);
    let started = Instant::now();
    let start_at = tokio::time::Instant::now();
    let written = stream::iter(0..writes)
        .map(|i| {
            let api = api.clone();
            // Paced: write i is due at i / rate seconds after the start.
            let due = start_at + interval.mul_f64(i as f64);
            async move {
                tokio::time::sleep_until(due).await;
                // A value no earlier write set (objects start at round 0), so each is an event.
                let patch = json!({"data": {"round": format!("{round}-{}", i + 1)}});
                let name = format!("cm-{:05}", i % n);
                api.patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
                .map(drop)
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await?;
    let write_time = started.elapsed();
    let expected = (written.len() * args.watchers) as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while delivered.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = started.elapsed();
    for watcher in watchers {
        watcher.abort();
    }
    Ok(FanOut {
        written: written.len(),
        write_time,
        expected,
        got: delivered.load(Ordering::Relaxed),
        drained,
    })
}

/// kube-sim as measured, with room in the watch history for every write of the run.
fn config() -> kube_sim::Config {
    kube_sim::Config {
        history_size: 200_000,
        ..kube_sim::Config::default()
    }
}

/// Creates/s of `n` ConfigMaps against a kube-sim persisting to a fresh data directory, timed as
/// the in-memory creates are (the median of [`SAMPLES`] batches, the same concurrency).
async fn creates_with_data_dir(n: usize, concurrency: usize) -> Result<f64> {
    let dir = std::env::temp_dir().join(format!("capstan-bench-kube-sim-{}", std::process::id()));
    let sim = kube_sim::KubeSim::start(kube_sim::Config {
        data_dir: Some(dir.clone()),
        ..config()
    })
    .await?;
    let api: Api<ConfigMap> = Api::namespaced(sim.client()?, "default");
    let created = timed_batches(n, |range| create_config_maps(&api, range, concurrency)).await;
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(1.0 / created?.as_secs_f64())
}

fn config_map_name(i: usize) -> String {
    format!("cm-{i:05}")
}

fn config_map(i: usize, round: usize) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": config_map_name(i), "namespace": "default", "labels": {"app": "bench", "shard": (i % 10).to_string()}},
        "data": {"key": "value", "round": round.to_string()}
    }))
    .unwrap_or_default()
}

/// One typed list of `api`, timed and checked to hold `n` objects.
async fn timed_list(api: &Api<ConfigMap>, n: usize) -> Result<Duration> {
    let started = Instant::now();
    let list = api.list(&ListParams::default()).await?;
    let took = started.elapsed();
    if list.items.len() != n {
        bail!("listed {} of {n} objects", list.items.len());
    }
    Ok(took)
}

/// How long `work` took.
async fn timed(work: impl std::future::Future<Output = Result<()>>) -> Result<Duration> {
    let started = Instant::now();
    work.await?;
    Ok(started.elapsed())
}

/// `0..n` cut into `parts` consecutive ranges (the last may be shorter).
fn batches(n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let size = n.div_ceil(parts).max(1);
    (0..n)
        .step_by(size)
        .map(|start| start..(start + size).min(n))
        .collect()
}

/// A response body exactly as the server sent it.
async fn raw_get(client: &kube::Client, path: &str) -> Result<bytes::Bytes> {
    let text = client
        .request_text(http::Request::get(path).body(Vec::new())?)
        .await?;
    Ok(bytes::Bytes::from(text))
}

/// Timed samples per figure (list) and batches per create run: times are their medians.
const SAMPLES: usize = 5;

/// Turns kube-sim and the floor take at creating (a batch each per turn). Many short turns: on a
/// shared two-core machine one batch can run 50% slower than its neighbours, and the median of
/// five such batches moved the ratio by 0.3 between runs of one binary.
const CREATE_TURNS: usize = 20;

/// The first and third quartiles (nearest rank) of `samples`; zeros for none.
fn quartiles(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_unstable_by(f64::total_cmp);
    let at = |q: usize| samples.get(samples.len() * q / 4).copied().unwrap_or(0.0);
    (at(1), at(3))
}

/// Runs `batch` over `0..n` split into [`SAMPLES`] consecutive ranges, timing each; the median
/// batch time per item.
async fn timed_batches<F, Fut>(n: usize, batch: F) -> Result<Duration>
where
    F: Fn(std::ops::Range<usize>) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut times = Vec::new();
    for range in batches(n, SAMPLES) {
        let items = u32::try_from(range.len().max(1))?;
        times.push(timed(batch(range)).await? / items);
    }
    Ok(median(&times))
}

/// Creates the ConfigMaps of `range` through the kube client, `concurrency` at a time.
async fn create_config_maps(
    api: &Api<ConfigMap>,
    range: std::ops::Range<usize>,
    concurrency: usize,
) -> Result<()> {
    for_each_concurrent(range, concurrency, |i| async move {
        api.create(&PostParams::default(), &config_map(i, 0))
            .await
            .map(drop)
    })
    .await
}

/// What the fresh process measured: its RSS before and after kube-sim stored `objects` more
/// objects, and the JSON size of one stored object as served back.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Memory {
    objects: usize,
    rss_before: u64,
    rss_after: u64,
    stored_json: usize,
}

/// Runs `capstan-bench kube-sim-memory` (this binary) and reads its one line of JSON.
async fn memory_in_fresh_process(objects: usize, concurrency: usize) -> Result<Memory> {
    let exe = std::env::current_exe().context("the bench's own path")?;
    let out = tokio::process::Command::new(exe)
        .args(["kube-sim-memory", "--objects", &objects.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .context("running kube-sim-memory")?;
    if !out.status.success() {
        bail!("kube-sim-memory exited with {}", out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .last()
        .context("kube-sim-memory printed nothing")?;
    serde_json::from_str(line).with_context(|| format!("kube-sim-memory printed {line:?}"))
}

/// The fresh process's side: kube-sim in this process, `objects` ConfigMaps created, and the RSS
/// printed as one line of JSON. The first tenth (at most 100) warms up what any server pays once
/// (worker threads' allocator arenas, connection buffers); the figure is the growth over the rest.
pub async fn memory_probe(objects: usize, concurrency: usize) -> Result<()> {
    let sim = kube_sim::KubeSim::start(config()).await?;
    let api: Api<ConfigMap> = Api::namespaced(sim.client()?, "default");
    let create = |range| create_config_maps(&api, range, concurrency);
    let warm = (objects / 10).min(100);
    create(0..warm).await?;
    let rss_before = rss()?;
    create(warm..objects).await?;
    let rss_after = rss()?;
    let stored_json = serde_json::to_vec(&api.get(&config_map_name(0)).await?)?.len();
    let memory = Memory {
        objects: objects - warm,
        rss_before,
        rss_after,
        stored_json,
    };
    println!("{}", serde_json::to_string(&memory)?);
    sim.shutdown().await;
    Ok(())
}

/// Resident set size of this process, in bytes.
fn rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("VmRSS value")?
        .parse::<u64>()?
        * 1024)
}

/// An axum server answering POSTs with one object's bytes and GETs with a list's. It reads what
/// any server must (a POST's whole body) and serves its connections as kube-sim does (no Nagle
/// delay), so the two differ only in what happens between reading a request and answering it.
struct Floor {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Floor {
    async fn start(object: bytes::Bytes, list: bytes::Bytes) -> Result<Self> {
        let app = axum::Router::new().route(
            "/api/v1/namespaces/default/configmaps",
            axum::routing::post(move |_request_body: bytes::Bytes| {
                let object = object.clone();
                async move {
                    (
                        http::StatusCode::CREATED,
                        [("content-type", "application/json")],
                        object,
                    )
                }
            })
            .get(move || {
                let list = list.clone();
                async move { ([("content-type", "application/json")], list) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            use axum::serve::ListenerExt;
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, task })
    }

    fn client(&self) -> Result<kube::Client> {
        let config = kube::Config::new(format!("http://{}", self.addr).parse()?);
        Ok(kube::Client::try_from(config)?)
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::quartiles;

    #[test]
    fn quartiles_are_the_nearest_ranks_in_any_order() {
        assert_eq!(
            quartiles(vec![8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0]),
            (3.0, 7.0)
        );
        assert_eq!(quartiles(vec![1.5]), (1.5, 1.5));
        assert_eq!(quartiles(vec![]), (0.0, 0.0));
    }
}
