//! The chart as a user installs it: Helm's own Go library (through `helm/driver.py` and the
//! helm-sdkpy wheel) against a kube-sim with RBAC on, started in this process (a
//! [`SimCluster`] without CRDs: the chart brings them).

use std::path::Path;

use capstan_testkit_sim::SimCluster;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_sim::Config;
use kube_sim::auth::AuthConfig;
use serde_json::{Value, json};

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

/// True when Helm's library runs here; otherwise the calling test skips (or fails in CI) by the
/// kit's policy ([`capstan_testkit::require`]).
pub async fn available() -> bool {
    match lint().await {
        Err(HelmError::Unavailable(why)) => {
            capstan_testkit::skip_or_fail("Helm's library (pip install helm-sdkpy)", why);
            false
        }
        _ => true,
    }
}

/// kube-sim with authentication and RBAC on and no CRDs (Helm installs the chart's); Helm uses
/// the admin kubeconfig.
pub async fn cluster() -> SimCluster {
    cluster_with(Config::default()).await
}

/// As [`cluster`], with `config`'s other settings (workloads, containers that run).
pub async fn cluster_with(config: Config) -> SimCluster {
    SimCluster::start_without_crds(Config {
        auth: AuthConfig {
            rbac: true,
            ..config.auth
        },
        ..config
    })
    .await
}

async fn release_action(
    cluster: &SimCluster,
    action: &str,
    name: &str,
    namespace: &str,
    values: &Value,
) -> Result<Value, HelmError> {
    let chart = chart_dir().display().to_string();
    let values = values.to_string();
    driver(
        Some(Path::new(cluster.kubeconfig_path())),
        &[action, name, namespace, &chart, &values],
    )
    .await
}

/// `helm install NAME charts/capstan -n NAMESPACE --create-namespace` with `values`.
pub async fn install(
    cluster: &SimCluster,
    name: &str,
    namespace: &str,
    values: &Value,
) -> Result<Value, HelmError> {
    release_action(cluster, "install", name, namespace, values).await
}

/// `helm upgrade NAME charts/capstan -n NAMESPACE --reset-values` with `values`.
pub async fn upgrade(
    cluster: &SimCluster,
    name: &str,
    namespace: &str,
    values: &Value,
) -> Result<Value, HelmError> {
    release_action(cluster, "upgrade", name, namespace, values).await
}

/// `helm uninstall NAME -n NAMESPACE`.
pub async fn uninstall(
    cluster: &SimCluster,
    name: &str,
    namespace: &str,
) -> Result<Value, HelmError> {
    driver(
        Some(Path::new(cluster.kubeconfig_path())),
        &["uninstall", name, namespace],
    )
    .await
}

/// A minimal `monitoring.coreos.com/v1` CRD of `kind` (`ServiceMonitor`, `PrometheusRule`), as the
/// Prometheus Operator installs it, its schema reduced to "any object": the scenarios check what
/// the chart writes, not the operator.
pub fn monitoring_crd(kind: &str) -> CustomResourceDefinition {
    let singular = kind.to_lowercase();
    let plural = format!("{singular}s");
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": singular,
                      "kind": kind, "listKind": format!("{kind}List")},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .expect("CRD")
}
