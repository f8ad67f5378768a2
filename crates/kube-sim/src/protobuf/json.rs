//! Kubernetes protobuf messages <-> their JSON form, driven by the field table. Generic fields map
//! by their JSON names; the apimachinery types with a custom JSON form (Time, MicroTime, Duration,
//! IntOrString, Quantity, RawExtension, FieldsV1, the apiextensions schema unions) are mapped here
//! as their Go `MarshalJSON` writes them.

use serde_json::{Map, Number, Value};

use super::ProtoError;
use super::schema::{Field, Label, Schema, Ty};
use super::wire::{self, Raw};
use crate::util;

const META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.";
const APIEXT_V1: &str = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.";

/// Fields that are Go pointers where zero or false differs from unset. Go's protobuf writes every
/// non-pointer field, zero or not, and kube-apiserver's JSON then omits the `omitempty` zeros;
/// the wire does not say which is which, so zeros and falses are dropped except for these.
const MEANINGFUL_ZERO: &[&str] = &[
    "activeDeadlineSeconds",
    "allocateLoadBalancerNodePorts",
    "allowPrivilegeEscalation",
    "allowVolumeExpansion",
    "attachRequired",
    "automountServiceAccountToken",
    "averageUtilization",
    "backoffLimit",
    "backoffLimitPerIndex",
    "completions",
    "defaultMode",
    "deletionGracePeriodSeconds",
    "enableServiceLinks",
    "expirationSeconds",
    "failedJobsHistoryLimit",
    "force",
    "fsGroup",
    "gracePeriodSeconds",
    "hostUsers",
    "immutable",
    "manualSelector",
    "maxFailedIndexes",
    "minReplicas",
    "mode",
    "optional",
    "orphanDependents",
    "parallelism",
    "partition",
    "podInfoOnMount",
    "privileged",
    "progressDeadlineSeconds",
    "readOnlyRootFilesystem",
    "ready",
    "replicas",
    "requiresRepublish",
    "revisionHistoryLimit",
    "runAsGroup",
    "runAsNonRoot",
    "runAsUser",
    "serving",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "startingDeadlineSeconds",
    "storageCapacity",
    "successfulJobsHistoryLimit",
    "suspend",
    "terminating",
    "terminationGracePeriodSeconds",
    "ttlSecondsAfterFinished",
    "value",
];

fn omitted(field: &Field, v: &Value) -> bool {
    let zero = match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    };
    zero && !(matches!(v, Value::Bool(_) | Value::Number(_))
        && MEANINGFUL_ZERO.contains(&field.json.as_str()))
}

/// Depth bound: a hostile body must not recurse without end.
const MAX_DEPTH: usize = 64;

pub(crate) fn special(name: &str) -> Option<&str> {
    match name {
        "k8s.io.apimachinery.pkg.util.intstr.IntOrString" => return Some("IntOrString"),
        "k8s.io.apimachinery.pkg.api.resource.Quantity" => return Some("Quantity"),
        "k8s.io.apimachinery.pkg.runtime.RawExtension" => return Some("RawExtension"),
        _ => {}
    }
    if let Some(s) = name.strip_prefix(META) {
        return matches!(s, "Time" | "MicroTime" | "Duration" | "FieldsV1").then_some(s);
    }
    let short = name.strip_prefix(APIEXT_V1).or_else(|| {
        name.strip_prefix("k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1beta1.")
    })?;
    matches!(
        short,
        "Json"
            | "JsonSchemaPropsOrArray"
            | "JsonSchemaPropsOrBool"
            | "JsonSchemaPropsOrStringArray"
    )
    .then_some(short)
}

fn raw_json(b: &[u8]) -> Value {
    if b.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(b).unwrap_or_else(|_| Value::String(util::base64(b)))
}

/// Go's `time.Duration.String()`.
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    if n < 1_000_000_000 {
        let (unit, div) = match n {
            0..1_000 => ("ns", 1),
            1_000..1_000_000 => ("µs", 1_000),
            _ => ("ms", 1_000_000),
        };
        return format!("{sign}{}{unit}", trim_frac(n, div));
    }
    let (h, rem) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (m, rem) = (rem / 60_000_000_000, rem % 60_000_000_000);
    let s = trim_frac(rem, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{sign}{s}s"),
        (0, m) => format!("{sign}{m}m{s}s"),
        (h, m) => format!("{sign}{h}h{m}m{s}s"),
    }
}

fn trim_frac(n: u64, div: u64) -> String {
    let (whole, frac) = (n / div, n % div);
    if frac == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let f = format!("{frac:0width$}");
    format!("{whole}.{}", f.trim_end_matches('0'))
}

fn parse_go_duration(s: &str) -> Option<i64> {
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += n * mult;
    }
    Some(if neg { -total } else { total } as i64)
}

fn decode_special(
    kind: &str,
    buf: &[u8],
    schema: &Schema,
    depth: usize,
) -> Result<Value, ProtoError> {
    let mut ints = [0i64; 4];
    let mut strs: [Option<String>; 4] = [None, None, None, None];
    let mut bytes: Vec<u8> = vec![];
    let mut present = false;
    let mut items = vec![];
    let mut schema_value = None;
    for (num, raw) in wire::fields(buf)? {
        present = true;
        let idx = num as usize;
        match raw {
            Raw::Varint(v) if idx < 4 => ints[idx] = v as i64,
            Raw::Bytes(b) => match (kind, num) {
                ("RawExtension" | "FieldsV1" | "Json", 1) => bytes = b.to_vec(),
                (
                    "JsonSchemaPropsOrArray"
                    | "JsonSchemaPropsOrBool"
                    | "JsonSchemaPropsOrStringArray",
                    1,
                )
                | ("JsonSchemaPropsOrBool", 2) => {
                    let props = format!("{APIEXT_V1}JsonSchemaProps");
                    schema_value = Some(decode_message(schema, &props, b, depth + 1)?);
                }
                ("JsonSchemaPropsOrArray", 2) => items.push(decode_message(
                    schema,
                    &format!("{APIEXT_V1}JsonSchemaProps"),
                    b,
                    depth + 1,
                )?),
                ("JsonSchemaPropsOrStringArray", 2) => items.push(Value::String(utf8(b)?)),
                (_, n) if n < 4 => strs[n as usize] = Some(utf8(b)?),
                _ => {}
            },
            _ => {}
        }
    }
    Ok(match kind {
        "Time" | "MicroTime" if !present => Value::Null,
        "Time" => Value::String(util::rfc3339(ints[1])),
        "MicroTime" => Value::String(format!(
            "{}.{:06}Z",
            util::rfc3339(ints[1]).trim_end_matches('Z'),
            ints[2] / 1000
        )),
        "Duration" => Value::String(go_duration(ints[1])),
        "IntOrString" if ints[1] == 1 => Value::String(strs[3].take().unwrap_or_default()),
        "IntOrString" => Value::Number(ints[2].into()),
        "Quantity" => Value::String(strs[1].take().unwrap_or_default()),
        "RawExtension" | "FieldsV1" | "Json" => raw_json(&bytes),
        "JsonSchemaPropsOrBool" => schema_value.unwrap_or(Value::Bool(ints[1] != 0)),
        _ => schema_value.unwrap_or(Value::Array(items)),
    })
}

fn utf8(b: &[u8]) -> Result<String, ProtoError> {
    String::from_utf8(b.to_vec())
        .map_err(|_| ProtoError::Malformed("invalid UTF-8 in a string".into()))
}

fn scalar(field: &Field, raw: Raw<'_>) -> Result<Value, ProtoError> {
    let mismatch =
        || ProtoError::Malformed(format!("field {} has the wrong wire type", field.json));
    Ok(match (&field.ty, raw) {
        (Ty::String, Raw::Bytes(b)) => Value::String(utf8(b)?),
        (Ty::Bytes, Raw::Bytes(b)) => Value::String(util::base64(b)),
        (Ty::Bool, Raw::Varint(v)) => Value::Bool(v != 0),
        (Ty::Int32, Raw::Varint(v)) => Value::Number(i64::from(v as i32).into()),
        (Ty::Int64, Raw::Varint(v)) => Value::Number((v as i64).into()),
        (Ty::Double, Raw::Fixed64(v)) => Number::from_f64(f64::from_bits(v))
            .map(Value::Number)
            .unwrap_or(Value::Null),
        _ => return Err(mismatch()),
    })
}

fn value(schema: &Schema, field: &Field, raw: Raw<'_>, depth: usize) -> Result<Value, ProtoError> {
    match (&field.ty, raw) {
        (Ty::Message(name), Raw::Bytes(b)) => decode_message(schema, name, b, depth + 1),
        (Ty::Message(_), _) => Err(ProtoError::Malformed(format!(
            "field {} has the wrong wire type",
            field.json
        ))),
        (_, raw) => scalar(field, raw),
    }
}

/// Decodes one message into its JSON form. Empty strings and (see `MEANINGFUL_ZERO`) zeros are
/// dropped, as Go's `omitempty` does when kube-apiserver re-encodes what it decoded.
pub fn decode_message(
    schema: &Schema,
    name: &str,
    buf: &[u8],
    depth: usize,
) -> Result<Value, ProtoError> {
    if depth > MAX_DEPTH {
        return Err(ProtoError::Malformed("nesting too deep".into()));
    }
    if let Some(kind) = special(name) {
        return decode_special(kind, buf, schema, depth);
    }
    let msg = schema
        .message(name)
        .ok_or_else(|| ProtoError::Malformed(format!("unknown message {name}")))?;
    let mut out = Map::new();
    for (num, raw) in wire::fields(buf)? {
        let Some(field) = msg.by_tag(num) else {
            continue;
        };
        match field.label {
            Label::Optional => {
                let v = value(schema, field, raw, depth)?;
                if field.inlined().is_some() {
                    // Go embeds it: its fields are the outer object's.
                    if let Value::Object(inner) = v {
                        out.extend(inner);
                    }
                    continue;
                }
                if !omitted(field, &v) {
                    out.insert(field.json.clone(), v);
                }
            }
            Label::Repeated => {
                let entry = out
                    .entry(field.json.clone())
                    .or_insert_with(|| Value::Array(vec![]));
                let Value::Array(list) = entry else { continue };
                match (&field.ty, raw) {
                    // Packed numbers.
                    (Ty::Int32 | Ty::Int64, Raw::Bytes(b)) => {
                        let mut pos = 0;
                        while pos < b.len() {
                            let v = wire::varint(b, &mut pos)?;
                            list.push(scalar(field, Raw::Varint(v))?);
                        }
                    }
                    (_, raw) => list.push(value(schema, field, raw, depth)?),
                }
            }
            Label::Map => {
                let Raw::Bytes(entry_buf) = raw else {
                    return Err(ProtoError::Malformed(format!(
                        "map {} is not a message",
                        field.json
                    )));
                };
                let (mut key, mut val) = (String::new(), None);
                for (n, r) in wire::fields(entry_buf)? {
                    match (n, r) {
                        (1, Raw::Bytes(k)) => key = utf8(k)?,
                        (2, r) => val = Some(value(schema, field, r, depth)?),
                        _ => {}
                    }
                }
                let val = val.unwrap_or_else(|| match field.ty {
                    Ty::Message(_) => Value::Object(Map::new()),
                    _ => Value::String(String::new()),
                });
                if let Value::Object(m) = out
                    .entry(field.json.clone())
                    .or_insert_with(|| Value::Object(Map::new()))
                {
                    m.insert(key, val);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

fn encode_special(kind: &str, v: &Value, schema: &Schema, depth: usize) -> Option<Vec<u8>> {
    let mut out = vec![];
    match (kind, v) {
        ("Time" | "MicroTime", Value::String(s)) => {
            let secs = util::parse_rfc3339(s)?;
            wire::put_uvarint_field(&mut out, 1, secs as u64);
            let nanos = s
                .split_once('.')
                .map(|(_, f)| f.trim_end_matches(|c: char| !c.is_ascii_digit()))
                .map(|f| {
                    format!("{f:0<9}")
                        .get(..9)
                        .and_then(|x| x.parse::<u64>().ok())
                        .unwrap_or(0)
                })
                .unwrap_or(0);
            if nanos > 0 {
                wire::put_uvarint_field(&mut out, 2, nanos);
            }
        }
        ("Duration", Value::String(s)) => {
            wire::put_uvarint_field(&mut out, 1, parse_go_duration(s)? as u64);
        }
        ("IntOrString", Value::Number(n)) => {
            wire::put_uvarint_field(&mut out, 1, 0);
            wire::put_uvarint_field(&mut out, 2, n.as_i64()? as i32 as i64 as u64);
        }
        ("IntOrString", Value::String(s)) => {
            wire::put_uvarint_field(&mut out, 1, 1);
            wire::put_bytes(&mut out, 3, s.as_bytes());
        }
        ("Quantity", Value::String(s)) => wire::put_bytes(&mut out, 1, s.as_bytes()),
        ("Quantity", Value::Number(n)) => wire::put_bytes(&mut out, 1, n.to_string().as_bytes()),
        ("RawExtension" | "FieldsV1" | "Json", v) => {
            wire::put_bytes(&mut out, 1, &serde_json::to_vec(v).ok()?);
        }
        ("JsonSchemaPropsOrBool", Value::Bool(b)) => {
            wire::put_uvarint_field(&mut out, 1, u64::from(*b))
        }
        ("JsonSchemaPropsOrStringArray", Value::Array(items)) => {
            for s in items.iter().filter_map(Value::as_str) {
                wire::put_bytes(&mut out, 2, s.as_bytes());
            }
        }
        ("JsonSchemaPropsOrArray", Value::Array(items)) => {
            for item in items {
                let b = encode_message(
                    schema,
                    &format!("{APIEXT_V1}JsonSchemaProps"),
                    item,
                    depth + 1,
                )?;
                wire::put_bytes(&mut out, 2, &b);
            }
        }
        (_, Value::Object(_)) => {
            let b = encode_message(schema, &format!("{APIEXT_V1}JsonSchemaProps"), v, depth + 1)?;
            let tag = if kind == "JsonSchemaPropsOrBool" {
                2
            } else {
                1
            };
            if kind == "JsonSchemaPropsOrBool" {
                wire::put_uvarint_field(&mut out, 1, 1);
            }
            wire::put_bytes(&mut out, tag, &b);
        }
        _ => return None,
    }
    Some(out)
}

fn encode_value(
    schema: &Schema,
    field: &Field,
    tag: u32,
    v: &Value,
    out: &mut Vec<u8>,
    depth: usize,
) {
    match (&field.ty, v) {
        (Ty::String, Value::String(s)) => wire::put_bytes(out, tag, s.as_bytes()),
        (Ty::Bytes, Value::String(s)) => {
            wire::put_bytes(out, tag, &util::base64_decode(s).unwrap_or_default());
        }
        (Ty::Bool, Value::Bool(b)) => wire::put_uvarint_field(out, tag, u64::from(*b)),
        (Ty::Int32 | Ty::Int64, Value::Number(n)) => {
            if let Some(i) = n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)) {
                wire::put_uvarint_field(out, tag, i as u64);
            }
        }
        (Ty::Double, Value::Number(n)) => {
            if let Some(f) = n.as_f64() {
                wire::put_double(out, tag, f);
            }
        }
        (Ty::Message(name), v) => {
            if let Some(b) = encode_message(schema, name, v, depth + 1) {
                wire::put_bytes(out, tag, &b);
            }
        }
        _ => {}
    }
}

/// Encodes a JSON value as the named message; values of the wrong JSON type are left out
/// (stored objects were validated when written).
pub fn encode_message(schema: &Schema, name: &str, v: &Value, depth: usize) -> Option<Vec<u8>> {
    if depth > MAX_DEPTH {
        return None;
    }
    if let Some(kind) = special(name) {
        return encode_special(kind, v, schema, depth);
    }
    let msg = schema.message(name)?;
    let obj = v.as_object()?;
    let mut out = vec![];
    for field in &msg.fields {
        if let Some(inner) = field.inlined() {
            // A Go-embedded struct: its fields are read from this same object.
            if let Some(bytes) = encode_message(schema, inner, v, depth + 1) {
                wire::put_bytes(&mut out, field.tag, &bytes);
            }
            continue;
        }
        let Some(fv) = obj.get(&field.json).filter(|x| !x.is_null()) else {
            continue;
        };
        match (field.label, fv) {
            (Label::Optional, fv) => encode_value(schema, field, field.tag, fv, &mut out, depth),
            (Label::Repeated, Value::Array(items)) => {
                for item in items {
                    encode_value(schema, field, field.tag, item, &mut out, depth);
                }
            }
            (Label::Map, Value::Object(m)) => {
                for (k, item) in m {
                    let mut entry = vec![];
                    wire::put_bytes(&mut entry, 1, k.as_bytes());
                    encode_value(schema, field, 2, item, &mut entry, depth);
                    wire::put_bytes(&mut out, field.tag, &entry);
                }
            }
            _ => {}
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_go_writes_them() {
        assert_eq!(go_duration(90_000_000_000), "1m30s");
        assert_eq!(go_duration(3_600_000_000_000), "1h0m0s");
        assert_eq!(go_duration(1_500_000_000), "1.5s");
        assert_eq!(go_duration(2_000_000), "2ms");
        assert_eq!(parse_go_duration("1m30s"), Some(90_000_000_000));
        assert_eq!(parse_go_duration("1h0m0s"), Some(3_600_000_000_000));
        assert_eq!(parse_go_duration("bogus"), None);
    }
}
