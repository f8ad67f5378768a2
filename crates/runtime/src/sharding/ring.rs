//! Which live shard owns an object: rendezvous (highest-random-weight) hashing, pure.
//!
//! Every shard gets a weight per object key and the heaviest wins. Removing a shard moves only
//! the keys it won (each to its runner-up), adding one moves only the keys it now wins (about
//! 1/N), and no ring of virtual nodes has to be built or kept.
//!
//! **Decision**: rendezvous hashing instead of the anchor's consistent-hash ring with 100 virtual
//! nodes per shard (`pkg/sharding/consistenthash/ring.go`, xxhash): the same movement
//! properties, balance without tuning a token count, and no state; choosing costs one hash per
//! shard per key, a few nanoseconds times a handful of shards.
//!
//! **Decision**: the weight is FNV-1a 64 over `shard`, a `0xff` byte (never in UTF-8, so the
//! pair is unambiguous) and `key`, finished with SplitMix64's finalizer (FNV-1a alone mixes its
//! last bytes poorly). Both are fixed published constants, stable across Rust versions and
//! platforms (std's `DefaultHasher` is not); changing them moves objects, and a test pins them.
//!
//! **Decision**: the key is `namespace/name` (`name` when cluster-scoped), without the anchor's
//! group and kind: objects of different kinds with the same key land on the same shard, as a
//! controller keyed by Node name wants for a Node and its NodeSLO.

/// The hash key of an object: `namespace/name`, or `name` when it is cluster-scoped.
pub fn object_key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) if !namespace.is_empty() => format!("{namespace}/{name}"),
        _ => name.to_owned(),
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for byte in bytes {
        state ^= u64::from(*byte);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

/// SplitMix64's output function: a bijection with full avalanche.
fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The weight of `shard` for `key`; the heaviest live shard owns the key.
pub fn weight(shard: &str, key: &str) -> u64 {
    let state = fnv1a(FNV_OFFSET, shard.as_bytes());
    let state = fnv1a(state, &[0xff]);
    finalize(fnv1a(state, key.as_bytes()))
}

/// The owner of `key` among `shards`: the heaviest, ties (astronomically rare) to the greater
/// id so that the choice never depends on the order given. `None` without shards.
pub fn choose<'a, I>(key: &str, shards: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    shards
        .into_iter()
        .max_by_key(|shard| (weight(shard, key), *shard))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn keys(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| object_key(Some("default"), &format!("object-{i}")))
            .collect()
    }

    fn owners<'a>(keys: &[String], shards: &[&'a str]) -> Vec<&'a str> {
        keys.iter()
            .map(|key| choose(key, shards.iter().copied()).expect("shards given"))
            .collect()
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn ten_thousand_keys_spread_within_ten_percent_over_three_shards() {
        let keys = keys(10_000);
        let mut counts = BTreeMap::<&str, usize>::new();
        for owner in owners(&keys, &["shard-0", "shard-1", "shard-2"]) {
            *counts.entry(owner).or_default() += 1;
        }
        assert_eq!(counts.len(), 3, "{counts:?}");
        for (shard, count) in &counts {
            assert!(
                (3_000..=3_667).contains(count),
                "{shard} owns {count} of 10000 keys: {counts:?}"
            );
        }
    }

    #[test]
    fn removing_a_shard_moves_only_its_own_keys() {
        let keys = keys(10_000);
        let before = owners(&keys, &["shard-0", "shard-1", "shard-2"]);
        let after = owners(&keys, &["shard-0", "shard-2"]);
        for (old, new) in before.iter().zip(&after) {
            if *old != "shard-1" {
                assert_eq!(old, new, "a key of a remaining shard moved");
            } else {
                assert_ne!(*new, "shard-1");
            }
        }
    }

    #[test]
    fn adding_a_fourth_shard_moves_about_a_quarter_of_the_keys_all_to_it() {
        let keys = keys(10_000);
        let before = owners(&keys, &["shard-0", "shard-1", "shard-2"]);
        let after = owners(&keys, &["shard-0", "shard-1", "shard-2", "shard-3"]);
        let moved: Vec<_> = before
            .iter()
            .zip(&after)
            .filter(|(old, new)| old != new)
            .collect();
        assert!(
            moved.iter().all(|(_, new)| **new == "shard-3"),
            "keys moved between old shards"
        );
        assert!(
            (2_250..=2_750).contains(&moved.len()),
            "{} of 10000 keys moved, expected about 2500",
            moved.len()
        );
    }

    #[test]
    fn the_choice_ignores_the_order_of_the_shards() {
        let key = object_key(None, "node-17");
        assert_eq!(choose(&key, ["a", "b", "c"]), choose(&key, ["c", "a", "b"]));
        assert_eq!(choose(&key, std::iter::empty()), None);
    }

    /// A change of the hash, the separator or the key format moves every object of a running
    /// ring at the next sharder start: this pins the assignment.
    #[test]
    fn pinned_assignments_fail_on_a_hash_change() {
        let shards = ["shard-0", "shard-1", "shard-2"];
        let pinned = [
            (object_key(Some("default"), "object-0"), "shard-1"),
            (object_key(Some("default"), "object-1"), "shard-2"),
            (object_key(Some("kube-system"), "coredns"), "shard-2"),
            (object_key(None, "node-1"), "shard-2"),
            (object_key(None, "node-2"), "shard-1"),
        ];
        for (key, expected) in &pinned {
            assert_eq!(choose(key, shards), Some(*expected), "{key}");
        }
        assert_eq!(weight("shard-0", "default/object-0"), 0x2641_a806_2cfd_7a1a);
    }
}
