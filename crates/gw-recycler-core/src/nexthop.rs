//! The slice router's next hops towards the remote subnet: the NSM IPs of gateway pods that carry
//! traffic (not excluded by a recycle, NSM interface up, tunnel UP), and when not to push them.
//! **Decision**: a pod without a `peerPodName` still carries traffic (recent KubeSlice releases
//! skip it): its sidecar's UP tunnel is the evidence, and the peer is asked only where the
//! SliceGateway has a remote VPN IP, which not every hub sets.

/// What the selection reads of one Running gateway pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatewayPodFacts {
    pub pod_name: String,
    /// Labelled `kubeslice.io/exclude-gw-route=true`.
    pub excluded: bool,
    /// The gateway sidecar's NSM IP (empty: not wired yet).
    pub nsm_ip: String,
    pub tunnel_up: bool,
    /// The pod's sidecar did not answer, and nothing is known of this pod incarnation (no earlier
    /// answer kept, nothing published for it): its NSM IP and tunnel are unknown, not absent.
    pub unanswered: bool,
}

/// What the router gets for one gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextHops {
    /// `UpdateSliceGwConnectionContext` with these NSM IPs, sorted and without duplicates.
    Push(Vec<String>),
    /// Nothing: no pod is known to carry traffic, but these pods' sidecars did not answer, so an
    /// empty list would withdraw the route because of a sidecar hiccup. The router keeps the list
    /// it has, as the reference's failed reconcile keeps it.
    Keep { unanswered: Vec<String> },
}

/// The next hops of `pods`. An empty list is pushed only when the sidecars said so (or no pod
/// could carry traffic at all), never because they did not answer.
pub fn next_hops(pods: &[GatewayPodFacts]) -> NextHops {
    let mut hops: Vec<String> = pods
        .iter()
        .filter(|p| !p.excluded && p.tunnel_up && !p.nsm_ip.is_empty())
        .map(|p| p.nsm_ip.clone())
        .collect();
    hops.sort();
    hops.dedup();
    let unanswered: Vec<String> = pods
        .iter()
        .filter(|p| !p.excluded && p.unanswered)
        .map(|p| p.pod_name.clone())
        .collect();
    if hops.is_empty() && !unanswered.is_empty() {
        return NextHops::Keep { unanswered };
    }
    NextHops::Push(hops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, nsm_ip: &str, excluded: bool, tunnel_up: bool) -> GatewayPodFacts {
        GatewayPodFacts {
            pod_name: name.into(),
            excluded,
            nsm_ip: nsm_ip.into(),
            tunnel_up,
            unanswered: false,
        }
    }

    fn unanswered(name: &str) -> GatewayPodFacts {
        GatewayPodFacts {
            unanswered: true,
            ..pod(name, "", false, false)
        }
    }

    fn push(hops: &[&str]) -> NextHops {
        NextHops::Push(hops.iter().map(|h| (*h).to_owned()).collect())
    }

    #[test]
    fn excludes_labelled_tunnel_down_and_unwired_pods() {
        let pods = [
            pod("keep-b", "10.1.0.3", false, true),
            pod("excluded", "10.1.0.4", true, true),
            pod("down", "10.1.0.5", false, false),
            pod("no-nsm", "", false, true),
            pod("keep-a", "10.1.0.2", false, true),
        ];
        assert_eq!(next_hops(&pods), push(&["10.1.0.2", "10.1.0.3"]));
    }

    #[test]
    fn nothing_eligible_is_an_empty_list() {
        assert_eq!(next_hops(&[pod("x", "10.0.0.1", true, true)]), push(&[]));
        assert_eq!(next_hops(&[]), push(&[]));
        // Sidecars that answered DOWN, or no NSM IP yet, said so: the route goes.
        let said_so = [
            pod("down", "10.0.0.1", false, false),
            pod("new", "", false, true),
        ];
        assert_eq!(next_hops(&said_so), push(&[]));
    }

    #[test]
    fn sidecars_that_did_not_answer_never_empty_the_list() {
        let all_silent = [unanswered("gw-0"), unanswered("gw-1")];
        assert_eq!(
            next_hops(&all_silent),
            NextHops::Keep {
                unanswered: vec!["gw-0".into(), "gw-1".into()]
            }
        );
        // One DOWN, one silent: still not known to be empty.
        let one_down = [pod("gw-0", "10.0.0.1", false, false), unanswered("gw-1")];
        assert!(matches!(next_hops(&one_down), NextHops::Keep { .. }));
        // A silent pod next to one carrying traffic does not hold the list back: it is not in it
        // until its sidecar answers (a pod coming up).
        let one_up = [pod("gw-0", "10.0.0.1", false, true), unanswered("gw-1")];
        assert_eq!(next_hops(&one_up), push(&["10.0.0.1"]));
        // An excluded pod's silence does not matter: it is never a hop.
        let excluded_silent = [GatewayPodFacts {
            excluded: true,
            ..unanswered("old")
        }];
        assert_eq!(next_hops(&excluded_silent), push(&[]));
    }
}
