//! The sharder's decision for one object and the shard's for one of its own, pure.
//!
//! An object is never owned by two shards at once because an owner that may still be working
//! only loses an object by acknowledging a drain (it removes both labels after it stopped),
//! and a shard only works on objects carrying its label. Only an owner confirmed dead (its
//! Lease released, or acquired by the sharder after it expired) loses its objects directly.
//!
//! **Decision**: an owner whose Lease expired but is not yet confirmed dead keeps its objects
//! untouched (no drain it could not acknowledge, no reassignment) until the sharder confirms
//! the death; the anchor keeps such shards in its ring, so new objects may still land on them.

use std::collections::BTreeMap;

use super::lease::Membership;
use super::{DRAIN_VALUE, RingName, ShardId};

/// What the sharder does with one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AssignDecision {
    /// The object is where it belongs, or a handover is under way, or there is no ready shard.
    Nothing,
    /// Write this shard into the shard label (and remove any drain label): the object has no
    /// owner, or its owner is dead or unknown.
    Assign(String),
    /// Add the drain label: the owner is alive but the ring chose another shard; the owner
    /// removes both labels once it stopped, then the object is assigned as unowned.
    Drain,
}

/// The ring-related labels of one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectLabels<'a> {
    /// The value of the shard label.
    pub shard: Option<&'a str>,
    /// Whether the drain label is present (any value).
    pub draining: bool,
}

impl<'a> ObjectLabels<'a> {
    pub fn read(labels: Option<&'a BTreeMap<String, String>>, ring: &RingName) -> Self {
        let Some(labels) = labels else {
            return Self {
                shard: None,
                draining: false,
            };
        };
        Self {
            shard: labels
                .get(&ring.shard_label())
                .map(String::as_str)
                .filter(|shard| !shard.is_empty()),
            draining: labels.contains_key(&ring.drain_label()),
        }
    }
}

/// The sharder's decision for an object with `labels`, given the ring's `membership` and its
/// `choice` among the ready shards (`membership.choose(key)`).
pub fn assign(
    labels: ObjectLabels<'_>,
    membership: &Membership,
    choice: Option<&str>,
) -> AssignDecision {
    let Some(choice) = choice else {
        // No ready shard: an object of a dead owner waits unowned-in-effect for the first one.
        return AssignDecision::Nothing;
    };
    let Some(owner) = labels.shard else {
        return AssignDecision::Assign(choice.to_owned());
    };
    let state = membership.state(owner);
    if !state.is_some_and(|state| state.may_be_working()) {
        // Released, confirmed dead, orphaned or without a Lease: nobody works on it.
        return AssignDecision::Assign(choice.to_owned());
    }
    if owner == choice || labels.draining {
        // In place, or the owner has yet to acknowledge the drain (or cannot: expired).
        return AssignDecision::Nothing;
    }
    if state.is_some_and(|state| state.is_ready()) {
        AssignDecision::Drain
    } else {
        // Expired but not confirmed dead: it might still work and would not acknowledge.
        AssignDecision::Nothing
    }
}

/// What a shard does with an object it sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardAction {
    /// The object is this shard's: reconcile it.
    Reconcile,
    /// The sharder asked for it back: stop working on it, then remove both labels
    /// ([`super::release_object`]); do not reconcile it again.
    Release,
    /// Not this shard's object (a stale cache entry or a requeue after it moved): skip it.
    Ignore,
}

/// The shard `shard`'s action on an object with `labels`; call it at the top of every
/// reconcile, as the cache may still hold an object that has moved.
pub fn shard_action(
    labels: Option<&BTreeMap<String, String>>,
    ring: &RingName,
    shard: &ShardId,
) -> ShardAction {
    let labels = ObjectLabels::read(labels, ring);
    match labels.shard {
        Some(owner) if owner == shard.as_str() => {
            if labels.draining {
                ShardAction::Release
            } else {
                ShardAction::Reconcile
            }
        }
        _ => ShardAction::Ignore,
    }
}

/// [`shard_action`] for a whole object.
pub fn shard_action_for<K: kube::Resource>(
    object: &K,
    ring: &RingName,
    shard: &ShardId,
) -> ShardAction {
    shard_action(object.meta().labels.as_ref(), ring, shard)
}

/// The label map of an object a test or caller builds: shard and optional drain label.
pub fn labels_for(ring: &RingName, shard: &str, draining: bool) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([(ring.shard_label(), shard.to_owned())]);
    if draining {
        labels.insert(ring.drain_label(), DRAIN_VALUE.to_owned());
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::super::lease::ShardState;
    use super::*;

    fn ring() -> RingName {
        RingName::new("ring").expect("valid")
    }

    fn members(states: &[(&str, ShardState)]) -> Membership {
        Membership::from_states(states.iter().map(|(id, state)| ((*id).to_owned(), *state)))
    }

    fn labels(shard: Option<&str>, draining: bool) -> ObjectLabels<'_> {
        ObjectLabels { shard, draining }
    }

    fn three_ready() -> Membership {
        members(&[
            ("a", ShardState::Ready),
            ("b", ShardState::Ready),
            ("c", ShardState::Ready),
        ])
    }

    #[test]
    fn an_unassigned_object_goes_to_the_rings_choice() {
        let membership = three_ready();
        assert_eq!(
            assign(labels(None, false), &membership, Some("b")),
            AssignDecision::Assign("b".into())
        );
        // A leftover drain label without an owner is cleared by the assignment.
        assert_eq!(
            assign(labels(None, true), &membership, Some("b")),
            AssignDecision::Assign("b".into())
        );
    }

    #[test]
    fn an_object_in_place_is_left_alone() {
        assert_eq!(
            assign(labels(Some("a"), false), &three_ready(), Some("a")),
            AssignDecision::Nothing
        );
    }

    #[test]
    fn a_live_owner_is_drained_not_overwritten() {
        assert_eq!(
            assign(labels(Some("a"), false), &three_ready(), Some("c")),
            AssignDecision::Drain
        );
    }

    #[test]
    fn a_drain_waits_for_the_owner_and_ends_in_an_assignment_once_acknowledged() {
        let membership = three_ready();
        assert_eq!(
            assign(labels(Some("a"), true), &membership, Some("c")),
            AssignDecision::Nothing,
            "the owner has not acknowledged yet"
        );
        // The owner acknowledged: both labels are gone.
        assert_eq!(
            assign(labels(None, false), &membership, Some("c")),
            AssignDecision::Assign("c".into())
        );
    }

    #[test]
    fn a_dead_owner_loses_its_objects_directly_without_a_drain() {
        for dead in [ShardState::Dead, ShardState::Orphaned] {
            let membership = members(&[("a", dead), ("b", ShardState::Ready)]);
            assert_eq!(
                assign(labels(Some("a"), false), &membership, Some("b")),
                AssignDecision::Assign("b".into()),
                "{dead:?}"
            );
            // A drain the owner died before acknowledging is overridden too.
            assert_eq!(
                assign(labels(Some("a"), true), &membership, Some("b")),
                AssignDecision::Assign("b".into()),
                "{dead:?}"
            );
        }
        let membership = members(&[("b", ShardState::Ready)]);
        assert_eq!(
            assign(labels(Some("gone"), false), &membership, Some("b")),
            AssignDecision::Assign("b".into()),
            "an owner without a Lease is dead"
        );
    }

    #[test]
    fn an_expired_owner_keeps_its_objects_until_confirmed_dead() {
        for expired in [ShardState::Expired, ShardState::Uncertain] {
            let membership = members(&[("a", expired), ("b", ShardState::Ready)]);
            assert_eq!(
                assign(labels(Some("a"), false), &membership, Some("b")),
                AssignDecision::Nothing,
                "{expired:?}"
            );
        }
    }

    #[test]
    fn without_a_ready_shard_nothing_moves() {
        let membership = members(&[("a", ShardState::Dead)]);
        assert_eq!(
            assign(labels(Some("a"), false), &membership, None),
            AssignDecision::Nothing
        );
        assert_eq!(
            assign(labels(None, false), &membership, None),
            AssignDecision::Nothing
        );
    }

    #[test]
    fn a_shard_reconciles_its_own_releases_drained_and_ignores_the_rest() {
        let ring = ring();
        let me = ShardId::new("a").expect("valid");
        let own = labels_for(&ring, "a", false);
        let drained = labels_for(&ring, "a", true);
        let other = labels_for(&ring, "b", false);
        assert_eq!(shard_action(Some(&own), &ring, &me), ShardAction::Reconcile);
        assert_eq!(
            shard_action(Some(&drained), &ring, &me),
            ShardAction::Release
        );
        assert_eq!(shard_action(Some(&other), &ring, &me), ShardAction::Ignore);
        assert_eq!(shard_action(None, &ring, &me), ShardAction::Ignore);
        let other_ring = RingName::new("other").expect("valid");
        assert_eq!(
            shard_action(Some(&own), &other_ring, &me),
            ShardAction::Ignore,
            "labels of another ring are not ours"
        );
    }

    #[test]
    fn labels_are_read_per_ring() {
        let ring = ring();
        let map = labels_for(&ring, "a", true);
        assert_eq!(
            ObjectLabels::read(Some(&map), &ring),
            labels(Some("a"), true)
        );
        assert_eq!(
            ObjectLabels::read(Some(&map), &RingName::new("x").expect("valid")),
            labels(None, false)
        );
    }
}
