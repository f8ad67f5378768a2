//! Rebalancing (`--rebalance`): when one node holds more of a SliceGateway's gateway pods than its
//! share, ceil(pods / gateway nodes), while more than one node is usable for gateways, recycle one
//! of the gateways on that node together with its peer, so its replacement is scheduled afresh.
//! The peer is read, never guessed: the pod's `peerPodName` in `gatewayPodStatus` (what its
//! gateway sidecar's `GetSliceGwRemotePodName` answered) names the client pod, whose name names
//! its deployment (the reference's `getPodPairToRebalance`). Which client instance a server
//! instance's tunnel reaches is the client's choice of node port, not the instance number.
//! Pure: the edge observes pod placement, peers and node count, and creates the recycle this
//! returns.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::Timestamp;
use crate::naming::deployment_of_pod;

/// Where one Running gateway pod of the SliceGateway runs, and who its peer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlacement {
    /// The pod's gateway deployment (`<slicegw>-<instance>-<generation>`).
    pub deployment: String,
    /// `spec.nodeName` (empty: not scheduled, not counted on any node).
    pub node: String,
    /// `peerPodName` published for the pod (`None`: its sidecar has not named it yet).
    pub peer_pod: Option<String>,
}

/// What the edge observed for one server-side SliceGateway.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebalanceFacts {
    pub pods: Vec<PodPlacement>,
    /// Nodes labelled `kubeslice.io/node-type=gateway`.
    pub gateway_nodes: usize,
    /// An unfinished recycle of this SliceGateway exists (at most one at a time).
    pub recycle_in_progress: bool,
    /// The client SliceGateway (`sliceGatewayRemoteGatewayId`), whose pods the peers are.
    pub remote_gateway: String,
}

/// What rebalancing decides for one SliceGateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebalance {
    /// Nothing to do: balanced, a recycle runs, or at most one usable node.
    Stay,
    /// Recycle this pair: the server deployment on the crowded node and its peer's deployment.
    Recycle { server: String, client: String },
    /// `node` holds more than its share, but none of its pods has a peer known yet (its sidecar
    /// has not answered `GetSliceGwRemotePodName`, or named a pod of another gateway).
    PeerUnknown { node: String },
}

/// The gateway pair to recycle, if the pods are unbalanced: on the most loaded node over its
/// share (then the next one), the first deployment by name whose pod's peer is known.
pub fn pick_pair_to_rebalance(facts: &RebalanceFacts) -> Rebalance {
    if facts.recycle_in_progress || facts.gateway_nodes < 2 {
        return Rebalance::Stay;
    }
    let scheduled: Vec<&PodPlacement> = facts.pods.iter().filter(|p| !p.node.is_empty()).collect();
    let share = scheduled.len().div_ceil(facts.gateway_nodes);
    let mut per_node: BTreeMap<&str, Vec<&PodPlacement>> = BTreeMap::new();
    for pod in &scheduled {
        per_node.entry(pod.node.as_str()).or_default().push(pod);
    }
    let mut crowded: Vec<(&str, Vec<&PodPlacement>)> = per_node
        .into_iter()
        .filter(|(_, pods)| pods.len() > share)
        .collect();
    // Most loaded first; among equals, by node name.
    crowded.sort_by(|(a_node, a), (b_node, b)| b.len().cmp(&a.len()).then(a_node.cmp(b_node)));
    let Some((first_node, _)) = crowded.first() else {
        return Rebalance::Stay;
    };
    let first_node = (*first_node).to_owned();
    for (_, mut pods) in crowded {
        pods.sort_by(|a, b| a.deployment.cmp(&b.deployment));
        let pair = pods.iter().find_map(|pod| {
            let peer = pod.peer_pod.as_deref()?;
            let client = deployment_of_pod(&facts.remote_gateway, peer)?;
            Some(Rebalance::Recycle {
                server: pod.deployment.clone(),
                client,
            })
        });
        if let Some(pair) = pair {
            return pair;
        }
    }
    Rebalance::PeerUnknown { node: first_node }
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

    /// A pod of `deployment` on `node` whose peer is the client pod of the same instance and
    /// generation (what a pair flipped together looks like).
    fn on(deployment: &str, node: &str) -> PodPlacement {
        let suffix = deployment.rsplitn(3, '-').take(2).collect::<Vec<_>>();
        PodPlacement {
            deployment: deployment.into(),
            node: node.into(),
            peer_pod: Some(format!("client-{}-{}-5d8f-abcde", suffix[1], suffix[0])),
        }
    }

    fn facts(pods: Vec<PodPlacement>, gateway_nodes: usize) -> RebalanceFacts {
        RebalanceFacts {
            pods,
            gateway_nodes,
            recycle_in_progress: false,
            remote_gateway: "client".into(),
        }
    }

    fn recycle(server: &str, client: &str) -> Rebalance {
        Rebalance::Recycle {
            server: server.into(),
            client: client.into(),
        }
    }

    #[test]
    fn two_pods_on_one_of_two_gateway_nodes_recycle_one() {
        let f = facts(vec![on("a-b-1-0", "n1"), on("a-b-0-0", "n1")], 2);
        assert_eq!(pick_pair_to_rebalance(&f), recycle("a-b-0-0", "client-0-0"));
    }

    #[test]
    fn balanced_pods_stay() {
        let f = facts(vec![on("a-b-0-0", "n1"), on("a-b-1-0", "n2")], 2);
        assert_eq!(pick_pair_to_rebalance(&f), Rebalance::Stay);
        // Three pods on two nodes: a share of 2 per node.
        let f = facts(
            vec![
                on("a-b-0-0", "n1"),
                on("a-b-1-0", "n1"),
                on("a-b-2-0", "n2"),
            ],
            2,
        );
        assert_eq!(pick_pair_to_rebalance(&f), Rebalance::Stay);
    }

    #[test]
    fn a_single_usable_node_never_rebalances() {
        let f = facts(vec![on("a-b-0-0", "n1"), on("a-b-1-0", "n1")], 1);
        assert_eq!(pick_pair_to_rebalance(&f), Rebalance::Stay);
        let f = facts(vec![on("a-b-0-0", "n1"), on("a-b-1-0", "n1")], 0);
        assert_eq!(pick_pair_to_rebalance(&f), Rebalance::Stay);
    }

    #[test]
    fn a_recycle_in_progress_blocks_another() {
        let mut f = facts(vec![on("a-b-0-0", "n1"), on("a-b-1-0", "n1")], 2);
        f.recycle_in_progress = true;
        assert_eq!(pick_pair_to_rebalance(&f), Rebalance::Stay);
    }

    #[test]
    fn unscheduled_pods_count_nowhere() {
        let f = facts(vec![on("a-b-0-0", "n1"), on("a-b-1-0", "")], 2);
        assert_eq!(pick_pair_to_rebalance(&f), Rebalance::Stay);
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
        assert_eq!(pick_pair_to_rebalance(&f), recycle("g-1-1", "client-1-1"));
    }

    #[test]
    fn the_client_is_the_peer_its_sidecar_named_not_the_same_instance() {
        // Server instance 0's tunnel reaches client instance 1 (the client picked that node
        // port), after the client side alone was recycled once.
        let mut pods = vec![on("a-b-0-0", "n1"), on("a-b-1-0", "n1")];
        pods[0].peer_pod = Some("client-1-1-7d9f8c6b5-x2k4q".into());
        pods[1].peer_pod = Some("client-0-0-7d9f8c6b5-p9m2z".into());
        assert_eq!(
            pick_pair_to_rebalance(&facts(pods, 2)),
            recycle("a-b-0-0", "client-1-1")
        );
    }

    #[test]
    fn a_pod_whose_peer_is_unknown_is_passed_over_and_none_known_waits() {
        let mut pods = vec![on("a-b-0-0", "n1"), on("a-b-1-0", "n1")];
        pods[0].peer_pod = None;
        assert_eq!(
            pick_pair_to_rebalance(&facts(pods.clone(), 2)),
            recycle("a-b-1-0", "client-1-0")
        );
        // A peer of another gateway names no client deployment of ours.
        pods[1].peer_pod = Some("other-1-0-abc-def".into());
        assert_eq!(
            pick_pair_to_rebalance(&facts(pods, 2)),
            Rebalance::PeerUnknown { node: "n1".into() }
        );
    }

    #[test]
    fn a_crowded_node_without_known_peers_gives_way_to_the_next_crowded_one() {
        // Eight pods on six nodes, a share of 2: n1 and n2 hold 3 each; n1's peers are unknown.
        let mut pods = vec![
            on("g-0-0", "n1"),
            on("g-1-0", "n1"),
            on("g-2-0", "n1"),
            on("g-3-0", "n2"),
            on("g-4-0", "n2"),
            on("g-5-0", "n2"),
            on("g-6-0", "n3"),
            on("g-7-0", "n4"),
        ];
        for pod in &mut pods[..3] {
            pod.peer_pod = None;
        }
        assert_eq!(
            pick_pair_to_rebalance(&facts(pods, 6)),
            recycle("g-3-0", "client-3-0")
        );
    }
}
