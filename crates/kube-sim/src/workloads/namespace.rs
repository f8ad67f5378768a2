//! What kube-controller-manager puts in every namespace: the `default` ServiceAccount
//! (serviceaccounts-controller) and the `kube-root-ca.crt` ConfigMap holding the cluster CA
//! (root-ca-cert-publisher), created for namespaces that exist at start as for new ones.

use super::{Infos, PassReport, WorkloadError, all, deleting, name, opts, write_err};
use crate::cluster::Cluster;
use serde_json::json;

const MANAGER: &str = "kube-controller-manager";

/// Creates what is missing; a namespace being deleted gets nothing new.
pub(super) fn sync(
    cluster: &mut Cluster,
    i: &Infos,
    root_ca: &str,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    for ns in all(cluster, &i.namespaces) {
        if deleting(&ns) {
            continue;
        }
        let ns = name(&ns).to_string();
        let key = (ns.clone(), String::new());
        let sa_key = (key.0.clone(), "default".to_string());
        // `contains`, not `get`: a pass looks at every namespace, and `get` decodes the object.
        if !cluster
            .store
            .contains(&i.serviceaccounts.storage_key(), &sa_key)
        {
            let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "default", "namespace": ns}});
            cluster
                .create(&i.serviceaccounts, &ns, sa, &opts(MANAGER))
                .map_err(|e| write_err("a ServiceAccount", &e))?;
            report.writes += 1;
        }
        let cm_key = (key.0, "kube-root-ca.crt".to_string());
        if !cluster.store.contains(&i.configmaps.storage_key(), &cm_key) {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "kube-root-ca.crt", "namespace": ns,
                             "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                "data": {"ca.crt": root_ca}});
            cluster
                .create(&i.configmaps, &ns, cm, &opts("kube-root-ca-cert-publisher"))
                .map_err(|e| write_err("a ConfigMap", &e))?;
            report.writes += 1;
        }
    }
    Ok(())
}
