//! End to end: kube-sim, the real `machineclass-controller` binary and the simulated provider
//! (in process, and served over gRPC).

mod common;

use std::sync::Arc;
use std::time::Duration;

use capstan_apis::machine::{
    FINALIZER_MCM, FINALIZER_NODE, FINALIZER_SECRET, NODE_ANNOTATION_LAST_APPLIED,
};
use capstan_testkit::process::http_get;
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_goes_pending_then_running_with_its_node() {
    let env = Env::start().await;
    let bin = env.controller(&[]).await;
    env.secret("cloud").await;
    let mut class = class_json(
        "sim",
        "cloud",
        json!({"simulate": {"readyDelaySeconds": 2}}),
    );
    class["nodeTemplate"]["virtualCapacity"] = json!({"hc.hana.com/memory": "1234567"});
    env.create_json(&env.classes(), class).await;
    env.machine(
        "m-1",
        "sim",
        json!({"nodeTemplate": {
            "metadata": {"labels": {"role": "worker"}, "annotations": {"team": "a"}},
            "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}
        }}),
    )
    .await;

    let machines = env.machines();
    let pending = until(&bin, "Pending", T, || async {
        let m = machines.get("m-1").await.ok()?;
        (phase(&m).as_deref() == Some("Pending")).then_some(m)
    })
    .await;
    assert!(has_finalizer(&pending, FINALIZER_MCM));
    assert_eq!(
        pending.spec.provider_id.as_deref(),
        Some("sim:///default/m-1")
    );
    assert_eq!(pending.node_name(), Some("m-1"));
    assert_eq!(last_op(&pending).0, "Creating machine on cloud provider");

    let running = until(&bin, "Running", T, || async {
        let m = machines.get("m-1").await.ok()?;
        (phase(&m).as_deref() == Some("Running")).then_some(m)
    })
    .await;
    let (description, state, _) = last_op(&running);
    assert_eq!(
        (description.as_str(), state.as_str()),
        ("Machine m-1 successfully joined the cluster", "Successful")
    );
    let conditions = running
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{conditions:?}"
    );

    // The class and its secret are guarded while in use.
    let class = env.classes().get("sim").await.expect("class");
    assert!(has_finalizer(&class, FINALIZER_MCM));
    let secret = until(&bin, "secret finalizer", T, || async {
        let s = env.secrets().get("cloud").await.ok()?;
        has_finalizer(&s, FINALIZER_SECRET).then_some(s)
    })
    .await;
    assert!(has_finalizer(&secret, FINALIZER_SECRET));

    // The Node carries the template, the machine label and the node finalizer.
    let nodes: Api<Node> = Api::all(env.client.clone());
    let node = until(&bin, "node synced", T, || async {
        let n = nodes.get("m-1").await.ok()?;
        n.annotations()
            .contains_key(NODE_ANNOTATION_LAST_APPLIED)
            .then_some(n)
    })
    .await;
    assert_eq!(
        node.labels().get("role").map(String::as_str),
        Some("worker")
    );
    assert_eq!(
        node.labels()
            .get("node.gardener.cloud/machine-name")
            .map(String::as_str),
        Some("m-1")
    );
    assert_eq!(
        node.annotations().get("team").map(String::as_str),
        Some("a")
    );
    assert!(has_finalizer(&node, FINALIZER_NODE));
    let node = until(&bin, "virtual capacity", T, || async {
        let n = nodes.get("m-1").await.ok()?;
        let capacity = n.status.as_ref()?.capacity.as_ref()?;
        (capacity.get("hc.hana.com/memory")?.0 == "1234567").then_some(n)
    })
    .await;
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    assert_eq!(taints.len(), 1);
    assert_eq!(
        (taints[0].key.as_str(), taints[0].effect.as_str()),
        ("dedicated", "NoSchedule")
    );

    // Metrics with MCM's names.
    let metrics = until(&bin, "phase metric", T, || async {
        let body = http_get(bin.admin_addr(), "/metrics").await.ok()?.body;
        body.contains(r#"mcm_machine_current_status_phase{name="m-1",namespace="default"} 1"#)
            .then_some(body)
    })
    .await;
    assert!(metrics.contains("mcm_machine_items_total 1"), "{metrics}");
    assert!(
        metrics
            .contains(r#"mcm_cloud_api_requests_total{provider="sim",service="CreateMachine"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("mcm_cloud_api_driver_request_duration_seconds_bucket"),
        "{metrics}"
    );

    // Steady state: reconciles keep running (retries are short here), but nothing is written.
    let before = env.sim.resource_version();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        env.sim.resource_version(),
        before,
        "steady state makes no writes:\n{}",
        bin.output().join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_in_use_cannot_be_deleted_until_its_machines_are_gone() {
    let env = Env::start().await;
    let bin = env.controller(&[]).await;
    env.secret("cloud").await;
    env.class("sim", "cloud", json!({})).await;
    env.machine("m-1", "sim", json!({})).await;
    let machines = env.machines();
    until(&bin, "Running", T, || async {
        let m = machines.get("m-1").await.ok()?;
        (phase(&m).as_deref() == Some("Running")).then_some(())
    })
    .await;

    let classes = env.classes();
    classes
        .delete("sim", &DeleteParams::default())
        .await
        .expect("delete accepted");
    let events: Api<Event> = Api::namespaced(env.client.clone(), NS);
    let warning = until(&bin, "still-referred warning", T, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.into_iter()
            .find(|e| e.reason.as_deref() == Some("MachineClassInUse"))
    })
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(
        warning
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("machines still refer to this machine class")
    );
    let blocked = classes.get("sim").await.expect("class still there");
    assert!(blocked.metadata.deletion_timestamp.is_some());
    assert!(has_finalizer(&blocked, FINALIZER_MCM));

    // Retried while blocked, but announced once: no further writes.
    let before = env.sim.resource_version();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        env.sim.resource_version(),
        before,
        "a blocked deletion keeps writing"
    );

    machines
        .delete("m-1", &DeleteParams::default())
        .await
        .expect("machine delete accepted");
    until(&bin, "machine and class gone", T, || async {
        let machine_gone = machines.get_opt("m-1").await.ok()?.is_none();
        let class_gone = classes.get_opt("sim").await.ok()?.is_none();
        (machine_gone && class_gone).then_some(())
    })
    .await;
    // The secret is released once no class references it.
    until(&bin, "secret finalizer removed", T, || async {
        let s = env.secrets().get("cloud").await.ok()?;
        (!has_finalizer(&s, FINALIZER_SECRET)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_deletion_drains_and_removes_its_node_then_the_machine() {
    let env = Env::start().await;
    let bin = env.controller(&[]).await;
    env.secret("cloud").await;
    env.class("sim", "cloud", json!({})).await;
    env.machine("m-1", "sim", json!({})).await;
    let machines = env.machines();
    until(&bin, "Running", T, || async {
        let m = machines.get("m-1").await.ok()?;
        (phase(&m).as_deref() == Some("Running")).then_some(())
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NS);
    let pod = |name: &str, owner: Option<&str>| {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeName": "m-1", "containers": [{"name": "c", "image": "busybox"}]}});
        if let Some(kind) = owner {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind, "name": "ds",
                "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]);
        }
        p
    };
    env.create_json(&pods, pod("app", None)).await;
    env.create_json(&pods, pod("daemon", Some("DaemonSet")))
        .await;
    env.create_json(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "elsewhere", "namespace": NS},
        "spec": {"nodeName": "other-node", "containers": [{"name": "c", "image": "busybox"}]}})).await;
    // Two volumes attached to the machine's node, one to another node.
    let attachments: Api<VolumeAttachment> = Api::all(env.client.clone());
    for (name, node) in [("va-1", "m-1"), ("va-2", "m-1"), ("va-other", "other-node")] {
        env.create_json(
            &attachments,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": name},
            "spec": {"attacher": "csi.example.com", "nodeName": node,
                     "source": {"persistentVolumeName": format!("pv-{name}")}}}),
        )
        .await;
    }

    machines
        .delete("m-1", &DeleteParams::default())
        .await
        .expect("delete accepted");
    let nodes: Api<Node> = Api::all(env.client.clone());
    let vms: Api<ConfigMap> = Api::namespaced(env.client.clone(), NS);
    until(&bin, "machine, node and VM gone", T, || async {
        let machine_gone = machines.get_opt("m-1").await.ok()?.is_none();
        let node_gone = nodes.get_opt("m-1").await.ok()?.is_none();
        let vm_gone = vms.get_opt("sim-vm-m-1").await.ok()?.is_none();
        (machine_gone && node_gone && vm_gone).then_some(())
    })
    .await;
    assert!(
        pods.get_opt("app").await.expect("get").is_none(),
        "the app pod was evicted"
    );
    assert!(
        pods.get_opt("daemon").await.expect("get").is_some(),
        "DaemonSet pods are not evicted"
    );
    assert!(
        pods.get_opt("elsewhere").await.expect("get").is_some(),
        "pods on other nodes are untouched"
    );
    let left: Vec<String> = attachments
        .list(&ListParams::default())
        .await
        .expect("list volume attachments")
        .iter()
        .map(|va| va.name_any())
        .collect();
    assert_eq!(
        left,
        ["va-other"],
        "the node's volume attachments were deleted"
    );
    let output = bin.output().join("\n");
    for step in [
        "set_terminating",
        "get_vm_status",
        "drain",
        "delete_volume_attachments",
        "delete_vm",
        "delete_node",
        "remove_finalizer",
    ] {
        assert!(
            output.contains(&format!("step=\"{step}\""))
                || output.contains(&format!("step={step}")),
            "step {step} missing:\n{output}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_error_gives_crash_loop_then_failed_after_creation_timeout() {
    let env = Env::start().await;
    let bin = env
        .controller(&["--resource-exhausted-retry", "500ms"])
        .await;
    env.secret("cloud").await;
    env.class(
        "quota",
        "cloud",
        json!({"simulate": {"createError": "ResourceExhausted"}}),
    )
    .await;
    env.machine("m-1", "quota", json!({"creationTimeout": "4s"}))
        .await;
    let machines = env.machines();
    let crash = until(&bin, "CrashLoopBackOff", T, || async {
        let m = machines.get("m-1").await.ok()?;
        (phase(&m).as_deref() == Some("CrashLoopBackOff")).then_some(m)
    })
    .await;
    let (description, state, code) = last_op(&crash);
    assert!(
        description.starts_with("Cloud provider message - "),
        "{description}"
    );
    assert_eq!(
        (state.as_str(), code.as_str()),
        ("Failed", "ResourceExhausted")
    );
    assert!(crash.spec.provider_id.is_none(), "no VM");
    let failed = until(&bin, "Failed", T, || async {
        let m = machines.get("m-1").await.ok()?;
        (phase(&m).as_deref() == Some("Failed")).then_some(m)
    })
    .await;
    assert_eq!(last_op(&failed).2, "ResourceExhausted");
    let nodes: Api<Node> = Api::all(env.client.clone());
    assert!(
        nodes.get_opt("m-1").await.expect("get").is_none(),
        "no node registered"
    );
}

/// The simulated provider served over gRPC from this test process; the controller uses it with
/// `--driver grpc://...`.
async fn grpc_sim(env: &Env) -> (String, tokio::sync::oneshot::Sender<()>) {
    let driver = Arc::new(machine_driver::sim::SimDriver::new(
        env.client.clone(),
        machine_driver::sim::SimConfig {
            namespace: NS.into(),
            ready_delay: Duration::from_millis(500),
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(machine_driver::grpc::serve(driver, listener, async {
        let _ = stopped.await;
    }));
    (format!("grpc://{addr}"), stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_flows_through_the_grpc_driver() {
    let env = Env::start().await;
    let (endpoint, _stop) = grpc_sim(&env).await;
    let bin = env
        .controller(&[
            "--driver",
            &endpoint,
            "--resource-exhausted-retry",
            "500ms",
            // The default for machines without their own creationTimeout.
            "--machine-creation-timeout",
            "3s",
        ])
        .await;
    env.secret("cloud").await;
    env.class("sim", "cloud", json!({})).await;
    env.class(
        "quota",
        "cloud",
        json!({"simulate": {"createError": "ResourceExhausted"}}),
    )
    .await;
    env.machine("good", "sim", json!({})).await;
    env.machine("bad", "quota", json!({})).await;
    let machines = env.machines();
    until(&bin, "good Running and bad Failed", T, || async {
        let good = machines.get("good").await.ok()?;
        let bad = machines.get("bad").await.ok()?;
        (phase(&good).as_deref() == Some("Running") && phase(&bad).as_deref() == Some("Failed"))
            .then_some(())
    })
    .await;
    let bad = machines.get("bad").await.expect("bad");
    assert_eq!(
        last_op(&bad).2,
        "ResourceExhausted",
        "the code crossed the wire"
    );

    machines
        .delete("good", &DeleteParams::default())
        .await
        .expect("delete accepted");
    let nodes: Api<Node> = Api::all(env.client.clone());
    until(&bin, "good machine and node gone", T, || async {
        let gone = machines.get_opt("good").await.ok()?.is_none()
            && nodes.get_opt("good").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    let metrics = http_get(bin.admin_addr(), "/metrics")
        .await
        .expect("metrics")
        .body;
    assert!(
        metrics
            .contains(r#"mcm_cloud_api_requests_total{provider="grpc",service="DeleteMachine"}"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"mcm_cloud_api_requests_failed_total{provider="grpc",service="CreateMachine"}"#
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_deletion_resumes_at_the_recorded_step() {
    let env = Env::start().await;
    let mut first = env.controller(&[]).await;
    env.secret("cloud").await;
    env.class(
        "sim",
        "cloud",
        json!({"simulate": {"deleteError": "Unavailable"}}),
    )
    .await;
    env.machine("m-1", "sim", json!({})).await;
    let machines = env.machines();
    until(&first, "Running", T, || async {
        let m = machines.get("m-1").await.ok()?;
        (phase(&m).as_deref() == Some("Running")).then_some(())
    })
    .await;
    machines
        .delete("m-1", &DeleteParams::default())
        .await
        .expect("delete accepted");
    let stuck = until(&first, "stuck at VM deletion", T, || async {
        let m = machines.get("m-1").await.ok()?;
        let (description, state, code) = last_op(&m);
        (description.contains("Initiate VM deletion") && state == "Failed" && code == "Unavailable")
            .then_some(m)
    })
    .await;
    assert_eq!(phase(&stuck).as_deref(), Some("Terminating"));
    first
        .signal(nix::sys::signal::Signal::SIGKILL)
        .expect("kill -9");
    first
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("killed");

    // The provider recovers; a new controller continues at the recorded step.
    env.classes()
        .patch(
            "sim",
            &PatchParams::default(),
            &Patch::Merge(json!({"providerSpec": {"simulate": null}})),
        )
        .await
        .expect("class patched");
    let second = env.controller(&[]).await;
    until(&second, "machine gone", T, || async {
        machines.get_opt("m-1").await.ok()?.is_none().then_some(())
    })
    .await;
    let output = second.output();
    let steps: Vec<&String> = output
        .iter()
        .filter(|l| l.contains("deletion step"))
        .collect();
    assert!(!steps.is_empty(), "{output:?}");
    assert!(
        steps[0].contains("delete_vm"),
        "resumed at VM deletion: {steps:?}"
    );
    for earlier in [
        "set_terminating",
        "get_vm_status",
        "\"drain\"",
        "step=drain",
    ] {
        assert!(
            steps.iter().all(|l| !l.contains(earlier)),
            "{earlier} repeated: {steps:?}"
        );
    }
    let nodes: Api<Node> = Api::all(env.client.clone());
    assert!(
        nodes.get_opt("m-1").await.expect("get").is_none(),
        "node removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_reported_on_the_object_and_disturbs_nothing_else() {
    let env = Env::start().await;
    let bin = env.controller(&[]).await;
    env.secret("cloud").await;
    env.class("sim", "cloud", json!({})).await;
    // A class with an incomplete node template, and one whose secret does not exist.
    let mut incomplete = class_json("incomplete", "cloud", json!({}));
    incomplete["nodeTemplate"] = json!({"capacity": {"cpu": "2", "memory": "1Gi"}, "instanceType": "x", "region": "r", "zone": ""});
    env.create_json(&env.classes(), incomplete).await;
    env.class("no-secret", "nope", json!({})).await;

    let mut nameless = machine_json("nameless", "sim", json!({}));
    nameless["spec"]["class"] = json!({"kind": "MachineClass"});
    env.create_json(&env.machines(), nameless).await;
    env.machine("uses-incomplete", "incomplete", json!({}))
        .await;
    env.machine("uses-no-secret", "no-secret", json!({})).await;
    env.machine("good", "sim", json!({})).await;

    let machines = env.machines();
    let expect_report = |name: &'static str, text: &'static str| {
        let machines = machines.clone();
        let bin = &bin;
        async move {
            let m = until(bin, name, T, || async {
                let m = machines.get(name).await.ok()?;
                last_op(&m).0.contains(text).then_some(m)
            })
            .await;
            assert_eq!(last_op(&m).1, "Failed", "{name}");
            assert!(m.spec.provider_id.is_none(), "{name}: no VM created");
            assert_eq!(phase(&m), None, "{name}: phase unchanged");
        }
    };
    expect_report("nameless", "spec.class.name is required").await;
    expect_report(
        "uses-incomplete",
        "nodeTemplate.capacity is missing \"gpu\"",
    )
    .await;
    expect_report(
        "uses-no-secret",
        "secret default/nope referenced by machine class no-secret not found",
    )
    .await;
    until(&bin, "good Running", T, || async {
        let m = machines.get("good").await.ok()?;
        (phase(&m).as_deref() == Some("Running")).then_some(())
    })
    .await;
    let incomplete_report = last_op(&machines.get("uses-incomplete").await.expect("get")).0;
    assert!(
        incomplete_report.contains("nodeTemplate.zone is empty"),
        "{incomplete_report}"
    );
    let events: Api<Event> = Api::namespaced(env.client.clone(), NS);
    let list = events.list(&ListParams::default()).await.expect("events");
    let validation: Vec<_> = list
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ValidationFailed"))
        .collect();
    assert!(validation.len() >= 3, "{validation:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_phase_follows_node_health_and_a_deleted_node_takes_its_machine() {
    let env = Env::start().await;
    let bin = env.controller(&[]).await;
    env.secret("cloud").await;
    env.class("sim", "cloud", json!({})).await;
    env.machine("sick", "sim", json!({"healthTimeout": "2s"}))
        .await;
    env.machine("doomed", "sim", json!({})).await;
    let machines = env.machines();
    until(&bin, "both Running", T, || async {
        let a = machines.get("sick").await.ok()?;
        let b = machines.get("doomed").await.ok()?;
        (phase(&a).as_deref() == Some("Running") && phase(&b).as_deref() == Some("Running"))
            .then_some(())
    })
    .await;

    // The kubelet reports a kernel deadlock: Running -> Unknown -> Failed after healthTimeout.
    let nodes: Api<Node> = Api::all(env.client.clone());
    nodes
        .patch_status(
            "sick",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [
                {"type": "Ready", "status": "True"}, {"type": "KernelDeadlock", "status": "True"}
            ]}})),
        )
        .await
        .expect("node status patched");
    let unknown = until(&bin, "Unknown", T, || async {
        let m = machines.get("sick").await.ok()?;
        (phase(&m).as_deref() == Some("Unknown")).then_some(m)
    })
    .await;
    assert!(
        last_op(&unknown).0.contains("KernelDeadlock=True"),
        "{:?}",
        last_op(&unknown)
    );
    let failed = until(&bin, "Failed", T, || async {
        let m = machines.get("sick").await.ok()?;
        (phase(&m).as_deref() == Some("Failed")).then_some(m)
    })
    .await;
    assert!(
        last_op(&failed).0.contains("is not healthy since"),
        "{:?}",
        last_op(&failed)
    );

    // Deleting a Node deletes its Machine, which then completes the deletion flow.
    nodes
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("node delete accepted");
    until(&bin, "machine and node gone", T, || async {
        let gone = machines.get_opt("doomed").await.ok()?.is_none()
            && nodes.get_opt("doomed").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
}

/// The Lease is named after the binary by default.
const LEASE: &str = "machineclass-controller";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_replica_takes_over_the_objects_it_parked() {
    let env = Env::start().await;
    let elect = common::leader_elect_args;
    let mut leader = env.controller(&elect("replica-a")).await;
    env.secret("cloud").await;
    env.class("sim", "cloud", json!({})).await;
    env.machine("m-1", "sim", json!({})).await;
    let machines = env.machines();
    until(&leader, "m-1 Running", T, || async {
        let m = machines.get("m-1").await.ok()?;
        (phase(&m).as_deref() == Some("Running")).then_some(())
    })
    .await;
    let standby = env.controller(&elect("replica-b")).await;

    // The leader freezes without releasing its Lease, right after renewing it (so the Lease
    // outlives the check below by seconds, however loaded the machine); a Machine created now
    // is seen, but only parked, by the standby.
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "default");
    let renewed = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.renew_time.clone());
    let before = renewed(&leases.get(LEASE).await.expect("the leader's Lease"));
    until(&leader, "the leader renews its Lease", T, || async {
        let now = renewed(&leases.get(LEASE).await.ok()?);
        (now != before).then_some(())
    })
    .await;
    leader
        .signal(nix::sys::signal::Signal::SIGSTOP)
        .expect("stopped");
    env.machine("m-2", "sim", json!({})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let parked = machines.get("m-2").await.expect("m-2");
    assert!(
        parked.metadata.finalizers.is_none(),
        "no writes before the Lease expires"
    );

    // Once the Lease expires the standby leads and reconciles what it parked.
    until(&standby, "m-2 Running under the new leader", T, || async {
        let m = machines.get("m-2").await.ok()?;
        (phase(&m).as_deref() == Some("Running")).then_some(())
    })
    .await;
    leader
        .signal(nix::sys::signal::Signal::SIGKILL)
        .expect("killed");
    let _ = leader.wait_exit(Duration::from_secs(10)).await;
}

/// MCM's safety controller: a VM the provider lists that no Machine accounts for is deleted on
/// the next sweep; the VM of a live Machine is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_vm_is_collected_and_a_machines_vm_is_kept() {
    use machine_driver::sim::{CLASS_LABEL, VM_LABEL};
    let env = Env::start().await;
    env.secret("cloud").await;
    env.class("sim", "cloud", json!({})).await;
    // A VM left behind by a Machine that is gone (as after a crash between the VM's creation and
    // the Machine's status write, then the Machine's deletion).
    let ghost: ConfigMap = capstan_testkit::objects::from_json(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "sim-vm-ghost", "namespace": NS,
                     "labels": {VM_LABEL: "true", CLASS_LABEL: "sim"}},
        "data": {"providerID": "sim:///default/ghost", "nodeName": "ghost", "machine": "ghost",
                 "readyAt": "2026-01-01T00:00:00Z", "neverReady": "false"}
    }));
    let config_maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), NS);
    config_maps
        .create(&Default::default(), &ghost)
        .await
        .expect("orphan VM");
    let bin = env
        .controller(&["--machine-safety-orphan-vms-period", "1s"])
        .await;
    env.machine("m-1", "sim", json!({})).await;
    let machines = env.machines();
    until(&bin, "m-1 Running", T, || async {
        let m = machines.get("m-1").await.ok()?;
        (phase(&m).as_deref() == Some("Running")).then_some(())
    })
    .await;
    until(&bin, "the orphan VM deleted", T, || async {
        config_maps
            .get_opt("sim-vm-ghost")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    // Two more sweeps: the live Machine's VM stays.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        config_maps
            .get_opt("sim-vm-m-1")
            .await
            .expect("get")
            .is_some(),
        "the VM of a live Machine is not an orphan"
    );
    let metrics = http_get(bin.admin_addr(), "/metrics")
        .await
        .expect("metrics");
    assert!(
        metrics
            .body
            .contains("capstan_machineclass_orphan_vms_deleted_total 1"),
        "{}",
        metrics.body
    );
}
