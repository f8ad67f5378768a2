//! Just enough Kubernetes protobuf decoding for the request bodies kubectl's typed clients send
//! (`kubectl create namespace|configmap|secret|serviceaccount`): the `k8s\0` + `runtime.Unknown`
//! envelope, `ObjectMeta`, and those kinds' simple fields. Everything else answers 415.

use serde_json::{Map, Value, json};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("protobuf: {0}")]
pub struct ProtoError(String);

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, ProtoError> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf
            .get(*pos)
            .ok_or_else(|| ProtoError("truncated varint".into()))?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(out);
        }
    }
    Err(ProtoError("varint too long".into()))
}

fn fields(buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, ProtoError> {
    let mut pos = 0;
    let mut out = vec![];
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let (num, wire) = (key >> 3, key & 7);
        let f = match wire {
            0 => Field::Varint(varint(buf, &mut pos)?),
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?)
                    .map_err(|_| ProtoError("length".into()))?;
                let end = pos
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or_else(|| ProtoError("truncated field".into()))?;
                let b = &buf[pos..end];
                pos = end;
                Field::Bytes(b)
            }
            1 => {
                pos += 8;
                Field::Varint(0)
            }
            5 => {
                pos += 4;
                Field::Varint(0)
            }
            w => return Err(ProtoError(format!("unsupported wire type {w}"))),
        };
        out.push((num, f));
    }
    Ok(out)
}

fn string(b: &[u8]) -> Result<String, ProtoError> {
    String::from_utf8(b.to_vec()).map_err(|_| ProtoError("invalid UTF-8".into()))
}

fn base64(b: &[u8]) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A `map<string, string|bytes>` entry.
fn map_entry(b: &[u8], bytes_value: bool) -> Result<(String, Value), ProtoError> {
    let (mut k, mut v) = (String::new(), json!(""));
    for (num, f) in fields(b)? {
        if let Field::Bytes(x) = f {
            match num {
                1 => k = string(x)?,
                2 => {
                    v = if bytes_value {
                        json!(base64(x))
                    } else {
                        json!(string(x)?)
                    }
                }
                _ => {}
            }
        }
    }
    Ok((k, v))
}

/// Go's protobuf writes empty strings; JSON clients omit them.
fn insert_non_empty(m: &mut Map<String, Value>, key: &str, value: String) {
    if !value.is_empty() {
        m.insert(key.into(), json!(value));
    }
}

fn object_meta(b: &[u8]) -> Result<Value, ProtoError> {
    let mut m = Map::new();
    let (mut labels, mut annotations, mut finalizers) = (Map::new(), Map::new(), vec![]);
    for (num, f) in fields(b)? {
        match (num, f) {
            (1, Field::Bytes(x)) => {
                insert_non_empty(&mut m, "name", string(x)?);
            }
            (2, Field::Bytes(x)) => {
                insert_non_empty(&mut m, "generateName", string(x)?);
            }
            (3, Field::Bytes(x)) => {
                insert_non_empty(&mut m, "namespace", string(x)?);
            }
            (6, Field::Bytes(x)) => {
                insert_non_empty(&mut m, "resourceVersion", string(x)?);
            }
            (11, Field::Bytes(x)) => {
                let (k, v) = map_entry(x, false)?;
                labels.insert(k, v);
            }
            (12, Field::Bytes(x)) => {
                let (k, v) = map_entry(x, false)?;
                annotations.insert(k, v);
            }
            (14, Field::Bytes(x)) => finalizers.push(json!(string(x)?)),
            _ => {}
        }
    }
    if !labels.is_empty() {
        m.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    Ok(Value::Object(m))
}

fn local_object_reference(b: &[u8]) -> Result<Value, ProtoError> {
    let mut name = String::new();
    for (num, f) in fields(b)? {
        if let (1, Field::Bytes(x)) = (num, f) {
            name = string(x)?;
        }
    }
    Ok(json!({"name": name}))
}

fn decode_kind(api_version: &str, kind: &str, raw: &[u8]) -> Result<Value, ProtoError> {
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind));
    let mut data = Map::new();
    let mut other = Map::new();
    let mut lists: Map<String, Value> = Map::new();
    for (num, f) in fields(raw)? {
        match (kind, num, f) {
            (_, 1, Field::Bytes(x)) => {
                obj.insert("metadata".into(), object_meta(x)?);
            }
            ("ConfigMap", 2, Field::Bytes(x)) => {
                let (k, v) = map_entry(x, false)?;
                data.insert(k, v);
            }
            ("ConfigMap", 3, Field::Bytes(x)) => {
                let (k, v) = map_entry(x, true)?;
                let bd = other.entry("binaryData").or_insert_with(|| json!({}));
                bd[k] = v;
            }
            ("ConfigMap", 4, Field::Varint(v)) | ("Secret", 5, Field::Varint(v)) => {
                other.insert("immutable".into(), json!(v != 0));
            }
            ("Secret", 2, Field::Bytes(x)) => {
                let (k, v) = map_entry(x, true)?;
                data.insert(k, v);
            }
            ("Secret", 3, Field::Bytes(x)) => insert_non_empty(&mut other, "type", string(x)?),
            ("Secret", 4, Field::Bytes(x)) => {
                let (k, v) = map_entry(x, false)?;
                let sd = other.entry("stringData").or_insert_with(|| json!({}));
                sd[k] = v;
            }
            ("ServiceAccount", 3, Field::Bytes(x)) => {
                let list = lists.entry("imagePullSecrets").or_insert_with(|| json!([]));
                if let Some(a) = list.as_array_mut() {
                    a.push(local_object_reference(x)?);
                }
            }
            ("ServiceAccount", 4, Field::Varint(v)) => {
                other.insert("automountServiceAccountToken".into(), json!(v != 0));
            }
            ("Namespace", 2, Field::Bytes(x)) => {
                let mut fins = vec![];
                for (n, f) in fields(x)? {
                    if let (1, Field::Bytes(s)) = (n, f) {
                        fins.push(json!(string(s)?));
                    }
                }
                if !fins.is_empty() {
                    other.insert("spec".into(), json!({"finalizers": fins}));
                }
            }
            _ => {}
        }
    }
    if !data.is_empty() {
        obj.insert("data".into(), Value::Object(data));
    }
    obj.extend(other);
    obj.extend(lists);
    Ok(Value::Object(obj))
}

/// Decodes a `application/vnd.kubernetes.protobuf` body of a supported kind into JSON.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let rest = body
        .strip_prefix(b"k8s\0")
        .ok_or_else(|| ProtoError("missing k8s envelope".into()))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (num, f) in fields(rest)? {
        match (num, f) {
            (1, Field::Bytes(tm)) => {
                for (n, f) in fields(tm)? {
                    match (n, f) {
                        (1, Field::Bytes(x)) => api_version = string(x)?,
                        (2, Field::Bytes(x)) => kind = string(x)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(x)) => raw = x,
            _ => {}
        }
    }
    match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace" | "ConfigMap" | "Secret" | "ServiceAccount") => {
            decode_kind(&api_version, &kind, raw)
        }
        _ => Err(ProtoError(format!(
            "{api_version}, Kind={kind} is not supported in protobuf"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ld(num: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![(num << 3) | 2, payload.len() as u8];
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_a_configmap_envelope() {
        let meta = [
            ld(1, b"settings"),
            ld(3, b"default"),
            ld(11, &[ld(1, b"app"), ld(2, b"web")].concat()),
        ]
        .concat();
        let cm = [ld(1, &meta), ld(2, &[ld(1, b"a"), ld(2, b"1")].concat())].concat();
        let type_meta = [ld(1, b"v1"), ld(2, b"ConfigMap")].concat();
        let body = [b"k8s\0".to_vec(), ld(1, &type_meta), ld(2, &cm)].concat();
        let v = decode(&body).expect("decodes");
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "settings", "namespace": "default", "labels": {"app": "web"}},
                   "data": {"a": "1"}})
        );
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        assert!(decode(b"not protobuf").is_err());
    }
}
