//! kube-sim through the Python `kubernetes` client (a loud skip without it; a failure under
//! `CAPSTAN_REQUIRE_ALL_TESTS=1`).

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_lists_with_selectors_and_watches_from_a_resource_version() {
    let module = capstan_testkit::python_modules(&["kubernetes"]);
    if !capstan_testkit::require("the Python kubernetes client", module) {
        return;
    }
    let sim = common::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/list_watch.py");
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .arg(&kubeconfig)
        .output()
        .await
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python client test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    sim.shutdown().await;
}
