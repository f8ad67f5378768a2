//! The real controller against hostile input and a flaky API server: one class with an
//! out-of-range number in `providerSpec.simulate` is reported on its Machine while the process
//! keeps managing the others (it used to panic on every start), and 30 Machines created under
//! injected 500s, 429s and cut watches all reach Running once the faults stop, without a restart.

mod common;

use std::time::Duration;

use capstan_testkit::process::{BinaryUnderTest, http_get};
use common::{BIN, Env, NS, last_op, machine_json, phase, until};
use kube::api::PostParams;
use kube_sim::faults::{ErrorRule, FaultConfig};
use serde_json::json;

/// The controller with fast retries and a short simulated boot.
async fn fast_controller(env: &Env) -> BinaryUnderTest {
    env.spawn(
        BIN,
        &[
            "--namespace",
            NS,
            "--conflict-retry",
            "50ms",
            "--short-retry",
            "200ms",
            "--medium-retry",
            "1s",
            "--resource-exhausted-retry",
            "1s",
            "--sim-ready-delay",
            "100ms",
            "--log-level",
            "info,kube=warn",
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_range_simulate_number_is_reported_and_the_controller_keeps_running() {
    let env = Env::start().await;
    let bin = fast_controller(&env).await;
    env.secret("creds").await;
    env.class(
        "bad",
        "creds",
        json!({"simulate": {"readyDelaySeconds": 1e300}}),
    )
    .await;
    env.class("good", "creds", json!({})).await;
    env.machine("m-bad", "bad", json!({})).await;

    let machines = env.machines();
    let (description, state, code) = until(
        &bin,
        "the bad class's field reported on its machine",
        Duration::from_secs(60),
        || async {
            let m = machines.get("m-bad").await.ok()?;
            let op = last_op(&m);
            op.0.contains("providerSpec.simulate.readyDelaySeconds")
                .then_some(op)
        },
    )
    .await;
    assert!(
        description.starts_with(
            "Cloud provider message - providerSpec.simulate.readyDelaySeconds: must be between 0 and 86400 seconds"
        ),
        "{description}"
    );
    assert_eq!(state, "Failed");
    assert_eq!(code, "InvalidArgument");

    // The same process still manages other machines.
    env.machine("m-good", "good", json!({})).await;
    until(&bin, "m-good Running", Duration::from_secs(60), || async {
        let m = machines.get("m-good").await.ok()?;
        (phase(&m).as_deref() == Some("Running")).then_some(())
    })
    .await;
    let live = http_get(bin.admin_addr(), "/livez").await.expect("livez");
    assert_eq!(live.status, 200);
    assert!(
        !bin.output().iter().any(|l| l.contains("panicked")),
        "no panic:\n{}",
        bin.output().join("\n")
    );
    // The bad machine stays reported, not created.
    let m = machines.get("m-bad").await.expect("m-bad");
    assert_ne!(phase(&m).as_deref(), Some("Running"));
}

/// 12% 500s and 8% 429s on every write, and watches cut every 2 s.
fn flaky_api() -> FaultConfig {
    let writes: Vec<String> = ["create", "update", "patch", "delete"]
        .map(String::from)
        .to_vec();
    FaultConfig {
        seed: 15,
        errors: vec![
            ErrorRule {
                verbs: writes.clone(),
                resources: Vec::new(),
                rate: 0.12,
                code: 500,
                retry_after_seconds: 1,
            },
            ErrorRule {
                verbs: writes,
                resources: Vec::new(),
                rate: 0.08 / 0.88,
                code: 429,
                retry_after_seconds: 1,
            },
        ],
        watch_max_seconds: Some(2.0),
        ..FaultConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_machines_converge_after_api_faults_stop_without_a_restart() {
    const MACHINES: usize = 30;
    let env = Env::start().await;
    let bin = fast_controller(&env).await;
    env.secret("creds").await;
    env.class("flaky", "creds", json!({})).await;

    env.sim.set_faults(flaky_api());
    let machines = env.machines();
    for i in 0..MACHINES {
        let machine = serde_json::from_value(machine_json(&format!("m-{i}"), "flaky", json!({})))
            .expect("machine");
        // The test's own writes meet the faults too: retry until the Machine exists.
        until(&bin, "machine created", Duration::from_secs(30), || async {
            match machines.create(&PostParams::default(), &machine).await {
                Ok(_) => Some(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Some(()),
                Err(_) => None,
            }
        })
        .await;
    }
    // Let the controller work through the faults for a while before they stop.
    tokio::time::sleep(Duration::from_secs(8)).await;
    env.sim.clear_faults();

    until(
        &bin,
        "all 30 machines Running",
        Duration::from_secs(180),
        || async {
            let list = machines.list(&Default::default()).await.ok()?;
            let running = list
                .items
                .iter()
                .filter(|m| phase(m).as_deref() == Some("Running"))
                .count();
            (running == MACHINES).then_some(())
        },
    )
    .await;
    assert!(
        !bin.output().iter().any(|l| l.contains("panicked")),
        "no panic:\n{}",
        bin.output().join("\n")
    );
}
