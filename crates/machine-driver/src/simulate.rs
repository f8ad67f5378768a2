//! `providerSpec.simulate`, the simulated provider's failure-injection block, parsed and checked.
//!
//! The block comes from a user's MachineClass, so every value is checked here, before it turns
//! into a duration: a bad one is an `InvalidArgument` naming the field, never a panic.

use std::time::Duration;

use serde_json::{Map, Value};

/// The longest `readyDelaySeconds` accepted (one day): a simulated boot longer than that is a typo.
pub const MAX_READY_DELAY: Duration = Duration::from_secs(24 * 3600);

/// What is wrong with a `providerSpec.simulate` block; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("providerSpec.simulate{field}: {problem}")]
pub struct SimulateError {
    /// `""` for the block itself, else `.<key>`.
    field: String,
    problem: String,
}

impl SimulateError {
    fn new(field: &str, problem: impl Into<String>) -> Self {
        Self {
            field: if field.is_empty() {
                String::new()
            } else {
                format!(".{field}")
            },
            problem: problem.into(),
        }
    }

    /// The field's path, e.g. `providerSpec.simulate.readyDelaySeconds`.
    pub fn field(&self) -> String {
        format!("providerSpec.simulate{}", self.field)
    }
}

/// A checked `providerSpec.simulate` block. Unknown keys are ignored, like the reference's
/// lenient JSON decoding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Simulate {
    pub create_error: Option<String>,
    pub delete_error: Option<String>,
    pub get_error: Option<String>,
    pub initialize_error: Option<String>,
    /// `readyDelaySeconds`, in `0..=MAX_READY_DELAY`.
    pub ready_delay: Option<Duration>,
    pub never_ready: bool,
}

impl Simulate {
    /// Reads `simulate` out of a class's `providerSpec` (absent or null: nothing simulated).
    pub fn from_provider_spec(provider_spec: &Value) -> Result<Self, SimulateError> {
        match provider_spec.get("simulate") {
            None | Some(Value::Null) => Ok(Self::default()),
            Some(Value::Object(block)) => Self::from_block(block),
            Some(other) => Err(SimulateError::new(
                "",
                format!("expected an object, found {}", json_type(other)),
            )),
        }
    }

    fn from_block(block: &Map<String, Value>) -> Result<Self, SimulateError> {
        Ok(Self {
            create_error: code_name(block, "createError")?,
            delete_error: code_name(block, "deleteError")?,
            get_error: code_name(block, "getError")?,
            initialize_error: code_name(block, "initializeError")?,
            ready_delay: ready_delay(block)?,
            never_ready: match block.get("neverReady") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(SimulateError::new(
                        "neverReady",
                        format!("expected a boolean, found {}", json_type(other)),
                    ));
                }
            },
        })
    }
}

fn code_name(block: &Map<String, Value>, field: &str) -> Result<Option<String>, SimulateError> {
    match block.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(SimulateError::new(
            field,
            format!("expected an error code name, found {}", json_type(other)),
        )),
    }
}

fn ready_delay(block: &Map<String, Value>) -> Result<Option<Duration>, SimulateError> {
    const FIELD: &str = "readyDelaySeconds";
    let seconds = match block.get(FIELD) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_f64(),
        Some(other) => {
            return Err(SimulateError::new(
                FIELD,
                format!("expected a number of seconds, found {}", json_type(other)),
            ));
        }
    };
    seconds_in_range(seconds, MAX_READY_DELAY)
        .map(Some)
        .ok_or_else(|| {
            SimulateError::new(
                FIELD,
                format!(
                    "must be between 0 and {} seconds, found {}",
                    MAX_READY_DELAY.as_secs(),
                    block.get(FIELD).map(Value::to_string).unwrap_or_default()
                ),
            )
        })
}

/// `seconds` as a Duration when it is finite and in `0..=max`.
pub fn seconds_in_range(seconds: Option<f64>, max: Duration) -> Option<Duration> {
    let seconds = seconds.filter(|s| s.is_finite() && *s >= 0.0 && *s <= max.as_secs_f64())?;
    Duration::try_from_secs_f64(seconds).ok()
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(spec: Value) -> Result<Simulate, SimulateError> {
        Simulate::from_provider_spec(&spec)
    }

    #[test]
    fn absent_block_simulates_nothing() {
        assert_eq!(parse(json!({})), Ok(Simulate::default()));
        assert_eq!(parse(json!({"simulate": null})), Ok(Simulate::default()));
    }

    #[test]
    fn a_valid_block_is_read_whole() {
        let sim = parse(json!({"simulate": {
            "createError": "ResourceExhausted", "readyDelaySeconds": 1.5, "neverReady": true,
            "somethingNew": 1
        }}))
        .expect("valid");
        assert_eq!(sim.create_error.as_deref(), Some("ResourceExhausted"));
        assert_eq!(sim.ready_delay, Some(Duration::from_millis(1500)));
        assert!(sim.never_ready);
    }

    #[test]
    fn out_of_range_ready_delays_are_refused_naming_the_field() {
        for bad in [json!(1e300), json!(-1), json!(86401), json!(u64::MAX)] {
            let err = parse(json!({"simulate": {"readyDelaySeconds": bad}})).expect_err("refused");
            assert_eq!(err.field(), "providerSpec.simulate.readyDelaySeconds");
            assert!(
                err.to_string().starts_with(
                    "providerSpec.simulate.readyDelaySeconds: must be between 0 and 86400 seconds"
                ),
                "{err}"
            );
        }
        assert_eq!(
            parse(json!({"simulate": {"readyDelaySeconds": 86400}}))
                .expect("the maximum is allowed")
                .ready_delay,
            Some(MAX_READY_DELAY)
        );
    }

    #[test]
    fn wrong_types_are_refused_naming_the_field() {
        for (block, field) in [
            (json!({"readyDelaySeconds": "3"}), "readyDelaySeconds"),
            (json!({"neverReady": "yes"}), "neverReady"),
            (json!({"createError": 14}), "createError"),
            (json!({"deleteError": []}), "deleteError"),
        ] {
            let err = parse(json!({ "simulate": block })).expect_err("refused");
            assert_eq!(err.field(), format!("providerSpec.simulate.{field}"));
        }
        let err = parse(json!({"simulate": [1]})).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "providerSpec.simulate: expected an object, found an array"
        );
    }
}
