//! machineset-controller rolling MachineDeployments: N deployments of R Machines each (10 x 100
//! by default), the real `machineset-controller` and the real `machineclass-controller` (its
//! simulated provider turns a Node Ready `--ready-delay` after its VM is made) on one kube-sim.
//! Every deployment is `RollingUpdate` with `maxUnavailable: 0` and `maxSurge: --max-surge`. Once
//! every deployment is rolled out and every Machine Running, the class of every template is
//! changed from `c1` to `c2` at once, and the roll is timed and counted until every deployment
//! reports `updatedReplicas == availableReplicas == status.replicas == spec.replicas`, every
//! Machine is of class `c2` and Running, and every old set is at 0.
//!
//! Figures, each against a floor computed for the same run:
//!
//! - **writes per replaced machine** (machineset-controller's creates, updates, patches and
//!   deletes during the roll, as kube-sim counts them by its User-Agent, failed ones included)
//!   against the writes a correct controller cannot avoid, per replaced machine. With `surge` the
//!   resolved `maxSurge` (a percent of the replicas rounded up, at least 1) and
//!   `steps = ceil(R / surge)`, the floor of one deployment is:
//!   - per replaced machine: one Machine create and one Machine delete (2 R);
//!   - per step: one scale write of the new set and one of the old set (2 steps);
//!   - once: the new MachineSet's create and the new revision annotation on the deployment (2);
//!   - per step, each object the step changed reports it once: the status of the new set, of the
//!     old set and of the deployment (3 steps);
//!   - per step, the Events an operator reads at their coarsest: `ScalingMachineSet` for each of
//!     the two scales, one `SuccessfulCreate` and one `SuccessfulDelete` batch (4 steps);
//!
//!   that is `2 R + 9 steps + 2` per deployment, over the R replaced machines. Target <= 1.2x.
//!   Every write counts, Event creates and failed (conflicting) writes included; a second row
//!   leaves the Events out of both (floor `2 R + 5 steps + 2`). (An earlier floor counted a set
//!   status write per Machine state, 3 R; a controller that batches status writes while Machines
//!   change does not need them, and measured below it.) machineclass-controller's writes per
//!   replaced machine are shown too, without a target;
//! - **roll time** against the sim driver's own delays: each step waits once for the new
//!   Machines' Nodes to turn Ready (`--ready-delay`; deleting a simulated VM is taken as free),
//!   the deployments roll in parallel, so the floor is `steps * ready-delay`. Target <= 1.5x;
//! - machineset-controller's **peak RSS** (VmHWM), target < 96 MiB.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use capstan_apis::machine::{
    Machine, MachineClass, MachineDeployment, MachinePhase, MachineSet, MachineSetSpec,
};
use capstan_testkit::objects;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_sim::accounting::RequestStats;
use serde_json::{Value, json};

use crate::cluster::{Cluster, Controller, by_write, cpu_time, for_each_concurrent, of_client};
use crate::report::Report;

#[derive(clap::Args)]
pub struct Args {
    /// Number of MachineDeployments (rolled in parallel).
    #[arg(long, default_value_t = 10)]
    deployments: usize,
    /// Replicas of each deployment.
    #[arg(long, default_value_t = 100)]
    replicas: usize,
    /// Each deployment's `maxSurge`: a percent of the replicas (`10%`) or a number (`5`).
    #[arg(long, default_value = "10%")]
    max_surge: String,
    /// The simulated provider's time until a new VM's Node turns Ready (Go duration).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    ready_delay: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    capstan_apis::machine::GoDuration::new(text)
        .to_std()
        .map_err(|e| e.to_string())
}

const NS: &str = "default";
const SETS_AGENT: &str = "machineset-controller";
const MACHINES_AGENT: &str = "machineclass-controller";
/// How often the bench looks at the deployments while waiting.
const POLL: Duration = Duration::from_millis(50);
/// Quiet time (no write by anyone) after the first rollout before the roll starts.
const QUIET: Duration = Duration::from_secs(1);

/// `maxSurge` as the deployment takes it: a percent as a string, a number as an int.
fn surge_value(text: &str) -> Result<Value> {
    let text = text.trim();
    if let Some(percent) = text.strip_suffix('%') {
        let _: u32 = percent
            .parse()
            .with_context(|| format!("--max-surge {text}"))?;
        Ok(json!(text))
    } else {
        let n: u32 = text
            .parse()
            .with_context(|| format!("--max-surge {text}"))?;
        Ok(json!(n))
    }
}

/// The resolved surge: a percent of `replicas` rounded up (as MCM and Kubernetes do for
/// maxSurge), at least 1 (with `maxUnavailable: 0`, a surge of 0 is taken as 1).
fn resolved_surge(text: &str, replicas: usize) -> Result<usize> {
    let surge = match surge_value(text)? {
        Value::String(s) => {
            let percent: usize = s.trim_end_matches('%').parse()?;
            (replicas * percent).div_ceil(100)
        }
        n => usize::try_from(n.as_u64().unwrap_or(1))?,
    };
    Ok(surge.max(1))
}

/// The writes a correct controller cannot avoid to roll one deployment of `replicas` in `steps`
/// (see the module docs); `events` counts the four Events of each step.
fn floor_writes(replicas: usize, steps: usize, events: bool) -> usize {
    let machines = 2 * replicas; // create + delete
    let scales = 2 * steps; // new set up, old set down
    let once = 2; // new set create, revision annotation
    let statuses = 3 * steps; // new set, old set, deployment: once per step each
    let step_events = if events { 4 * steps } else { 0 };
    machines + scales + once + statuses + step_events
}

pub async fn run(bin_dir: &Path, args: &Args) -> Result<Report> {
    let (n, replicas) = (args.deployments.max(1), args.replicas.max(1));
    let surge = resolved_surge(&args.max_surge, replicas)?;
    let surge_json = surge_value(&args.max_surge)?;
    let steps = replicas.div_ceil(surge);
    let delay = args.ready_delay;
    let scratch = std::env::temp_dir().join(format!("capstan-bench-ms-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    eprintln!(
        "machineset bench: {n} deployments x {replicas} machines, maxSurge {} (= {surge}, \
         {steps} steps), ready delay {delay:?}",
        args.max_surge
    );

    let cluster = Cluster::start(&scratch, "machineset").await?;
    seed(&cluster.client).await?;
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    let delay_arg = format!("{}ms", delay.as_millis());
    // Both binaries against the bench's kube-sim, metrics on a free port, quiet logs.
    let spawn = |name: &str, extra: &[&str]| {
        let mut args = vec![
            "--kubeconfig",
            kubeconfig.as_str(),
            "--metrics-addr",
            "127.0.0.1:0",
            "--namespace",
            NS,
            "--log-level",
            "warn",
        ];
        args.extend_from_slice(extra);
        Controller::spawn(&bin_dir.join(name), &args)
    };
    let machines_ctl = spawn(
        "machineclass-controller",
        &["--sim-ready-delay", &delay_arg],
    )?;
    let sets_ctl = spawn("machineset-controller", &[])?;

    let deployments: Api<MachineDeployment> = Api::namespaced(cluster.client.clone(), NS);
    let started = Instant::now();
    for_each_concurrent(0..n, 16, |i| {
        let api = deployments.clone();
        let body = deployment(i, replicas, &surge_json);
        async move {
            api.create(&PostParams::default(), &objects::from_json(body))
                .await
                .map(drop)
        }
    })
    .await?;
    wait_rolled(&cluster, n, replicas, "c1", timeout(steps, delay)).await?;
    eprintln!(
        "machineset bench: first rollout done in {:.2?}",
        started.elapsed()
    );
    wait_quiet(&cluster).await;

    // The roll: every template to c2 at once.
    let requests_before = cluster.sim.requests();
    let (cpu_before, sets_cpu_before, machines_cpu_before) = (
        cpu_time(None)?,
        sets_ctl.cpu_time()?,
        machines_ctl.cpu_time()?,
    );
    let started = Instant::now();
    let patch =
        json!({"spec": {"template": {"spec": {"class": {"kind": "MachineClass", "name": "c2"}}}}});
    for_each_concurrent(0..n, n, |i| {
        let api = deployments.clone();
        let patch = patch.clone();
        async move {
            api.patch(
                &format!("pool-{i}"),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
            .map(drop)
        }
    })
    .await?;
    wait_rolled(&cluster, n, replicas, "c2", timeout(steps, delay)).await?;
    let time = started.elapsed();
    let requests = cluster.sim.requests().since(&requests_before);
    let (cpu, sets_cpu, machines_cpu) = (
        cpu_time(None)? - cpu_before,
        sets_ctl.cpu_time()? - sets_cpu_before,
        machines_ctl.cpu_time()? - machines_cpu_before,
    );
    let peak_rss = sets_ctl.peak_rss()?;
    sets_ctl.stop().await?;
    machines_ctl.stop().await?;
    eprintln!(
        "machineset bench: roll done in {time:.2?} (CPU: bench and kube-sim {cpu:.2?}, \
         machineset-controller {sets_cpu:.2?}, machineclass-controller {machines_cpu:.2?})"
    );

    let sets_requests = of_client(&requests, SETS_AGENT);
    let machines_requests = of_client(&requests, MACHINES_AGENT);
    let replaced = (n * replicas) as f64;
    let floor = (n * floor_writes(replicas, steps, true)) as f64 / replaced;
    let floor_no_events = (n * floor_writes(replicas, steps, false)) as f64 / replaced;
    let writes = |r: &RequestStats| r.writes() as f64 / replaced;
    let conflicts = sets_requests.count_where(|k| k.is_write() && k.code == 409);

    let mut report = Report::new(format!(
        "machineset-controller, roll of {n} MachineDeployments x {replicas} machines, \
         maxSurge {} ({steps} steps), ready delay {delay:?}",
        args.max_surge
    ));
    report.per_object_against(
        "machineset-controller writes per replaced machine",
        writes(&sets_requests),
        floor,
        "<= 1.2x",
        &format!(
            "floor per deployment 2 R + 9 steps + 2 (machine create+delete, 2 scales, 3 statuses \
             and 4 Events per step, set create, revision); {conflicts} conflicts; {}",
            by_write(&sets_requests)
        ),
    );
    let events = sets_requests.count_where(|k| k.is_write() && k.resource == "events");
    report.per_object(
        "machineset-controller writes per replaced machine, Events left out",
        (sets_requests.writes() - events) as f64 / replaced,
        floor_no_events,
        &format!("{events} Event creates left out, and the floor's 4 per step"),
    );
    report.row(
        "machineclass-controller writes per replaced machine",
        format!("{:.3}", writes(&machines_requests)),
        format!("no target; {}", by_write(&machines_requests)),
    );
    report.ratio(
        "roll (all machines of c2 Running, deployments updated)",
        time,
        delay * u32::try_from(steps)?,
        "<= 1.5x",
    );
    report.row(
        "machineset-controller peak RSS",
        format!("{:.1} MiB", peak_rss as f64 / 1048576.0),
        "target < 96 MiB",
    );
    Ok(report)
}

/// Generous: ten times the floor's time plus a minute.
fn timeout(steps: usize, delay: Duration) -> Duration {
    Duration::from_secs(60) + 10 * delay * u32::try_from(steps).unwrap_or(u32::MAX)
}

/// The Secret and the classes `c1` and `c2` of the simulated provider.
async fn seed(client: &kube::Client) -> Result<()> {
    let secret = objects::secret(NS, "cloud", &[("userData", "Y2xvdWQtaW5pdA==")]);
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await?;
    let classes: Api<MachineClass> = Api::namespaced(client.clone(), NS);
    for class in ["c1", "c2"] {
        let body = objects::machine_class(NS, class, "cloud", json!({}));
        classes
            .create(&PostParams::default(), &objects::from_json(body))
            .await?;
    }
    Ok(())
}

fn deployment(i: usize, replicas: usize, surge: &Value) -> Value {
    let name = format!("pool-{i}");
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"name": name}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": surge, "maxUnavailable": 0}
            },
            "template": {
                "metadata": {"labels": {"name": name}},
                "spec": {"class": {"kind": "MachineClass", "name": "c1"}}
            }
        }
    })
}

fn class_of(spec_class: Option<&capstan_apis::machine::ClassSpec>) -> Option<&str> {
    spec_class.and_then(|c| c.name.as_deref())
}

/// Every deployment rolled out to `class`: its status says so, every Machine is of `class` and
/// Running (none left Terminating), and every other set is at 0.
async fn wait_rolled(
    cluster: &Cluster,
    deployments: usize,
    replicas: usize,
    class: &str,
    timeout: Duration,
) -> Result<()> {
    let client = &cluster.client;
    let deployment_api: Api<MachineDeployment> = Api::namespaced(client.clone(), NS);
    let machine_api: Api<Machine> = Api::namespaced(client.clone(), NS);
    let set_api: Api<MachineSet> = Api::namespaced(client.clone(), NS);
    let r = i32::try_from(replicas)?;
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for the roll to {class}: {last}");
        }
        tokio::time::sleep(POLL).await;
        let list = deployment_api.list(&ListParams::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|d| {
                let Some(status) = d.status.as_ref() else {
                    return false;
                };
                let template = d.spec.template.spec.as_ref();
                d.spec.replicas == r
                    && class_of(template.and_then(|t| t.class.as_ref())) == Some(class)
                    && Some(status.observed_generation) >= d.metadata.generation
                    && status.updated_replicas == r
                    && status.available_replicas == r
                    && status.replicas == r
            })
            .count();
        if done < deployments {
            last = format!("{done} of {deployments} deployments rolled out");
            continue;
        }
        let machines = machine_api.list(&ListParams::default()).await?.items;
        let settled = machines
            .iter()
            .filter(|m| {
                m.metadata.deletion_timestamp.is_none()
                    && m.phase() == Some(&MachinePhase::Running)
                    && class_of(m.spec.class.as_ref()) == Some(class)
            })
            .count();
        if machines.len() != deployments * replicas || settled != machines.len() {
            last = format!(
                "{} machines, {settled} of them Running of {class}",
                machines.len()
            );
            continue;
        }
        let sets = set_api.list(&ListParams::default()).await?.items;
        let wrong = sets
            .iter()
            .filter(|s| {
                let MachineSetSpec {
                    replicas: set_replicas,
                    template,
                    ..
                } = &s.spec;
                let of_class = class_of(
                    template
                        .as_ref()
                        .and_then(|t| t.spec.as_ref())
                        .and_then(|s| s.class.as_ref()),
                ) == Some(class);
                if of_class {
                    *set_replicas != r
                } else {
                    *set_replicas != 0
                }
            })
            .count();
        if wrong > 0 {
            last = format!("{wrong} sets not yet at their replicas");
            continue;
        }
        return Ok(());
    }
}

/// Waits until nobody writes for [`QUIET`] (at most 30 s): the trailing status writes of the
/// first rollout stay out of the roll's count.
async fn wait_quiet(cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut writes = cluster.writes();
    while Instant::now() < deadline {
        tokio::time::sleep(QUIET).await;
        let now = cluster.writes();
        if now == writes {
            return;
        }
        writes = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_surge_resolves_percents_rounding_up() {
        assert_eq!(resolved_surge("10%", 100).expect("valid"), 10);
        assert_eq!(resolved_surge("10%", 15).expect("valid"), 2);
        assert_eq!(resolved_surge("3", 100).expect("valid"), 3);
        assert_eq!(resolved_surge("0", 100).expect("valid"), 1);
        assert_eq!(surge_value("25%").expect("valid"), json!("25%"));
        assert_eq!(surge_value("2").expect("valid"), json!(2));
        assert!(surge_value("x%").is_err());
    }

    #[test]
    fn the_floor_of_one_deployment_is_2r_plus_9_steps_plus_2() {
        // 100 replicas in 10 steps: 200 machine writes, 20 scales, 2, 30 statuses, 40 Events.
        assert_eq!(floor_writes(100, 10, true), 292);
        assert_eq!(floor_writes(100, 10, false), 252);
        assert_eq!(floor_writes(20, 10, true), 132);
    }
}
