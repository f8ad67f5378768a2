//! The field table of every Kubernetes protobuf message (`proto/k8s-wire.txt`, generated from the
//! `k8s-pb` crate, itself generated from upstream's `generated.proto` files), parsed once, and the
//! lookup from an object's `apiVersion`/`kind` to its message.

use std::collections::HashMap;
use std::sync::OnceLock;

const TABLE: &str = include_str!("../../proto/k8s-wire.txt");

/// A field's value type on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ty {
    String,
    Bytes,
    Bool,
    Int32,
    Int64,
    Double,
    /// A message, by its full name (`k8s.io.api.core.v1.Pod`).
    Message(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    Optional,
    Repeated,
    /// `map<string, V>`: repeated entries of key = 1, value = 2.
    Map,
}

#[derive(Debug, Clone)]
pub struct Field {
    pub tag: u32,
    pub json: String,
    pub label: Label,
    pub ty: Ty,
}

/// Protobuf fields whose Go struct is embedded with `json:",inline"`: in JSON, the embedded
/// message's fields sit in the outer object and the field's own name does not appear.
const INLINED: &[&str] = &[
    "handler",
    "volumeSource",
    "persistentVolumeSource",
    "ephemeralContainerCommon",
];

impl Field {
    /// The embedded message, when this field is a Go-inlined struct (`Probe.handler`, ...).
    pub fn inlined(&self) -> Option<&str> {
        match &self.ty {
            Ty::Message(m) if INLINED.contains(&self.json.as_str()) => Some(m),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
pub struct Message {
    pub fields: Vec<Field>,
}

impl Message {
    pub fn by_tag(&self, tag: u32) -> Option<&Field> {
        self.fields.iter().find(|f| f.tag == tag)
    }
}

#[derive(Debug, Default)]
pub struct Schema {
    pub messages: HashMap<String, Message>,
    /// `(package, lowercased kind)` -> message name; some message names
    /// lost their acronyms' case in generation (`HostIp`), so kinds are matched without it.
    kinds: HashMap<(String, String), String>,
}

fn ty(s: &str) -> Ty {
    match s {
        "string" => Ty::String,
        "bytes" => Ty::Bytes,
        "bool" => Ty::Bool,
        "int32" => Ty::Int32,
        "int64" => Ty::Int64,
        "double" => Ty::Double,
        other => Ty::Message(other.trim_start_matches('.').to_string()),
    }
}

fn parse(table: &str) -> Schema {
    let mut schema = Schema::default();
    let mut current: Option<String> = None;
    for line in table.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix("message ") {
            let name = name.trim().to_string();
            if let Some((pkg, short)) = name.rsplit_once('.') {
                schema
                    .kinds
                    .insert((pkg.to_string(), short.to_lowercase()), name.clone());
            }
            schema.messages.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        let (Some(msg), [tag, json, label, rest @ ..]) = (&current, parts.as_slice()) else {
            continue;
        };
        let Ok(tag) = tag.parse() else { continue };
        let (label, ty) = match (*label, rest) {
            ("map", [_key, value]) => (Label::Map, ty(value)),
            ("repeated", [t]) => (Label::Repeated, ty(t)),
            (_, [t]) => (Label::Optional, ty(t)),
            _ => continue,
        };
        if let Some(m) = schema.messages.get_mut(msg) {
            m.fields.push(Field {
                tag,
                json: (*json).to_string(),
                label,
                ty,
            });
        }
    }
    schema
}

pub fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| parse(TABLE))
}

/// The protobuf package of an API group/version (`apps/v1` -> `k8s.io.api.apps.v1`).
fn package(api_version: &str) -> String {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    match group {
        "" => format!("k8s.io.api.core.{version}"),
        "meta.k8s.io" => format!("k8s.io.apimachinery.pkg.apis.meta.{version}"),
        "apiextensions.k8s.io" => {
            format!("k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.{version}")
        }
        "apiregistration.k8s.io" => {
            format!("k8s.io.kube_aggregator.pkg.apis.apiregistration.{version}")
        }
        "internal.apiserver.k8s.io" => format!("k8s.io.api.apiserverinternal.{version}"),
        // Only Kubernetes' own groups: a custom `apps.example.com` is not `apps`.
        g if g.contains('.') && !g.ends_with(".k8s.io") => String::new(),
        g => format!(
            "k8s.io.api.{}.{version}",
            g.split('.').next().unwrap_or_default()
        ),
    }
}

impl Schema {
    /// The message of a built-in kind; `meta.k8s.io/v1` kinds (DeleteOptions, Status, ...) are
    /// found under any group version, as client-go sends them with the resource's.
    pub fn message_of(&self, api_version: &str, kind: &str) -> Option<&str> {
        let mut key = (package(api_version), kind.to_lowercase());
        if let Some(message) = self.kinds.get(&key) {
            return Some(message);
        }
        key.0 = package("meta.k8s.io/v1");
        self.kinds.get(&key).map(String::as_str)
    }

    pub fn message(&self, name: &str) -> Option<&Message> {
        self.messages.get(name)
    }

    /// A message with its name as the table keeps it.
    pub fn messages_entry(&self, name: &str) -> Option<(&str, &Message)> {
        self.messages
            .get_key_value(name)
            .map(|(k, m)| (k.as_str(), m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_knows_every_group_and_json_names_keep_their_acronyms() {
        let s = schema();
        assert!(s.messages.len() > 1000, "{}", s.messages.len());
        let pod_status = s
            .message("k8s.io.api.core.v1.PodStatus")
            .expect("PodStatus");
        assert_eq!(pod_status.by_tag(6).map(|f| f.json.as_str()), Some("podIP"));
        assert_eq!(
            s.message_of("batch/v1", "CronJob"),
            Some("k8s.io.api.batch.v1.CronJob")
        );
        assert_eq!(
            s.message_of("storage.k8s.io/v1", "CSIDriver"),
            Some("k8s.io.api.storage.v1.CSIDriver")
        );
        assert_eq!(
            s.message_of("v1", "DeleteOptions"),
            Some("k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions")
        );
        assert_eq!(s.message_of("example.com/v1", "Widget"), None);
        assert_eq!(s.message_of("apps.example.com/v1", "Deployment"), None);
    }
}
