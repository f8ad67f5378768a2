//! kube-sim through the Python `kubernetes` client (skipped with a message when it is not installed).

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_lists_with_selectors_and_watches_from_a_resource_version() {
    let has_module = std::process::Command::new("python3")
        .args(["-c", "import kubernetes"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_module {
        eprintln!(
            "SKIPPED: the Python 'kubernetes' module is missing; `pip install kubernetes` to run this test"
        );
        return;
    }
    let sim = common::start().await;
    common::run_python(&sim, "list_watch.py").await;
    sim.shutdown().await;
}
