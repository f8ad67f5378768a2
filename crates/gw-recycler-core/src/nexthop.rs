//! The slice router's next hops towards the remote subnet: the NSM IPs of gateway pods that carry
//! traffic (not excluded by a recycle, NSM interface up, tunnel UP).

/// What the selection reads of one Running gateway pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatewayPodFacts {
    pub pod_name: String,
    /// Labelled `kubeslice.io/exclude-gw-route=true`.
    pub excluded: bool,
    /// The gateway sidecar's NSM IP (empty: not wired yet).
    pub nsm_ip: String,
    pub tunnel_up: bool,
}

/// The next-hop list for `UpdateSliceGwConnectionContext`, sorted and without duplicates.
pub fn next_hops(pods: &[GatewayPodFacts]) -> Vec<String> {
    let mut hops: Vec<String> = pods
        .iter()
        .filter(|p| !p.excluded && p.tunnel_up && !p.nsm_ip.is_empty())
        .map(|p| p.nsm_ip.clone())
        .collect();
    hops.sort();
    hops.dedup();
    hops
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
        }
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
        assert_eq!(next_hops(&pods), ["10.1.0.2", "10.1.0.3"]);
    }

    #[test]
    fn nothing_eligible_is_an_empty_list() {
        assert!(next_hops(&[pod("x", "10.0.0.1", true, true)]).is_empty());
        assert!(next_hops(&[]).is_empty());
    }
}
