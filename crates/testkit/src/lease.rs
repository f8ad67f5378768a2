//! Leader-election Leases as a test sees them: who holds one, and another holder taking it over
//! (as after a partition where the leader's renewals did not land), so the leader-election
//! suites read and steal a Lease one way.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{Patch, PatchParams};

/// The holder identity of Lease `name` in `leases`; `None` when it is released. Panics when the
/// Lease does not exist (a released Lease stays, holder-less) or the API fails.
pub async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get Lease {name}: {e}"))
        .spec
        .and_then(|spec| spec.holder_identity)
}

/// Waits until Lease `name` exists and `identity` holds it, panicking after `timeout`.
pub async fn wait_for_holder(leases: &Api<Lease>, name: &str, identity: &str, timeout: Duration) {
    let what = format!("Lease {name} held by {identity}");
    crate::eventually(&what, timeout, || async {
        let lease = leases.get_opt(name).await.ok()??;
        (lease.spec?.holder_identity.as_deref() == Some(identity)).then_some(())
    })
    .await;
}

/// `identity` takes Lease `name` over: holder, a fresh renew time and a 30 s duration, so the
/// former holder's next renewal finds it held by someone else.
pub async fn take_over(leases: &Api<Lease>, name: &str, identity: &str) {
    let takeover = serde_json::json!({
        "spec": {
            "holderIdentity": identity,
            "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
            "leaseDurationSeconds": 30,
        }
    });
    leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&takeover))
        .await
        .unwrap_or_else(|e| panic!("take Lease {name} over as {identity}: {e}"));
}
