//! `cargo xtask demo`: the embedded default. Starts kube-sim, installs Capstan's CRDs, seeds a
//! few objects, runs every Capstan binary against it, recycles a slice gateway pair across a hub
//! and a second worker (demo_slice.rs) and prints how to look around with kubectl.
//! Ctrl-C stops everything. `--smoke` (the scenario tests/demo.rs, so CI, runs it) checks that the seeded objects
//! converge and that every process drains and exits 0 on SIGTERM, then exits.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use capstan_apis::machine::{Machine, MachineClass, MachineDeployment, MachinePhase};
use capstan_apis::slo::NodeSlo;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use tokio::process::{Child, Command};

#[derive(clap::Args)]
pub struct Args {
    /// kube-sim's listen address (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: String,
    /// Folder for the kubeconfig and the components' logs (default: target/demo).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Check that everything comes up and converges, stop it all, and exit (tests/demo.rs's use).
    #[arg(long)]
    smoke: bool,
    /// More `IMAGE=DIR` for worker A's kube-sim (repeatable): containers of IMAGE run
    /// `DIR/<command>` on this host, e.g. `busybox=/bin` for `kubectl run --image=busybox -- sh -c ..`.
    /// Off by default: it lets anyone who reaches kube-sim run those programs.
    #[arg(long = "exec-images", value_name = "IMAGE=DIR")]
    exec_images: Vec<String>,
}

/// The binaries the demo runs against kube-sim, with their own flags.
const COMPONENTS: &[(&str, &[&str])] = &[
    ("nodeslo-controller", &[]),
    ("machineclass-controller", &["--sim-ready-delay", "1s"]),
    ("machineset-controller", &[]),
    (
        "router-sidecar",
        &["--backend", "memory", "--listen", "127.0.0.1:0"],
    ),
    (
        "gw-sidecar",
        &[
            "--backend",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--pod-ip",
            "127.0.0.1",
        ],
    ),
];

const ADMIN_MARKER: &str = capstan_testkit::process::ADMIN_LISTENING_MARKER;
const START_TIMEOUT: Duration = Duration::from_secs(60);

pub fn run(args: &Args) -> Result<()> {
    crate::ci::cargo(&["build", "--bins"])?;
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(run_async(args))
}

/// A process of the demo, its log file and, once up, its admin address.
pub(crate) struct Process {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    pub admin: Option<SocketAddr>,
    /// What the components list shows for a process without an admin endpoint.
    pub about: Option<String>,
}

async fn run_async(args: &Args) -> Result<()> {
    let target = crate::target_dir()?;
    let bin_dir = target.join("debug");
    let dir = args.dir.clone().unwrap_or_else(|| target.join("demo"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let kubeconfig = dir.join("kubeconfig");
    let _ = std::fs::remove_file(&kubeconfig);

    let kubeconfig_arg = kubeconfig.to_string_lossy().into_owned();
    // Worker A of the slice part: the pods of Capstan's image run the built sidecars.
    let [exec_flag, exec_image] = crate::demo_slice::exec_images_args(&bin_dir);
    let mut sim_args = vec![
        "serve",
        "--addr",
        &args.addr,
        "--kubeconfig-out",
        &kubeconfig_arg,
        "--simulate-workloads",
        "--pod-cidr",
        crate::demo_slice::WORKER_A_POD_CIDR,
        &exec_flag,
        &exec_image,
    ];
    for image in &args.exec_images {
        sim_args.extend(["--exec-images", image]);
    }
    let mut sim = spawn(&bin_dir, &dir, "kube-sim", &sim_args)?;
    let result = async {
        let client = wait_for_kubeconfig(&kubeconfig, &mut sim).await?;
        capstan_testkit::install_capstan_crds(&client).await?;
        seed(&client).await?;
        let mut processes = Vec::new();
        let outcome = async {
            for (name, extra) in COMPONENTS {
                let mut process_args = vec![
                    "--kubeconfig",
                    &kubeconfig_arg,
                    "--metrics-addr",
                    "127.0.0.1:0",
                ];
                process_args.extend_from_slice(extra);
                let mut process = spawn(&bin_dir, &dir, name, &process_args)?;
                process.admin = Some(wait_for_admin(&mut process).await?);
                processes.push(process);
            }
            let table = wait_for_nodeslos(&client).await?;
            let node = wait_for_machine(&client).await?;
            wait_for_pool(&client, "demo-class").await?;
            roll_pool(&client).await?;
            let mut slice = crate::demo_slice::start(&bin_dir, &dir, &kubeconfig, &client).await?;
            processes.append(&mut slice.processes);
            slice.recycle(&bin_dir).await?;
            print_guide(&kubeconfig, &dir, &processes, &table, &node);
            slice.print_guide(&bin_dir);
            if !args.smoke {
                println!("\nRunning. Ctrl-C stops everything.");
                tokio::signal::ctrl_c()
                    .await
                    .context("waiting for Ctrl-C")?;
            }
            Ok::<_, anyhow::Error>(())
        }
        .await;
        let stopped = stop_all(&mut processes).await;
        outcome.and(stopped)
    }
    .await;
    let sim_stopped = stop(&mut sim).await;
    result?;
    sim_stopped?;
    if args.smoke {
        println!("demo smoke run passed: every process converged and exited 0 on SIGTERM");
    }
    Ok(())
}

pub(crate) fn spawn(bin_dir: &Path, dir: &Path, name: &str, args: &[&str]) -> Result<Process> {
    spawn_as(bin_dir, dir, name, name, args)
}

/// Runs binary `name` as process `label` (its log is `<label>.log`).
pub(crate) fn spawn_as(
    bin_dir: &Path,
    dir: &Path,
    name: &str,
    label: &str,
    args: &[&str],
) -> Result<Process> {
    let log = dir.join(format!("{label}.log"));
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let child = Command::new(bin_dir.join(name))
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {name} from {}", bin_dir.display()))?;
    Ok(Process {
        name: label.to_string(),
        child,
        log,
        admin: None,
        about: None,
    })
}

/// Polls `check` every 100 ms until it yields, failing early if the process exits.
async fn poll<T>(
    process: &mut Process,
    what: &str,
    mut check: impl FnMut(&Process) -> Option<T>,
) -> Result<T> {
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        if let Some(value) = check(process) {
            return Ok(value);
        }
        if let Some(status) = process.child.try_wait()? {
            bail!(
                "{} exited with {status} before {what}; see {}",
                process.name,
                process.log.display()
            );
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "{} did not report {what} within {START_TIMEOUT:?}; see {}",
                process.name,
                process.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn wait_for_kubeconfig(path: &Path, sim: &mut Process) -> Result<kube::Client> {
    let kubeconfig = poll(sim, "its kubeconfig", |_| Kubeconfig::read_from(path).ok()).await?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

pub(crate) async fn wait_for_admin(process: &mut Process) -> Result<SocketAddr> {
    poll(process, "its admin address", |p| {
        let log = std::fs::read_to_string(&p.log).ok()?;
        log.lines().find_map(|line| {
            let rest = &line[line.find(ADMIN_MARKER)? + ADMIN_MARKER.len()..];
            rest.split(|c: char| c.is_whitespace() || c == '"')
                .next()?
                .parse()
                .ok()
        })
    })
    .await
}

/// Demo nodes and the SLO ConfigMap of the NodeSLO spec's node-strategy example.
const DEMO_NODES: &[(&str, &[(&str, &str)])] = &[
    ("worker-a", &[("xxx", "yyy")]),
    ("worker-b", &[("zzz", "zzz")]),
    ("worker-c", &[]),
];

async fn seed(client: &kube::Client) -> Result<()> {
    let pp = PostParams::default();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "koordinator-system"}}))?,
        )
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, labels) in DEMO_NODES {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        nodes
            .create(
                &pp,
                &serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?,
            )
            .await?;
    }
    let config: Api<ConfigMap> = Api::namespaced(client.clone(), "koordinator-system");
    let threshold = json!({
        "clusterStrategy": {"enable": true, "cpuSuppressThresholdPercent": 60},
        "nodeStrategies": [
            {"name": "xxx", "nodeSelector": {"matchLabels": {"xxx": "yyy"}}, "cpuSuppressThresholdPercent": 40},
            {"name": "zzz", "nodeSelector": {"matchLabels": {"zzz": "zzz"}}, "cpuSuppressThresholdPercent": 50}
        ]
    });
    let cm = json!({
        "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
        "data": {"resource-threshold-config": threshold.to_string()}
    });
    config.create(&pp, &serde_json::from_value(cm)?).await?;

    // A MachineClass with its Secret and one Machine, created by the simulated provider.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "default");
    let secret = json!({"metadata": {"name": "demo-cloud", "namespace": "default"}, "data": {"userData": "Y2xvdWQtaW5pdA=="}});
    secrets
        .create(&pp, &serde_json::from_value(secret)?)
        .await?;
    let classes: Api<MachineClass> = Api::namespaced(client.clone(), "default");
    let class = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
        "metadata": {"name": "demo-class", "namespace": "default"},
        "provider": "simulated", "providerSpec": {"image": "demo"},
        "secretRef": {"name": "demo-cloud", "namespace": "default"},
        "nodeTemplate": {"capacity": {"cpu": "2", "gpu": "0", "memory": "8Gi"},
                         "instanceType": "sim.large", "region": "sim-1", "zone": "sim-1a"}
    });
    classes
        .create(&pp, &serde_json::from_value(class.clone())?)
        .await?;
    // A second class for the MachineDeployment to roll to.
    let mut class_b = class.clone();
    class_b["metadata"]["name"] = json!(DEMO_CLASS_B);
    class_b["nodeTemplate"]["instanceType"] = json!("sim.xlarge");
    classes
        .create(&pp, &serde_json::from_value(class_b)?)
        .await?;
    let deployments: Api<MachineDeployment> = Api::namespaced(client.clone(), "default");
    let pool = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
        "metadata": {"name": DEMO_POOL, "namespace": "default"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"name": DEMO_POOL}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": {"name": DEMO_POOL}},
                         "spec": {"class": {"kind": "MachineClass", "name": "demo-class"}}}
        }
    });
    deployments
        .create(&pp, &serde_json::from_value(pool)?)
        .await?;
    let machines: Api<Machine> = Api::namespaced(client.clone(), "default");
    let machine = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": DEMO_MACHINE, "namespace": "default", "labels": {"name": "demo-deployment"}},
        "spec": {"class": {"kind": "MachineClass", "name": "demo-class"}}
    });
    machines
        .create(&pp, &serde_json::from_value(machine)?)
        .await?;
    Ok(())
}

const DEMO_MACHINE: &str = "demo-machine-0";
/// The demo's MachineDeployment, and the class it is rolled to once it is up.
const DEMO_POOL: &str = "demo-pool";
const DEMO_CLASS_B: &str = "demo-class-b";

/// Waits until the demo pool's Machines are all Running on `class` and its deployment reports them.
async fn wait_for_pool(client: &kube::Client, class: &str) -> Result<()> {
    let machines: Api<Machine> = Api::namespaced(client.clone(), "default");
    let deployments: Api<MachineDeployment> = Api::namespaced(client.clone(), "default");
    let selector = format!("name={DEMO_POOL}");
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        let list = machines
            .list(&kube::api::ListParams::default().labels(&selector))
            .await?
            .items;
        let on_class =
            |m: &Machine| m.spec.class.as_ref().and_then(|c| c.name.as_deref()) == Some(class);
        let running = list.len() == 2
            && list
                .iter()
                .all(|m| on_class(m) && m.phase() == Some(&MachinePhase::Running));
        let status = deployments.get(DEMO_POOL).await?.status.unwrap_or_default();
        if running && status.updated_replicas == 2 && status.available_replicas == 2 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "MachineDeployment {DEMO_POOL} not rolled to {class}: {} machines (see machineset-controller.log)",
                list.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Rolls the demo pool to the second class (RollingUpdate, maxSurge 1, maxUnavailable 0) and waits.
async fn roll_pool(client: &kube::Client) -> Result<()> {
    let deployments: Api<MachineDeployment> = Api::namespaced(client.clone(), "default");
    let patch = json!({"spec": {"template": {"spec": {"class": {"kind": "MachineClass", "name": DEMO_CLASS_B}}}}});
    deployments
        .patch(
            DEMO_POOL,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await?;
    wait_for_pool(client, DEMO_CLASS_B).await
}

/// Waits until the demo Machine is Running (its VM created and its Node Ready).
async fn wait_for_machine(client: &kube::Client) -> Result<String> {
    let machines: Api<Machine> = Api::namespaced(client.clone(), "default");
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        let machine = machines.get(DEMO_MACHINE).await?;
        if machine.phase() == Some(&MachinePhase::Running) {
            return Ok(machine.node_name().unwrap_or_default().to_string());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "Machine {DEMO_MACHINE} not Running: {:?} (see machineclass-controller.log)",
                machine.status
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every demo node has its NodeSLO with the expected threshold; returns the table.
async fn wait_for_nodeslos(client: &kube::Client) -> Result<Vec<(String, i64)>> {
    let slos: Api<NodeSlo> = Api::all(client.clone());
    let expected = [("worker-a", 40), ("worker-b", 50), ("worker-c", 60)];
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        let mut table = Vec::new();
        for (name, _) in expected {
            let percent = slos
                .get_opt(name)
                .await?
                .and_then(|s| s.spec.resource_used_threshold_with_be)
                .and_then(|t| t.cpu_suppress_threshold_percent);
            if let Some(percent) = percent {
                table.push((name.to_string(), percent));
            }
        }
        let want: Vec<(String, i64)> = expected.iter().map(|(n, p)| (n.to_string(), *p)).collect();
        if table == want {
            return Ok(table);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "NodeSLOs did not converge: want {want:?}, have {table:?} (see nodeslo-controller.log)"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn print_guide(
    kubeconfig: &Path,
    dir: &Path,
    processes: &[Process],
    table: &[(String, i64)],
    machine_node: &str,
) {
    println!("\nCapstan demo is up.\n");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl get nodes,nodeslos");
    println!(
        "  kubectl -n koordinator-system edit configmap slo-controller-config   # watch the NodeSLOs follow"
    );
    println!(
        "  kubectl label node worker-c xxx=yyy                                  # worker-c moves to 40%"
    );
    println!(
        "  kubectl create deployment web --image=nginx   # pods are simulated: Running on a Node, no process"
    );
    println!(
        "  # containers run for real only for images given to kube-sim's --exec-images (here Capstan's);"
    );
    println!(
        "  # `cargo xtask demo --exec-images busybox=/bin` makes `kubectl run hi --image=busybox --restart=Never -- sh -c 'echo hi'` run sh here"
    );
    println!("\nNodeSLOs (cpuSuppressThresholdPercent from the node strategies):");
    for (name, percent) in table {
        println!("  {name:<10} {percent}");
    }
    println!("\nMachine {DEMO_MACHINE} is Running on Node {machine_node} (simulated provider):");
    println!("  kubectl get machineclasses,machines");
    println!(
        "  kubectl delete machineclass demo-class      # blocked while the machine uses it (see its Events)"
    );
    println!(
        "  kubectl delete machine {DEMO_MACHINE}       # drains and removes its Node, then the class can go"
    );
    println!(
        "\nMachineDeployment {DEMO_POOL} was rolled from demo-class to {DEMO_CLASS_B}, one Machine at a time:"
    );
    println!("  kubectl get mcd,mcs,mc");
    println!("  kubectl scale mcd {DEMO_POOL} --replicas 4");
    println!(
        "  kubectl patch mcd {DEMO_POOL} --type merge -p '{{\"spec\":{{\"template\":{{\"spec\":{{\"class\":{{\"name\":\"demo-class\"}}}}}}}}}}'   # roll back: watch with kubectl get mc -w"
    );
    println!(
        "\nComponents (admin: /metrics /livez /readyz; logs in {}):",
        dir.display()
    );
    for p in processes {
        let shown = p
            .admin
            .map(|a| format!("http://{a}/metrics"))
            .or_else(|| p.about.clone())
            .unwrap_or_default();
        println!("  {:<24} {shown}", p.name);
    }
}

async fn stop_all(processes: &mut [Process]) -> Result<()> {
    let mut failures = Vec::new();
    for process in processes.iter_mut().rev() {
        if let Err(error) = stop(process).await {
            failures.push(format!("{error:#}"));
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

/// SIGTERM, then at most 15 s for a clean exit 0.
async fn stop(process: &mut Process) -> Result<()> {
    if let Some(pid) = process.child.id() {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    }
    let status = tokio::time::timeout(Duration::from_secs(15), process.child.wait()).await;
    match status {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => bail!(
            "{} exited with {status}; see {}",
            process.name,
            process.log.display()
        ),
        Ok(Err(error)) => Err(error.into()),
        Err(_) => {
            let _ = process.child.kill().await;
            bail!(
                "{} did not exit within 15 s of SIGTERM; see {}",
                process.name,
                process.log.display()
            )
        }
    }
}
