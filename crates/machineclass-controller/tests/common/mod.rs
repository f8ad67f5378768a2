//! Shared harness of the end-to-end tests: kube-sim with the CRDs, the real controller binary,
//! and polling helpers.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use capstan_apis::machine::{Machine, MachineClass};
use capstan_testkit::process::BinaryUnderTest;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use kube_sim::{Config, KubeSim};

use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_machineclass-controller");
pub const NS: &str = "default";

pub struct Env {
    pub sim: KubeSim,
    pub client: Client,
    pub kubeconfig: tempfile::NamedTempFile,
}

impl Env {
    /// kube-sim with Capstan's CRDs applied and served.
    pub async fn start() -> Self {
        let sim = KubeSim::start(Config::default())
            .await
            .expect("kube-sim starts");
        let client = sim.client().expect("client");
        capstan_testkit::install_capstan_crds(&client)
            .await
            .expect("Capstan's CRDs installed and Established");
        let kubeconfig = tempfile::NamedTempFile::new().expect("temp file");
        sim.write_kubeconfig(kubeconfig.path())
            .expect("kubeconfig written");
        Self {
            sim,
            client,
            kubeconfig,
        }
    }

    pub fn kubeconfig_path(&self) -> String {
        self.kubeconfig.path().display().to_string()
    }

    /// Starts the controller with short retries plus `extra` flags.
    pub async fn controller(&self, extra: &[&str]) -> BinaryUnderTest {
        let kubeconfig = self.kubeconfig_path();
        let mut args = vec![
            "--kubeconfig",
            kubeconfig.as_str(),
            "--metrics-addr",
            "127.0.0.1:0",
            "--namespace",
            NS,
            "--short-retry",
            "500ms",
            "--sim-ready-delay",
            "1s",
            "--log-level",
            "info,kube=warn",
        ];
        args.extend_from_slice(extra);
        BinaryUnderTest::spawn(BIN, &args)
            .await
            .expect("controller starts")
    }

    pub fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn classes(&self) -> Api<MachineClass> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub async fn create_json<K>(&self, api: &Api<K>, value: Value) -> K
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let obj: K = serde_json::from_value(value).expect("valid object");
        api.create(&PostParams::default(), &obj)
            .await
            .expect("created")
    }

    pub async fn secret(&self, name: &str) -> Secret {
        self.create_json(
            &self.secrets(),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
                   "data": {"userData": "Y2xvdWQtaW5pdA=="}}),
        )
        .await
    }

    /// A valid class referring to Secret `secret`, with extra `providerSpec` fields.
    pub async fn class(&self, name: &str, secret: &str, provider_spec: Value) -> MachineClass {
        self.create_json(&self.classes(), class_json(name, secret, provider_spec))
            .await
    }

    pub async fn machine(&self, name: &str, class: &str, extra_spec: Value) -> Machine {
        self.create_json(&self.machines(), machine_json(name, class, extra_spec))
            .await
    }
}

pub fn class_json(name: &str, secret: &str, provider_spec: Value) -> Value {
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
        "metadata": {"name": name, "namespace": NS},
        "provider": "simulated",
        "providerSpec": provider_spec,
        "secretRef": {"name": secret, "namespace": NS},
        "nodeTemplate": {
            "capacity": {"cpu": "2", "gpu": "0", "memory": "8Gi"},
            "instanceType": "sim.large", "region": "sim-1", "zone": "sim-1a"
        }
    })
}

pub fn machine_json(name: &str, class: &str, extra_spec: Value) -> Value {
    let mut spec = json!({"class": {"kind": "MachineClass", "name": class}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "namespace": NS, "labels": {"name": "md-1"}},
        "spec": spec
    })
}

/// Like `capstan_testkit::eventually`, with the controller's output in the failure message.
pub async fn until<T, F, Fut>(
    bin: &BinaryUnderTest,
    what: &str,
    timeout: Duration,
    mut probe: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}; controller output:\n{}",
                bin.output().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn phase(m: &Machine) -> Option<String> {
    m.phase().map(|p| p.as_str().to_owned())
}

pub fn last_op(m: &Machine) -> (String, String, String) {
    let op = m
        .status
        .as_ref()
        .and_then(|s| s.last_operation.clone())
        .unwrap_or_default();
    (
        op.description.unwrap_or_default(),
        op.state.map(|s| s.as_str().to_owned()).unwrap_or_default(),
        op.error_code.unwrap_or_default(),
    )
}

pub fn has_finalizer<K: kube::Resource>(obj: &K, finalizer: &str) -> bool {
    obj.finalizers().iter().any(|f| f == finalizer)
}
