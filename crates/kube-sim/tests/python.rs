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
    common::run_python(&sim, "list_watch.py").await;
    sim.shutdown().await;
}
