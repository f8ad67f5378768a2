//! The demo smoke run as a scenario: `cargo xtask demo --smoke` (the README's first command, made
//! to check itself and stop) starts kube-sim, seeds it, runs every Capstan binary against it,
//! recycles a slice gateway pair, then stops everything. This test runs exactly that command and
//! asserts what a user would see: it converged (the NodeSLO table of the node-strategy example,
//! the Machine Running on its Node, the gateway recycle through the spec's states to `end`), every
//! component logged its admin address, and all exited 0.
//! `cargo xtask ci` relies on this scenario instead of running the smoke run a second time.

use std::path::Path;
use std::process::Command;

use capstan_scenarios::tools::workspace_root;

/// The demo's API servers (worker A, the hub, worker B), by the name of their log files.
const SIM_LOGS: &[&str] = &["kube-sim", "kube-sim-hub", "kube-sim-worker-b"];

/// Every Capstan component the demo starts, by the name of its log file.
const COMPONENT_LOGS: &[&str] = &[
    "nodeslo-controller",
    "machineclass-controller",
    "machineset-controller",
    "router-sidecar",
    "gw-sidecar",
    "gw-recycler-worker-a",
    "gw-recycler-worker-b",
];

fn log_of(dir: &Path, name: &str) -> String {
    let path = dir.join(format!("{name}.log"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn demo_smoke_run_converges_and_every_process_exits_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dir_arg = dir.path().to_str().expect("utf-8 temp path");
    // The README's command, through the same cargo alias (`cargo xtask` = `run --bin xtask --`).
    let output = Command::new(env!("CARGO"))
        .args(["xtask", "demo", "--smoke", "--dir", dir_arg])
        .current_dir(workspace_root())
        .env_remove("KUBECONFIG")
        .output()
        .expect("cargo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let logs: String = SIM_LOGS
        .iter()
        .chain(COMPONENT_LOGS)
        .filter(|name| dir.path().join(format!("{name}.log")).is_file())
        .map(|name| format!("--- {name}.log\n{}\n", log_of(dir.path(), name)))
        .collect();
    assert!(
        output.status.success(),
        "`cargo xtask demo --smoke` failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}\n{logs}",
        output.status
    );
    assert!(
        stdout.contains("demo smoke run passed: every process converged and exited 0 on SIGTERM"),
        "stdout:\n{stdout}"
    );
    // The node-strategy example of the NodeSLO spec: worker-a matches xxx=yyy (40), worker-b
    // zzz=zzz (50), worker-c only the cluster strategy (60).
    for row in ["worker-a   40", "worker-b   50", "worker-c   60"] {
        assert!(
            stdout.lines().any(|line| line.trim() == row),
            "NodeSLO row {row:?} missing from:\n{stdout}"
        );
    }
    let machine_line = stdout
        .lines()
        .find(|line| line.starts_with("Machine demo-machine-0 is Running on Node "))
        .unwrap_or_else(|| panic!("no Running machine line in:\n{stdout}"));
    let node = machine_line
        .trim_start_matches("Machine demo-machine-0 is Running on Node ")
        .trim_end_matches(" (simulated provider):");
    assert!(
        !node.is_empty(),
        "the Machine names its Node: {machine_line}"
    );
    // The demo's MachineDeployment came up and was rolled to the second class.
    assert!(
        stdout.contains("MachineDeployment demo-pool was rolled from demo-class to demo-class-b"),
        "no rolled MachineDeployment in:\n{stdout}"
    );
    // `gw-recycler trigger --wait` prints each state change; the server side's FSM goes through
    // the spec's states to `end` (`error_state` is terminal too, so it cannot come before).
    let states: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("state: "))
        .collect();
    assert_eq!(
        states.last(),
        Some(&"end"),
        "the recycle did not end:\n{stdout}"
    );
    for name in COMPONENT_LOGS {
        let log = log_of(dir.path(), name);
        assert!(
            log.contains(capstan_testkit::process::ADMIN_LISTENING_MARKER),
            "{name} never served its admin endpoints:\n{log}"
        );
    }
}
