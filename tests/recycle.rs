//! gw-recycler end to end: a hub and two worker clusters (three kube-sims that really run the
//! pods' containers), the real `gw-recycler` per worker, `router-sidecar` in each slice router pod
//! and `gw-sidecar` in each gateway pod, each on its own pod IP. A recycle moves both routers to
//! the new gateways make-before-break; it survives kill -9 of either recycler at each state, a
//! router that is away for a while, write errors and cut watches; a condition that never comes
//! ends in error_state with a Warning Event, as does a recycle naming a client deployment that
//! does not exist.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capstan_scenarios::slice::{
    CLIENT_AFTER, CLIENT_BEFORE, CLIENT_WRITES, SERVER_AFTER, SERVER_BEFORE, SERVER_WRITES,
    Testbed, WAIT, Worker, announced, block_writes, deployments_created, events_on_hub,
    failed_writes, gateway_nsm_ip, route_present, set_unavailable, use_kubeslice_controller_crd,
};
use capstan_testkit::eventually;
use capstan_testkit::process::{BinaryUnderTest, http_get};
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube_sim::faults::{ErrorRule, FaultConfig};
use nix::sys::signal::Signal;

/// The reference's states of a full recycle, in order.
const STATES: [&str; 5] = [
    "init",
    "new_deployment_created_state",
    "slicerouter_updated_state",
    "old_deployment_deleted_state",
    "end",
];
/// The client's response that lets the server leave each waiting state.
const RESPONSES: [&str; 3] = [
    "new_deployment_created",
    "routing_table_updated",
    "old_gw_deployment_deleted",
];
const FAST: [&str; 4] = ["--drain-delay", "200ms", "--step-timeout", "90s"];

/// Records every distinct `spec.state` written to the recycle of instance 0, from a watch.
fn record_states(bed: &Testbed) -> Arc<Mutex<Vec<String>>> {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let out = seen.clone();
    let config = watcher::Config::default().fields("metadata.name=red-a-b-0-0");
    let stream = watcher(bed.recyclers(), config)
        .default_backoff()
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            let Ok(cr) = item else { continue };
            let state = cr.state().to_string();
            let mut seen = out.lock().expect("lock");
            if seen.last() != Some(&state) {
                seen.push(state);
            }
        }
    });
    seen
}

/// Waits until the watch saw `end`, then returns every state it saw.
async fn states_seen(states: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    eventually("the watch saw end", WAIT, || async {
        let seen = states.lock().expect("lock").clone();
        (seen.last().map(String::as_str) == Some("end")).then_some(seen)
    })
    .await
}

/// Both workers serve through their generation-0 gateways; returns (server, client) NSM IPs.
async fn initial(bed: &Testbed) -> (BTreeSet<String>, BTreeSet<String>) {
    let none = BTreeSet::new();
    (
        bed.server.wait_steady(&SERVER_BEFORE, &none).await,
        bed.client.wait_steady(&CLIENT_BEFORE, &none).await,
    )
}

/// Instance 0 of both workers moved to generation 1, the old gateways gone from the routers.
async fn recycled(bed: &Testbed, old: &(BTreeSet<String>, BTreeSet<String>)) {
    let server = bed.server.wait_steady(&SERVER_AFTER, &old.0).await;
    let client = bed.client.wait_steady(&CLIENT_AFTER, &old.1).await;
    assert_eq!(
        server.difference(&old.0).count(),
        1,
        "one new server NSM IP"
    );
    assert_eq!(
        client.difference(&old.1).count(),
        1,
        "one new client NSM IP"
    );
    assert!(bed.server.intermediate().await.is_empty());
    assert!(bed.client.intermediate().await.is_empty());
}

/// Samples (over gRPC) whether `worker`'s router routes via some gateway of instance 0: the old
/// one, asked first, or any new one. A moment with neither is a gap.
async fn instance_0_routed(
    worker: &Worker,
    old: &str,
    new_deployment: &str,
    nsm_of: &mut HashMap<String, String>,
) -> Option<bool> {
    let router = worker.router_ip().await?;
    if route_present(&router, worker.remote_subnet, old).await? {
        return Some(true);
    }
    for pod_ip in worker.pod_ips_of(new_deployment).await {
        if !nsm_of.contains_key(&pod_ip)
            && let Some(nsm) = gateway_nsm_ip(&pod_ip).await
        {
            nsm_of.insert(pod_ip.clone(), nsm);
        }
        if let Some(nsm) = nsm_of.get(&pod_ip)
            && route_present(&router, worker.remote_subnet, nsm).await == Some(true)
        {
            return Some(true);
        }
    }
    Some(false)
}

struct Sampler {
    gaps: Arc<Mutex<Vec<String>>>,
    samples: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// Samples both routers until stopped, recording each moment instance 0 had no next hop.
fn sample_routers(bed: &Arc<Testbed>, old_server: String, old_client: String) -> Sampler {
    let gaps: Arc<Mutex<Vec<String>>> = Arc::default();
    let samples = Arc::new(AtomicUsize::new(0));
    let (g, s, b) = (gaps.clone(), samples.clone(), bed.clone());
    let task = tokio::spawn(async move {
        // A gateway pod's NSM IP, asked once (it does not change while the pod lives).
        let mut nsm_of = HashMap::new();
        loop {
            let sides = [
                (&b.server, old_server.as_str(), "red-a-b-0-1"),
                (&b.client, old_client.as_str(), "red-b-a-0-1"),
            ];
            for (worker, old, new) in sides {
                match instance_0_routed(worker, old, new, &mut nsm_of).await {
                    Some(true) => {}
                    Some(false) => g
                        .lock()
                        .expect("lock")
                        .push(format!("{}: no next hop", worker.gateway)),
                    None => g
                        .lock()
                        .expect("lock")
                        .push(format!("{}: router not answering", worker.gateway)),
                }
            }
            s.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    Sampler {
        gaps,
        samples,
        task,
    }
}

/// After the killed recycles: the recycle ends with exactly the reference's states, instance 0
/// moved, and each worker created its two initial gateways and one new one, each once.
async fn ended_creating_each_gateway_once(
    bed: &Testbed,
    states: &Arc<Mutex<Vec<String>>>,
    old: &(BTreeSet<String>, BTreeSet<String>),
) {
    bed.wait_state("end").await;
    bed.hub.sim.set_faults(FaultConfig::default());
    assert_eq!(states_seen(states).await, STATES);
    recycled(bed, old).await;
    assert_eq!(
        deployments_created(&bed.server.cluster),
        3,
        "newS created once"
    );
    assert_eq!(
        deployments_created(&bed.client.cluster),
        3,
        "newC created once"
    );
}

async fn kill_9(bin: &mut BinaryUnderTest) {
    bin.signal(Signal::SIGKILL).expect("kill -9");
    let _ = bin.wait_exit(Duration::from_secs(10)).await;
}

/// The only NSM IP of a set (one gateway pod per deployment).
fn only(ips: BTreeSet<String>) -> String {
    assert_eq!(ips.len(), 1, "{ips:?}");
    ips.into_iter().next().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycle_moves_both_routers_to_the_new_gateways_without_a_gap() {
    let bed = Arc::new(Testbed::start(70).await);
    // A longer drain: the sampler gets many looks between the route swap and the old's removal.
    let drain = ["--drain-delay", "2s", "--step-timeout", "90s"];
    let server = bed.server.spawn_recycler(&bed.hub, &drain).await;
    let _client = bed.client.spawn_recycler(&bed.hub, &drain).await;
    let old = initial(&bed).await;
    let old_server_0 = only(bed.server.nsm_ips_of(SERVER_BEFORE[0]).await);
    let old_client_0 = only(bed.client.nsm_ips_of(CLIENT_BEFORE[0]).await);

    let states = record_states(&bed);
    let sampler = sample_routers(&bed, old_server_0.clone(), old_client_0.clone());
    let out = bed.trigger(&["--wait"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "trigger failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sampler.task.abort();

    // `--wait` printed each state change and ended at end; the watch saw exactly the states.
    assert_eq!(
        stdout.lines().rfind(|l| l.starts_with("state: ")),
        Some("state: end")
    );
    assert_eq!(states_seen(&states).await, STATES);
    let cr = bed.recycle().await.expect("recycler");
    assert_eq!(
        cr.spec.request.as_ref().map(|r| r.to_string()).as_deref(),
        Some("none")
    );
    assert_eq!(
        cr.response().map(|r| r.to_string()).as_deref(),
        Some("old_gw_deployment_deleted")
    );

    // New deployments regular, old ones gone, routers only at the new gateways' NSM IPs.
    recycled(&bed, &old).await;
    assert_eq!(bed.server.routes_via(&old_server_0).await, Some(false));
    assert_eq!(bed.client.routes_via(&old_client_0).await, Some(false));

    let samples = sampler.samples.load(Ordering::SeqCst);
    eprintln!("router samples during the recycle: {samples}");
    assert!(samples > 10, "the sampler ran only {samples} times");
    let gaps = sampler.gaps.lock().expect("lock").clone();
    assert!(gaps.is_empty(), "a router lost instance 0: {gaps:?}");

    // Each Event follows its state write, so the last one may arrive after `end` is seen.
    let reasons = eventually("the three reference Events", WAIT, || async {
        let reasons: BTreeSet<String> = events_on_hub(&bed.hub)
            .await
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        [
            "FSMNewGWSpawned",
            "FSMRoutingTableUpdated",
            "FSMDeleteOldGW",
        ]
        .iter()
        .all(|r| reasons.contains(*r))
        .then_some(reasons)
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

    // Two initial gateways and one new one per worker, each created once.
    assert_eq!(deployments_created(&bed.server.cluster), 3);
    assert_eq!(deployments_created(&bed.client.cluster), 3);

    // A new trigger for the recycled pair starts anew; two at once start it once, the other is
    // refused whether it lost at the list or at the create (409).
    let again = [
        "--server-deployment",
        "red-a-b-0-1",
        "--client-deployment",
        "red-b-a-0-1",
    ];
    let (first, second) = tokio::join!(bed.trigger(&again), bed.trigger(&again));
    let (started, refused): (Vec<_>, Vec<_>) = [first, second]
        .into_iter()
        .partition(|out| out.status.success());
    assert_eq!(
        (started.len(), refused.len()),
        (1, 1),
        "{started:?} {refused:?}"
    );
    let stderr = String::from_utf8_lossy(&refused[0].stderr);
    assert!(
        stderr.contains("recycle red-a-b-0-1 of SliceGateway red-a-b is in progress"),
        "{stderr}"
    );
    let refused = bed.trigger(&["--instance", "1"]).await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("recycle red-a-b-0-1 of SliceGateway red-a-b is in progress"),
        "{stderr}"
    );
}

/// The server is killed (-9) at each state in turn, right after it did that state's work and
/// tried to move on (its CR writes fail meanwhile), and restarted: it resumes from the CR and
/// creates nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_at_each_state_resumes_and_creates_nothing_twice() {
    let bed = Testbed::start(73).await;
    let mut server = bed.server.spawn_recycler(&bed.hub, &FAST).await;
    let _client = bed.client.spawn_recycler(&bed.hub, &FAST).await;
    let old = initial(&bed).await;
    let states = record_states(&bed);

    // init: the server adds newS but cannot record the next state.
    bed.hub.sim.set_faults(block_writes(SERVER_WRITES));
    assert!(bed.trigger(&[]).await.status.success());
    eventually("newS created while the state write fails", WAIT, || async {
        let created = bed.server.deployment_names().await.contains("red-a-b-0-1");
        (created && failed_writes(&bed.hub, SERVER_WRITES) > 0).then_some(())
    })
    .await;
    assert_eq!(bed.recycle().await.expect("cr").state().as_str(), "init");
    kill_9(&mut server).await;
    // From here the client cannot answer until the server is held in its next state.
    bed.hub.sim.set_faults(block_writes(CLIENT_WRITES));
    server = bed.server.spawn_recycler(&bed.hub, &FAST).await;

    for (state, response) in STATES[1..4].iter().zip(RESPONSES) {
        bed.wait_state(state).await;
        let failed = failed_writes(&bed.hub, SERVER_WRITES);
        // The client may answer now; the server's move to the next state fails.
        bed.hub.sim.set_faults(block_writes(SERVER_WRITES));
        bed.wait_response(response).await;
        let what = format!("the server trying to leave {state}");
        eventually(&what, WAIT, || async {
            (failed_writes(&bed.hub, SERVER_WRITES) > failed).then_some(())
        })
        .await;
        assert_eq!(bed.recycle().await.expect("cr").state().as_str(), *state);
        kill_9(&mut server).await;
        bed.hub.sim.set_faults(block_writes(CLIENT_WRITES));
        server = bed.server.spawn_recycler(&bed.hub, &FAST).await;
    }
    ended_creating_each_gateway_once(&bed, &states, &old).await;
    drop(server);
}

/// The client is killed (-9) at each state in turn, after it did the work the request asks and
/// tried to answer (its status writes fail meanwhile), and restarted: it answers from the CR and
/// creates nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_at_each_state_resumes_and_creates_nothing_twice() {
    let bed = Testbed::start(76).await;
    let _server = bed.server.spawn_recycler(&bed.hub, &FAST).await;
    let mut client = bed.client.spawn_recycler(&bed.hub, &FAST).await;
    let old = initial(&bed).await;
    let states = record_states(&bed);

    // init: the server is held there; the client has nothing to do yet.
    bed.hub.sim.set_faults(block_writes(SERVER_WRITES));
    assert!(bed.trigger(&[]).await.status.success());
    eventually("the server trying to leave init", WAIT, || async {
        (failed_writes(&bed.hub, SERVER_WRITES) > 0).then_some(())
    })
    .await;
    kill_9(&mut client).await;
    client = bed.client.spawn_recycler(&bed.hub, &FAST).await;
    bed.hub.sim.set_faults(block_writes(CLIENT_WRITES));

    for (state, response) in STATES[1..4].iter().zip(RESPONSES) {
        bed.wait_state(state).await;
        let failed = failed_writes(&bed.hub, CLIENT_WRITES);
        let what = format!("the client trying to answer in {state}");
        eventually(&what, WAIT, || async {
            (failed_writes(&bed.hub, CLIENT_WRITES) > failed).then_some(())
        })
        .await;
        kill_9(&mut client).await;
        // The restarted client answers; the server stays until that answer is seen.
        bed.hub.sim.set_faults(block_writes(SERVER_WRITES));
        client = bed.client.spawn_recycler(&bed.hub, &FAST).await;
        bed.wait_response(response).await;
        bed.hub.sim.set_faults(block_writes(CLIENT_WRITES));
    }
    ended_creating_each_gateway_once(&bed, &states, &old).await;
    drop(client);
}

/// The server's slice router pod is gone (its router-sidecar stopped) while the recycle needs it:
/// the step waits, as the route via the new gateway cannot be verified, and proceeds once a
/// router pod runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_down_for_a_while_holds_the_step_until_it_returns() {
    let bed = Testbed::start(79).await;
    let _server = bed.server.spawn_recycler(&bed.hub, &FAST).await;
    let _client = bed.client.spawn_recycler(&bed.hub, &FAST).await;
    let old = initial(&bed).await;
    let states = record_states(&bed);

    bed.server.delete_router().await;
    assert!(bed.trigger(&[]).await.status.success());
    // Everything but the router is ready: newS runs and the client has answered.
    bed.wait_response("new_deployment_created").await;
    eventually("newS's gateway sidecar answering", WAIT, || async {
        (!bed.server.nsm_ips_of("red-a-b-0-1").await.is_empty()).then_some(())
    })
    .await;
    // Still waiting a while later (the probes back off to at most a second).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        bed.recycle().await.expect("cr").state().as_str(),
        "new_deployment_created_state"
    );

    bed.server.create_router().await;
    bed.wait_state("end").await;
    assert_eq!(states_seen(&states).await, STATES);
    recycled(&bed, &old).await;
}

/// A recycle with no recycler on the client cluster: the client never responds, and the server
/// (running, returned) fails it at its 2 s step timeout; the trigger's output.
async fn fail_without_client(bed: &Testbed) -> (BinaryUnderTest, std::process::Output) {
    let server = bed
        .server
        .spawn_recycler(
            &bed.hub,
            &["--step-timeout", "2s", "--drain-delay", "200ms"],
        )
        .await;
    bed.server
        .wait_steady(&SERVER_BEFORE, &BTreeSet::new())
        .await;
    let out = bed.trigger(&["--wait"]).await;
    assert!(!out.status.success(), "a failed recycle exits non-zero");
    (server, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_that_never_comes_ends_in_error_state_with_a_warning() {
    let bed = Testbed::start(82).await;
    let (_server, out) = fail_without_client(&bed).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("state: error_state"), "{stdout}");

    // The condition is written right after the state, so it may follow the trigger's exit.
    let condition = eventually("a condition that says why", WAIT, || async {
        let cr = bed.recycle().await?;
        assert_eq!(cr.state().as_str(), "error_state");
        cr.status?.conditions?.first().cloned()
    })
    .await;
    assert!(
        condition.message.contains("new_deployment_created_state"),
        "{}",
        condition.message
    );
    let warning = eventually("a Warning Event", WAIT, || async {
        events_on_hub(&bed.hub)
            .await
            .into_iter()
            .find(|e| e.type_.as_deref() == Some("Warning"))
    })
    .await;
    let note = warning.note.unwrap_or_default();
    assert!(note.contains("new_deployment_created_state"), "{note}");

    // The failure blocks another recycle of either gateway until someone deletes it.
    let refused = bed.trigger(&["--instance", "1"]).await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(
            "recycle red-a-b-0-0 of SliceGateway red-a-b ended in error_state and needs attention"
        ) && stderr.contains("new_deployment_created_state")
            && stderr.contains("kubectl describe workerslicegwrecycler red-a-b-0-0"),
        "{stderr}"
    );
}

/// A recycle naming a client deployment that does not exist (a generation already recycled,
/// whose flip is the gateway serving now): the client creates nothing and never answers, and the
/// recycle fails at the step timeout, instead of ending as if the client's gateway were replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycle_naming_a_client_generation_that_does_not_exist_fails_and_creates_nothing_there()
{
    let bed = Testbed::start(97).await;
    let fast = ["--drain-delay", "200ms", "--step-timeout", "3s"];
    let _server = bed.server.spawn_recycler(&bed.hub, &fast).await;
    let _client = bed.client.spawn_recycler(&bed.hub, &fast).await;
    initial(&bed).await;
    let created_before = deployments_created(&bed.client.cluster);

    let out = bed
        .trigger(&["--client-deployment", CLIENT_AFTER[0], "--wait"])
        .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the recycle must fail: {stdout}");
    assert!(stdout.contains("state: error_state"), "{stdout}");
    assert!(
        !stdout.contains("state: slicerouter_updated_state"),
        "the server went on without the client: {stdout}"
    );
    assert_eq!(deployments_created(&bed.client.cluster), created_before);
    assert_eq!(
        bed.client.deployment_names().await,
        CLIENT_BEFORE.iter().map(|d| d.to_string()).collect()
    );
}

/// 5% of all writes fail and every watch is cut after a few events, on all three clusters: each
/// step is retried from the CR and the recycle still ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycle_ends_despite_write_errors_and_cut_watches() {
    let bed = Testbed::start(85).await;
    let _server = bed.server.spawn_recycler(&bed.hub, &FAST).await;
    let _client = bed.client.spawn_recycler(&bed.hub, &FAST).await;
    let old = initial(&bed).await;
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
    let states = record_states(&bed);
    bed.server.cluster.sim.set_faults(faults());
    bed.client.cluster.sim.set_faults(faults());
    // The trigger's own create is not under test: faults on the hub start after it.
    assert!(bed.trigger(&[]).await.status.success());
    bed.hub.sim.set_faults(faults());

    bed.wait_state("end").await;
    for cluster in [&bed.hub, &bed.server.cluster, &bed.client.cluster] {
        cluster.sim.set_faults(FaultConfig::default());
    }
    assert_eq!(states_seen(&states).await, STATES);
    recycled(&bed, &old).await;
}

/// On a hub with kubeslice-controller's CRD (no `status.conditions`, pruned on every write) a
/// failed recycle keeps its reason in the annotation and is announced by one Warning, not one
/// per pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_recycle_on_kubeslice_controllers_crd_is_announced_once() {
    let bed = Testbed::start(103).await;
    use_kubeslice_controller_crd(&bed.hub).await;
    let (_server, _) = fail_without_client(&bed).await;
    eventually("the failure announced", WAIT, || async {
        (announced(&bed.hub, "FSMErrorState").await >= 1).then_some(())
    })
    .await;
    // Several step timeouts and passes later: still one Warning.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(announced(&bed.hub, "FSMErrorState").await, 1);
    let cr = bed.recycle().await.expect("recycle");
    assert_eq!(cr.state().as_str(), "error_state");
    let why = cr
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("capstan.io/failure"))
        .cloned()
        .unwrap_or_default();
    assert!(why.contains("new_deployment_created_state"), "{why}");
    assert!(
        cr.status.and_then(|s| s.conditions).is_none(),
        "the hub's CRD prunes status.conditions"
    );
}

/// The happy path on a hub with kubeslice-controller's CRD: it ends, and each router routes via
/// exactly the new gateways' NSM IPs (the new ones routed, the old ones not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycle_on_kubeslice_controllers_crd_ends_at_exactly_the_new_gateways() {
    let bed = Testbed::start(106).await;
    use_kubeslice_controller_crd(&bed.hub).await;
    let _server = bed.server.spawn_recycler(&bed.hub, &FAST).await;
    let _client = bed.client.spawn_recycler(&bed.hub, &FAST).await;
    let old = initial(&bed).await;
    let out = bed.trigger(&["--wait"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bed.wait_state("end").await;
    recycled(&bed, &old).await;
    assert_eq!(announced(&bed.hub, "FSMErrorState").await, 0);
}

/// A sick old gateway on each side: its sidecar stops answering before the recycle. The NSM IP
/// last published for it in `gatewayPodStatus` stands for it, so the router's own routes decide
/// that the old gateway is withdrawn, and the recycle ends instead of waiting for a sidecar that
/// never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycle_of_gateways_whose_sidecars_stopped_answering_ends() {
    let bed = Testbed::start(109).await;
    // A step that cannot finish fails in 20 s, not FAST's 90 s.
    let timing = ["--drain-delay", "200ms", "--step-timeout", "20s"];
    let _server = bed.server.spawn_recycler(&bed.hub, &timing).await;
    let _client = bed.client.spawn_recycler(&bed.hub, &timing).await;
    let old = initial(&bed).await;
    for (worker, deployment) in [
        (&bed.server, SERVER_BEFORE[0]),
        (&bed.client, CLIENT_BEFORE[0]),
    ] {
        let pods = worker.pod_ips_of(deployment).await;
        assert_eq!(pods.len(), 1, "{deployment}: {pods:?}");
        for pod_ip in pods {
            set_unavailable(&pod_ip, true).await;
        }
    }
    let out = bed.trigger(&["--wait"]).await;
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    recycled(&bed, &old).await;
}
