//! A missing RBAC rule is visible: run as a ServiceAccount with no grants (kube-sim enforcing
//! RBAC), the controller logs each 403 at warn level naming the verb, the resource and the
//! namespace (or "cluster-wide") the ServiceAccount lacks, instead of only retrying in silence.

use std::time::Duration;

use capstan_testkit::eventually_with;
use capstan_testkit::process::BinaryUnderTest;
use capstan_testkit_sim::SimCluster;
use kube_sim::Config;
use kube_sim::auth::AuthConfig;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_nodeslo-controller");

/// The JSON log lines of `output` that are warnings from the request tracing layer.
fn forbidden_warnings(output: &[String]) -> Vec<Value> {
    output
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["level"] == "WARN" && line["target"] == "capstan_runtime::http_trace")
        .collect()
}

fn warning_for<'a>(warnings: &'a [Value], verb: &str, resource: &str) -> Option<&'a Value> {
    warnings
        .iter()
        .find(|w| w["fields"]["verb"] == verb && w["fields"]["resource"] == resource)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_403_is_a_warning_naming_verb_resource_and_namespace() {
    let cluster = SimCluster::start_with(Config {
        auth: AuthConfig {
            rbac: true,
            ..AuthConfig::default()
        },
        ..Config::default()
    })
    .await;
    cluster.create_namespaces(&["koordinator-system"]).await;
    // A ServiceAccount no Role or ClusterRole is bound to.
    let kubeconfig = cluster
        .service_account_kubeconfig("koordinator-system", "no-grants")
        .await;
    let kubeconfig = kubeconfig.path().to_str().expect("utf-8 temp path");

    let controller = BinaryUnderTest::spawn(
        BIN,
        &[
            "--kubeconfig",
            kubeconfig,
            "--metrics-addr",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ],
    )
    .await
    .expect("controller starts");
    let warnings = eventually_with(
        "403 warnings for configmaps and nodes",
        Duration::from_secs(30),
        || controller.output().join("\n"),
        || async {
            let warnings = forbidden_warnings(&controller.output());
            let both = warning_for(&warnings, "list", "configmaps").is_some()
                && warning_for(&warnings, "list", "nodes").is_some();
            both.then_some(warnings)
        },
    )
    .await;

    let configmaps = warning_for(&warnings, "list", "configmaps").expect("found above");
    assert_eq!(configmaps["fields"]["namespace"], "koordinator-system");
    assert_eq!(
        configmaps["fields"]["message"],
        "forbidden: the ServiceAccount may not list configmaps in namespace koordinator-system; \
         grant it in the RBAC rules"
    );
    let nodes = warning_for(&warnings, "list", "nodes").expect("found above");
    assert_eq!(nodes["fields"]["namespace"], "");
    assert_eq!(
        nodes["fields"]["message"],
        "forbidden: the ServiceAccount may not list nodes cluster-wide; grant it in the RBAC rules"
    );
}
