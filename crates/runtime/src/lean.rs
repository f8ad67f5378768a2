//! Decoding watched objects without their `metadata.managedFields`.
//!
//! The API server sends every object with its managedFields: per writer, a `FieldsV1` tree of the
//! fields it owns. k8s-openapi decodes each tree into a `serde_json::Value` (a map per level) that
//! no controller decision reads, for every object of every list and watch event. [`Lean`] decodes
//! a kind through [`Pruned`], a deserializer that skips that one path: the bytes are scanned
//! ([`IgnoredAny`]) but nothing is built.
//!
//! [`Pruned`] wraps any serde deserializer and passes every call through, except that maps it
//! reaches along its path drop the last key of the path; every other key and value decodes as it
//! would without it.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::DynamicResourceScope;
use kube::runtime::watcher;
use serde::Deserialize;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, Visitor,
};

/// The path from an object's root that [`Lean`] leaves out.
const MANAGED_FIELDS: &[&str] = &["metadata", "managedFields"];

/// `K`, decoded without `metadata.managedFields` (left `None`). A resource like `K` (same kind,
/// group, version, plural), so an `Api<Lean<K>>` lists and watches what an `Api<K>` does.
#[derive(Clone, Debug)]
pub struct Lean<K>(pub K);

impl<'de, K: Deserialize<'de>> Deserialize<'de> for Lean<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(Pruned::new(deserializer, MANAGED_FIELDS)).map(Lean)
    }
}

impl<K: kube::Resource<DynamicType = ()>> kube::Resource for Lean<K> {
    type DynamicType = ();
    // Dynamic, so one `Api` constructor serves namespaced and cluster-scoped kinds alike.
    type Scope = DynamicResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

/// An `Api` over the same URL as `api` (its namespace, or all), decoding [`Lean`] objects.
pub fn lean_api<K: kube::Resource<DynamicType = ()>>(api: kube::Api<K>) -> kube::Api<Lean<K>> {
    let namespace = api.namespace().map(str::to_owned);
    let client = api.into_client();
    match namespace {
        Some(ns) => kube::Api::namespaced_with(client, &ns, &()),
        None => kube::Api::all_with(client, &()),
    }
}

/// The event of `K` that a watch event of `Lean<K>` stands for.
pub fn unwrap_event<K>(event: watcher::Event<Lean<K>>) -> watcher::Event<K> {
    match event {
        watcher::Event::Apply(Lean(obj)) => watcher::Event::Apply(obj),
        watcher::Event::Delete(Lean(obj)) => watcher::Event::Delete(obj),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(Lean(obj)) => watcher::Event::InitApply(obj),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Writes whose answer is decoded as the watches decode objects, without
/// `metadata.managedFields`: the server answers a patch or a delete with the whole object, and no
/// decision reads its managedFields, while what a write returns stands in for the cached object
/// (`own_writes`), which the watches cache without them too.
pub struct LeanApi<K>(kube::Api<Lean<K>>);

impl<K> LeanApi<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + fmt::Debug + serde::de::DeserializeOwned,
{
    pub fn new(api: kube::Api<K>) -> Self {
        Self(lean_api(api))
    }

    /// `Api::patch`.
    pub async fn patch<P: serde::Serialize + fmt::Debug>(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> kube::Result<K> {
        self.0.patch(name, params, patch).await.map(|Lean(k)| k)
    }

    /// `Api::patch_status`.
    pub async fn patch_status<P: serde::Serialize + fmt::Debug>(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> kube::Result<K> {
        self.0
            .patch_status(name, params, patch)
            .await
            .map(|Lean(k)| k)
    }

    /// `Api::delete`, the answer (the object being deleted, or a Status) dropped.
    pub async fn delete(&self, name: &str, params: &DeleteParams) -> kube::Result<()> {
        self.0.delete(name, params).await.map(drop)
    }
}

/// A deserializer like `inner`, except that the value at `path` (keys from here, at least one)
/// is skipped.
pub struct Pruned<D> {
    inner: D,
    path: &'static [&'static str],
}

impl<D> Pruned<D> {
    pub fn new(inner: D, path: &'static [&'static str]) -> Self {
        debug_assert!(!path.is_empty(), "a pruned path names at least one key");
        Self { inner, path }
    }
}

/// The calls that cannot reach a map: passed straight to the inner deserializer.
macro_rules! forward_to_inner {
    ($($method:ident ( $($arg:ident : $ty:ty),* )),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                self.inner.$method($($arg,)* visitor)
            }
        )*
    };
}

/// The calls that may reach a map (or a value holding one): the visitor is wrapped.
macro_rules! forward_pruning {
    ($($method:ident ( $($arg:ident : $ty:ty),* )),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                self.inner.$method($($arg,)* PruneVisitor { inner: visitor, path: self.path })
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Pruned<D> {
    type Error = D::Error;

    forward_pruning! {
        deserialize_any(),
        deserialize_option(),
        deserialize_map(),
        deserialize_newtype_struct(name: &'static str),
        deserialize_struct(name: &'static str, fields: &'static [&'static str]),
    }

    forward_to_inner! {
        deserialize_bool(), deserialize_i8(), deserialize_i16(), deserialize_i32(),
        deserialize_i64(), deserialize_i128(), deserialize_u8(), deserialize_u16(),
        deserialize_u32(), deserialize_u64(), deserialize_u128(), deserialize_f32(),
        deserialize_f64(), deserialize_char(), deserialize_str(), deserialize_string(),
        deserialize_bytes(), deserialize_byte_buf(), deserialize_unit(),
        deserialize_unit_struct(name: &'static str), deserialize_seq(),
        deserialize_tuple(len: usize),
        deserialize_tuple_struct(name: &'static str, len: usize),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
        deserialize_identifier(), deserialize_ignored_any(),
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// `inner`, with any map it is given pruned and any `Some` or newtype it is given still pruning.
struct PruneVisitor<V> {
    inner: V,
    path: &'static [&'static str],
}

macro_rules! forward_visit {
    ($($method:ident ( $ty:ty )),* $(,)?) => {
        $(
            fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
                self.inner.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for PruneVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(PrunedMap {
            inner: map,
            path: self.path,
            descend: false,
        })
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(Pruned::new(d, self.path))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.inner.visit_newtype_struct(Pruned::new(d, self.path))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(seq)
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.inner.visit_enum(data)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }

    forward_visit! {
        visit_bool(bool), visit_i8(i8), visit_i16(i16), visit_i32(i32), visit_i64(i64),
        visit_i128(i128), visit_u8(u8), visit_u16(u16), visit_u32(u32), visit_u64(u64),
        visit_u128(u128), visit_f32(f32), visit_f64(f64), visit_char(char),
        visit_str(&str), visit_borrowed_str(&'de str), visit_string(String),
        visit_bytes(&[u8]), visit_borrowed_bytes(&'de [u8]), visit_byte_buf(Vec<u8>),
    }
}

/// A map that drops the key `path[0]` if it is the last of the path, or decodes its value still
/// pruning the rest of the path.
struct PrunedMap<A> {
    inner: A,
    path: &'static [&'static str],
    /// The key just handed out is `path[0]`: its value is pruned further.
    descend: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for PrunedMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.inner.next_key::<Key<'de>>()? else {
                return Ok(None);
            };
            let on_path = key.as_str() == self.path[0];
            if on_path && self.path.len() == 1 {
                self.inner.next_value::<IgnoredAny>()?;
                continue;
            }
            self.descend = on_path;
            return match key {
                Key::Borrowed(s) => seed.deserialize(de::value::BorrowedStrDeserializer::new(s)),
                Key::Owned(s) => seed.deserialize(s.into_deserializer()),
            }
            .map(Some);
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        if std::mem::take(&mut self.descend) {
            self.inner.next_value_seed(PrunedSeed {
                inner: seed,
                path: &self.path[1..],
            })
        } else {
            self.inner.next_value_seed(seed)
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// `inner`, decoding through [`Pruned`].
struct PrunedSeed<S> {
    inner: S,
    path: &'static [&'static str],
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for PrunedSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Pruned::new(d, self.path))
    }
}

/// A map key, borrowed from the input where it can be.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(s))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(s))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Secret};
    use kube::Resource;
    use serde_json::json;

    fn node_json() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "n1",
                "labels": {"zone": "a"},
                "managedFields": [{
                    "manager": "kubelet",
                    "operation": "Update",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {".": {}}}}
                }],
                "resourceVersion": "7"
            },
            "spec": {"providerID": "sim://n1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        })
    }

    #[test]
    fn lean_drops_managed_fields_and_keeps_everything_else() {
        let bytes = serde_json::to_vec(&node_json()).expect("decodes");
        let Lean(lean) = serde_json::from_slice::<Lean<Node>>(&bytes).expect("decodes");
        let mut full: Node = serde_json::from_slice(&bytes).expect("decodes");
        assert!(
            full.metadata.managed_fields.is_some(),
            "the input has managedFields"
        );
        full.metadata.managed_fields = None;
        assert_eq!(lean, full);
    }

    #[test]
    fn only_the_metadata_key_is_pruned() {
        // A `managedFields` key anywhere else is data and stays.
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "annotations": {"managedFields": "x"}},
            "stringData": {"managedFields": "kept"}
        });
        let Lean(lean) = serde_json::from_value::<Lean<Secret>>(secret).expect("decodes");
        assert_eq!(
            lean.metadata.annotations.expect("decodes")["managedFields"],
            "x"
        );
        assert_eq!(lean.string_data.expect("decodes")["managedFields"], "kept");
    }

    #[test]
    fn escaped_keys_and_non_borrowing_input_decode_too() {
        // `from_value` hands keys out owned, `from_str` with escapes too: both paths are taken.
        let Lean(node) = serde_json::from_value::<Lean<Node>>(node_json()).expect("decodes");
        assert!(node.metadata.managed_fields.is_none());
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
        let escaped = r#"{"metadata":{"na\u006de":"n2","managed\u0046ields":[{"manager":"m"}]}}"#;
        let Lean(node) = serde_json::from_str::<Lean<Node>>(escaped).expect("decodes");
        assert_eq!(node.metadata.name.as_deref(), Some("n2"));
        assert!(node.metadata.managed_fields.is_none());
    }

    #[test]
    fn decoding_errors_still_name_the_field() {
        let bad = json!({"metadata": {"name": 5}});
        let err = serde_json::from_value::<Lean<Node>>(bad)
            .expect_err("refused")
            .to_string();
        assert!(err.contains("expected a string"), "{err}");
    }

    #[test]
    fn the_lean_kind_has_the_same_urls() {
        assert_eq!(Lean::<Node>::url_path(&(), None), Node::url_path(&(), None));
        assert_eq!(
            Lean::<Secret>::url_path(&(), Some("ns")),
            Secret::url_path(&(), Some("ns"))
        );
        assert_eq!(Lean::<Node>::api_version(&()), "v1");
    }
}
