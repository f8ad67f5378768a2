//! Containers that really run (`--exec-images`): the `kube-sim-testpod` binary as a pod, checked
//! through the API (status, restarts, logs), its own pod IP, kubectl (`logs`, `logs -f`, `exec`)
//! and the Python client's `stream` API. kubectl and Python are called unconditionally.

mod common;

use kube_sim::kubelet::KubeletConfig;
use kube_sim::{Config, KubeSim};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

const IMAGE: &str = "capstan/testpod";

fn testpod_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kube-sim-testpod"))
        .parent()
        .expect("binary directory")
        .to_path_buf()
}

/// A server whose pods get IPs from `pod_cidr` (one per test: tests run in parallel and every
/// pod listens on port 8080 of its own IP).
async fn start(pod_cidr: &str) -> KubeSim {
    let kubelet = KubeletConfig {
        exec_images: vec![(IMAGE.into(), testpod_dir())],
        restart_backoff: Duration::from_millis(300),
        max_restart_backoff: Duration::from_secs(2),
        ..Default::default()
    };
    common::start_simulating(pod_cidr, kubelet).await
}

fn testpod(name: &str, restart_policy: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": restart_policy, "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "app", "image": format!("{IMAGE}:v1"),
                "command": ["kube-sim-testpod"],
                "args": ["--greet", "$(GREETING)", "$$(GREETING)", "$(NOT_SET)"],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "GREETING", "value": "hi-$(POD_NAME)-in-$(POD_NAMESPACE)-on-$(NODE)"},
                    {"name": "PORT", "value": "8080"}],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1}}]}})
    .to_string()
}

async fn pod(sim: &KubeSim, name: &str) -> Value {
    let (code, body) = common::raw_json(
        sim,
        "GET",
        &format!("/api/v1/namespaces/default/pods/{name}"),
        "application/json",
        "",
    )
    .await;
    if code == 200 { body } else { Value::Null }
}

/// Polls the pod until `check` holds (panics with the last pod after 30s).
async fn wait_pod(sim: &KubeSim, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        last = pod(sim, name).await;
        if check(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pod {name} never {what}: {last:#}");
}

fn ready(p: &Value) -> bool {
    p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// A plain HTTP GET to the pod's own IP; `None` when nothing listens.
fn get(addr: &str, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // One write: the test server answers after its first read.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).ok()?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    Some(out)
}

async fn logs(sim: &KubeSim, name: &str, query: &str) -> (u16, String) {
    common::raw(
        sim,
        "GET",
        &format!("/api/v1/namespaces/default/pods/{name}/log{query}"),
        "application/json",
        "",
    )
    .await
}

async fn create(sim: &KubeSim, body: &str) {
    let (code, created) = common::raw_json(
        sim,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        body,
    )
    .await;
    assert_eq!(code, 201, "{created}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_testpod_runs_with_expanded_env_serves_its_ip_restarts_and_stops_on_delete() {
    let sim = start("127.11.0.0/24").await;
    create(&sim, &testpod("web-0", "Always")).await;
    let p = wait_pod(&sim, "web-0", "Ready", ready).await;
    assert_eq!(p["status"]["phase"], "Running");
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["restartCount"], 0);
    assert!(cs["state"]["running"]["startedAt"].is_string(), "{cs}");
    let ip = p["status"]["podIP"].as_str().expect("pod IP").to_string();
    assert!(ip.starts_with("127.11.0."), "{ip}");
    let addr = format!("{ip}:8080");
    let Some(hello) = get(&addr, "/") else {
        let (_, log) = logs(&sim, "web-0", "").await;
        panic!(
            "the pod does not serve on its own IP: {log}\n{:#}",
            pod(&sim, "web-0").await["status"]
        );
    };
    assert!(hello.ends_with("hello from web-0"), "{hello}");

    // Env and $(VAR) expansion, stdout and stderr in the log.
    let (code, log) = logs(&sim, "web-0", "").await;
    assert_eq!(code, 200, "{log}");
    assert!(log.contains(&format!("started pod=web-0 ip={ip}")), "{log}");
    assert!(
        log.contains("args: --greet hi-web-0-in-default-on-kube-sim-node $(GREETING) $(NOT_SET)"),
        "{log}"
    );
    assert!(
        log.contains("greeting on stderr: hi-web-0-in-default-on-kube-sim-node"),
        "{log}"
    );
    let (_, tail) = logs(&sim, "web-0", "?tailLines=1").await;
    assert_eq!(tail, format!("listening on {addr}\n"));
    let (code, err) = logs(&sim, "web-0", "?previous=true").await;
    assert_eq!(code, 400, "{err}");
    assert!(
        err.contains("previous terminated container \\\"app\\\" in pod \\\"web-0\\\" not found"),
        "{err}"
    );

    // Readiness follows the probe.
    get(&addr, "/unready").expect("unready");
    wait_pod(&sim, "web-0", "NotReady", |p| !ready(p)).await;

    // An exit restarts it (restartPolicy Always), the old instance in lastState and ?previous.
    get(&addr, "/exit?code=3").expect("exit");
    let p = wait_pod(&sim, "web-0", "restarted and Ready", |p| {
        p["status"]["containerStatuses"][0]["restartCount"] == 1 && ready(p)
    })
    .await;
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["lastState"]["terminated"]["exitCode"], 3, "{cs}");
    assert_eq!(cs["lastState"]["terminated"]["reason"], "Error");
    let (_, previous) = logs(&sim, "web-0", "?previous=true&container=app").await;
    assert!(previous.contains("exiting with 3"), "{previous}");
    let (_, current) = logs(&sim, "web-0", "").await;
    assert!(!current.contains("exiting with 3"), "{current}");

    // A second crash waits in CrashLoopBackOff before the next start.
    get(&addr, "/exit?code=4").expect("exit");
    let p = wait_pod(&sim, "web-0", "in CrashLoopBackOff", |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    })
    .await;
    let waiting = &p["status"]["containerStatuses"][0]["state"]["waiting"];
    assert!(
        waiting["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("back-off ")
                && m.contains("restarting failed container=app pod=web-0_default(")),
        "{waiting}"
    );
    wait_pod(&sim, "web-0", "restarted twice", |p| {
        p["status"]["containerStatuses"][0]["restartCount"] == 2 && ready(p)
    })
    .await;

    // Deleting the pod stops the process (SIGTERM).
    let (code, _) = common::raw(
        &sim,
        "DELETE",
        "/api/v1/namespaces/default/pods/web-0",
        "application/json",
        "",
    )
    .await;
    assert_eq!(code, 200);
    let mut stopped = false;
    for _ in 0..100 {
        if get(&addr, "/").is_none() {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(stopped, "the pod's process still serves after deletion");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_exits_under_restart_policy_never_succeeds_or_fails() {
    let sim = start("127.11.1.0/24").await;
    create(&sim, &testpod("once", "Never")).await;
    let p = wait_pod(&sim, "once", "Ready", ready).await;
    let addr = format!("{}:8080", p["status"]["podIP"].as_str().expect("ip"));
    get(&addr, "/exit?code=0").expect("exit");
    let p = wait_pod(&sim, "once", "Succeeded", |p| {
        p["status"]["phase"] == "Succeeded"
    })
    .await;
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["state"]["terminated"]["exitCode"], 0, "{cs}");
    assert_eq!(cs["state"]["terminated"]["reason"], "Completed");
    assert_eq!(cs["restartCount"], 0);

    // A pod whose containers no kubelet runs: exec fails as kube-apiserver's does without one.
    let nginx = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nginx", "namespace": "default"},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}});
    create(&sim, &nginx.to_string()).await;
    wait_pod(&sim, "nginx", "Ready", ready).await;
    let (code, status) = common::raw_json(
        &sim,
        "POST",
        "/api/v1/namespaces/default/pods/nginx/exec?command=true&stdout=true",
        "application/json",
        "",
    )
    .await;
    assert_eq!(code, 500, "{status}");
    assert_eq!(
        status["message"],
        "error dialing backend: dial tcp 127.0.1.1:10250: connect: connection refused"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_command_cannot_climb_out_of_its_image_directory() {
    let sim = start("127.11.9.0/24").await;
    // The host's /bin/sh, reached from the image directory by `..`: it must not run.
    let ups = testpod_dir().components().count();
    let escape = format!("{}bin/sh", "../".repeat(ups));
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "escape", "namespace": "default"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "app", "image": IMAGE,
            "command": [escape, "-c", "echo escaped"]}]}});
    create(&sim, &pod.to_string()).await;
    let p = wait_pod(&sim, "escape", "Failed", |p| {
        p["status"]["phase"] == "Failed"
    })
    .await;
    let terminated = &p["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["reason"], "StartError", "{terminated}");
    let message = terminated["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&testpod_dir().join("bin/sh").display().to_string()),
        "the start error names the path inside the image directory: {message}"
    );
    let (_, log) = logs(&sim, "escape", "").await;
    assert!(!log.contains("escaped"), "a host program ran: {log}");
    sim.shutdown().await;
}

struct Kubectl {
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(sim: &KubeSim) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        sim.write_kubeconfig(&dir.path().join("kubeconfig"))
            .expect("kubeconfig");
        Self { dir }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("kubectl");
        c.env("KUBECONFIG", self.dir.path().join("kubeconfig"))
            .env("HOME", self.dir.path())
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        c
    }

    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = self.command(args).output().await.expect("kubectl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_follow_and_exec_reach_a_running_pod() {
    let sim = start("127.11.2.0/24").await;
    create(&sim, &testpod("web-1", "Always")).await;
    let p = wait_pod(&sim, "web-1", "Ready", ready).await;
    let addr = format!("{}:8080", p["status"]["podIP"].as_str().expect("ip"));
    let k = Kubectl::new(&sim);

    let (ok, out, err) = k.run(&["logs", "web-1"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("started pod=web-1"), "{out}");
    let (ok, out, err) = k.run(&["logs", "web-1", "--tail=1"]).await;
    assert!(ok, "{err}");
    assert_eq!(out, format!("listening on {addr}\n"));

    // exec runs in the container's environment; its exit code comes back.
    let (ok, out, err) = k
        .run(&[
            "exec",
            "web-1",
            "--",
            "sh",
            "-c",
            "echo $POD_NAME $GREETING; echo to-stderr >&2",
        ])
        .await;
    assert!(ok, "{err}");
    assert_eq!(out, "web-1 hi-web-1-in-default-on-kube-sim-node\n");
    assert_eq!(err, "to-stderr\n");
    let (ok, _, err) = k.run(&["exec", "web-1", "--", "sh", "-c", "exit 7"]).await;
    assert!(!ok);
    assert!(err.contains("command terminated with exit code 7"), "{err}");
    // stdin reaches the command.
    let mut child = k
        .command(&["exec", "-i", "web-1", "--", "cat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl exec -i");
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"through stdin\n").await.expect("write");
    }
    let out = child.wait_with_output().await.expect("exec -i ends");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through stdin\n");

    // logs -f streams until the instance ends.
    let mut follow = k
        .command(&["logs", "-f", "web-1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl logs -f");
    let mut lines = tokio::io::BufReader::new(follow.stdout.take().expect("stdout"));
    let mut out = String::new();
    {
        use tokio::io::AsyncBufReadExt;
        // The stream is open once the existing output arrived; then the container exits.
        while !out.contains("listening on") {
            let n = lines.read_line(&mut out).await.expect("read");
            assert!(n > 0, "logs -f ended early: {out}");
        }
        get(&addr, "/exit?code=0").expect("exit");
        let rest = async {
            use tokio::io::AsyncReadExt;
            lines.read_to_string(&mut out).await.expect("read");
            follow.wait().await.expect("kubectl ends")
        };
        let status = tokio::time::timeout(Duration::from_secs(30), rest)
            .await
            .expect("logs -f ends with the container");
        assert!(status.success());
    }
    assert!(
        out.contains("started pod=web-1") && out.ends_with("exiting with 0\n"),
        "{out}"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_stream_exec_runs_in_the_pod() {
    let sim = start("127.11.3.0/24").await;
    create(&sim, &testpod("web-2", "Always")).await;
    wait_pod(&sim, "web-2", "Ready", ready).await;
    common::run_python(&sim, "stream_exec.py").await;
    sim.shutdown().await;
}

/// The folder of the workspace's `gw-sidecar` binary (`cargo build -p sidecar-shim --bin
/// gw-sidecar`): this test's own profile folder (the test is `<target>/<profile>/deps/<test>`),
/// so that a `CARGO_TARGET_DIR` elsewhere works too.
fn gw_sidecar_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("<target>/<profile>/deps layout")
        .to_path_buf();
    assert!(
        dir.join("gw-sidecar").is_file(),
        "build it first: cargo build -p sidecar-shim --bin gw-sidecar"
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_gw_sidecar_runs_as_a_pod_and_serves_grpc_on_its_pod_ip() {
    let sim = common::start_with(Config {
        simulate_workloads: true,
        workloads: kube_sim::workloads::WorkloadOptions {
            pod_cidr: "127.11.4.0/24".into(),
            ..Default::default()
        },
        kubelet: KubeletConfig {
            exec_images: vec![("capstan/gw-sidecar".into(), gw_sidecar_dir())],
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let body = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gw", "namespace": "default"},
        "spec": {"containers": [{"name": "gw-sidecar", "image": "capstan/gw-sidecar:latest",
            "command": ["gw-sidecar"],
            "args": ["--backend", "memory", "--listen", "$(POD_IP):5000", "--metrics-addr", "$(POD_IP):8080"],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1}}]}});
    create(&sim, &body.to_string()).await;
    let p = wait_pod(&sim, "gw", "Ready", ready).await;
    let ip = p["status"]["podIP"].as_str().expect("pod IP").to_string();
    // gRPC is HTTP/2: the server answers the connection preface with its SETTINGS frame.
    let addr = format!("{ip}:5000");
    let mut s = std::net::TcpStream::connect(&addr).expect("gRPC port on the pod IP");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .expect("preface");
    let mut head = [0u8; 9];
    s.read_exact(&mut head).expect("a frame back");
    assert_eq!(
        head[3], 0x4,
        "the first frame of an HTTP/2 server is SETTINGS: {head:?}"
    );
    let (_, log) = logs(&sim, "gw", "").await;
    assert!(!log.is_empty(), "gw-sidecar logs are served");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_run_with_only_args_runs_them_when_the_image_has_no_entrypoint() {
    // `shell` maps to /bin, which holds no binary named `shell`: like an image without
    // ENTRYPOINT, the container's args are its command line.
    let kubelet = KubeletConfig {
        exec_images: vec![("shell".into(), PathBuf::from("/bin"))],
        ..Default::default()
    };
    let sim = common::start_simulating("127.11.8.0/24", kubelet).await;
    let k = Kubectl::new(&sim);
    let (ok, out, err) = k
        .run(&[
            "run",
            "sh1",
            "--image=shell",
            "--",
            "sh",
            "-c",
            "echo hi from sh; sleep 1000",
        ])
        .await;
    assert!(ok, "{out}{err}");
    let p = wait_pod(&sim, "sh1", "Ready", ready).await;
    assert_eq!(
        p["status"]["containerStatuses"][0]["restartCount"], 0,
        "{p}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, out, err) = k.run(&["logs", "sh1"]).await;
        if ok && out == "hi from sh\n" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "logs: {out}{err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (ok, out, err) = k
        .run(&["exec", "sh1", "--", "sh", "-c", "echo exec ok"])
        .await;
    assert!(ok, "{err}");
    assert_eq!(out, "exec ok\n");
    sim.shutdown().await;
}
