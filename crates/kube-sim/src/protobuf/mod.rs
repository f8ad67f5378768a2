//! Kubernetes' protobuf serialization (`application/vnd.kubernetes.protobuf`) for every built-in
//! kind, both directions: the `k8s\0` magic + `runtime.Unknown` envelope around a message, and the
//! length-prefixed watch frames. Messages are mapped to and from the JSON the store keeps by a
//! field table generated from Kubernetes' own `.proto` definitions (see `proto/gen_schema.py`),
//! so no kind needs hand-written code; custom resources have no protobuf form (415, as upstream).

pub(crate) mod json;
pub mod openapi;
pub mod schema;
mod wire;

use serde_json::{Value, json};

pub use schema::schema;

/// The media type kube-apiserver names protobuf by.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
const MAGIC: &[u8] = b"k8s\0";
const WATCH_EVENT: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.WatchEvent";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtoError {
    #[error("protobuf: truncated message")]
    Truncated,
    #[error("protobuf: {0}")]
    Malformed(String),
    #[error("provided protobuf data does not carry the {MEDIA_TYPE} magic prefix")]
    NoMagic,
    /// A kind without a protobuf message (custom resources).
    #[error("{0} is not a protobuf message")]
    NotProtobuf(String),
}

impl ProtoError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Truncated => "truncated",
            Self::Malformed(_) => "malformed",
            Self::NoMagic => "no_magic",
            Self::NotProtobuf(_) => "not_protobuf",
        }
    }
}

/// Whether a kind has a protobuf form (built-in) or not (custom resources).
pub fn has_message(api_version: &str, kind: &str) -> bool {
    schema().message_of(api_version, kind).is_some()
}

/// Decodes a request body: the magic, the `runtime.Unknown` envelope and the message it names.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let rest = body.strip_prefix(MAGIC).ok_or(ProtoError::NoMagic)?;
    let s = schema();
    let unknown = json::decode_message(s, "k8s.io.apimachinery.pkg.runtime.Unknown", rest, 0)?;
    let api_version = unknown["typeMeta"]["apiVersion"]
        .as_str()
        .unwrap_or_default();
    let kind = unknown["typeMeta"]["kind"].as_str().unwrap_or_default();
    let raw = wire::fields(rest)?
        .into_iter()
        .find_map(|(n, r)| match (n, r) {
            (2, wire::Raw::Bytes(b)) => Some(b),
            _ => None,
        })
        .unwrap_or_default();
    let message = s
        .message_of(api_version, kind)
        .ok_or_else(|| ProtoError::NotProtobuf(format!("{api_version}, Kind={kind}")))?;
    let mut obj = json::decode_message(s, message, raw, 0)?;
    if let Value::Object(m) = &mut obj {
        let mut typed = serde_json::Map::new();
        typed.insert("apiVersion".into(), json!(api_version));
        typed.insert("kind".into(), json!(kind));
        typed.extend(std::mem::take(m));
        *m = typed;
    }
    Ok(obj)
}

/// The body client-go sends: magic, then a `runtime.Unknown` naming apiVersion/kind around `raw`.
pub fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = vec![];
    wire::put_bytes(&mut type_meta, 1, api_version.as_bytes());
    wire::put_bytes(&mut type_meta, 2, kind.as_bytes());
    let mut out = MAGIC.to_vec();
    wire::put_bytes(&mut out, 1, &type_meta);
    wire::put_bytes(&mut out, 2, raw);
    // contentEncoding and contentType are written empty, as Go's marshaller does.
    wire::put_bytes(&mut out, 3, b"");
    wire::put_bytes(&mut out, 4, b"");
    out
}

/// Encodes an object, list or Status as a protobuf response body.
pub fn encode(obj: &Value) -> Result<Vec<u8>, ProtoError> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    let s = schema();
    let message = s
        .message_of(api_version, kind)
        .ok_or_else(|| ProtoError::NotProtobuf(format!("{api_version}, Kind={kind}")))?;
    let raw = json::encode_message(s, message, obj, 0)
        .ok_or_else(|| ProtoError::Malformed(format!("{kind} is not an object")))?;
    Ok(envelope(api_version, kind, &raw))
}

/// One watch event as client-go's protobuf watch decoder reads it: a 4-byte big-endian length,
/// then a bare `WatchEvent` whose object is the enveloped object.
pub fn encode_watch_frame(event_type: &str, obj: &Value) -> Result<Vec<u8>, ProtoError> {
    let object = encode(obj)?;
    let mut raw_ext = vec![];
    wire::put_bytes(&mut raw_ext, 1, &object);
    let mut event = vec![];
    wire::put_bytes(&mut event, 1, event_type.as_bytes());
    wire::put_bytes(&mut event, 2, &raw_ext);
    debug_assert!(schema().message(WATCH_EVENT).is_some());
    let len =
        u32::try_from(event.len()).map_err(|_| ProtoError::Malformed("event too large".into()))?;
    let mut out = len.to_be_bytes().to_vec();
    out.extend(event);
    Ok(out)
}

/// Whether a client's `Accept` asks for protobuf first (client-go sends
/// `application/vnd.kubernetes.protobuf, */*` and takes JSON for kinds without a message).
pub fn wants_protobuf(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .map(|first| first.trim().split(';').next().unwrap_or("").trim())
        == Some(MEDIA_TYPE)
        && !accept.contains("as=")
}

#[cfg(test)]
mod tests;
