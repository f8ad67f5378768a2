//! The NodeSLO CRD's numeric bounds and quantity syntax, checked on a merged strategy before it is
//! accepted. Without this, a percentage of 150 passed the ConfigMap parse and failed at the API
//! server on every node, and `totalNetworkBandwidth: "lots"` reached every NodeSLO.
//!
//! The bounds are read from the CRD Capstan ships, so they cannot drift from what the API server
//! enforces.

use std::sync::LazyLock;

use capstan_apis::slo;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;

use crate::quantity::is_valid_quantity;

/// `spec` of the NodeSLO CRD schema (empty if the CRD had none: then nothing is bounded).
static SPEC_SCHEMA: LazyLock<JSONSchemaProps> = LazyLock::new(|| {
    capstan_apis::crds::crd::<slo::NodeSlo>()
        .spec
        .versions
        .into_iter()
        .find_map(|v| v.schema?.open_api_v3_schema)
        .and_then(|s| s.properties?.remove("spec"))
        .unwrap_or_default()
});

/// Fields of type `resource.Quantity`: Go's decoding rejects a string that is not a quantity.
const QUANTITY_FIELDS: [&str; 1] = ["totalNetworkBandwidth"];

/// Checks `value`, a value of NodeSLO `spec.<spec_field>`, against the CRD's minimum and maximum
/// of every number in it and the syntax of its quantities. The error names the first bad field
/// by its path below `spec_field` (e.g. `beClass.memoryQOS.wmarkRatio`).
pub fn check_bounds(spec_field: &str, value: &Value) -> Result<(), String> {
    match SPEC_SCHEMA
        .properties
        .as_ref()
        .and_then(|p| p.get(spec_field))
    {
        Some(schema) => check(value, schema, ""),
        None => Ok(()),
    }
}

fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

fn check(value: &Value, schema: &JSONSchemaProps, path: &str) -> Result<(), String> {
    match value {
        Value::Number(n) => check_number(n, schema, path),
        Value::String(s) => {
            let field = path.rsplit('.').next().unwrap_or(path);
            if QUANTITY_FIELDS.contains(&field) && !is_valid_quantity(s) {
                return Err(format!("{path}: {s:?} is not a valid quantity"));
            }
            Ok(())
        }
        Value::Object(fields) => {
            for (name, field_value) in fields {
                let field_schema = schema.properties.as_ref().and_then(|p| p.get(name)).or(
                    match &schema.additional_properties {
                        Some(JSONSchemaPropsOrBool::Schema(s)) => Some(s.as_ref()),
                        _ => None,
                    },
                );
                if let Some(field_schema) = field_schema {
                    check(field_value, field_schema, &child(path, name))?;
                }
            }
            Ok(())
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(item_schema)) = &schema.items {
                for (index, item) in items.iter().enumerate() {
                    check(item, item_schema, &format!("{path}[{index}]"))?;
                }
            }
            Ok(())
        }
        Value::Null | Value::Bool(_) => Ok(()),
    }
}

fn check_number(
    n: &serde_json::Number,
    schema: &JSONSchemaProps,
    path: &str,
) -> Result<(), String> {
    let Some(x) = n.as_f64() else { return Ok(()) };
    if let Some(min) = schema.minimum {
        let exclusive = schema.exclusive_minimum == Some(true);
        if x < min || (exclusive && x == min) {
            return Err(format!("{path}: {n} is below the minimum {min}"));
        }
    }
    if let Some(max) = schema.maximum {
        let exclusive = schema.exclusive_maximum == Some(true);
        if x > max || (exclusive && x == max) {
            return Err(format!("{path}: {n} is above the maximum {max}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn percentages_outside_the_crd_range_are_refused_naming_the_field() {
        assert_eq!(
            check_bounds(
                "resourceUsedThresholdWithBE",
                &json!({"cpuSuppressThresholdPercent": 150})
            ),
            Err("cpuSuppressThresholdPercent: 150 is above the maximum 100".into())
        );
        assert_eq!(
            check_bounds(
                "resourceUsedThresholdWithBE",
                &json!({"memoryEvictThresholdPercent": -1})
            ),
            Err("memoryEvictThresholdPercent: -1 is below the minimum 0".into())
        );
        assert!(
            check_bounds(
                "resourceUsedThresholdWithBE",
                &json!({"cpuSuppressThresholdPercent": 100, "memoryEvictThresholdPercent": 0})
            )
            .is_ok()
        );
    }

    #[test]
    fn nested_bounds_are_found() {
        assert_eq!(
            check_bounds(
                "resourceQOSStrategy",
                &json!({"beClass": {"memoryQOS": {"wmarkRatio": 101}}})
            ),
            Err("beClass.memoryQOS.wmarkRatio: 101 is above the maximum 100".into())
        );
        assert_eq!(
            check_bounds(
                "resourceQOSStrategy",
                &json!({"lsClass": {"cpuQOS": {"groupIdentity": -2}}})
            ),
            Err("lsClass.cpuQOS.groupIdentity: -2 is below the minimum -1".into())
        );
        assert_eq!(
            check_bounds("cpuBurstStrategy", &json!({"cpuBurstPercent": 10001})),
            Err("cpuBurstPercent: 10001 is above the maximum 10000".into())
        );
        assert_eq!(
            check_bounds("systemStrategy", &json!({"watermarkScaleFactor": 0})),
            Err("watermarkScaleFactor: 0 is below the minimum 1".into())
        );
    }

    #[test]
    fn quantities_must_parse() {
        assert_eq!(
            check_bounds("systemStrategy", &json!({"totalNetworkBandwidth": "lots"})),
            Err(r#"totalNetworkBandwidth: "lots" is not a valid quantity"#.into())
        );
        assert!(check_bounds("systemStrategy", &json!({"totalNetworkBandwidth": "10G"})).is_ok());
    }

    #[test]
    fn unbounded_fields_and_unknown_fields_pass() {
        assert!(
            check_bounds(
                "cpuBurstStrategy",
                &json!({"cfsQuotaBurstPeriodSeconds": -1, "somethingNew": 1e300})
            )
            .is_ok()
        );
        assert!(check_bounds("noSuchField", &json!({"x": 1})).is_ok());
    }
}
