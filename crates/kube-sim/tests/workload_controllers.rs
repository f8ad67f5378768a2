//! The controller-manager behaviours clients rely on, through the Python client and kubectl:
//! DaemonSets (a pod per eligible Node, rolling update, `kubectl drain --ignore-daemonsets`),
//! Jobs that run to completion (simulated, and `sh` through `--exec-images`; Indexed; a pod failure policy), CronJobs that start them, ReplicationControllers
//! that keep their pods.
//! kubectl and Python are called unconditionally.

mod common;

use common::kubectl::Kubectl;
use kube_sim::KubeSim;
use serde_json::Value;
use std::time::Duration;

/// A simulating server; image `shell` runs the host's `/bin` commands (`--exec-images`).
async fn start(pod_cidr: &str) -> KubeSim {
    let kubelet = kube_sim::kubelet::KubeletConfig {
        exec_images: vec![("shell".into(), "/bin".into())],
        ..Default::default()
    };
    common::start_simulating(pod_cidr, kubelet).await
}

fn items(list: &Value) -> Vec<Value> {
    list["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_daemonset_runs_a_pod_per_eligible_node_and_rolls_updates() {
    let sim = start("127.12.1.0/24").await;
    common::run_python(&sim, "daemonset.py").await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drain_ignores_daemonset_pods_and_evicts_the_rest() {
    let sim = start("127.12.2.0/24").await;
    let k = Kubectl::new(&sim);
    let manifest = k.file(
        "cluster.yaml",
        r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: a, image: agent:1}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: w, image: nginx}]}
"#,
    );
    k.ok(&["apply", "-f", &manifest]).await;
    let on = |list: &Value, app: &str, node: &str| {
        items(list)
            .iter()
            .filter(|p| p["metadata"]["labels"]["app"] == app && p["spec"]["nodeName"] == node)
            .count()
    };
    k.wait_json(
        &["get", "pods"],
        "a daemon on each node and web on n1",
        |l| on(l, "agent", "n1") == 1 && on(l, "agent", "n2") == 1 && on(l, "web", "n1") == 1,
    )
    .await;
    let ds = k
        .wait_json(&["get", "ds", "agent"], "the DaemonSet ready", |d| {
            d["status"]["numberReady"] == 2
        })
        .await;
    assert_eq!(ds["status"]["desiredNumberScheduled"], 2);

    // Without --ignore-daemonsets kubectl refuses, naming the daemon pod.
    let refused = k.run(&["drain", "n1"]).await;
    assert!(!refused.ok);
    assert!(
        refused
            .stderr
            .contains("cannot delete DaemonSet-managed Pods"),
        "{}",
        refused.stderr
    );
    let out = k
        .ok(&["drain", "n1", "--ignore-daemonsets", "--timeout=60s"])
        .await;
    assert!(out.contains("node/n1 drained"), "{out}");
    let n1 = k.json(&["get", "node", "n1"]).await;
    assert_eq!(n1["spec"]["unschedulable"], true);
    // The daemon stays on the cordoned node; web moved to n2.
    k.wait_json(&["get", "pods"], "web off n1, the daemon kept", |l| {
        on(l, "agent", "n1") == 1 && on(l, "web", "n1") == 0 && on(l, "web", "n2") == 2
    })
    .await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_job_runs_completions_with_parallelism() {
    let sim = start("127.12.3.0/24").await;
    common::run_python(&sim, "job.py").await;
    sim.shutdown().await;
}

fn condition<'a>(job: &'a Value, kind: &str) -> Option<&'a Value> {
    job["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["status"] == "True")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_job_runs_to_completion_and_a_failing_one_hits_its_backoff_limit() {
    let sim = start("127.12.4.0/24").await;
    let k = Kubectl::new(&sim);
    k.ok(&[
        "create",
        "job",
        "hello",
        "--image=shell:1",
        "--",
        "sh",
        "-c",
        "echo hello from the job",
    ])
    .await;
    let out = k
        .ok(&[
            "wait",
            "--for=condition=complete",
            "job/hello",
            "--timeout=60s",
        ])
        .await;
    assert!(out.contains("job.batch/hello condition met"), "{out}");
    assert_eq!(k.ok(&["logs", "job/hello"]).await, "hello from the job\n");
    let job = k.json(&["get", "job", "hello"]).await;
    assert_eq!(job["status"]["succeeded"], 1);
    assert_eq!(job["metadata"]["labels"]["job-name"], "hello", "{job:#}");
    assert_eq!(
        k.ok(&["get", "jobs", "-l", "job-name=hello", "-o", "name"])
            .await,
        "job.batch/hello\n"
    );
    assert!(job["status"]["completionTime"].is_string(), "{job:#}");
    assert!(condition(&job, "SuccessCriteriaMet").is_some(), "{job:#}");

    let manifest = k.file(
        "boom.yaml",
        r#"
apiVersion: batch/v1
kind: Job
metadata: {name: boom, namespace: default}
spec:
  backoffLimit: 1
  template:
    spec:
      restartPolicy: Never
      containers: [{name: b, image: shell, command: [sh, -c, "echo failing; exit 3"]}]
"#,
    );
    k.ok(&["apply", "-f", &manifest]).await;
    k.ok(&[
        "wait",
        "--for=condition=failed",
        "job/boom",
        "--timeout=60s",
    ])
    .await;
    let job = k.json(&["get", "job", "boom"]).await;
    // backoffLimit 1: the second failure ends it.
    assert_eq!(job["status"]["failed"], 2, "{job:#}");
    assert!(job["status"]["succeeded"].is_null(), "{job:#}");
    let failed = condition(&job, "Failed").expect("Failed condition");
    assert_eq!(failed["reason"], "BackoffLimitExceeded");
    assert_eq!(
        failed["message"],
        "Job has reached the specified backoff limit"
    );
    assert!(condition(&job, "FailureTarget").is_some(), "{job:#}");
    let pods = k.json(&["get", "pods", "-l", "job-name=boom"]).await;
    let phases: Vec<&Value> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| &p["status"]["phase"])
        .collect();
    assert_eq!(phases, ["Failed", "Failed"], "{pods:#}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexed_job_runs_each_index_once_with_its_completion_index() {
    let sim = start("127.12.7.0/24").await;
    let k = Kubectl::new(&sim);
    // Index 1 fails on its first try (a marker file stands for the retry), so the Job must run
    // that index again and still count each index once.
    let marker = tempfile::tempdir().expect("tempdir");
    let manifest = k.file(
        "indexed.yaml",
        &format!(
            r#"
apiVersion: batch/v1
kind: Job
metadata: {{name: shards, namespace: default}}
spec:
  completionMode: Indexed
  completions: 3
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: w
        image: shell
        command: [sh, -c, 'if [ "$JOB_COMPLETION_INDEX" = 1 ] && [ ! -e {dir}/tried ]; then touch {dir}/tried; exit 1; fi; echo "shard $JOB_COMPLETION_INDEX on $HOSTNAME"']
"#,
            dir = marker.path().display()
        ),
    );
    k.ok(&["apply", "-f", &manifest]).await;
    k.ok(&[
        "wait",
        "--for=condition=complete",
        "job/shards",
        "--timeout=60s",
    ])
    .await;
    let job = k.json(&["get", "job", "shards"]).await;
    assert_eq!(job["status"]["completedIndexes"], "0-2", "{job:#}");
    assert_eq!(job["status"]["succeeded"], 3, "{job:#}");
    assert_eq!(job["status"]["failed"], 1, "{job:#}");

    let pods = items(&k.json(&["get", "pods", "-l", "job-name=shards"]).await);
    let mut succeeded: Vec<(String, String)> = Vec::new();
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().expect("name");
        let index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            .as_str()
            .expect("every pod of an Indexed Job carries its index");
        assert_eq!(
            pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"], index,
            "{pod:#}"
        );
        assert!(name.starts_with(&format!("shards-{index}-")), "{name}");
        assert_eq!(pod["spec"]["hostname"], format!("shards-{index}"));
        if pod["status"]["phase"] == "Succeeded" {
            succeeded.push((index.to_owned(), k.ok(&["logs", name]).await));
        }
    }
    succeeded.sort();
    assert_eq!(
        succeeded,
        (0..3)
            .map(|i| (i.to_string(), format!("shard {i} on shards-{i}\n")))
            .collect::<Vec<_>>()
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_failure_policy_ignores_one_exit_code_and_fails_the_job_on_another() {
    let sim = start("127.12.8.0/24").await;
    let k = Kubectl::new(&sim);
    // First try exits 42 (ignored: not counted, even with backoffLimit 0), the retry exits 3.
    let marker = tempfile::tempdir().expect("tempdir");
    let manifest = k.file(
        "policy.yaml",
        &format!(
            r#"
apiVersion: batch/v1
kind: Job
metadata: {{name: policy, namespace: default}}
spec:
  backoffLimit: 0
  podFailurePolicy:
    rules:
    - {{action: Ignore, onExitCodes: {{operator: In, values: [42]}}}}
    - {{action: FailJob, onExitCodes: {{containerName: main, operator: In, values: [3]}}}}
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: shell
        command: [sh, -c, 'if [ ! -e {dir}/tried ]; then touch {dir}/tried; exit 42; fi; exit 3']
"#,
            dir = marker.path().display()
        ),
    );
    k.ok(&["apply", "-f", &manifest]).await;
    k.ok(&[
        "wait",
        "--for=condition=failed",
        "job/policy",
        "--timeout=60s",
    ])
    .await;
    let job = k.json(&["get", "job", "policy"]).await;
    assert_eq!(
        job["status"]["failed"], 1,
        "the ignored pod is not counted: {job:#}"
    );
    let pods = items(&k.json(&["get", "pods", "-l", "job-name=policy"]).await);
    assert_eq!(pods.len(), 2, "the ignored pod was replaced once");
    let last = pods
        .iter()
        .find(|p| p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3)
        .expect("the pod that exited 3");
    let failed = condition(&job, "Failed").expect("Failed condition");
    assert_eq!(failed["reason"], "PodFailurePolicy");
    assert_eq!(
        failed["message"],
        format!(
            "Container main for pod default/{} failed with exit code 3 matching FailJob rule at index 1",
            last["metadata"]["name"].as_str().expect("name")
        )
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_cronjob_runs_a_job_at_the_next_minute() {
    let sim = start("127.12.9.0/24").await;
    let k = Kubectl::new(&sim);
    k.ok(&[
        "create",
        "cronjob",
        "tick",
        "--image=shell",
        "--schedule=* * * * *",
        "--",
        "sh",
        "-c",
        "echo tick",
    ])
    .await;
    // The first run is at the next minute boundary: up to a minute away.
    let mut jobs = Value::Null;
    for _ in 0..90 {
        jobs = k.json(&["get", "jobs"]).await;
        if items(&jobs).iter().any(|j| j["status"]["succeeded"] == 1) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let jobs = items(&jobs);
    assert_eq!(jobs.len(), 1, "one run in a minute: {jobs:#?}");
    let job = &jobs[0];
    let owner = &job["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("CronJob"), Some("tick"))
    );
    let scheduled =
        job["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]
            .as_str()
            .expect("scheduled-timestamp annotation");
    let minute = scheduled
        .parse::<jiff::Timestamp>()
        .expect("RFC 3339")
        .as_second()
        / 60;
    assert_eq!(job["metadata"]["name"], format!("tick-{minute}"));
    let name = job["metadata"]["name"].as_str().expect("name");
    assert_eq!(k.ok(&["logs", &format!("job/{name}")]).await, "tick\n");
    let cronjob = k
        .wait_json(&["get", "cronjob", "tick"], "recording its run", |c| {
            c["status"]["lastSuccessfulTime"].is_string()
        })
        .await;
    assert_eq!(
        cronjob["status"]["lastScheduleTime"], scheduled,
        "{cronjob:#}"
    );
    assert!(cronjob["status"]["active"].is_null(), "{cronjob:#}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_replicationcontroller_keeps_its_pods() {
    let sim = start("127.12.5.0/24").await;
    common::run_python(&sim, "replicationcontroller.py").await;
    sim.shutdown().await;
}
