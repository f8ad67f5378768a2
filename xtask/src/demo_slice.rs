//! The KubeSlice part of `cargo xtask demo`: a hub and two worker clusters (the demo's main
//! kube-sim is worker A), a SliceGateway pair, one gw-recycler per worker, and a stand-in kubelet
//! that runs each pod's Capstan sidecar binary on the pod's IP, so a gateway pair recycles live.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use capstan_apis::networking::{LABEL_POD_TYPE, POD_TYPE_SLICEGATEWAY, SliceGateway};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::process::{Child, Command};

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

/// One worker cluster of the slice: its kubeconfig, client and stand-in kubelet.
struct Worker {
    name: &'static str,
    kubeconfig: PathBuf,
    client: kube::Client,
    kubelet: tokio::task::JoinHandle<()>,
}

/// The processes of the slice part (stopped by the caller, with the rest) and its kubelets.
pub struct Slice {
    pub processes: Vec<Process>,
    pub hub_kubeconfig: PathBuf,
    workers: Vec<Worker>,
}

impl Drop for Slice {
    fn drop(&mut self) {
        for worker in &self.workers {
            worker.kubelet.abort();
        }
    }
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
    let b_args = ["--simulate-workloads", "--pod-cidr", WORKER_B_POD_CIDR];
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
        let kubelet = tokio::spawn(kubelet(
            client.clone(),
            bin_dir.to_path_buf(),
            dir.join(format!("pods-{name}")),
            kubeconfig.clone(),
        ));
        slice.workers.push(Worker {
            name,
            kubeconfig,
            client,
            kubelet,
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
            "--gateway-arg=--log-level=warn",
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
        let hub = self.hub_kubeconfig.to_string_lossy().into_owned();
        let trigger = Command::new(bin_dir.join("gw-recycler"))
            .args(self.trigger_args(&hub))
            .arg("--wait")
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

    fn trigger_args<'a>(&self, hub: &'a str) -> Vec<&'a str> {
        vec![
            "trigger",
            "--hub-kubeconfig",
            hub,
            "--hub-namespace",
            HUB_NS,
            "--slice",
            SLICE,
            "--server-gateway",
            SERVER_GW,
            "--client-gateway",
            CLIENT_GW,
        ]
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
        let hub = hub.to_string();
        println!(
            "  {} {} --instance 1 --wait   # recycle the other instance",
            bin_dir.join("gw-recycler").display(),
            self.trigger_args(&hub).join(" ")
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
    let client = wait_for_kubeconfig(kubeconfig, &mut process).await;
    slice.processes.push(process);
    let client = client?;
    capstan_testkit::install_capstan_crds(&client).await?;
    Ok(client)
}

async fn namespace(client: &kube::Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    namespaces.create(&PostParams::default(), &ns).await?;
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
    let gateways: Api<SliceGateway> = Api::namespaced(client.clone(), GW_NS);
    let gw = serde_json::from_value(json!({
        "apiVersion": "networking.kubeslice.io/v1beta1", "kind": "SliceGateway",
        "metadata": {"name": gateway, "namespace": GW_NS},
        "spec": {"sliceName": SLICE}
    }))?;
    gateways.create(&PostParams::default(), &gw).await?;
    let status = json!({"status": {"config": {
        "sliceName": SLICE, "sliceGatewayName": gateway, "sliceGatewayHostType": host_type,
        "sliceGatewayRemoteSubnet": remote_subnet
    }}});
    gateways
        .patch_status(gateway, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), GW_NS);
    let router = serde_json::from_value(json!({
        "metadata": {"name": format!("vl3-slice-router-{SLICE}"), "namespace": GW_NS,
                     "labels": {"networkservicemesh.io/impl": format!("vl3-service-{SLICE}")}},
        "spec": {"containers": [{
            "name": "kubeslice-router-sidecar", "image": "capstan", "command": ["router-sidecar"],
            "args": ["--backend", "memory", "--listen", "$(POD_IP):5000",
                     "--metrics-addr", "$(POD_IP):8081", "--log-level", "warn"],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
        }]}
    }))?;
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
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
            .count();
        if running >= 2 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "{}: {running} gateway pods with an IP, want 2 (see gw-recycler-{}.log)",
                worker.name,
                worker.name
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Plays kubelet for Capstan's sidecars until kube-sim runs containers itself: every pod with an
/// IP whose first container's command is a Capstan binary gets that binary, with the container's
/// args (`$(VAR)` expanded from its env, `status.podIP` and `metadata.name` field refs), as a
/// process; it is killed when the pod goes. Looks every 200 ms (a demo, not a product).
async fn kubelet(client: kube::Client, bin_dir: PathBuf, logs: PathBuf, kubeconfig: PathBuf) {
    let _ = std::fs::create_dir_all(&logs);
    let pods: Api<Pod> = Api::namespaced(client, GW_NS);
    let mut running: HashMap<String, Child> = HashMap::new();
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            let mut live = Vec::new();
            for pod in &list.items {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if pod.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                live.push(uid.clone());
                if running.contains_key(&uid) {
                    continue;
                }
                if let Some(child) = run_pod(pod, &bin_dir, &logs, &kubeconfig) {
                    running.insert(uid, child);
                }
            }
            running.retain(|uid, child| {
                let keep = live.contains(uid);
                if !keep {
                    let _ = child.start_kill();
                }
                keep
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn run_pod(pod: &Pod, bin_dir: &Path, logs: &Path, kubeconfig: &Path) -> Option<Child> {
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let container = pod.spec.as_ref()?.containers.first()?;
    let binary = container
        .command
        .as_ref()?
        .first()?
        .rsplit('/')
        .next()?
        .to_string();
    if !["gw-sidecar", "router-sidecar"].contains(&binary.as_str()) {
        return None;
    }
    let mut env = vec![("HOSTNAME".to_string(), name.clone())];
    for var in container.env.iter().flatten() {
        let field = var.value_from.as_ref().and_then(|f| f.field_ref.as_ref());
        let value = match field.map(|f| f.field_path.as_str()) {
            Some("status.podIP") => ip.clone(),
            Some("metadata.name") => name.clone(),
            Some(_) => continue,
            None => var.value.clone().unwrap_or_default(),
        };
        env.push((var.name.clone(), value));
    }
    let args: Vec<String> = container
        .args
        .iter()
        .flatten()
        .map(|arg| {
            env.iter()
                .fold(arg.clone(), |a, (k, v)| a.replace(&format!("$({k})"), v))
        })
        .collect();
    let log = std::fs::File::create(logs.join(format!("{name}.log"))).ok()?;
    Command::new(bin_dir.join(&binary))
        .args(&args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .envs(env)
        .stdin(Stdio::null())
        .stdout(log.try_clone().ok()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .ok()
}
