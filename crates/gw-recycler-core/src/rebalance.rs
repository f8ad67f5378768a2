//! Rebalancing (`--rebalance`): when one node holds more of a SliceGateway's gateway pods than its
//! share, ceil(pods / gateway nodes), while more than one node is usable for gateways, recycle one
//! of the gateways on that node, so its replacement is scheduled afresh. Pure: the edge observes
//! pod placement and node count, and creates the recycle this returns.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::Timestamp;

/// Where one Running gateway pod of the SliceGateway runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlacement {
    /// The pod's gateway deployment (`<slicegw>-<instance>-<generation>`).
    pub deployment: String,
    /// `spec.nodeName` (empty: not scheduled, not counted on any node).
    pub node: String,
}

/// What the edge observed for one server-side SliceGateway.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebalanceFacts {
    pub pods: Vec<PodPlacement>,
    /// Nodes labelled `kubeslice.io/node-type=gateway`.
    pub gateway_nodes: usize,
    /// An unfinished recycle of this SliceGateway exists (at most one at a time).
    pub recycle_in_progress: bool,
}

/// The gateway deployment to recycle, if the pods are unbalanced: the first (by name) deployment
/// with a pod on the most loaded node over its share. `None` while a recycle runs, with at most one
/// usable node, or when every node holds at most its share.
pub fn pick_deployment_to_rebalance(facts: &RebalanceFacts) -> Option<String> {
    if facts.recycle_in_progress || facts.gateway_nodes < 2 {
        return None;
    }
    let scheduled: Vec<&PodPlacement> = facts.pods.iter().filter(|p| !p.node.is_empty()).collect();
    let share = scheduled.len().div_ceil(facts.gateway_nodes);
    let mut per_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for pod in &scheduled {
        per_node
            .entry(pod.node.as_str())
            .or_default()
            .push(pod.deployment.as_str());
    }
    let (_, deployments) = per_node
        .into_iter()
        .filter(|(_, deployments)| deployments.len() > share)
        .max_by(|(a_node, a), (b_node, b)| a.len().cmp(&b.len()).then(b_node.cmp(a_node)))?;
    deployments.into_iter().min().map(str::to_owned)
}

/// What rebalancing does while a recycle of the SliceGateway it would recycle is in
/// `error_state`: whatever made it fail (no room on another node, a sick peer) is likely still
/// there, so it is retried at most once per retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedRecycle {
    /// Leave it (a person may be looking at it) until `until`.
    Hold { until: Timestamp },
    /// Its retention has passed: replace it with a new recycle.
    Retry,
}

/// `failed_at`: when the recycle entered `error_state` (`None`: unknown, counted as now).
pub fn failed_recycle(
    failed_at: Option<Timestamp>,
    retention: Duration,
    now: Timestamp,
) -> FailedRecycle {
    let failed_at = failed_at.unwrap_or(now);
    let until = failed_at.checked_add(retention).unwrap_or(Timestamp::MAX);
    if now >= until {
        FailedRecycle::Retry
    } else {
        FailedRecycle::Hold { until }
    }
}

/// The peer deployment of `local_deployment` on the other side of the pair: the remote
/// SliceGateway's deployment of the same instance and generation (both sides of a pair flip
/// generation together on every recycle). `None` when `local_deployment` is not `local_gateway`'s.
pub fn peer_deployment(
    local_gateway: &str,
    remote_gateway: &str,
    local_deployment: &str,
) -> Option<String> {
    crate::naming::instance_of(local_gateway, local_deployment)?;
    let suffix = local_deployment.strip_prefix(local_gateway)?;
    Some(format!("{remote_gateway}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_recycle_is_retried_only_once_its_retention_has_passed() {
        let failed: Timestamp = "2026-12-06T10:00:00Z".parse().expect("time");
        let hour = Duration::from_secs(3600);
        let at = |t: &str| t.parse::<Timestamp>().expect("time");
        let until = at("2026-12-06T11:00:00Z");
        assert_eq!(
            failed_recycle(Some(failed), hour, at("2026-12-06T10:00:01Z")),
            FailedRecycle::Hold { until }
        );
        assert_eq!(
            failed_recycle(Some(failed), hour, at("2026-12-06T10:59:59Z")),
            FailedRecycle::Hold { until }
        );
        assert_eq!(
            failed_recycle(Some(failed), hour, until),
            FailedRecycle::Retry
        );
        // Unknown failure time: held a whole retention from now, never retried at once.
        let now = at("2026-12-06T12:00:00Z");
        assert_eq!(
            failed_recycle(None, hour, now),
            FailedRecycle::Hold {
                until: at("2026-12-06T13:00:00Z")
            }
        );
        // Zero retention: retried on the next pass (as a finished recycle is deleted at once).
        assert_eq!(
            failed_recycle(Some(failed), Duration::ZERO, failed),
            FailedRecycle::Retry
        );
    }

    fn on(deployment: &str, node: &str) -> PodPlacement {
        PodPlacement {
            deployment: deployment.into(),
            node: node.into(),
        }
    }

    fn facts(pods: Vec<PodPlacement>, gateway_nodes: usize) -> RebalanceFacts {
        RebalanceFacts {
            pods,
            gateway_nodes,
            recycle_in_progress: false,
        }
    }

    #[test]
    fn two_pods_on_one_of_two_gateway_nodes_recycle_one() {
        let f = facts(vec![on("a-b-1-0", "n1"), on("a-b-0-0", "n1")], 2);
        assert_eq!(pick_deployment_to_rebalance(&f).as_deref(), Some("a-b-0-0"));
    }

    #[test]
    fn balanced_pods_stay() {
        let f = facts(vec![on("a-b-0-0", "n1"), on("a-b-1-0", "n2")], 2);
        assert_eq!(pick_deployment_to_rebalance(&f), None);
        // Three pods on two nodes: a share of 2 per node.
        let f = facts(
            vec![
                on("a-b-0-0", "n1"),
                on("a-b-1-0", "n1"),
                on("a-b-2-0", "n2"),
            ],
            2,
        );
        assert_eq!(pick_deployment_to_rebalance(&f), None);
    }

    #[test]
    fn a_single_usable_node_never_rebalances() {
        let f = facts(vec![on("a-b-0-0", "n1"), on("a-b-1-0", "n1")], 1);
        assert_eq!(pick_deployment_to_rebalance(&f), None);
        let f = facts(vec![on("a-b-0-0", "n1"), on("a-b-1-0", "n1")], 0);
        assert_eq!(pick_deployment_to_rebalance(&f), None);
    }

    #[test]
    fn a_recycle_in_progress_blocks_another() {
        let mut f = facts(vec![on("a-b-0-0", "n1"), on("a-b-1-0", "n1")], 2);
        f.recycle_in_progress = true;
        assert_eq!(pick_deployment_to_rebalance(&f), None);
    }

    #[test]
    fn unscheduled_pods_count_nowhere() {
        let f = facts(vec![on("a-b-0-0", "n1"), on("a-b-1-0", "")], 2);
        assert_eq!(pick_deployment_to_rebalance(&f), None);
    }

    #[test]
    fn the_most_loaded_node_gives_the_gateway() {
        // Six pods on three nodes: share 2; n2 holds 3.
        let f = facts(
            vec![
                on("g-0-0", "n1"),
                on("g-1-1", "n2"),
                on("g-2-0", "n2"),
                on("g-3-0", "n2"),
                on("g-4-0", "n3"),
                on("g-5-0", "n1"),
            ],
            3,
        );
        assert_eq!(pick_deployment_to_rebalance(&f).as_deref(), Some("g-1-1"));
    }

    #[test]
    fn the_peer_is_the_remote_gateways_deployment_of_the_same_instance_and_generation() {
        assert_eq!(
            peer_deployment("red-a-b", "red-b-a", "red-a-b-1-1").as_deref(),
            Some("red-b-a-1-1")
        );
        assert_eq!(peer_deployment("red-a-b", "red-b-a", "other-0-0"), None);
        assert_eq!(peer_deployment("red-a-b", "red-b-a", "red-a-b-x"), None);
    }
}
