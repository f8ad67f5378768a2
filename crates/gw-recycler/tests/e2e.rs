//! End to end across a hub and two worker clusters (three kube-sims), the real `gw-recycler`
//! binary per worker, and sidecars on the gateway and router pods' IPs: a recycle moves the
//! routers to the new gateways make-before-break, survives a kill -9 of the server, and fails
//! into error_state with a Warning Event when a condition never comes.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capstan_apis::networking::SliceGateway;
use capstan_apis::worker::WorkerSliceGwRecycler;
use capstan_runtime::testing::http_get;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube_sim::faults::{ErrorRule, FaultConfig};

mod common;
use common::{
    BIN, CLIENT_GW, CLIENT_REMOTE_SUBNET, Cluster, HUB_NS, SERVER_GW, SERVER_REMOTE_SUBNET, Worker,
    eventually,
};

const WAIT: u64 = 60;

struct Testbed {
    hub: Cluster,
    server: Worker,
    client: Worker,
}

impl Testbed {
    /// `octet`: pod IPs come from 127.<octet>.0.0/16 and the next two, distinct per test so
    /// tests running at once never share a pod IP.
    async fn start(octet: u8) -> Self {
        let cidr = |n: u8| format!("127.{}.0.0/16", octet + n);
        Self {
            hub: Cluster::start(&cidr(0), HUB_NS).await,
            server: Worker::start(&cidr(1), SERVER_GW, "Server", SERVER_REMOTE_SUBNET).await,
            client: Worker::start(&cidr(2), CLIENT_GW, "Client", CLIENT_REMOTE_SUBNET).await,
        }
    }

    fn recyclers(&self) -> Api<WorkerSliceGwRecycler> {
        Api::namespaced(self.hub.client.clone(), HUB_NS)
    }

    /// Records every distinct `spec.state` written to the recycle `name`.
    fn record_states(&self, name: &str) -> Arc<Mutex<Vec<String>>> {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let out = seen.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(self.recyclers(), config)
            .default_backoff()
            .applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(cr)) = stream.next().await {
                let state = cr
                    .spec
                    .state
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                let mut seen = out.lock().expect("lock");
                if seen.last() != Some(&state) {
                    seen.push(state);
                }
            }
        });
        seen
    }

    /// Waits until both workers serve through their generation-0 gateways.
    async fn wait_initial_gateways(&self) -> (BTreeSet<IpAddr>, BTreeSet<IpAddr>) {
        (
            wait_steady(&self.server, &["red-a-b-0-0", "red-a-b-1-0"]).await,
            wait_steady(&self.client, &["red-b-a-0-0", "red-b-a-1-0"]).await,
        )
    }

    /// Waits until instance 0 of both workers moved to generation 1 and the routers follow.
    async fn wait_recycled_gateways(&self) -> (BTreeSet<IpAddr>, BTreeSet<IpAddr>) {
        (
            wait_steady(&self.server, &["red-a-b-0-1", "red-a-b-1-0"]).await,
            wait_steady(&self.client, &["red-b-a-0-1", "red-b-a-1-0"]).await,
        )
    }

    /// Waits until the recycle of `red-a-b-0-0` is in `state`.
    async fn wait_state(&self, state: &str) {
        let what = format!("recycle in {state}");
        eventually(WAIT, &what, || async {
            let cr = self.recyclers().get("red-a-b-0-0").await.ok()?;
            (cr.state().as_str() == state).then_some(())
        })
        .await;
    }

    async fn trigger(&self, extra: &[&str]) -> std::process::Output {
        let mut args = vec![
            "trigger",
            "--hub-kubeconfig",
            self.hub.kubeconfig_path(),
            "--hub-namespace",
            HUB_NS,
            "--slice",
            "red",
            "--server-gateway",
            SERVER_GW,
            "--client-gateway",
            CLIENT_GW,
        ];
        args.extend_from_slice(extra);
        let run = tokio::process::Command::new(BIN).args(&args).output();
        tokio::time::timeout(Duration::from_secs(WAIT), run)
            .await
            .expect("trigger finishes in time")
            .expect("trigger runs")
    }
}

async fn deployment_names(worker: &Worker) -> BTreeSet<String> {
    let api: Api<Deployment> = Api::namespaced(worker.cluster.client.clone(), common::NS);
    api.list(&ListParams::default())
        .await
        .expect("deployments")
        .items
        .into_iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .filter_map(|d| d.metadata.name)
        .collect()
}

async fn intermediate(worker: &Worker) -> Vec<String> {
    let api: Api<SliceGateway> = Api::namespaced(worker.cluster.client.clone(), common::NS);
    api.get(worker.gateway)
        .await
        .expect("gateway")
        .intermediate_deployments()
        .to_vec()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Waits until `worker` runs exactly `deployments` and its router's next hops are exactly their
/// pods' IPs (one per deployment).
async fn wait_steady(worker: &Worker, deployments: &[&str]) -> BTreeSet<IpAddr> {
    let what = format!("{} serves via {deployments:?}", worker.gateway);
    eventually(WAIT, &what, || async {
        if deployment_names(worker).await != set(deployments) {
            return None;
        }
        let mut ips = BTreeSet::new();
        for d in deployments {
            ips.extend(worker.pod_ips_of(d).await);
        }
        (ips.len() == deployments.len() && worker.next_hops() == ips).then_some(ips)
    })
    .await
}

/// Samples both routers until stopped; counts moments when the recycled instance (0) had no
/// next hop, i.e. the router's hops were only those of the untouched instance 1.
fn sample_routers(
    bed: &Arc<Testbed>,
    untouched: [BTreeSet<IpAddr>; 2],
) -> (
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let gaps = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(AtomicUsize::new(0));
    let (g, s, b) = (gaps.clone(), samples.clone(), bed.clone());
    let task = tokio::spawn(async move {
        loop {
            for (worker, instance_1) in [&b.server, &b.client].into_iter().zip(&untouched) {
                if worker.next_hops().difference(instance_1).next().is_none() {
                    g.fetch_add(1, Ordering::SeqCst);
                }
            }
            s.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    (gaps, samples, task)
}

async fn events_on_hub(hub: &Cluster) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(hub.client.clone(), HUB_NS);
    api.list(&ListParams::default())
        .await
        .expect("events")
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycle_moves_both_routers_to_the_new_gateways_without_a_gap() {
    let bed = Arc::new(Testbed::start(30).await);
    let server = bed
        .server
        .spawn_recycler(&bed.hub, &["--drain-delay", "300ms"])
        .await;
    let _client = bed.client.spawn_recycler(&bed.hub, &[]).await;
    let (old_server, old_client) = bed.wait_initial_gateways().await;

    let states = bed.record_states("red-a-b-0-0");
    let untouched = [
        bed.server.pod_ips_of("red-a-b-1-0").await,
        bed.client.pod_ips_of("red-b-a-1-0").await,
    ];
    let (gaps, samples, sampler) = sample_routers(&bed, untouched);
    let out = bed.trigger(&["--wait"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "trigger failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sampler.abort();

    assert_eq!(
        stdout.lines().rfind(|l| l.starts_with("state: ")),
        Some("state: end")
    );
    let expected = [
        "init",
        "new_deployment_created_state",
        "slicerouter_updated_state",
        "old_deployment_deleted_state",
        "end",
    ];
    eventually(10, "the watch saw end", || async {
        (states.lock().expect("lock").last().map(String::as_str) == Some("end")).then_some(())
    })
    .await;
    assert_eq!(*states.lock().expect("lock"), expected);
    let cr = bed.recyclers().get("red-a-b-0-0").await.expect("recycler");
    assert_eq!(
        cr.spec.request.as_ref().map(|r| r.to_string()).as_deref(),
        Some("none")
    );
    assert_eq!(
        cr.response().map(|r| r.to_string()).as_deref(),
        Some("old_gw_deployment_deleted")
    );

    // New deployments regular, old ones gone, routers only at the new gateways' NSM IPs.
    let (new_server, new_client) = bed.wait_recycled_gateways().await;
    assert!(intermediate(&bed.server).await.is_empty());
    assert!(intermediate(&bed.client).await.is_empty());
    let old_only: Vec<_> = old_server.difference(&new_server).collect();
    assert_eq!(
        old_only.len(),
        1,
        "exactly the recycled gateway left the server router"
    );
    assert_eq!(old_client.difference(&new_client).count(), 1);

    assert!(samples.load(Ordering::SeqCst) > 10, "the sampler ran");
    assert_eq!(
        gaps.load(Ordering::SeqCst),
        0,
        "a router was without a next hop for the recycled gateway instance"
    );

    // Each Event follows its state write, so the last one may arrive after `end` is seen.
    let reasons = eventually(10, "the three reference Events", || async {
        let reasons: BTreeSet<String> = events_on_hub(&bed.hub)
            .await
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        let all = [
            "FSMNewGWSpawned",
            "FSMRoutingTableUpdated",
            "FSMDeleteOldGW",
        ]
        .iter()
        .all(|r| reasons.contains(*r));
        all.then_some(reasons)
    })
    .await;
    assert!(!reasons.contains("FSMErrorState"), "{reasons:?}");

    // The server counted each transition once and one finished recycle.
    let metrics = http_get(server.admin_addr(), "/metrics")
        .await
        .expect("metrics")
        .body;
    for line in [
        r#"capstan_gw_recycler_transitions_total{from="init",to="new_deployment_created_state"} 1"#,
        r#"capstan_gw_recycler_transitions_total{from="old_deployment_deleted_state",to="end"} 1"#,
        r#"capstan_gw_recycler_recycles_total{outcome="end"} 1"#,
        "capstan_gw_recycler_recycle_duration_seconds_count 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }

    // A second trigger while none is in progress starts anew; one in progress is refused.
    let again = bed
        .trigger(&[
            "--server-deployment",
            "red-a-b-0-1",
            "--client-deployment",
            "red-b-a-0-1",
        ])
        .await;
    assert!(again.status.success());
    let refused = bed.trigger(&["--instance", "1"]).await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("recycle red-a-b-0-1 of SliceGateway red-a-b is in progress"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_recycle_resumes_and_creates_nothing_twice() {
    let bed = Arc::new(Testbed::start(33).await);
    let mut server = bed
        .server
        .spawn_recycler(&bed.hub, &["--drain-delay", "100ms"])
        .await;
    // The client's recycler starts later, so the server waits in new_deployment_created_state.
    let client_gateways = bed
        .client
        .spawn_recycler(&bed.hub, &["--role", "server"])
        .await;
    bed.wait_initial_gateways().await;

    // Count creations of the new server deployment from here on.
    let created = Arc::new(AtomicUsize::new(0));
    let c = created.clone();
    let deployments: Api<Deployment> =
        Api::namespaced(bed.server.cluster.client.clone(), common::NS);
    let watch = watcher(
        deployments,
        watcher::Config::default().fields("metadata.name=red-a-b-0-1"),
    );
    tokio::spawn(async move {
        let mut watch = std::pin::pin!(watch);
        let mut seen_uids = BTreeSet::new();
        while let Some(Ok(event)) = watch.next().await {
            if let watcher::Event::Apply(d) | watcher::Event::InitApply(d) = event
                && seen_uids.insert(d.metadata.uid.clone().unwrap_or_default())
            {
                c.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let states = bed.record_states("red-a-b-0-0");
    assert!(bed.trigger(&[]).await.status.success());
    eventually(
        WAIT,
        "server in new_deployment_created_state with newS up",
        || async {
            let cr = bed.recyclers().get("red-a-b-0-0").await.ok()?;
            let up = !bed.server.pod_ips_of("red-a-b-0-1").await.is_empty();
            (cr.state().as_str() == "new_deployment_created_state" && up).then_some(())
        },
    )
    .await;
    server
        .signal(nix::sys::signal::Signal::SIGKILL)
        .expect("kill -9");
    let _ = server.wait_exit(Duration::from_secs(10)).await;
    let _server = bed
        .server
        .spawn_recycler(&bed.hub, &["--drain-delay", "100ms"])
        .await;
    // The client side joins now (auto role); the restricted one only reconciled gateways.
    drop(client_gateways);
    let _client = bed.client.spawn_recycler(&bed.hub, &[]).await;

    bed.wait_state("end").await;
    eventually(10, "the watch saw end", || async {
        (states.lock().expect("lock").last().map(String::as_str) == Some("end")).then_some(())
    })
    .await;
    assert_eq!(
        *states.lock().expect("lock"),
        [
            "init",
            "new_deployment_created_state",
            "slicerouter_updated_state",
            "old_deployment_deleted_state",
            "end"
        ]
    );
    assert_eq!(
        created.load(Ordering::SeqCst),
        1,
        "red-a-b-0-1 created once"
    );
    bed.wait_recycled_gateways().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_that_never_comes_ends_in_error_state_with_a_warning() {
    let bed = Arc::new(Testbed::start(36).await);
    // No recycler on the client cluster: the client never responds.
    let _server = bed
        .server
        .spawn_recycler(&bed.hub, &["--step-timeout", "2s"])
        .await;
    wait_steady(&bed.server, &["red-a-b-0-0", "red-a-b-1-0"]).await;
    let out = bed.trigger(&["--wait"]).await;
    assert!(!out.status.success(), "a failed recycle exits non-zero");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("state: error_state"), "{stdout}");

    let cr = bed.recyclers().get("red-a-b-0-0").await.expect("recycler");
    assert_eq!(cr.state().as_str(), "error_state");
    let condition = cr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.first())
        .cloned()
        .expect("a condition says why");
    assert!(
        condition.message.contains("new_deployment_created_state"),
        "{}",
        condition.message
    );
    assert!(
        condition
            .message
            .contains("the client responds new_deployment_created"),
        "{}",
        condition.message
    );
    let warning = eventually(10, "Warning Event", || async {
        events_on_hub(&bed.hub)
            .await
            .into_iter()
            .find(|e| e.type_.as_deref() == Some("Warning"))
    })
    .await;
    let note = warning.note.unwrap_or_default();
    assert!(note.contains("new_deployment_created_state"), "{note}");
}

/// 5% of the recyclers' writes fail and every watch is cut after a few events, on all three
/// clusters: each step is retried from the CR and the recycle still ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycle_ends_despite_write_errors_and_cut_watches() {
    let bed = Arc::new(Testbed::start(39).await);
    let _server = bed
        .server
        .spawn_recycler(&bed.hub, &["--drain-delay", "100ms"])
        .await;
    let _client = bed.client.spawn_recycler(&bed.hub, &[]).await;
    bed.wait_initial_gateways().await;
    let faults = || FaultConfig {
        seed: 7,
        errors: vec![ErrorRule {
            verbs: ["create", "update", "patch", "delete"]
                .map(String::from)
                .into(),
            resources: Vec::new(),
            rate: 0.05,
            code: 500,
            retry_after_seconds: 1,
        }],
        watch_max_events: Some(5),
        ..FaultConfig::default()
    };
    bed.server.cluster.sim.set_faults(faults());
    bed.client.cluster.sim.set_faults(faults());
    // The trigger's own create is not under test: faults on the hub start after it.
    assert!(bed.trigger(&[]).await.status.success());
    bed.hub.sim.set_faults(faults());

    bed.wait_state("end").await;
    bed.server.cluster.sim.set_faults(FaultConfig::default());
    bed.client.cluster.sim.set_faults(FaultConfig::default());
    bed.wait_recycled_gateways().await;
    assert!(intermediate(&bed.server).await.is_empty());
    assert!(intermediate(&bed.client).await.is_empty());
}

/// The server's router sidecar is unreachable while the recycle needs it: the step waits (the
/// route via the new gateway cannot be verified) and proceeds once the router answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_down_for_a_while_holds_the_step_until_it_returns() {
    let bed = Arc::new(Testbed::start(42).await);
    let _server = bed
        .server
        .spawn_recycler(&bed.hub, &["--drain-delay", "100ms"])
        .await;
    let _client = bed.client.spawn_recycler(&bed.hub, &[]).await;
    bed.wait_initial_gateways().await;

    let outage = {
        let bed = bed.clone();
        tokio::spawn(async move {
            bed.server
                .kubelet
                .router_outage(Duration::from_secs(3))
                .await
        })
    };
    assert!(bed.trigger(&[]).await.status.success());
    // While the router is away the server cannot see the route via newS.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let cr = bed.recyclers().get("red-a-b-0-0").await.expect("recycler");
    assert_eq!(cr.state().as_str(), "new_deployment_created_state");
    outage.await.expect("router back");

    bed.wait_state("end").await;
    wait_steady(&bed.server, &["red-a-b-0-1", "red-a-b-1-0"]).await;
}

/// Both recyclers killed (-9) while the server drains in old_deployment_deleted_state: restarted,
/// they finish from the CR (the drain counts from the recorded state time) without redoing steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_recyclers_killed_while_draining_finish_after_restart() {
    let bed = Arc::new(Testbed::start(45).await);
    let drain = ["--drain-delay", "3s"];
    let mut server = bed.server.spawn_recycler(&bed.hub, &drain).await;
    let mut client = bed.client.spawn_recycler(&bed.hub, &[]).await;
    bed.wait_initial_gateways().await;
    let states = bed.record_states("red-a-b-0-0");
    assert!(bed.trigger(&[]).await.status.success());
    bed.wait_state("old_deployment_deleted_state").await;
    for bin in [&mut server, &mut client] {
        bin.signal(nix::sys::signal::Signal::SIGKILL)
            .expect("kill -9");
        let _ = bin.wait_exit(Duration::from_secs(10)).await;
    }
    let _server = bed.server.spawn_recycler(&bed.hub, &drain).await;
    let _client = bed.client.spawn_recycler(&bed.hub, &[]).await;
    bed.wait_state("end").await;
    eventually(10, "the watch saw end", || async {
        (states.lock().expect("lock").last().map(String::as_str) == Some("end")).then_some(())
    })
    .await;
    assert_eq!(
        *states.lock().expect("lock"),
        [
            "init",
            "new_deployment_created_state",
            "slicerouter_updated_state",
            "old_deployment_deleted_state",
            "end"
        ]
    );
    let cr = bed.recyclers().get("red-a-b-0-0").await.expect("recycler");
    assert_eq!(
        cr.response().map(|r| r.to_string()).as_deref(),
        Some("old_gw_deployment_deleted")
    );
    bed.wait_recycled_gateways().await;
}
