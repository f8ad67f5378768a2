//! Active-active sharding: N replicas of one controller each own about 1/N of its objects, no
//! object is reconciled by two replicas at once, and a dead replica's share moves to the others.
//!
//! The design follows timebertt/kubernetes-controller-sharding (facts and paths in
//! `docs/sharding.md`): every replica (a *shard*) holds a Lease of its own labelled with the ring
//! ([`lease`]); one *sharder* watches those Leases, picks an owner per object among the ready
//! shards ([`ring`]) and writes it into a label on the object ([`sharder`], deciding with
//! [`mod@assign`]); each shard watches only the objects carrying its label
//! ([`shard_watcher_config`]) and hands an object back when the sharder adds the drain label
//! ([`assign::shard_action`], [`release_object`]).
//!
//! **Decision**: no ControllerRing CRD and no mutating webhook. The ring is a name in code, and
//! the sharder is a metadata-only watch on the replica that holds the ordinary leader Lease
//! ([`crate::leader`]); the anchor moved to a webhook to keep the sharder's cost independent of
//! the object count, we accept a metadata cache (labels and names only) on one replica instead.
//!
//! **Decision**: label keys are `shard.sharding.capstan.dev/<ring>` and
//! `drain.sharding.capstan.dev/<ring>`, the ring name itself (a DNS label, so the key is valid)
//! rather than the anchor's hash-prefixed, shortened ring suffix.

pub mod assign;
pub mod lease;
pub mod member;
pub mod metrics;
pub mod ring;
pub mod shard;
pub mod sharder;

use std::fmt;

pub use assign::{AssignDecision, ShardAction, assign, shard_action, shard_action_for};
pub use lease::{
    Membership, ShardEnd, ShardHandle, ShardLease, ShardLeaseConfig, ShardState, watch_membership,
};
pub use member::ShardMember;
pub use metrics::ShardingMetrics;
pub use shard::{ReleaseOutcome, release_object, shard_watcher_config};
pub use sharder::{Sharder, SharderConfig};

/// The label on every shard Lease naming its ring (the sharder's Lease selector).
pub const RING_LABEL: &str = "sharding.capstan.dev/ring";
/// Prefix of the label on sharded objects naming their shard: `shard.sharding.capstan.dev/<ring>`.
pub const SHARD_LABEL_PREFIX: &str = "shard.sharding.capstan.dev/";
/// Prefix of the label asking an object's shard to hand it back:
/// `drain.sharding.capstan.dev/<ring>`.
pub const DRAIN_LABEL_PREFIX: &str = "drain.sharding.capstan.dev/";
/// The value the sharder writes into the drain label.
pub const DRAIN_VALUE: &str = "true";
/// The holder identity the sharder writes into the Lease of a shard it declares dead.
pub const SHARDER_IDENTITY: &str = "capstan-sharder";

/// Errors of sharding: invalid names and settings, and the API calls of leases and the sharder.
#[derive(Debug, thiserror::Error)]
pub enum ShardingError {
    #[error("invalid ring name {name:?}: {reason}")]
    InvalidRing { name: String, reason: &'static str },
    #[error("invalid shard id {id:?}: {reason}")]
    InvalidShard { id: String, reason: &'static str },
    #[error("invalid shard lease settings: {0}")]
    LeaseConfig(String),
    #[error("shard lease {lease} was lost while held")]
    LeaseLost { lease: String },
    #[error("shard lease task failed: {0}")]
    TaskJoin(#[from] tokio::task::JoinError),
    #[error("releasing {object} from shard {shard}: {source}")]
    Release {
        object: String,
        shard: String,
        #[source]
        source: kube::Error,
    },
    #[error("the sharder's {what} watch ended before it synced")]
    NotSynced { what: &'static str },
}

impl crate::ErrorLabel for ShardingError {
    fn metric_label(&self) -> &'static str {
        match self {
            Self::InvalidRing { .. } | Self::InvalidShard { .. } | Self::LeaseConfig(_) => {
                "sharding_config"
            }
            Self::LeaseLost { .. } => "shard_lease_lost",
            Self::TaskJoin(_) => "shard_lease_task",
            Self::Release { .. } => "shard_release",
            Self::NotSynced { .. } => "sharder_not_synced",
        }
    }
}

/// A ring's name: a DNS label (RFC 1123, at most 63 characters), so that it can end a label key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RingName(String);

impl RingName {
    pub fn new(name: impl Into<String>) -> Result<Self, ShardingError> {
        let name = name.into();
        match dns_label_problem(&name) {
            None => Ok(Self(name)),
            Some(reason) => Err(ShardingError::InvalidRing { name, reason }),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `shard.sharding.capstan.dev/<ring>`: the label holding an object's shard.
    pub fn shard_label(&self) -> String {
        format!("{SHARD_LABEL_PREFIX}{}", self.0)
    }

    /// `drain.sharding.capstan.dev/<ring>`: the label asking the shard to hand the object back.
    pub fn drain_label(&self) -> String {
        format!("{DRAIN_LABEL_PREFIX}{}", self.0)
    }

    /// `sharding.capstan.dev/ring=<ring>`: the selector of this ring's shard Leases.
    pub fn lease_selector(&self) -> String {
        format!("{RING_LABEL}={}", self.0)
    }

    /// `shard.sharding.capstan.dev/<ring>=<shard>`: the label selector of every watch of `shard`
    /// on the ring's objects, so its caches hold only its own share.
    pub fn shard_selector(&self, shard: &ShardId) -> String {
        format!("{}={}", self.shard_label(), shard.as_str())
    }

    /// `<ring>-<shard>`: the name of `shard`'s Lease.
    pub fn lease_name(&self, shard: &ShardId) -> String {
        format!("{}-{}", self.0, shard.as_str())
    }

    /// The shard a Lease of this ring belongs to, from its name (`<ring>-<shard>`).
    pub fn shard_of_lease<'a>(&self, lease_name: &'a str) -> Option<&'a str> {
        lease_name
            .strip_prefix(self.0.as_str())?
            .strip_prefix('-')
            .filter(|shard| !shard.is_empty())
    }
}

impl fmt::Display for RingName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A shard's id (the pod name): it is a label value on every object the shard owns, so it must
/// be one (at most 63 characters of alphanumerics, `-`, `_`, `.`, alphanumeric at both ends).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(String);

impl ShardId {
    pub fn new(id: impl Into<String>) -> Result<Self, ShardingError> {
        let id = id.into();
        match label_value_problem(&id) {
            None => Ok(Self(id)),
            Some(reason) => Err(ShardingError::InvalidShard { id, reason }),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn dns_label_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > 63 {
        return Some("must be 1 to 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Some("must consist of lower case alphanumerics and '-'");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Some("must start and end with an alphanumeric character");
    }
    None
}

fn label_value_problem(value: &str) -> Option<&'static str> {
    if value.is_empty() || value.len() > 63 {
        return Some("must be 1 to 63 characters (it is a label value)");
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Some("must consist of alphanumerics, '-', '_' and '.'");
    }
    let alnum = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if !alnum(value.bytes().next()) || !alnum(value.bytes().last()) {
        return Some("must start and end with an alphanumeric character");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_names_are_dns_labels_and_shape_the_label_keys() {
        let ring = RingName::new("nodeslo").expect("valid");
        let shard = ShardId::new("nodeslo-controller-0").expect("valid");
        assert_eq!(ring.shard_label(), "shard.sharding.capstan.dev/nodeslo");
        assert_eq!(ring.drain_label(), "drain.sharding.capstan.dev/nodeslo");
        assert_eq!(ring.lease_selector(), "sharding.capstan.dev/ring=nodeslo");
        assert_eq!(
            ring.shard_selector(&shard),
            "shard.sharding.capstan.dev/nodeslo=nodeslo-controller-0"
        );
        assert_eq!(ring.lease_name(&shard), "nodeslo-nodeslo-controller-0");
        assert_eq!(
            ring.shard_of_lease("nodeslo-nodeslo-controller-0"),
            Some("nodeslo-controller-0")
        );
        assert_eq!(ring.shard_of_lease("nodeslo-"), None);
        assert_eq!(ring.shard_of_lease("machineclass-a"), None);
        for bad in ["", "Upper", "-a", "a-", "a.b", &"x".repeat(64)] {
            assert!(RingName::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn shard_ids_must_be_label_values() {
        assert!(ShardId::new("Pod_0.a").is_ok());
        for bad in ["", "-a", "a.", "a/b", &"x".repeat(64)] {
            assert!(ShardId::new(bad).is_err(), "{bad:?} accepted");
        }
    }
}
