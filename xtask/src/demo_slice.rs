//! The KubeSlice part of `cargo xtask demo`: a hub and two worker clusters (the demo's main
//! kube-sim is worker A), a SliceGateway pair and one gw-recycler per worker. Both workers run
//! the pods of Capstan's image for real (`kube-sim --exec-images`): the slice router pod runs
//! `router-sidecar` and each gateway pod `gw-sidecar` on its own pod IP, so a gateway pair
//! recycles live.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use capstan_apis::networking::{LABEL_POD_TYPE, POD_TYPE_SLICEGATEWAY};
use capstan_gw_recycler::trigger::TriggerArgs;
use capstan_testkit::kubeslice;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, PostParams};
use tokio::process::Command;

use crate::demo::{Process, spawn_as, wait_for_admin, wait_for_kubeconfig};

pub const HUB_NS: &str = "kubeslice-demo";
pub const GW_NS: &str = capstan_apis::networking::DEFAULT_NAMESPACE;
pub const SLICE: &str = "red";
pub const SERVER_GW: &str = "red-a-b";
pub const CLIENT_GW: &str = "red-b-a";
/// Pod CIDRs of worker A and B: loopback addresses, so a sidecar can listen on its pod IP.
pub const WORKER_A_POD_CIDR: &str = "127.61.0.0/16";
const WORKER_B_POD_CIDR: &str = "127.62.0.0/16";
const TIMEOUT: Duration = Duration::from_secs(120);
/// Capstan's image (the gateway template's default, tag ignored): its containers run the built
/// binaries.
const IMAGE: &str = "ghcr.io/capstan/capstan";

/// `kube-sim serve` arguments that run the containers of Capstan's image from `bin_dir`.
pub fn exec_images_args(bin_dir: &Path) -> [String; 2] {
    [
        "--exec-images".into(),
        format!("{IMAGE}={}", bin_dir.display()),
    ]
}

/// One worker cluster of the slice: its kubeconfig and client.
struct Worker {
    name: &'static str,
    kubeconfig: PathBuf,
    client: kube::Client,
}

/// The processes of the slice part (stopped by the caller, with the rest).
pub struct Slice {
    pub processes: Vec<Process>,
    pub hub_kubeconfig: PathBuf,
    workers: Vec<Worker>,
}

/// Starts the hub and worker B, seeds both workers and runs one gw-recycler per worker.
pub async fn start(
    bin_dir: &Path,
    dir: &Path,
    worker_a_kubeconfig: &Path,
    worker_a: &kube::Client,
) -> Result<Slice> {
    let mut slice = Slice {
        processes: Vec::new(),
        hub_kubeconfig: dir.join("hub.kubeconfig"),
        workers: Vec::new(),
    };
    let hub_kubeconfig = slice.hub_kubeconfig.clone();
    let hub = start_sim(bin_dir, dir, "hub", &hub_kubeconfig, &[], &mut slice).await?;
    namespace(&hub, HUB_NS).await?;
    let b_kubeconfig = dir.join("worker-b.kubeconfig");
    let [exec_flag, exec_image] = exec_images_args(bin_dir);
    let b_args = [
        "--simulate-workloads",
        "--pod-cidr",
        WORKER_B_POD_CIDR,
        &exec_flag,
        &exec_image,
    ];
    let worker_b = start_sim(bin_dir, dir, "worker-b", &b_kubeconfig, &b_args, &mut slice).await?;
    let sides = [
        (
            "worker-a",
            worker_a_kubeconfig.to_path_buf(),
            worker_a.clone(),
            SERVER_GW,
            "Server",
            "10.2.0.0/16",
        ),
        (
            "worker-b",
            b_kubeconfig,
            worker_b,
            CLIENT_GW,
            "Client",
            "10.1.0.0/16",
        ),
    ];
    for (name, kubeconfig, client, gateway, host_type, remote) in sides {
        namespace(&client, GW_NS).await?;
        seed_worker(&client, gateway, host_type, remote).await?;
        slice.workers.push(Worker {
            name,
            kubeconfig,
            client,
        });
    }
    let hub_arg = slice.hub_kubeconfig.to_string_lossy().into_owned();
    for worker in &slice.workers {
        let kubeconfig = worker.kubeconfig.to_string_lossy().into_owned();
        let args = [
            "--kubeconfig",
            &kubeconfig,
            "--hub-kubeconfig",
            &hub_arg,
            "--hub-namespace",
            HUB_NS,
            "--metrics-addr",
            "127.0.0.1:0",
            "--drain-delay",
            "1s",
            "--step-timeout",
            "60s",
        ];
        let label = format!("gw-recycler-{}", worker.name);
        let mut process = spawn_as(bin_dir, dir, "gw-recycler", &label, &args)?;
        process.admin = Some(wait_for_admin(&mut process).await?);
        slice.processes.push(process);
    }
    Ok(slice)
}

impl Slice {
    /// Waits for both gateways' pods, then recycles instance 0 of the pair with `gw-recycler
    /// trigger --wait`, whose state changes go straight to the terminal.
    pub async fn recycle(&self, bin_dir: &Path) -> Result<()> {
        for worker in &self.workers {
            wait_for_gateway_pods(worker).await?;
        }
        println!("\nRecycling gateway pair {SERVER_GW} / {CLIENT_GW} (instance 0) live:");
        let wait = TriggerArgs {
            wait: true,
            ..self.trigger_args()
        };
        let trigger = Command::new(bin_dir.join("gw-recycler"))
            .args(wait.to_args())
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .status();
        let status = tokio::time::timeout(TIMEOUT, trigger)
            .await
            .context("the recycle did not end within 120 s (see gw-recycler-*.log)")??;
        if !status.success() {
            bail!("gw-recycler trigger --wait exited with {status} (see gw-recycler-*.log)");
        }
        Ok(())
    }

    fn trigger_args(&self) -> TriggerArgs {
        TriggerArgs::new(&self.hub_kubeconfig, HUB_NS, SLICE, SERVER_GW, CLIENT_GW)
    }

    pub fn print_guide(&self, bin_dir: &Path) {
        let hub = self.hub_kubeconfig.display();
        println!(
            "\nKubeSlice gateway recycling (hub + worker A = server side, worker B = client side):"
        );
        println!("  KUBECONFIG={hub} kubectl -n {HUB_NS} get workerslicegwrecyclers -w");
        for worker in &self.workers {
            println!(
                "  KUBECONFIG={} kubectl -n {GW_NS} get slicegateways,deployments,pods   # {}",
                worker.kubeconfig.display(),
                worker.name
            );
        }
        if let Some(worker) = self.workers.first() {
            println!(
                "  KUBECONFIG={} kubectl -n {GW_NS} logs vl3-slice-router-{SLICE}   # the router sidecar, a real process",
                worker.kubeconfig.display()
            );
        }
        let other_instance = TriggerArgs {
            instance: 1,
            wait: true,
            ..self.trigger_args()
        };
        println!(
            "  {} {}   # recycle the other instance",
            bin_dir.join("gw-recycler").display(),
            other_instance.to_args().join(" ")
        );
    }
}

async fn start_sim(
    bin_dir: &Path,
    dir: &Path,
    name: &str,
    kubeconfig: &Path,
    extra: &[&str],
    slice: &mut Slice,
) -> Result<kube::Client> {
    let _ = std::fs::remove_file(kubeconfig);
    let out = kubeconfig.to_string_lossy().into_owned();
    let mut args = vec!["serve", "--addr", "127.0.0.1:0", "--kubeconfig-out", &out];
    args.extend_from_slice(extra);
    let mut process = spawn_as(bin_dir, dir, "kube-sim", &format!("kube-sim-{name}"), &args)?;
    process.about = Some(format!("API server, kubeconfig {out}"));
    let client = wait_for_kubeconfig(kubeconfig, &mut process).await;
    slice.processes.push(process);
    let client = client?;
    capstan_testkit::install_capstan_crds(&client).await?;
    Ok(client)
}

async fn namespace(client: &kube::Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &capstan_testkit::objects::namespace(name),
        )
        .await?;
    Ok(())
}

/// The SliceGateway of one side (its config as the worker-operator writes it) and the slice
/// router pod, running `router-sidecar` on its pod IP.
async fn seed_worker(
    client: &kube::Client,
    gateway: &str,
    host_type: &str,
    remote_subnet: &str,
) -> Result<()> {
    kubeslice::create_slice_gateway(client, GW_NS, SLICE, gateway, host_type, remote_subnet)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), GW_NS);
    let router = kubeslice::slice_router_pod(GW_NS, SLICE, IMAGE, &[]);
    pods.create(&PostParams::default(), &router).await?;
    Ok(())
}

async fn wait_for_gateway_pods(worker: &Worker) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(worker.client.clone(), GW_NS);
    let selector = format!("{LABEL_POD_TYPE}={POD_TYPE_SLICEGATEWAY}");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let list = pods.list(&ListParams::default().labels(&selector)).await?;
        let running = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running >= 2 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "{}: {running} gateway pods Running, want 2 (see gw-recycler-{}.log)",
                worker.name,
                worker.name
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
