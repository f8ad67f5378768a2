//! One stored object: its JSON in one shared allocation, decoded only where a request needs the
//! tree, and the few fields the store's indexes read from it without decoding the rest.

use bytes::Bytes;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The largest encoding buffer a thread keeps between objects.
const MAX_KEPT_BUFFER: usize = 64 * 1024;

/// One object as the store holds it: its JSON, serialized once and shared by the object map,
/// the event history, lists and watch streams. One allocation (the count and the bytes), two
/// words where it is held.
#[derive(Debug, Clone)]
pub struct Stored(Arc<[u8]>);

impl Stored {
    pub fn encode(obj: &Value) -> Self {
        // Serialized into a buffer this thread keeps, then copied once into the shared
        // allocation: a fresh `Vec` would grow (and copy) several times on the way to an
        // object's size.
        thread_local! {
            static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        BUFFER.with_borrow_mut(|buffer| {
            buffer.clear();
            if serde_json::to_writer(&mut *buffer, obj).is_err() {
                buffer.clear();
            }
            let stored = Self(Arc::from(buffer.as_slice()));
            // One huge object does not pin its size in every thread for good.
            if buffer.capacity() > MAX_KEPT_BUFFER {
                *buffer = Vec::new();
            }
            stored
        })
    }

    pub fn json(&self) -> &[u8] {
        &self.0
    }

    /// Whether both hold the very same JSON allocation (one write's bytes), not merely equal
    /// bytes.
    pub fn same_allocation(&self, other: &Stored) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The JSON as `Bytes` sharing this allocation (no copy).
    pub fn to_bytes(&self) -> Bytes {
        Bytes::from_owner(self.clone())
    }

    /// The object as a tree. The bytes were written by `encode`, so they decode.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.0).unwrap_or_default()
    }

    /// `apiVersion` without decoding when it is the first key (as serde_json writes a Map in
    /// key order, it is for every kind whose top-level keys all sort after it); else decodes.
    pub fn api_version(&self) -> Option<String> {
        const LEAD: &[u8] = b"{\"apiVersion\":\"";
        if let Some(rest) = self.0.strip_prefix(LEAD)
            && let Some(end) = rest.iter().position(|b| *b == b'"' || *b == b'\\')
            && rest[end] == b'"'
        {
            return std::str::from_utf8(&rest[..end]).ok().map(String::from);
        }
        self.value()["apiVersion"].as_str().map(String::from)
    }

    /// Whether `metadata.deletionTimestamp` is set, read without building the tree (every create
    /// asks it of its namespace, whose managedFields would dominate a full decode).
    pub fn is_terminating(&self) -> bool {
        #[derive(serde::Deserialize)]
        struct Doc {
            #[serde(default)]
            metadata: Meta,
        }
        #[derive(Default, serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            #[serde(default)]
            deletion_timestamp: Option<serde::de::IgnoredAny>,
        }
        serde_json::from_slice::<Doc>(&self.0)
            .is_ok_and(|d| d.metadata.deletion_timestamp.is_some())
    }

    /// `metadata.labels`, decoded without building the rest of the tree: a label selector reads
    /// nothing else, and lists and watch fan-outs apply one to every object (a NodeSLO's spec is
    /// most of its bytes).
    pub fn labels(&self) -> BTreeMap<String, String> {
        #[derive(serde::Deserialize)]
        struct Doc {
            #[serde(default)]
            metadata: Meta,
        }
        #[derive(Default, serde::Deserialize)]
        struct Meta {
            #[serde(default)]
            labels: Option<BTreeMap<String, String>>,
        }
        serde_json::from_slice::<Doc>(&self.0)
            .ok()
            .and_then(|d| d.metadata.labels)
            .unwrap_or_default()
    }

    /// The uid and owner uids, decoded without building the tree (the indexes need only these).
    pub(super) fn identity(&self) -> Identity {
        serde_json::from_slice::<IdentityDoc>(&self.0)
            .map(|d| d.metadata)
            .unwrap_or_default()
    }
}

impl AsRef<[u8]> for Stored {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// The part of an object the uid and owner indexes read.
#[derive(Debug, Default, serde::Deserialize)]
struct IdentityDoc {
    #[serde(default)]
    metadata: Identity,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Identity {
    #[serde(default)]
    pub(super) uid: Option<String>,
    #[serde(default)]
    owner_references: Vec<OwnerUid>,
}

#[derive(Debug, serde::Deserialize)]
struct OwnerUid {
    #[serde(default)]
    uid: Option<String>,
}

impl Identity {
    pub(super) fn of(obj: &Value) -> Self {
        let m = &obj["metadata"];
        Self {
            uid: m["uid"].as_str().map(String::from),
            owner_references: m["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| OwnerUid {
                    uid: r["uid"].as_str().map(String::from),
                })
                .collect(),
        }
    }

    pub(super) fn owners(&self) -> impl Iterator<Item = &str> {
        self.owner_references
            .iter()
            .filter_map(|r| r.uid.as_deref())
    }
}
