//! The shard side's writes and watches: the selector of its own objects, and the release of a
//! drained one.

use kube::Resource;
use kube::api::{Patch, PatchParams};
use kube::core::{PartialObjectMeta, Request};

use super::metrics::ShardingMetrics;
use super::{RingName, ShardId, ShardingError};
use crate::kube_errors::{is_failed_patch_test, is_not_found};

/// The watcher config of every watch a shard keeps on the ring's objects: only those labelled
/// with this shard, so its caches hold its share alone.
pub fn shard_watcher_config(ring: &RingName, shard: &ShardId) -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default().labels(&ring.shard_selector(shard))
}

/// How a release ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Both labels are gone; the sharder assigns the object to its new shard.
    Released,
    /// The object was no longer this shard's (or is gone): nothing to release.
    NotOurs,
}

/// A JSON pointer to the label `key` (RFC 6901: `~` and `/` escaped).
fn label_pointer(key: &str) -> String {
    format!(
        "/metadata/labels/{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}

/// Acknowledges a drain: removes the shard and drain labels from `object`, guarded by a `test`
/// that the shard label still names `shard`. Call it only once this shard has stopped working
/// on the object (its [`super::ShardAction::Release`]); it leaves the shard's label selector
/// with this write.
pub async fn release_object<K>(
    client: &kube::Client,
    ring: &RingName,
    shard: &ShardId,
    object: &K,
    metrics: Option<&ShardingMetrics>,
) -> Result<ReleaseOutcome, ShardingError>
where
    K: Resource<DynamicType = ()>,
{
    let meta = object.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    let namespace = meta.namespace.as_deref();
    let shard_pointer = label_pointer(&ring.shard_label());
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        {"op": "test", "path": shard_pointer, "value": shard.as_str()},
        {"op": "remove", "path": shard_pointer},
        {"op": "remove", "path": label_pointer(&ring.drain_label())},
    ]))
    .map_err(|error| ShardingError::Release {
        object: name.to_owned(),
        shard: shard.to_string(),
        source: kube::Error::SerdeError(error),
    })?;
    let request = Request::new(K::url_path(&(), namespace))
        .patch_metadata(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .map_err(|error| ShardingError::Release {
            object: name.to_owned(),
            shard: shard.to_string(),
            source: kube::Error::BuildRequest(error),
        })?;
    match client.request::<PartialObjectMeta<K>>(request).await {
        Ok(_) => {
            if let Some(metrics) = metrics {
                metrics.drain_completed(ring);
            }
            tracing::debug!(object = name, shard = %shard, ring = %ring, "released after drain");
            Ok(ReleaseOutcome::Released)
        }
        Err(error) if is_failed_patch_test(&error) || is_not_found(&error) => {
            Ok(ReleaseOutcome::NotOurs)
        }
        Err(source) => Err(ShardingError::Release {
            object: match namespace {
                Some(namespace) => format!("{namespace}/{name}"),
                None => name.to_owned(),
            },
            shard: shard.to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_are_escaped_as_json_pointers() {
        assert_eq!(
            label_pointer("shard.sharding.capstan.dev/ring"),
            "/metadata/labels/shard.sharding.capstan.dev~1ring"
        );
        assert_eq!(label_pointer("a~b"), "/metadata/labels/a~0b");
    }
}
