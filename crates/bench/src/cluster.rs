//! A fresh kube-sim with Capstan's CRDs, a controller process running against it, and what every
//! suite does to it: requests `concurrency` at a time, and its request counts by verb.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use kube_sim::accounting::RequestStats;
use tokio::process::{Child, Command};

pub struct Cluster {
    pub sim: kube_sim::KubeSim,
    pub client: kube::Client,
    pub kubeconfig: std::path::PathBuf,
}

impl Cluster {
    /// kube-sim with a watch history deep enough for the bench's bursts ([`bench_config`]).
    pub async fn start(scratch: &Path, name: &str) -> Result<Self> {
        Self::start_with(scratch, name, bench_config()).await
    }

    /// kube-sim with `config`, Capstan's CRDs and `<scratch>/<name>.kubeconfig`.
    pub async fn start_with(scratch: &Path, name: &str, config: kube_sim::Config) -> Result<Self> {
        let sim = kube_sim::KubeSim::start(config).await?;
        let client = sim.client()?;
        capstan_testkit::install_capstan_crds(&client).await?;
        let kubeconfig = scratch.join(format!("{name}.kubeconfig"));
        sim.write_kubeconfig(&kubeconfig)?;
        Ok(Self {
            sim,
            client,
            kubeconfig,
        })
    }

    /// A client of this kube-sim that kube-sim's request accounting names `agent` (its
    /// User-Agent), so a floor's requests can be told from the bench's own completion watch.
    pub fn client_named(&self, agent: &str) -> Result<kube::Client> {
        let mut config = kube::Config::new(self.sim.url().parse()?);
        config.default_namespace = "default".into();
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(agent)?,
        ));
        Ok(kube::Client::try_from(config)?)
    }

    /// Writes since the start: kube-sim's one resourceVersion counter moves once per write.
    pub fn writes(&self) -> u64 {
        self.sim.resource_version()
    }
}

/// kube-sim's defaults with a watch history of 100,000 events, so a watch started before a
/// burst of writes never falls out of the window (410 Gone) while the bench counts.
pub fn bench_config() -> kube_sim::Config {
    kube_sim::Config {
        history_size: 100_000,
        ..kube_sim::Config::default()
    }
}

/// Runs `op(i)` for each `i` of `range` with at most `concurrency` in flight; the first error
/// stops it.
pub async fn for_each_concurrent<F, Fut>(
    range: Range<usize>,
    concurrency: usize,
    op: F,
) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    stream::iter(range)
        .map(op)
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// The requests one client (the product part of its User-Agent) made.
pub fn of_client(requests: &RequestStats, client: &str) -> RequestStats {
    RequestStats {
        counts: requests
            .counts
            .iter()
            .filter(|(k, _)| k.client == client)
            .map(|(k, n)| (k.clone(), *n))
            .collect(),
    }
}

/// `requests` summed by verb, `create 10, get 3`, or `none`.
pub fn by_verb(requests: &RequestStats) -> String {
    let mut verbs: BTreeMap<&str, u64> = BTreeMap::new();
    for (key, n) in &requests.counts {
        *verbs.entry(key.verb.as_str()).or_default() += n;
    }
    let text: Vec<String> = verbs.iter().map(|(v, n)| format!("{v} {n}")).collect();
    if text.is_empty() {
        "none".to_string()
    } else {
        text.join(", ")
    }
}

pub struct Controller {
    child: Child,
}

impl Controller {
    pub fn spawn(bin: &Path, args: &[&str]) -> Result<Self> {
        let child = Command::new(bin)
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (build it with cargo xtask bench)",
                    bin.display()
                )
            })?;
        Ok(Self { child })
    }

    /// Peak resident set size in bytes (`VmHWM` of /proc/PID/status).
    pub fn peak_rss(&self) -> Result<u64> {
        let pid = self.child.id().context("controller already exited")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let line = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .context("no VmHWM")?;
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .context("VmHWM value")?
            .parse()?;
        Ok(kib * 1024)
    }

    pub async fn stop(mut self) -> Result<()> {
        if let Some(pid) = self.child.id() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid)?),
                nix::sys::signal::Signal::SIGTERM,
            )?;
        }
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await??;
        if !status.success() {
            bail!("controller exited with {status}");
        }
        Ok(())
    }
}

/// The writes among `requests`, as `client verb resource[/subresource] xN`.
pub fn by_write(requests: &RequestStats) -> String {
    let writes: Vec<String> = requests
        .counts
        .iter()
        .filter(|(k, _)| !matches!(k.verb.as_str(), "get" | "list" | "watch"))
        .map(|(k, n)| {
            let sub = if k.subresource.is_empty() {
                String::new()
            } else {
                format!("/{}", k.subresource)
            };
            format!("{} {} {}{sub} x{n}", k.client, k.verb, k.resource)
        })
        .collect();
    writes.join(", ")
}
