//! The test kit's kube-sim half: [`SimCluster`] (kube-sim in-process on a free port, Capstan's
//! CRDs installed and Established, an admin client and a kubeconfig for binaries) and
//! [`InProcess`] (a controller's run future against it, stopped through its `Shutdown`).
//!
//! A crate of its own, not a feature of `capstan-testkit`: kube-sim's own tests use the test kit,
//! so the kit cannot depend on kube-sim (a dev-dependency cycle builds kube-sim twice and its
//! types no longer match), and a feature would not prevent it: Cargo unifies features across a
//! workspace build, so `cargo test --workspace` would turn the cycle back on.

use std::future::Future;
use std::time::Duration;

use capstan_runtime::shutdown::Shutdown;
use capstan_testkit::process::BinaryUnderTest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use kube_sim::{Config, KubeSim};
use tempfile::NamedTempFile;

pub use capstan_testkit::process::contract::wait_ready;

/// kube-sim with every Capstan CRD Established, its admin client and a kubeconfig file for it.
pub struct SimCluster {
    pub sim: KubeSim,
    /// The admin client (no RBAC applies to it).
    pub client: kube::Client,
    kubeconfig: NamedTempFile,
}

impl SimCluster {
    /// kube-sim with its default configuration and Capstan's CRDs.
    pub async fn start() -> Self {
        Self::start_with(Config::default()).await
    }

    /// kube-sim with `config` (RBAC, testbed, ...) and Capstan's CRDs.
    pub async fn start_with(config: Config) -> Self {
        let cluster = Self::start_without_crds(config).await;
        capstan_testkit::install_capstan_crds(&cluster.client)
            .await
            .expect("Capstan's CRDs installed and Established");
        cluster
    }

    /// kube-sim with `config` and no CRDs, for a test whose subject installs them (a Helm
    /// chart's `crds/`), so it cannot pass on CRDs the kit put there.
    pub async fn start_without_crds(config: Config) -> Self {
        let sim = KubeSim::start(config).await.expect("kube-sim starts");
        let client = sim.client().expect("admin client");
        let kubeconfig = NamedTempFile::new().expect("temp file");
        sim.write_kubeconfig(kubeconfig.path())
            .expect("kubeconfig written");
        Self {
            sim,
            client,
            kubeconfig,
        }
    }

    /// Creates `names` as the admin.
    pub async fn create_namespaces(&self, names: &[&str]) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        for name in names {
            api.create(
                &PostParams::default(),
                &capstan_testkit::objects::namespace(name),
            )
            .await
            .unwrap_or_else(|e| panic!("namespace {name} created: {e}"));
        }
    }

    /// The admin kubeconfig, for a binary's `--kubeconfig`.
    pub fn kubeconfig_path(&self) -> &str {
        self.kubeconfig.path().to_str().expect("utf-8 temp path")
    }

    /// A kubeconfig whose user is ServiceAccount `namespace/name` (kube-sim mints the token),
    /// for an account something else creates (a chart); with RBAC on, it may do only what its
    /// bindings grant.
    pub fn kubeconfig_as(&self, namespace: &str, name: &str) -> NamedTempFile {
        let token = self.sim.service_account_token(namespace, name);
        let file = NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), self.sim.kubeconfig_yaml_with_token(&token))
            .expect("kubeconfig written");
        file
    }

    /// Creates ServiceAccount `namespace/name` and returns [`kubeconfig_as`](Self::kubeconfig_as)
    /// it.
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> NamedTempFile {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let account: ServiceAccount = capstan_testkit::objects::from_json(serde_json::json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace}
        }));
        accounts
            .create(&PostParams::default(), &account)
            .await
            .unwrap_or_else(|e| panic!("ServiceAccount {namespace}/{name} created: {e}"));
        self.kubeconfig_as(namespace, name)
    }

    /// Spawns `program` with `--kubeconfig` (admin) and `--metrics-addr 127.0.0.1:0`, then
    /// `extra`; returns once it logged its admin address (not yet ready: see [`wait_ready`]).
    pub async fn spawn(&self, program: &str, extra: &[&str]) -> BinaryUnderTest {
        let mut args = vec![
            "--kubeconfig",
            self.kubeconfig_path(),
            "--metrics-addr",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        BinaryUnderTest::spawn(program, &args)
            .await
            .unwrap_or_else(|e| panic!("{program} starts: {e}"))
    }
}

/// How long [`InProcess::stop`] waits for the drain.
pub const STOP_WITHIN: Duration = Duration::from_secs(20);

/// A controller's run future on the test's runtime: its reconcilers against kube-sim without a
/// process, so a test can build the controller with its own settings and see its panics.
pub struct InProcess {
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// Spawns `run(client, shutdown)`; the future must return once `shutdown` is triggered and
    /// its in-flight work is done, as every Capstan controller's `run` does.
    pub fn start<F, Fut>(client: kube::Client, run: F) -> Self
    where
        F: FnOnce(kube::Client, Shutdown) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let shutdown = Shutdown::new();
        let task = tokio::spawn(run(client, shutdown.clone()));
        Self { shutdown, task }
    }

    /// Whether the future has returned (before [`stop`](Self::stop): it ended on its own).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Triggers shutdown and waits for the future to drain and return; panics (with the
    /// controller's own panic, if it had one) when it does not within [`STOP_WITHIN`].
    pub async fn stop(self) {
        self.shutdown.trigger();
        match tokio::time::timeout(STOP_WITHIN, self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Ok(Err(error)) => panic!("controller task failed: {error}"),
            Err(_) => panic!("controller did not drain within {STOP_WITHIN:?} of shutdown"),
        }
    }
}
