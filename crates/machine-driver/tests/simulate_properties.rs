//! Property test: no `providerSpec` makes the simulated provider's parse panic, and a refused
//! block names the field at fault under `providerSpec.simulate`.

use machine_driver::simulate::{MAX_READY_DELAY, Simulate};
use proptest::prelude::*;
use serde_json::{Value, json};

fn any_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,4}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_simulate_block_panics(field in prop::sample::select(vec![
            "readyDelaySeconds", "neverReady", "createError", "deleteError", "getError", "initializeError", "other"]),
            value in any_value()) {
        match Simulate::from_provider_spec(&json!({"simulate": {field: value}})) {
            Ok(sim) => prop_assert!(sim.ready_delay.is_none_or(|d| d <= MAX_READY_DELAY)),
            Err(e) => {
                prop_assert_eq!(e.field(), format!("providerSpec.simulate.{field}"));
                prop_assert!(e.to_string().starts_with(&e.field()));
            }
        }
    }

    #[test]
    fn any_simulate_value_is_parsed_or_refused(value in any_value()) {
        if let Err(e) = Simulate::from_provider_spec(&json!({"simulate": value})) {
            prop_assert!(e.to_string().starts_with("providerSpec.simulate"));
        }
    }
}
