//! The chart as a user installs it: Helm's own Go library (through `helm/driver.py` and the
//! helm-sdkpy wheel) against a kube-sim with RBAC on, started in this process.

use std::path::Path;

use kube_sim::auth::AuthConfig;
use kube_sim::{Config, KubeSim};
use serde_json::Value;

use crate::tools::{chart_dir, workspace_root};

/// Why a Helm action did not succeed.
#[derive(Debug)]
pub enum HelmError {
    /// Python or the helm-sdkpy wheel is not installed: the scenario skips or fails by policy.
    Unavailable(String),
    /// Helm ran and refused or failed; its message.
    Failed(String),
}

/// Runs `driver.py ARGS` with `kubeconfig` (if any) and parses its JSON answer.
pub async fn driver(kubeconfig: Option<&Path>, args: &[&str]) -> Result<Value, HelmError> {
    let script = workspace_root()
        .join("tests")
        .join("helm")
        .join("driver.py");
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(script).args(args);
    if let Some(path) = kubeconfig {
        cmd.env("KUBECONFIG", path);
    }
    let out = cmd
        .output()
        .await
        .map_err(|e| HelmError::Unavailable(format!("python3: {e}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    match out.status.code() {
        Some(0) => serde_json::from_slice(&out.stdout)
            .map_err(|e| HelmError::Failed(format!("driver output is not JSON: {e}"))),
        Some(3) => Err(HelmError::Unavailable(stderr)),
        _ => Err(HelmError::Failed(stderr)),
    }
}

/// `helm lint charts/capstan` through the library.
pub async fn lint() -> Result<Value, HelmError> {
    let chart = chart_dir().display().to_string();
    driver(None, &["lint", &chart]).await
}

/// True when Helm's library runs here; otherwise the test skips (or fails in CI) by the policy of
/// [`crate::tools::skip_or_fail`].
pub async fn available(test: &str) -> bool {
    match lint().await {
        Err(HelmError::Unavailable(why)) => {
            crate::tools::skip_or_fail(test, "Helm's library (pip install helm-sdkpy)", &why);
            false
        }
        _ => true,
    }
}

/// kube-sim with authentication and RBAC on; Helm uses the admin kubeconfig.
pub struct Cluster {
    pub sim: KubeSim,
    pub admin: kube::Client,
    kubeconfig: tempfile::NamedTempFile,
}

impl Cluster {
    pub async fn start() -> Self {
        Self::start_with(Config::default()).await
    }

    /// As [`Cluster::start`], with `config`'s other settings (workloads, containers that run).
    pub async fn start_with(config: Config) -> Self {
        let config = Config {
            auth: AuthConfig {
                rbac: true,
                ..config.auth
            },
            ..config
        };
        let sim = KubeSim::start(config).await.expect("kube-sim starts");
        let admin = sim.client().expect("admin client");
        let kubeconfig = tempfile::NamedTempFile::new().expect("temp file");
        sim.write_kubeconfig(kubeconfig.path())
            .expect("kubeconfig written");
        Self {
            sim,
            admin,
            kubeconfig,
        }
    }

    /// Creates namespaces as the admin (the chart puts Roles into namespaces it does not own).
    pub async fn create_namespaces(&self, names: &[&str]) {
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(self.admin.clone());
        for name in names {
            api.create(
                &kube::api::PostParams::default(),
                &capstan_testkit::objects::namespace(name),
            )
            .await
            .expect("namespace created");
        }
    }

    pub fn kubeconfig(&self) -> &Path {
        self.kubeconfig.path()
    }

    async fn release_action(
        &self,
        action: &str,
        name: &str,
        namespace: &str,
        values: &Value,
    ) -> Result<Value, HelmError> {
        let chart = chart_dir().display().to_string();
        let values = values.to_string();
        driver(
            Some(self.kubeconfig()),
            &[action, name, namespace, &chart, &values],
        )
        .await
    }

    /// `helm install NAME charts/capstan -n NAMESPACE --create-namespace` with `values`.
    pub async fn install(
        &self,
        name: &str,
        namespace: &str,
        values: &Value,
    ) -> Result<Value, HelmError> {
        self.release_action("install", name, namespace, values)
            .await
    }

    /// `helm upgrade NAME charts/capstan -n NAMESPACE --reset-values` with `values`.
    pub async fn upgrade(
        &self,
        name: &str,
        namespace: &str,
        values: &Value,
    ) -> Result<Value, HelmError> {
        self.release_action("upgrade", name, namespace, values)
            .await
    }

    pub async fn uninstall(&self, name: &str, namespace: &str) -> Result<Value, HelmError> {
        driver(Some(self.kubeconfig()), &["uninstall", name, namespace]).await
    }

    /// A kubeconfig whose user is ServiceAccount `namespace/name` (kube-sim mints the token).
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> tempfile::NamedTempFile {
        let token = self.sim.service_account_token(namespace, name);
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), self.sim.kubeconfig_yaml_with_token(&token))
            .expect("kubeconfig written");
        file
    }
}
