//! One pod's containers as host processes: spawn with the container's environment, supervise,
//! restart per `restartPolicy` with CrashLoopBackOff back-off (immediate, then `base` doubling
//! to `max`, as kubelet), stop with SIGTERM then SIGKILL after the grace period, and the
//! container statuses (`state`, `lastState`, `restartCount`, `ready`) kubelet reports for them.

use super::expand::{command_line, container_env};
use crate::util;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Restart back-off: no wait before the first restart, then `base`, doubling up to `max`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The wait before restart number `restart` (1-based).
    pub fn before_restart(&self, restart: u32) -> Duration {
        if restart <= 1 {
            return Duration::ZERO;
        }
        let factor = 1u32.checked_shl(restart - 2).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }
}

/// What a container is doing now.
#[derive(Debug, Clone)]
enum Current {
    Waiting { reason: String, message: String },
    Running { started_at: String },
    Terminated(Value),
}

#[derive(Debug)]
struct State {
    current: Current,
    last: Option<Value>,
    restart_count: u32,
    ready: bool,
    /// The log file index of the current (or latest) instance.
    instance: u32,
    pid: Option<u32>,
    /// The supervisor will not start it again.
    finished: bool,
}

/// A container of a running pod.
pub(crate) struct ContainerRun {
    pub name: String,
    image: String,
    /// The image's host directory; `None` for a container that is only simulated.
    dir: Option<PathBuf>,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: PathBuf,
    pub readiness: Value,
    pub ports: Value,
    pub pod_ip: String,
    log_dir: PathBuf,
    state: Mutex<State>,
}

impl ContainerRun {
    pub fn new(
        pod: &Value,
        c: &Value,
        pod_ip: &str,
        dir: Option<PathBuf>,
        log_root: &Path,
    ) -> Self {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        let mut env = vec![
            (
                "PATH".to_string(),
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
            ),
            (
                // kubelet's: `spec.hostname` when set (an Indexed Job's `<job>-<index>`), else
                // the pod's name.
                "HOSTNAME".to_string(),
                pod["spec"]["hostname"]
                    .as_str()
                    .or(pod["metadata"]["name"].as_str())
                    .unwrap_or_default()
                    .into(),
            ),
        ];
        let own = container_env(pod, c, pod_ip);
        env.retain(|(k, _)| !own.iter().any(|(o, _)| o == k));
        env.extend(own);
        let (command, args) = command_line(c, &env);
        let image = c["image"].as_str().unwrap_or_default().to_string();
        let base = dir.clone().unwrap_or_default();
        let (program, args) = match command.split_first() {
            Some((first, rest)) => (
                in_image(&base, first),
                rest.iter().cloned().chain(args).collect(),
            ),
            None => {
                // The image's entrypoint is the binary named after it; an image without one (no
                // such binary) runs its args as the command line, as a container runtime runs an
                // image without ENTRYPOINT (`kubectl run --image=shell -- sh -c '...'`).
                let entry = super::image_name(&image).rsplit('/').next().unwrap_or("");
                let entrypoint = base.join(entry);
                match args.split_first() {
                    Some((first, rest)) if !entrypoint.is_file() => {
                        (in_image(&base, first), rest.to_vec())
                    }
                    _ => (entrypoint, args),
                }
            }
        };
        let workdir = c["workingDir"]
            .as_str()
            .map(PathBuf::from)
            .filter(|d| d.is_dir())
            .unwrap_or(base);
        let m = &pod["metadata"];
        let log_dir = log_root
            .join(format!(
                "{}_{}_{}",
                m["namespace"].as_str().unwrap_or_default(),
                m["name"].as_str().unwrap_or_default(),
                m["uid"].as_str().unwrap_or_default()
            ))
            .join(&name);
        let simulated = dir.is_none();
        Self {
            name,
            image,
            dir,
            program,
            args,
            env,
            workdir,
            readiness: c["readinessProbe"].clone(),
            ports: c["ports"].clone(),
            pod_ip: pod_ip.to_string(),
            log_dir,
            state: Mutex::new(State {
                current: if simulated {
                    Current::Running {
                        started_at: util::now_rfc3339(),
                    }
                } else {
                    Current::Waiting {
                        reason: "ContainerCreating".into(),
                        message: String::new(),
                    }
                },
                last: None,
                restart_count: 0,
                ready: simulated,
                instance: 0,
                pid: None,
                finished: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this container runs as a process (not only simulated).
    pub fn is_process(&self) -> bool {
        self.dir.is_some()
    }

    /// The log file of one instance (0 = the first start, n = the n-th restart).
    pub fn log_path(&self, instance: u32) -> PathBuf {
        self.log_dir.join(format!("{instance}.log"))
    }

    /// (current instance, whether it is running now).
    pub fn instance(&self) -> (u32, bool) {
        let s = self.lock();
        (s.instance, matches!(s.current, Current::Running { .. }))
    }

    pub fn running(&self) -> bool {
        matches!(self.lock().current, Current::Running { .. })
    }

    pub fn set_ready(&self, ready: bool) -> bool {
        let mut s = self.lock();
        let changed = s.ready != ready && matches!(s.current, Current::Running { .. });
        if changed {
            s.ready = ready;
        }
        changed
    }

    fn container_id(&self, pod_uid: &str, instance: u32) -> String {
        format!("kube-sim://{pod_uid}-{}-{instance}", self.name)
    }

    /// The container status as kubelet writes it.
    pub fn status(&self, pod_uid: &str) -> Value {
        let s = self.lock();
        let state = match &s.current {
            Current::Waiting { reason, message } if message.is_empty() => {
                json!({"waiting": {"reason": reason}})
            }
            Current::Waiting { reason, message } => {
                json!({"waiting": {"reason": reason, "message": message}})
            }
            Current::Running { started_at } => json!({"running": {"startedAt": started_at}}),
            Current::Terminated(t) => json!({ "terminated": t }),
        };
        let running = matches!(s.current, Current::Running { .. });
        let mut status = json!({
            "name": self.name, "image": self.image, "imageID": "",
            "ready": s.ready && running, "started": running,
            "restartCount": s.restart_count, "state": state,
            "lastState": s.last.as_ref().map_or(json!({}), |t| json!({"terminated": t})),
        });
        if !matches!(s.current, Current::Waiting { .. }) || s.instance > 0 {
            status["containerID"] = json!(self.container_id(pod_uid, s.instance));
        }
        status
    }

    /// Exit code when it ended for good (not restarting).
    pub fn final_exit(&self) -> Option<i64> {
        let s = self.lock();
        match (&s.current, s.finished) {
            (Current::Terminated(t), true) => t["exitCode"].as_i64(),
            _ => None,
        }
    }

    pub fn ever_started(&self) -> bool {
        let s = self.lock();
        s.instance > 0 || !matches!(s.current, Current::Waiting { .. })
    }

    fn open_log(&self, instance: u32) -> std::io::Result<std::fs::File> {
        std::fs::create_dir_all(&self.log_dir)?;
        std::fs::File::create(self.log_path(instance))
    }

    fn spawn(&self, instance: u32) -> std::io::Result<tokio::process::Child> {
        let log = self.open_log(instance)?;
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.workdir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true);
        cmd.spawn()
    }

    /// Runs the container until the pod stops or it ends for good, per `restart_policy`.
    pub async fn supervise(self: Arc<Self>, ctx: Supervision, restart_policy: String) {
        if !self.is_process() {
            return;
        }
        let mut restarts = 0u32;
        loop {
            let started_at = util::now_rfc3339();
            let exit = match self.spawn(restarts) {
                Err(e) => {
                    let message = format!("failed to start {}: {e}", self.program.display());
                    use std::io::Write;
                    if let Ok(mut f) = self.open_log(restarts) {
                        let _ = writeln!(f, "{message}");
                    }
                    json!({"exitCode": 128, "reason": "StartError", "message": message,
                           "startedAt": started_at, "finishedAt": util::now_rfc3339(),
                           "containerID": self.container_id(&ctx.pod_uid, restarts)})
                }
                Ok(mut child) => {
                    {
                        let mut s = self.lock();
                        s.current = Current::Running {
                            started_at: started_at.clone(),
                        };
                        s.instance = restarts;
                        s.pid = child.id();
                        s.ready = self.readiness.is_null();
                    }
                    ctx.changed.notify_one();
                    let probing = ctx.stop.child_token();
                    if !self.readiness.is_null() {
                        tokio::spawn(super::probe::readiness(
                            self.clone(),
                            probing.clone(),
                            ctx.changed.clone(),
                        ));
                    }
                    let status = tokio::select! {
                        status = child.wait() => status,
                        _ = ctx.stop.cancelled() => terminate(&mut child, ctx.grace).await,
                    };
                    probing.cancel();
                    let code = match status {
                        Ok(s) => s
                            .code()
                            .map(i64::from)
                            .unwrap_or_else(|| 128 + i64::from(s.signal().unwrap_or(0))),
                        Err(_) => 137,
                    };
                    json!({"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                           "startedAt": started_at, "finishedAt": util::now_rfc3339(),
                           "containerID": self.container_id(&ctx.pod_uid, restarts)})
                }
            };
            let code = exit["exitCode"].as_i64().unwrap_or(1);
            let restart = !ctx.stop.is_cancelled()
                && match restart_policy.as_str() {
                    "Never" => false,
                    "OnFailure" => code != 0,
                    _ => true,
                };
            {
                let mut s = self.lock();
                s.pid = None;
                s.ready = false;
                s.instance = restarts;
                if restart {
                    s.last = Some(exit.clone());
                }
                s.current = Current::Terminated(exit);
                s.finished = !restart;
            }
            ctx.changed.notify_one();
            if !restart {
                return;
            }
            restarts += 1;
            let wait = ctx.backoff.before_restart(restarts);
            if !wait.is_zero() {
                self.lock().current = Current::Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: format!(
                        "back-off {} restarting failed container={} pod={}",
                        go_duration(wait),
                        self.name,
                        ctx.pod_label
                    ),
                };
                ctx.changed.notify_one();
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = ctx.stop.cancelled() => return,
                }
            }
            self.lock().restart_count = restarts;
        }
    }
}

/// A duration as Go prints it in kubelet's message (`10s`, `2m40s`, `5m0s`).
fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 {
        format!("{}m{}s", secs / 60, secs % 60)
    } else if d.subsec_millis() > 0 {
        format!("{}s", d.as_secs_f64())
    } else {
        format!("{secs}s")
    }
}

/// SIGTERM to the container's process group, SIGKILL after the grace period.
async fn terminate(
    child: &mut tokio::process::Child,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
            return status;
        }
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let _ = child.start_kill();
    child.wait().await
}

/// What every container supervisor of a pod shares.
#[derive(Clone)]
pub(crate) struct Supervision {
    pub stop: CancellationToken,
    pub grace: Duration,
    pub backoff: Backoff,
    pub changed: Arc<Notify>,
    pub pod_uid: String,
    /// `name_namespace(uid)`, as kubelet names a pod in messages.
    pub pod_label: String,
}

/// A pod whose containers the kubelet runs.
pub(crate) struct PodRun {
    pub uid: String,
    pub containers: Vec<Arc<ContainerRun>>,
    restart_policy: String,
    grace: Duration,
    pod_label: String,
    stop: CancellationToken,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl PodRun {
    pub fn new(pod: &Value, containers: Vec<Arc<ContainerRun>>) -> Self {
        let m = &pod["metadata"];
        let uid = m["uid"].as_str().unwrap_or_default().to_string();
        Self {
            pod_label: format!(
                "{}_{}({uid})",
                m["name"].as_str().unwrap_or_default(),
                m["namespace"].as_str().unwrap_or_default()
            ),
            uid,
            containers,
            restart_policy: pod["spec"]["restartPolicy"]
                .as_str()
                .unwrap_or("Always")
                .to_string(),
            grace: Duration::from_secs(
                pod["spec"]["terminationGracePeriodSeconds"]
                    .as_u64()
                    .unwrap_or(30),
            ),
            stop: CancellationToken::new(),
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub fn start(&self, backoff: Backoff, changed: Arc<Notify>) {
        let ctx = Supervision {
            stop: self.stop.clone(),
            grace: self.grace,
            backoff,
            changed,
            pod_uid: self.uid.clone(),
            pod_label: self.pod_label.clone(),
        };
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        for c in &self.containers {
            tasks.push(tokio::spawn(
                c.clone()
                    .supervise(ctx.clone(), self.restart_policy.clone()),
            ));
        }
    }

    pub fn container(&self, name: Option<&str>) -> Option<Arc<ContainerRun>> {
        match name {
            Some(n) if !n.is_empty() => self.containers.iter().find(|c| c.name == n).cloned(),
            _ => self.containers.first().cloned(),
        }
    }

    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Waits until every supervisor has returned (processes ended).
    pub async fn stopped(&self) {
        let tasks: Vec<_> =
            std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks {
            let _ = t.await;
        }
    }

    /// The pod status kubelet writes for these containers.
    pub fn status(&self, pod: &Value, pod_ip: &str, host_ip: &str) -> Value {
        let old = &pod["status"];
        let start = old["startTime"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(util::now_rfc3339);
        let statuses: Vec<Value> = self
            .containers
            .iter()
            .map(|c| c.status(&self.uid))
            .collect();
        let finals: Vec<Option<i64>> = self.containers.iter().map(|c| c.final_exit()).collect();
        let phase = if finals.iter().all(Option::is_some) {
            if finals.iter().all(|c| *c == Some(0)) {
                "Succeeded"
            } else {
                "Failed"
            }
        } else if self.containers.iter().any(|c| c.ever_started()) {
            "Running"
        } else {
            "Pending"
        };
        let ready = phase == "Running" && statuses.iter().all(|s| s["ready"] == json!(true));
        let cond = |kind: &str, status: bool| super::condition(old, kind, status, &start);
        let mut ready_cond = cond("Ready", ready);
        let mut containers_ready = cond("ContainersReady", ready);
        if matches!(phase, "Succeeded" | "Failed") {
            ready_cond["reason"] = json!("PodCompleted");
            containers_ready["reason"] = json!("PodCompleted");
        } else if !ready {
            let not_ready: Vec<&str> = statuses
                .iter()
                .filter(|s| s["ready"] != json!(true))
                .filter_map(|s| s["name"].as_str())
                .collect();
            let message = format!("containers with unready status: [{}]", not_ready.join(" "));
            for c in [&mut ready_cond, &mut containers_ready] {
                c["reason"] = json!("ContainersNotReady");
                c["message"] = json!(message);
            }
        }
        json!({
            "phase": phase,
            "conditions": [cond("PodReadyToStartContainers", phase != "Succeeded" && phase != "Failed"),
                           cond("Initialized", true), ready_cond, containers_ready,
                           cond("PodScheduled", true)],
            "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
            "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
            "startTime": start, "qosClass": "BestEffort",
            "containerStatuses": statuses,
        })
    }
}

/// `command[0]` inside the image's directory, resolved as in a container's root filesystem: an
/// absolute path is relative to it (`/bin/sh` is `DIR/bin/sh`) and `..` stops at its root, so a
/// pod runs only what `--exec-images` put in reach, never another host program.
fn in_image(base: &Path, command: &str) -> PathBuf {
    use std::path::Component;
    let mut inside = PathBuf::new();
    for part in Path::new(command).components() {
        match part {
            Component::Normal(name) => inside.push(name),
            Component::ParentDir => {
                inside.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    base.join(inside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_immediate_then_doubles_to_the_cap_as_kubelet() {
        let b = Backoff {
            base: Duration::from_secs(10),
            max: Duration::from_secs(300),
        };
        let waits: Vec<u64> = (1..=8).map(|r| b.before_restart(r).as_secs()).collect();
        assert_eq!(waits, vec![0, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.before_restart(200).as_secs(), 300);
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_secs(160)), "2m40s");
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
    }

    #[test]
    fn a_command_resolves_inside_the_image_directory_and_cannot_climb_out() {
        let dir = Path::new("/opt/images/capstan");
        let inside = |command| in_image(dir, command);
        assert_eq!(inside("gw-sidecar"), dir.join("gw-sidecar"));
        assert_eq!(inside("/bin/sh"), dir.join("bin/sh"));
        assert_eq!(inside("./tools/../gw-sidecar"), dir.join("gw-sidecar"));
        // As in a container's root filesystem, `..` stops at the top.
        assert_eq!(inside("../../../bin/sh"), dir.join("bin/sh"));
        assert_eq!(inside("/../../etc/../bin/sh"), dir.join("bin/sh"));
        assert!(inside("../../../../usr/bin/id").starts_with(dir));
    }
}
