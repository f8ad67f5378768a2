//! Conversion between a served version and the storage version. Every resource is stored once;
//! `events.k8s.io/v1` Events share storage with core `v1` Events, as on kube-apiserver, so that
//! events recorded by one API are listed (and shown by `kubectl describe`) through the other.

use crate::registry::ResourceInfo;
use serde_json::{Map, Value, json};

/// core/v1 field <-> events.k8s.io/v1 field.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn is_events_v1(info: &ResourceInfo) -> bool {
    info.group == "events.k8s.io" && info.plural == "events"
}

fn rename(
    obj: &Value,
    pairs: impl Iterator<Item = (&'static str, &'static str)>,
) -> Map<String, Value> {
    let mut m = obj.as_object().cloned().unwrap_or_default();
    for (from, to) in pairs {
        if let Some(v) = m.remove(from) {
            m.insert(to.to_string(), v);
        }
    }
    m
}

/// A request-version object in its storage form.
pub fn to_storage(info: &ResourceInfo, obj: Value) -> Value {
    if is_events_v1(info) {
        let mut m = rename(&obj, EVENT_FIELDS.iter().map(|(core, new)| (*new, *core)));
        m.insert("apiVersion".into(), json!("v1"));
        return Value::Object(m);
    }
    obj
}

/// A stored object as the requested version shows it.
pub fn from_storage(info: &ResourceInfo, obj: &Value) -> Value {
    if is_events_v1(info) {
        let mut m = rename(obj, EVENT_FIELDS.iter().copied());
        m.insert("apiVersion".into(), json!("events.k8s.io/v1"));
        return Value::Object(m);
    }
    let mut o = obj.clone();
    if o.is_object() {
        o["apiVersion"] = json!(info.api_version());
    }
    o
}

/// Whether a stored object must be converted before it is shown in this version.
pub fn needs_conversion(info: &ResourceInfo, obj: &Value) -> bool {
    !obj["apiVersion"]
        .as_str()
        .is_some_and(|av| info.is_api_version(av))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn events_round_trip_between_versions() {
        let reg = Registry::default();
        let v1 = reg
            .lookup("events.k8s.io", "v1", "events")
            .expect("events.k8s.io")
            .clone();
        let new = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"name": "x"}, "note": "hi", "reportingController": "c", "reason": "R"});
        let stored = to_storage(&v1, new.clone());
        assert_eq!(stored["involvedObject"]["name"], "x");
        assert_eq!(stored["message"], "hi");
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(from_storage(&v1, &stored), new);
        assert_eq!(v1.storage_key(), (String::new(), "events".to_string()));
    }
}
