//! A fresh kube-sim with Capstan's CRDs, a controller process running against it, and what every
//! suite does to it: requests `concurrency` at a time, and its request counts by verb.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use kube_sim::accounting::RequestStats;
use tokio::process::{Child, Command};

use crate::programs::Stat;

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

/// Runs `op` on each of `items` with at most `concurrency` in flight; the first error
/// stops it.
pub async fn for_each_concurrent<I, F, Fut>(items: I, concurrency: usize, op: F) -> Result<()>
where
    I: IntoIterator,
    F: Fn(I::Item) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    stream::iter(items)
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
    /// Starts `bin` with `args`; `CAPSTAN_BENCH_LOG_LEVEL` (e.g. `info,gw_recycler=debug`), when
    /// set, replaces the `--log-level` given and shows the logs (stdout), for a timeline of a run.
    pub fn spawn(bin: &Path, args: &[&str]) -> Result<Self> {
        Self::spawn_logging(bin, args, None)
    }

    /// [`Controller::spawn`], its logs (stdout) written to `log` when no log level was asked
    /// for, so a suite can show the last lines of a replica that did not converge.
    pub fn spawn_logging(bin: &Path, args: &[&str], log: Option<&Path>) -> Result<Self> {
        let log_level = std::env::var("CAPSTAN_BENCH_LOG_LEVEL").ok();
        let args = with_log_level(args, log_level.as_deref());
        let stdout = match (&log_level, log) {
            (Some(_), _) => Stdio::inherit(),
            (None, Some(path)) => std::fs::File::create(path)
                .with_context(|| format!("creating {}", path.display()))?
                .into(),
            (None, None) => Stdio::null(),
        };
        let child = Command::new(bin)
            .args(&args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            // Logs go to stdout: shown only when a log level was asked for (or kept in `log`).
            .stdout(stdout)
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

    /// CPU time the process has used so far.
    pub fn cpu_time(&self) -> Result<Duration> {
        cpu_time(Some(self.child.id().context("controller already exited")?))
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

    /// `kill -9`, as a crashed node or an OOM kill would stop it, and reaps it.
    pub async fn kill(mut self) -> Result<()> {
        if let Some(pid) = self.child.id() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid)?),
                nix::sys::signal::Signal::SIGKILL,
            )?;
        }
        tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await??;
        Ok(())
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

/// CPU time (user and system, every thread) a process has used: this one with `None`. From
/// `/proc/PID/stat` (see [`Stat`]).
pub fn cpu_time(pid: Option<u32>) -> Result<Duration> {
    let path = pid.map_or_else(
        || "/proc/self/stat".to_string(),
        |p| format!("/proc/{p}/stat"),
    );
    let line = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let stat = Stat::parse(&line).with_context(|| format!("unexpected {path}: {line:?}"))?;
    Ok(stat.cpu)
}

/// The machine's CPU time by kind, summed over its cores, from the first line of `/proc/stat`
/// (USER_HZ ticks, 100 per second). Counts every process: meaningful on a machine doing nothing
/// but the bench.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineCpu {
    /// Spent running anything: user, nice, system, irq, softirq.
    pub busy: Duration,
    /// Taken by the hypervisor for other guests while this one wanted to run.
    pub stolen: Duration,
    /// Every kind, idle included.
    pub total: Duration,
}

impl MachineCpu {
    pub fn now() -> Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        Self::parse(stat.lines().next().context("empty /proc/stat")?)
    }

    /// A `cpu  user nice system idle iowait irq softirq steal ...` line (guest time is already
    /// inside user).
    fn parse(line: &str) -> Result<Self> {
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("unexpected /proc/stat line {line:?}"))?;
        let ticks = |kinds: &[usize]| {
            let sum: u64 = kinds.iter().filter_map(|&i| fields.get(i)).sum();
            Duration::from_millis(sum * 10)
        };
        Ok(Self {
            busy: ticks(&[0, 1, 2, 5, 6]),
            stolen: ticks(&[7]),
            total: ticks(&[0, 1, 2, 3, 4, 5, 6, 7]),
        })
    }

    /// What was spent between `earlier` and this reading.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            busy: self.busy.saturating_sub(earlier.busy),
            stolen: self.stolen.saturating_sub(earlier.stolen),
            total: self.total.saturating_sub(earlier.total),
        }
    }

    /// The share of all CPU time the hypervisor took, in percent.
    pub fn stolen_percent(&self) -> f64 {
        100.0 * self.stolen.as_secs_f64() / self.total.as_secs_f64().max(f64::EPSILON)
    }
}

/// `args` with the value after `--log-level` replaced by `level`, when given.
fn with_log_level<'a>(args: &[&'a str], level: Option<&'a str>) -> Vec<&'a str> {
    let mut args = args.to_vec();
    if let Some(level) = level
        && let Some(at) = args.iter().position(|a| *a == "--log-level")
        && at + 1 < args.len()
    {
        args[at + 1] = level;
    }
    args
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

#[cfg(test)]
mod tests {
    use super::with_log_level;

    #[test]
    fn this_process_has_a_cpu_time() {
        // Spinning makes it grow within a few ticks; a reader stuck at one value never does.
        let spent = super::cpu_time(None).expect("readable");
        let started = std::time::Instant::now();
        let mut now = spent;
        while now == spent && started.elapsed() < std::time::Duration::from_secs(5) {
            std::hint::black_box((0..10_000).sum::<u64>());
            now = super::cpu_time(None).expect("readable");
        }
        assert!(now > spent, "CPU time stayed at {spent:?} while spinning");
    }

    #[test]
    fn machine_cpu_splits_busy_stolen_and_total_time() {
        let line = "cpu  100 5 30 9000 70 2 3 40 0 0";
        let cpu = super::MachineCpu::parse(line).expect("parses");
        let ms = |ticks: u64| std::time::Duration::from_millis(ticks * 10);
        assert_eq!(cpu.busy, ms(100 + 5 + 30 + 2 + 3));
        assert_eq!(cpu.stolen, ms(40));
        assert_eq!(cpu.total, ms(100 + 5 + 30 + 9000 + 70 + 2 + 3 + 40));
        let later = super::MachineCpu::parse("cpu  200 5 30 9800 70 2 3 140 0 0").expect("parses");
        let spent = later.since(&cpu);
        assert_eq!(spent.busy, ms(100));
        assert!((spent.stolen_percent() - 100.0 * 100.0 / 1000.0).abs() < 1e-9);
        assert!(super::MachineCpu::parse("cpu  x").is_err());
        assert!(super::MachineCpu::now().is_ok());
    }

    #[test]
    fn a_log_level_from_the_environment_replaces_the_one_given() {
        let args = ["--kubeconfig", "k", "--log-level", "warn"];
        assert_eq!(
            with_log_level(&args, Some("debug")),
            ["--kubeconfig", "k", "--log-level", "debug"]
        );
        assert_eq!(with_log_level(&args, None), args);
        assert_eq!(with_log_level(&["--x"], Some("debug")), ["--x"]);
    }
}
