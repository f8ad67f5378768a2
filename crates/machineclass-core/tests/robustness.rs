//! Property tests: no Machine, MachineClass or driver answer makes the pure decisions panic, and
//! bad timeouts are refused naming their field.

use std::time::Duration;

use capstan_apis::machine::{Code, MachineClass, MachinePhase, MachineSpec};
use k8s_openapi::api::core::v1::NodeCondition;
use machineclass_core::Timestamp;
use machineclass_core::driver_error::{RetryPeriods, creation_failure, elapsed};
use machineclass_core::health::{HealthInput, evaluate_health};
use machineclass_core::validate::{MachineTimeouts, validate_class, validate_class_ref};
use proptest::prelude::*;
use serde_json::json;

fn any_timestamp() -> impl Strategy<Value = Timestamp> {
    (Timestamp::MIN.as_second()..=Timestamp::MAX.as_second())
        .prop_map(|s| Timestamp::from_second(s).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..100_000).prop_map(Duration::from_secs),
    ]
}

fn any_phase() -> impl Strategy<Value = Option<MachinePhase>> {
    prop::option::of(prop::sample::select(vec![
        MachinePhase::Pending,
        MachinePhase::Available,
        MachinePhase::Running,
        MachinePhase::Terminating,
        MachinePhase::Unknown,
        MachinePhase::Failed,
        MachinePhase::CrashLoopBackOff,
    ]))
}

fn any_go_duration() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{0,25}(\\.[0-9]{0,12})?(ns|us|µs|ms|s|m|h|d|x)?",
        "[-+]?([0-9]{1,22}(ns|s|m|h)){1,4}",
        "\\PC{0,16}",
    ]
}

fn periods() -> RetryPeriods {
    RetryPeriods {
        conflict: Duration::from_millis(200),
        short: Duration::from_secs(5),
        medium: Duration::from_secs(180),
        long: Duration::from_secs(600),
        resource_exhausted: Duration::from_secs(180),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn timeouts_never_panic_and_errors_name_the_field(
        field in prop::sample::select(vec!["creationTimeout", "healthTimeout", "drainTimeout"]),
        text in any_go_duration(),
    ) {
        let spec: MachineSpec = serde_json::from_value(json!({ field: text })).expect("a string is a duration");
        match MachineTimeouts::from_spec(&spec) {
            Ok(t) => prop_assert!(t.creation <= Duration::MAX),
            Err(e) => prop_assert!(e.to_string().contains(field), "{}", e),
        }
    }

    #[test]
    fn class_validation_never_panics(
        kind in prop::option::of("\\PC{0,12}"),
        name in prop::option::of("\\PC{0,12}"),
        capacity in prop::collection::btree_map("[a-z]{1,6}", "[0-9]{1,3}", 0..4),
        instance_type in prop::option::of("\\PC{0,6}"),
    ) {
        let spec: MachineSpec = serde_json::from_value(json!({"class": {"kind": kind, "name": name}}))
            .expect("spec");
        if let Err(e) = validate_class_ref(&spec) {
            prop_assert!(e.to_string().contains("spec.class."), "{}", e);
        }
        let class: MachineClass = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
            "metadata": {"name": "c"}, "providerSpec": {},
            "nodeTemplate": {"capacity": capacity, "instanceType": instance_type}
        }))
        .expect("class");
        for problem in validate_class(&class) {
            prop_assert!(problem.to_string().contains("nodeTemplate"), "{}", problem);
        }
    }

    #[test]
    fn driver_failures_never_panic(
        code in prop::sample::select(Code::ALL.to_vec()),
        message in "\\PC{0,40}",
        created in any_timestamp(),
        now in any_timestamp(),
        timeout in any_duration(),
    ) {
        let failure = creation_failure(code, &message, created, now, timeout, &periods());
        prop_assert!(failure.retry_after > Duration::ZERO);
        // Elapsed time saturates instead of wrapping: a later `now` never looks earlier.
        if now > created {
            prop_assert!(elapsed(created, now) > Duration::ZERO);
        }
    }

    #[test]
    fn health_decisions_never_panic(
        phase in any_phase(),
        since in any_timestamp(),
        now in any_timestamp(),
        creation in any_duration(),
        health in any_duration(),
        disable in any::<bool>(),
        another in any::<bool>(),
        conditions in prop::option::of(prop::collection::vec(
            ("[A-Za-z]{1,12}", prop::sample::select(vec!["True", "False", "Unknown", ""])), 0..5)),
    ) {
        let conditions: Option<Vec<NodeCondition>> = conditions.map(|list| {
            list.into_iter()
                .map(|(type_, status)| NodeCondition { type_, status: status.to_owned(), ..Default::default() })
                .collect()
        });
        let unhealthy = vec!["KernelDeadlock".to_owned(), "DiskPressure".to_owned()];
        let _ = evaluate_health(&HealthInput {
            machine_name: "m",
            phase: phase.as_ref(),
            phase_since: since,
            node_conditions: conditions.as_deref(),
            unhealthy_types: &unhealthy,
            timeouts: MachineTimeouts {
                creation,
                health,
                drain: Duration::from_secs(7200),
                disable_health_timeout: disable,
            },
            another_failed_in_deployment: another,
            now,
        });
    }
}

#[test]
fn a_timeout_at_the_edge_of_u128_is_an_overflow_error_not_a_panic() {
    // whole * 1h fits in u128, the fraction then overflows it.
    let spec: MachineSpec =
        serde_json::from_value(json!({"creationTimeout": "94522879700260684295381835.9999h"}))
            .expect("spec");
    let err = MachineTimeouts::from_spec(&spec).expect_err("overflow");
    assert!(err.to_string().contains("creationTimeout"), "{err}");
}
