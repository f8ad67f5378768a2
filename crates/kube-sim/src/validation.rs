//! Field validation of built-in kinds, as kube-apiserver's decoding into Go structs does it: a
//! field the kind does not declare is an `unknown field` (refused with `fieldValidation=Strict`,
//! a `Warning` with `Warn`, the default, dropped silently with `Ignore`, and never stored), and a
//! value of the wrong JSON type is a 400 in encoding/json's words. The declared fields and their
//! types come from the protobuf field table (`crate::protobuf::schema`), generated from
//! Kubernetes' own definitions, so every built-in kind is covered without per-kind code.

use std::cell::RefCell;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::protobuf::schema::{Field, Label, Message, Schema, Ty, schema};

/// What a request's `fieldValidation` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Ignore,
    Warn,
    Strict,
}

impl Mode {
    /// kube-apiserver's default, when the parameter is absent, is `Warn`.
    pub fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        match v.unwrap_or("") {
            "" | "Warn" => Ok(Self::Warn),
            "Ignore" => Ok(Self::Ignore),
            "Strict" => Ok(Self::Strict),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other}"
            ))),
        }
    }
}

#[derive(Default)]
struct Findings {
    unknown: Vec<String>,
    /// The first type error, as Go's decoder reports it.
    type_error: Option<String>,
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Go's name of a field's type (`string`, `[]v1.Container`, `map[string]string`).
fn go_type(field: &Field, element_only: bool) -> String {
    let base = match &field.ty {
        Ty::String => "string".to_string(),
        Ty::Bytes => "[]uint8".to_string(),
        Ty::Bool => "bool".to_string(),
        Ty::Int32 => "int32".to_string(),
        Ty::Int64 => "int64".to_string(),
        Ty::Double => "float64".to_string(),
        Ty::Message(m) => go_struct(m),
    };
    match (field.label, element_only) {
        (_, true) | (Label::Optional, _) => base,
        (Label::Repeated, _) => format!("[]{base}"),
        (Label::Map, _) => format!("map[string]{base}"),
    }
}

/// `k8s.io.api.core.v1.PodSpec` -> `v1.PodSpec`.
fn go_struct(message: &str) -> String {
    let mut parts = message.rsplit('.');
    let name = parts.next().unwrap_or_default();
    let pkg = parts.next().unwrap_or_default();
    format!("{pkg}.{name}")
}

fn short_name(message: &str) -> &str {
    message.rsplit('.').next().unwrap_or_default()
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

struct Walker<'s> {
    schema: &'s Schema,
    found: Findings,
}

impl<'s> Walker<'s> {
    fn type_error(&mut self, v: &Value, owner: &str, path: &Path<'_>, go: String) {
        if self.found.type_error.is_none() {
            self.found.type_error = Some(format!(
                "json: cannot unmarshal {} into Go struct field {}.{} of type {go}",
                json_type(v),
                short_name(owner),
                path.render()
            ));
        }
    }

    /// Checks one object against a message; removes and records the fields it does not declare.
    /// Paths are rendered only for what is reported: a valid body allocates none.
    fn message(&mut self, name: &str, obj: &mut Map<String, Value>, path: &Path<'_>, root: bool) {
        let Some(msg) = self.schema.message(name) else {
            return;
        };
        let mut undeclared = Vec::new();
        for (key, v) in obj.iter_mut() {
            if root && matches!(key.as_str(), "apiVersion" | "kind") {
                continue;
            }
            // Strategic merge patch directives are not fields.
            if key.starts_with('$') {
                continue;
            }
            let at = Path::Key(path, key);
            match msg
                .fields
                .iter()
                .find(|f| f.json == *key && f.inlined().is_none())
                .map(|f| (name, f))
                .or_else(|| self.inlined_field(msg, key))
            {
                Some((owner, field)) => self.field(owner, field, v, &at),
                None => {
                    self.found.unknown.push(at.render());
                    undeclared.push(key.clone());
                }
            }
        }
        for key in undeclared {
            obj.remove(&key);
        }
    }

    /// A field of a message Go embeds inline (`Probe.handler` = ProbeHandler, `Volume.volumeSource`):
    /// its JSON keys sit in the outer object, so they are looked up in the embedded message.
    fn inlined_field(&self, msg: &Message, key: &str) -> Option<(&'s str, &'s Field)> {
        let schema = self.schema;
        msg.fields.iter().find_map(|f| {
            let (name, inner) = schema.messages_entry(f.inlined()?)?;
            inner
                .fields
                .iter()
                .find(|g| g.json == key)
                .map(|g| (name, g))
        })
    }

    fn field(&mut self, owner: &str, field: &Field, v: &mut Value, path: &Path<'_>) {
        if v.is_null() {
            return;
        }
        match (field.label, v) {
            (Label::Optional, v) => self.value(owner, field, v, path, path),
            (Label::Repeated, Value::Array(items)) => {
                for (i, item) in items.iter_mut().enumerate() {
                    self.value(owner, field, item, &Path::Index(path, i), path);
                }
            }
            (Label::Map, Value::Object(m)) => {
                for (k, item) in m.iter_mut() {
                    self.value(owner, field, item, &Path::Key(path, k), path);
                }
            }
            (_, v) => {
                let go = go_type(field, false);
                self.type_error(v, owner, path, go);
            }
        }
    }

    /// One value of a field's element type; `field_path` is where Go names the field.
    fn value(
        &mut self,
        owner: &str,
        field: &Field,
        v: &mut Value,
        path: &Path<'_>,
        field_path: &Path<'_>,
    ) {
        let ok = match (&field.ty, &*v) {
            (_, Value::Null) => true,
            (Ty::String, Value::String(_)) | (Ty::Bool, Value::Bool(_)) => true,
            (Ty::Bytes, Value::String(s)) => {
                if crate::util::base64_decode(s).is_none() && self.found.type_error.is_none() {
                    let at = s
                        .bytes()
                        .position(|c| {
                            !(c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='))
                        })
                        .unwrap_or(0);
                    self.found.type_error = Some(format!("illegal base64 data at input byte {at}"));
                }
                true
            }
            (Ty::Int32 | Ty::Int64, Value::Number(n)) => n.is_i64() || n.is_u64(),
            (Ty::Double, Value::Number(_)) => true,
            (Ty::Message(m), _) => match crate::protobuf::json::special(m) {
                Some("IntOrString" | "Quantity") => v.is_string() || v.is_number(),
                Some("Time" | "MicroTime" | "Duration") => v.is_string(),
                Some(_) => true,
                None => match v {
                    Value::Object(obj) => {
                        self.message(m, obj, path, false);
                        true
                    }
                    _ => false,
                },
            },
            _ => false,
        };
        if !ok && self.found.type_error.is_none() {
            // Go names the number only when it does not fit an integer field.
            let what = match (&field.ty, &*v) {
                (Ty::Int32 | Ty::Int64, Value::Number(n)) => format!("number {n}"),
                (_, other) => json_type(other).to_string(),
            };
            self.found.type_error = Some(format!(
                "json: cannot unmarshal {what} into Go struct field {}.{} of type {}",
                short_name(owner),
                field_path.render(),
                go_type(field, true)
            ));
        }
    }
}

/// Decodes a JSON body into its tree in one pass, recording the path of every key that repeats
/// within its object (`spec.paused`). Go keeps the last value, as does this (and serde_json), so
/// only `fieldValidation` reports them; decoding once spares every write a second scan of its body.
pub fn decode_json(raw: &[u8]) -> Result<Decoded, serde_json::Error> {
    let found = RefCell::new(vec![]);
    let mut de = serde_json::Deserializer::from_slice(raw);
    let value = Tree {
        at: &Path::Root,
        found: &found,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(Decoded {
        value,
        duplicates: found.into_inner(),
    })
}

/// A request body as a tree, with the paths of the fields it repeats.
#[derive(Debug)]
pub struct Decoded {
    pub value: Value,
    pub duplicates: Vec<String>,
}

impl Decoded {
    /// A body that cannot repeat a field the way JSON text can (protobuf, YAML).
    pub fn without_duplicates(value: Value) -> Self {
        Self {
            value,
            duplicates: vec![],
        }
    }
}

/// Where a value sits in the body, rendered only when a duplicate is found there.
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn render(&self) -> String {
        match self {
            Path::Root => String::new(),
            Path::Key(up, key) => join(&up.render(), key),
            Path::Index(up, i) => format!("{}[{i}]", up.render()),
        }
    }
}

/// Builds one JSON value as serde_json's own `Value` does, noting repeated keys.
struct Tree<'a> {
    at: &'a Path<'a>,
    found: &'a RefCell<Vec<String>>,
}

impl<'de> DeserializeSeed<'de> for Tree<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Tree<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = m.next_key::<String>()? {
            let value = m.next_value_seed(Tree {
                at: &Path::Key(self.at, &key),
                found: self.found,
            })?;
            if map.contains_key(&key) {
                let path = Path::Key(self.at, &key).render();
                self.found.borrow_mut().push(path);
            }
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(s.size_hint().unwrap_or(0));
        while let Some(item) = s.next_element_seed(Tree {
            at: &Path::Index(self.at, items.len()),
            found: self.found,
        })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// Validates a built-in kind's body in place (unknown fields removed). Returns the warnings to
/// send (`Warn`), or the 400 kube-apiserver answers (`Strict` with unknown fields, or a value of
/// the wrong type in any mode). Kinds without a message (custom resources) pass untouched.
pub fn admit(
    api_version: &str,
    kind: &str,
    body: &mut Value,
    duplicates: &[String],
    mode: Mode,
) -> Result<Vec<String>, ApiError> {
    let s = schema();
    let Some(message) = s.message_of(api_version, kind) else {
        return Ok(vec![]);
    };
    let Value::Object(obj) = body else {
        return Ok(vec![]);
    };
    let mut w = Walker {
        schema: s,
        found: Findings::default(),
    };
    w.message(message, obj, &Path::Root, true);
    let version = api_version.rsplit('/').next().unwrap_or(api_version);
    let prefix = || format!("{kind} in version \"{version}\" cannot be handled as a {kind}");
    if let Some(e) = w.found.type_error {
        return Err(ApiError::bad_request(format!("{}: {e}", prefix())));
    }
    let unknown: Vec<String> = duplicates
        .iter()
        .map(|p| format!("duplicate field \"{p}\""))
        .chain(
            w.found
                .unknown
                .iter()
                .map(|p| format!("unknown field \"{p}\"")),
        )
        .collect();
    match mode {
        Mode::Strict if !unknown.is_empty() => Err(ApiError::bad_request(format!(
            "{}: strict decoding error: {}",
            prefix(),
            unknown.join(", ")
        ))),
        Mode::Warn => Ok(unknown),
        _ => Ok(vec![]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(mut body: Value, mode: Mode) -> (Result<Vec<String>, String>, Value) {
        let av = body["apiVersion"].as_str().unwrap_or_default().to_string();
        let kind = body["kind"].as_str().unwrap_or_default().to_string();
        let r = admit(&av, &kind, &mut body, &[], mode).map_err(|e| {
            e.to_status()["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        });
        (r, body)
    }

    #[test]
    fn unknown_fields_are_refused_warned_or_dropped() {
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "colour": "x"},
                       "spec": {"foo": 1, "replicas": 1, "template": {"spec": {"containers": [{"name": "c", "imagee": "x"}]}}}});
        let (r, _) = check(d.clone(), Mode::Strict);
        assert_eq!(
            r,
            Err("Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: unknown field \"metadata.colour\", unknown field \"spec.foo\", unknown field \"spec.template.spec.containers[0].imagee\"".to_string())
        );
        let (r, stored) = check(d.clone(), Mode::Warn);
        assert_eq!(
            r,
            Ok(vec![
                "unknown field \"metadata.colour\"".to_string(),
                "unknown field \"spec.foo\"".to_string(),
                "unknown field \"spec.template.spec.containers[0].imagee\"".to_string()
            ])
        );
        assert!(stored["spec"].get("foo").is_none());
        assert_eq!(stored["spec"]["replicas"], 1);
        let (r, stored) = check(d, Mode::Ignore);
        assert_eq!(r, Ok(vec![]));
        assert!(stored["metadata"].get("colour").is_none());
        // Custom kinds are the CRD schema's business.
        let w =
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"anything": true}});
        assert_eq!(check(w, Mode::Strict).0, Ok(vec![]));
    }

    #[test]
    fn fields_of_inlined_go_structs_are_kept_and_checked() {
        // Probe embeds ProbeHandler and Volume embeds VolumeSource with `json:",inline"`.
        let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "x",
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1}}],
                "volumes": [{"name": "v", "emptyDir": {}}]}});
        let (r, stored) = check(p, Mode::Strict);
        assert_eq!(r, Ok(vec![]));
        let probe = &stored["spec"]["containers"][0]["readinessProbe"];
        assert_eq!(probe["httpGet"]["path"], "/ready");
        assert_eq!(stored["spec"]["volumes"][0]["emptyDir"], json!({}));
        let bad = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "livenessProbe": {"exec": {"comand": ["x"]}}}]}});
        let (r, _) = check(bad, Mode::Warn);
        assert_eq!(
            r,
            Ok(vec![
                "unknown field \"spec.containers[0].livenessProbe.exec.comand\"".to_string()
            ])
        );
        // The embedded struct's own name is no JSON field.
        let nested = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "livenessProbe": {"handler": {"exec": {}}}}],
                     "volumes": [{"name": "v", "volumeSource": {"emptyDir": {}}}]}});
        let (r, _) = check(nested, Mode::Warn);
        assert_eq!(
            r,
            Ok(vec![
                "unknown field \"spec.containers[0].livenessProbe.handler\"".to_string(),
                "unknown field \"spec.volumes[0].volumeSource\"".to_string()
            ])
        );
    }

    #[test]
    fn duplicate_fields_are_reported_by_path() {
        let raw = br#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},
            "spec":{"paused":false,"paused":true,"template":{"spec":{"containers":[{"name":"a","name":"b"}]}}}}"#;
        let Decoded {
            value: mut body,
            duplicates: dups,
        } = decode_json(raw).expect("json");
        assert_eq!(
            dups,
            ["spec.paused", "spec.template.spec.containers[0].name"]
        );
        // The last value wins, as in Go and serde_json.
        assert_eq!(body, serde_json::from_slice::<Value>(raw).expect("json"));
        assert_eq!(body["spec"]["paused"], true);
        let err =
            admit("apps/v1", "Deployment", &mut body, &dups, Mode::Strict).expect_err("strict");
        assert_eq!(
            err.to_status()["message"],
            "Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: duplicate field \"spec.paused\", duplicate field \"spec.template.spec.containers[0].name\""
        );
        assert!(decode_json(b"{not json").is_err());
        assert!(decode_json(b"{} trailing").is_err());
    }

    #[test]
    fn decoding_builds_the_tree_serde_json_builds() {
        let raw = br#"{"a":[1,-2,3.5,1e3,"s\u00e9",true,false,null,{}],"b":{"c":[[]]},"n":18446744073709551615}"#;
        let Decoded {
            value,
            duplicates: dups,
        } = decode_json(raw).expect("json");
        assert_eq!(value, serde_json::from_slice::<Value>(raw).expect("json"));
        assert!(dups.is_empty());
    }

    #[test]
    fn ill_typed_values_are_refused_in_go_words() {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": 1}});
        assert_eq!(
            check(cm, Mode::Ignore).0,
            Err("ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ConfigMap.data of type string".to_string())
        );
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"a": "no!"}});
        assert_eq!(
            check(secret, Mode::Strict).0,
            Err("Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data at input byte 2".to_string())
        );
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                         "spec": {"hostNetwork": "yes", "containers": []}});
        assert_eq!(
            check(pod, Mode::Strict).0,
            Err("Pod in version \"v1\" cannot be handled as a Pod: json: cannot unmarshal string into Go struct field PodSpec.spec.hostNetwork of type bool".to_string())
        );
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 1.5}});
        assert_eq!(
            check(d, Mode::Strict).0,
            Err("Deployment in version \"v1\" cannot be handled as a Deployment: json: cannot unmarshal number 1.5 into Go struct field DeploymentSpec.spec.replicas of type int32".to_string())
        );
        let svc = json!({"apiVersion": "v1", "kind": "Service", "spec": {"ports": {"port": 80}}});
        assert_eq!(
            check(svc, Mode::Strict).0,
            Err("Service in version \"v1\" cannot be handled as a Service: json: cannot unmarshal object into Go struct field ServiceSpec.spec.ports of type []v1.ServicePort".to_string())
        );
        // IntOrString and Quantity take either form; SMP directives are not fields.
        let ok = json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "c",
                        "resources": {"limits": {"cpu": 1, "memory": "1Gi"}},
                        "ports": [{"containerPort": 80}], "$patch": "replace"}]}});
        assert_eq!(check(ok, Mode::Strict).0, Ok(vec![]));
    }
}
