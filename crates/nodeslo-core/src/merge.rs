//! Deep merge of JSON values, the way Koordinator merges a strategy onto its defaults.

use serde_json::Value;

/// Returns `base` with `overlay` merged onto it.
///
/// A field absent or `null` in the overlay keeps the base value; nested objects (and so maps)
/// merge key by key; any other overlay value, `false` and `0` included, replaces the base; arrays
/// are replaced, not concatenated.
pub fn deep_merge(base: &Value, overlay: &Value) -> Value {
    match (base, overlay) {
        (_, Value::Null) => base.clone(),
        (Value::Object(base_map), Value::Object(overlay_map)) => {
            let mut merged = base_map.clone();
            for (key, overlay_value) in overlay_map {
                let value = match base_map.get(key) {
                    Some(base_value) => deep_merge(base_value, overlay_value),
                    None if overlay_value.is_null() => continue,
                    None => strip_nulls(overlay_value),
                };
                merged.insert(key.clone(), value);
            }
            Value::Object(merged)
        }
        _ => strip_nulls(overlay),
    }
}

/// Removes `null` object fields recursively, so that "absent" and "null" read the same downstream.
pub fn strip_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_and_null_keep_the_base() {
        let base = json!({"a": 1, "b": {"c": 2}});
        assert_eq!(deep_merge(&base, &json!({})), base);
        assert_eq!(deep_merge(&base, &json!({"a": null, "b": null})), base);
        assert_eq!(deep_merge(&base, &Value::Null), base);
    }

    #[test]
    fn false_and_zero_override() {
        let base = json!({"enable": true, "percent": 65});
        assert_eq!(
            deep_merge(&base, &json!({"enable": false, "percent": 0})),
            json!({"enable": false, "percent": 0})
        );
    }

    #[test]
    fn nested_objects_and_maps_merge_key_by_key() {
        let base = json!({"schedFeatures": {"A": true, "B": false}, "x": {"y": {"z": 1, "w": 2}}});
        let overlay = json!({"schedFeatures": {"B": true, "C": true}, "x": {"y": {"z": 9}}});
        assert_eq!(
            deep_merge(&base, &overlay),
            json!({"schedFeatures": {"A": true, "B": true, "C": true}, "x": {"y": {"z": 9, "w": 2}}})
        );
    }

    #[test]
    fn arrays_are_replaced() {
        let base = json!({"list": [1, 2, 3]});
        assert_eq!(
            deep_merge(&base, &json!({"list": [4]})),
            json!({"list": [4]})
        );
        assert_eq!(deep_merge(&base, &json!({"list": []})), json!({"list": []}));
    }

    #[test]
    fn new_keys_are_added_without_their_nulls() {
        let base = json!({"a": 1});
        assert_eq!(
            deep_merge(&base, &json!({"b": {"c": null, "d": 4}})),
            json!({"a": 1, "b": {"d": 4}})
        );
    }
}
