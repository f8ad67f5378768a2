//! kubectl with a ServiceAccount token over HTTPS.

use super::*;

/// Over HTTPS kubectl does send bearer tokens: a ServiceAccount's own kubeconfig works.
#[tokio::test]
async fn kubectl_with_a_service_account_token_over_https() {
    if !capstan_testkit::require("kubectl", capstan_testkit::on_path("kubectl")) {
        return;
    }
    let sim = common::start_with(kube_sim::Config {
        tls: true,
        auth: kube_sim::auth::AuthConfig {
            rbac: true,
            anonymous_requests: true,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let admin = sim.client().expect("admin");
    let apply = |v: serde_json::Value| {
        let admin = admin.clone();
        async move {
            let obj: kube::api::DynamicObject = serde_json::from_value(v).expect("object");
            let gvk = kube::api::GroupVersionKind::try_from(obj.types.as_ref().expect("types"))
                .expect("gvk");
            let (ar, _) = kube::discovery::pinned_kind(&admin, &gvk)
                .await
                .expect("discovered");
            let api: Api<kube::api::DynamicObject> = match obj.metadata.namespace.as_deref() {
                Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
                None => Api::all_with(admin.clone(), &ar),
            };
            api.create(&PostParams::default(), &obj)
                .await
                .expect("created");
        }
    };
    apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "reader", "namespace": "default"}}))
    .await;
    apply(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "reader", "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]}),
    )
    .await;
    apply(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "reader", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]}),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("reader.yaml");
    std::fs::write(
        &kubeconfig,
        sim.kubeconfig_yaml_with_token(&sim.service_account_token("default", "reader")),
    )
    .expect("kubeconfig");
    let kubectl = |args: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        async move {
            tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(args)
                .output()
                .await
                .expect("kubectl runs")
        }
    };
    let out = kubectl(&["auth", "can-i", "list", "configmaps"]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "yes");
    let out = kubectl(&["auth", "can-i", "delete", "configmaps"]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
    let out = kubectl(&["get", "configmaps"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl(&["get", "secrets"]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "secrets is forbidden: User \"system:serviceaccount:default:reader\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\""
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sim.shutdown().await;
}
