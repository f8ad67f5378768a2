//! `metadata.managedFields` entries: read into field sets and written back as kube-apiserver
//! writes them.

use serde_json::{Map, Value, json};

use super::fields_v1::{from_fields_v1, to_fields_v1};
use super::{FieldSet, Writer};

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedEntry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub subresource: String,
    pub time: String,
    pub fields: FieldSet,
}

pub fn read_managed(obj: &Value) -> Vec<ManagedEntry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| ManagedEntry {
            manager: e["manager"].as_str().unwrap_or_default().into(),
            operation: e["operation"].as_str().unwrap_or("Update").into(),
            api_version: e["apiVersion"].as_str().unwrap_or_default().into(),
            subresource: e["subresource"].as_str().unwrap_or_default().into(),
            time: e["time"].as_str().unwrap_or_default().into(),
            fields: from_fields_v1(&e["fieldsV1"]),
        })
        .collect()
}

pub fn write_managed(obj: &mut Value, entries: &[ManagedEntry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let w = Writer {
                manager: &e.manager,
                api_version: &e.api_version,
                subresource: &e.subresource,
                time: &e.time,
            };
            managed_fields_entry(&w, &e.operation, to_fields_v1(&e.fields))
        })
        .collect();
    set_managed_fields(obj, list);
}

/// Sets `metadata.managedFields` to `list` (removes it when empty).
pub(super) fn set_managed_fields(obj: &mut Value, list: Vec<Value>) {
    if !obj["metadata"].is_object() {
        if !obj.is_object() {
            return;
        }
        obj["metadata"] = json!({});
    }
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if list.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

/// One `managedFields` item as kube-apiserver writes it.
pub(super) fn managed_fields_entry(w: &Writer<'_>, operation: &str, fields_v1: Value) -> Value {
    let mut m = Map::new();
    m.insert("manager".into(), json!(w.manager));
    m.insert("operation".into(), json!(operation));
    m.insert("apiVersion".into(), json!(w.api_version));
    m.insert("time".into(), json!(w.time));
    m.insert("fieldsType".into(), json!("FieldsV1"));
    m.insert("fieldsV1".into(), fields_v1);
    if !w.subresource.is_empty() {
        m.insert("subresource".into(), json!(w.subresource));
    }
    Value::Object(m)
}
