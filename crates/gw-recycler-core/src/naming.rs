//! Gateway Deployment names: `<slicegw>-<instance>-<generation>`, the generation flipping
//! between 0 and 1 on each recycle.

/// The name of the deployment that replaces `dep`: the last `-` segment `0` becomes `1`, anything
/// else becomes `0` (the reference's rule, so `x-1-7` -> `x-1-0`).
pub fn next_deployment_name(dep: &str) -> String {
    let (prefix, last) = match dep.rsplit_once('-') {
        Some((prefix, last)) => (prefix, last),
        None => return format!("{dep}-0"),
    };
    let flipped = if last == "0" { "1" } else { "0" };
    format!("{prefix}-{flipped}")
}

/// `<slicegw>-<instance>-<generation>`.
pub fn deployment_name(slicegw: &str, instance: u32, generation: u32) -> String {
    format!("{slicegw}-{instance}-{generation}")
}

/// The instance number of `dep` when it is a gateway deployment of `slicegw`.
pub fn instance_of(slicegw: &str, dep: &str) -> Option<u32> {
    let rest = dep.strip_prefix(slicegw)?.strip_prefix('-')?;
    let (instance, generation) = rest.split_once('-')?;
    generation.parse::<u32>().ok()?;
    instance.parse().ok()
}

/// The gateway deployment of `slicegw` a pod named `pod` belongs to: pods of a Deployment are
/// named `<deployment>-<replicaset hash>-<suffix>`, so the two segments after `<slicegw>-` (the
/// instance and generation, both numbers) name it. How the reference reads a peer's deployment
/// from the `peerPodName` its gateway sidecar reported.
pub fn deployment_of_pod(slicegw: &str, pod: &str) -> Option<String> {
    let rest = pod.strip_prefix(slicegw)?.strip_prefix('-')?;
    let mut segments = rest.split('-');
    let instance: u32 = segments.next()?.parse().ok()?;
    let generation: u32 = segments.next()?.parse().ok()?;
    Some(deployment_name(slicegw, instance, generation))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_flip_matches_the_reference_examples() {
        assert_eq!(next_deployment_name("a-b-0-0"), "a-b-0-1");
        assert_eq!(next_deployment_name("a-b-0-1"), "a-b-0-0");
        assert_eq!(next_deployment_name("a-b-1-5"), "a-b-1-0");
        assert_eq!(next_deployment_name("x-0-0"), "x-0-1");
        assert_eq!(next_deployment_name("x-0-1"), "x-0-0");
        assert_eq!(next_deployment_name("x-1-7"), "x-1-0");
    }

    #[test]
    fn flipping_twice_returns_to_a_zero_or_one_name() {
        assert_eq!(
            next_deployment_name(&next_deployment_name("g-3-0")),
            "g-3-0"
        );
        assert_eq!(next_deployment_name("plain"), "plain-0");
    }

    #[test]
    fn instances_parse_only_for_their_gateway() {
        assert_eq!(deployment_name("red-a-b", 1, 0), "red-a-b-1-0");
        assert_eq!(instance_of("red-a-b", "red-a-b-1-0"), Some(1));
        assert_eq!(instance_of("red-a-b", "red-a-b-0-1"), Some(0));
        assert_eq!(instance_of("red-a", "red-a-b-0-1"), None);
        assert_eq!(instance_of("red-a-b", "red-a-b-x-1"), None);
        assert_eq!(instance_of("red-a-b", "red-a-b-0"), None);
    }

    #[test]
    fn a_pods_deployment_is_read_from_its_name() {
        assert_eq!(
            deployment_of_pod("red-b-a", "red-b-a-1-0-7d9f8c6b5-x2k4q").as_deref(),
            Some("red-b-a-1-0")
        );
        assert_eq!(
            deployment_of_pod("red-b-a", "red-b-a-0-1-abc").as_deref(),
            Some("red-b-a-0-1")
        );
        // Another gateway's pod, or a name that is not `<slicegw>-<n>-<n>-...`.
        assert_eq!(deployment_of_pod("red-b-a", "red-a-b-0-0-abc-xyz"), None);
        assert_eq!(deployment_of_pod("red-b", "red-b-a-0-0-abc-xyz"), None);
        assert_eq!(deployment_of_pod("red-b-a", "red-b-a-x-0-abc"), None);
        assert_eq!(deployment_of_pod("red-b-a", "red-b-a-0"), None);
        assert_eq!(deployment_of_pod("red-b-a", ""), None);
    }
}
