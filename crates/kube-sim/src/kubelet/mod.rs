//! Containers that really run: the kubelet side of the workload simulation for pods whose
//! container images are mapped to host directories (`--exec-images IMAGE=DIR`). Such a container
//! runs `DIR/<command[0]>` (or `DIR/<image name>` without a command) as a host process with the
//! container's environment, its output in a per-container log file; it is restarted per
//! `restartPolicy` with CrashLoopBackOff back-off, probed for readiness, and stopped (SIGTERM,
//! then SIGKILL after the grace period) when its pod goes. The pod status follows the processes,
//! written by `workloads::pod` from [`Kubelet::pod_status`].

pub mod expand;
pub mod logs;
mod probe;
mod process;

use process::{ContainerRun, PodRun};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the kubelet runs containers.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// Images (tag ignored) whose containers run as host processes, and the directory holding
    /// their executables.
    pub exec_images: Vec<(String, PathBuf)>,
    /// `pods/exec` runs commands on the host for every pod, not only for exec-image containers.
    pub exec_host_commands: bool,
    /// Back-off before the second restart of a crashing container (kubelet: 10s), doubled per
    /// restart up to `max_restart_backoff` (kubelet: 5m). The first restart is immediate.
    pub restart_backoff: Duration,
    pub max_restart_backoff: Duration,
    /// Where container logs go (a fresh temporary directory when unset).
    pub log_dir: Option<PathBuf>,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            exec_images: Vec::new(),
            exec_host_commands: false,
            restart_backoff: Duration::from_secs(10),
            max_restart_backoff: Duration::from_secs(300),
            log_dir: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("invalid --exec-images entry {0:?}: expected IMAGE=DIR")]
    InvalidExecImage(String),
    #[error("cannot create the container log directory {path}: {source}")]
    LogDir {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl KubeletError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::InvalidExecImage(_) => "invalid_exec_image",
            Self::LogDir { .. } => "log_dir",
        }
    }
}

/// Parses one `IMAGE=DIR` flag value.
pub fn parse_exec_image(flag: &str) -> Result<(String, PathBuf), KubeletError> {
    match flag.split_once('=') {
        Some((image, dir)) if !image.is_empty() && !dir.is_empty() => {
            Ok((image_name(image).to_string(), PathBuf::from(dir)))
        }
        _ => Err(KubeletError::InvalidExecImage(flag.to_string())),
    }
}

/// An image reference without its tag or digest (`reg:5000/a/b:1.2@sha256:..` -> `reg:5000/a/b`).
pub fn image_name(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        Some(colon) if !image[colon..].contains('/') => &image[..colon],
        _ => image,
    }
}

/// The simulated kubelets' process side, shared by the workload loop and the pod subresources.
pub struct Kubelet {
    config: KubeletConfig,
    log_root: PathBuf,
    /// Keeps a generated log directory alive as long as the kubelet.
    _log_tmp: Option<TempDir>,
    pods: Mutex<HashMap<String, Arc<PodRun>>>,
    /// Signalled when a container changes state, so the workload loop writes the pod status.
    pub changed: Arc<tokio::sync::Notify>,
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn uid(pod: &Value) -> &str {
    pod["metadata"]["uid"].as_str().unwrap_or_default()
}

impl Kubelet {
    pub fn new(config: KubeletConfig) -> Result<Self, KubeletError> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let (log_root, tmp) = match &config.log_dir {
            Some(dir) => (dir.clone(), None),
            None => {
                let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let dir =
                    std::env::temp_dir().join(format!("kube-sim-logs-{}-{n}", std::process::id()));
                (dir.clone(), Some(TempDir(dir)))
            }
        };
        // A configured directory must be usable now; a generated one appears with the first
        // container log (so servers that run no container leave nothing behind).
        if tmp.is_none() {
            std::fs::create_dir_all(&log_root).map_err(|source| KubeletError::LogDir {
                path: log_root.clone(),
                source,
            })?;
        }
        Ok(Self {
            config,
            log_root,
            _log_tmp: tmp,
            pods: Mutex::new(HashMap::new()),
            changed: Arc::new(tokio::sync::Notify::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<PodRun>>> {
        self.pods.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn exec_host_commands(&self) -> bool {
        self.config.exec_host_commands
    }

    /// The host directory of a container's image, when the kubelet runs it.
    fn image_dir(&self, container: &Value) -> Option<&Path> {
        let image = image_name(container["image"].as_str()?);
        self.config
            .exec_images
            .iter()
            .find(|(i, _)| i == image)
            .map(|(_, d)| d.as_path())
    }

    /// Whether any container of the pod runs as a process.
    pub fn runs(&self, pod: &Value) -> bool {
        pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| self.image_dir(c).is_some())
    }

    /// Starts the pod's processes when not yet started (the pod is bound and has its IP).
    pub fn ensure_started(&self, pod: &Value, pod_ip: &str) {
        let id = uid(pod).to_string();
        if self.lock().contains_key(&id) {
            return;
        }
        let containers = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let dir = self.image_dir(c).map(Path::to_path_buf);
                Arc::new(ContainerRun::new(pod, c, pod_ip, dir, &self.log_root))
            })
            .collect();
        let run = Arc::new(PodRun::new(pod, containers));
        run.start(
            process::Backoff {
                base: self.config.restart_backoff,
                max: self.config.max_restart_backoff,
            },
            self.changed.clone(),
        );
        self.lock().insert(id, run);
    }

    /// Stops the processes of every pod not in `live` (deleted, or being deleted).
    pub fn stop_missing(&self, live: &std::collections::HashSet<String>) {
        let gone: Vec<Arc<PodRun>> = {
            let mut pods = self.lock();
            let ids: Vec<String> = pods
                .keys()
                .filter(|k| !live.contains(*k))
                .cloned()
                .collect();
            ids.iter().filter_map(|k| pods.remove(k)).collect()
        };
        for run in gone {
            run.stop();
        }
    }

    /// A running pod by uid.
    pub(crate) fn pod(&self, uid: &str) -> Option<Arc<PodRun>> {
        self.lock().get(uid).cloned()
    }

    /// The status the kubelet writes for a pod it runs; `None` until it runs it.
    pub fn pod_status(&self, pod: &Value, pod_ip: &str, host_ip: &str) -> Option<Value> {
        let run = self.pod(uid(pod))?;
        Some(run.status(pod, pod_ip, host_ip))
    }

    /// Stops every process (server shutdown), waiting for them to end.
    pub async fn shutdown(&self) {
        let all: Vec<Arc<PodRun>> = self.lock().drain().map(|(_, v)| v).collect();
        for run in &all {
            run.stop();
        }
        for run in &all {
            run.stopped().await;
        }
    }
}

/// A status condition, its transition time kept from `old` while its status is unchanged.
pub(crate) fn condition(old: &Value, kind: &str, status: bool, default_since: &str) -> Value {
    let s = if status { "True" } else { "False" };
    let since = old["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind && c["status"] == s)
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or(default_since)
        .to_string();
    json!({"type": kind, "status": s, "lastProbeTime": null, "lastTransitionTime": since})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_drop_tags_and_digests_but_not_registry_ports() {
        assert_eq!(image_name("gw-sidecar"), "gw-sidecar");
        assert_eq!(image_name("capstan/gw-sidecar:1.2"), "capstan/gw-sidecar");
        assert_eq!(image_name("reg:5000/a/b"), "reg:5000/a/b");
        assert_eq!(image_name("reg:5000/a/b:v1@sha256:00"), "reg:5000/a/b");
        assert_eq!(
            parse_exec_image("capstan/testpod:latest=/opt/bin").expect("valid"),
            ("capstan/testpod".to_string(), PathBuf::from("/opt/bin"))
        );
        assert!(parse_exec_image("no-dir=").is_err());
        assert!(parse_exec_image("nodir").is_err());
    }
}
