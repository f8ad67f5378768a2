//! Shared harness of the end-to-end tests: kube-sim with the CRDs, the real controller binary,
//! and polling helpers.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use capstan_apis::machine::{Machine, MachineClass};
use capstan_testkit::objects;
use capstan_testkit::process::BinaryUnderTest;
use capstan_testkit_sim::SimCluster;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, PostParams};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_machineclass-controller");
pub const NS: &str = "default";

/// Leader election flags with a short Lease (3 s, renewed 1 s before it runs out), so hand-overs
/// happen within a test, as `identity`.
pub fn leader_elect_args(identity: &str) -> [&str; 7] {
    [
        "--leader-elect",
        "--lease-duration-seconds",
        "3",
        "--lease-grace-seconds",
        "1",
        "--lease-identity",
        identity,
    ]
}

pub struct Env(SimCluster);

impl std::ops::Deref for Env {
    type Target = SimCluster;
    fn deref(&self) -> &SimCluster {
        &self.0
    }
}

impl Env {
    /// kube-sim with Capstan's CRDs applied and served.
    pub async fn start() -> Self {
        Self(SimCluster::start().await)
    }

    /// Starts the controller with short retries plus `extra` flags.
    pub async fn controller(&self, extra: &[&str]) -> BinaryUnderTest {
        let mut args = vec![
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
        self.spawn(BIN, &args).await
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
        api.create(&PostParams::default(), &objects::from_json(value))
            .await
            .expect("created")
    }

    pub async fn secret(&self, name: &str) -> Secret {
        let secret = objects::secret(NS, name, &[("userData", "Y2xvdWQtaW5pdA==")]);
        self.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .expect("created")
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
    objects::machine_class(NS, name, secret, provider_spec)
}

pub fn machine_json(name: &str, class: &str, extra_spec: Value) -> Value {
    objects::machine(NS, name, "md-1", class, extra_spec)
}

/// Like `capstan_testkit::eventually`, with the controller's output in the failure message.
pub async fn until<T, F, Fut>(bin: &BinaryUnderTest, what: &str, timeout: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let context = || format!("controller output:\n{}", bin.output().join("\n"));
    capstan_testkit::eventually_with(what, timeout, context, probe).await
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
