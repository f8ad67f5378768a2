//! Authorization: a ServiceAccount can do exactly what its Role grants.

use super::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

fn status(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn setup(sim: &kube_sim::KubeSim) {
    let admin = sim.client().expect("admin client");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).expect("ns");
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "bot"}})).expect("sa");
    Api::<ServiceAccount>::namespaced(admin.clone(), "team")
        .create(&PostParams::default(), &sa)
        .await
        .expect("service account");
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "bot"},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"], "resourceNames": ["web"]},
            {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
        ]
    }))
    .expect("role");
    Api::<Role>::namespaced(admin.clone(), "team")
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bot"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bot"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "team"}]
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(admin.clone(), "team")
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    Api::<ConfigMap>::namespaced(admin, "team")
        .create(&PostParams::default(), &cm("visible", "v"))
        .await
        .expect("configmap");
}

#[tokio::test]
async fn a_service_account_can_do_exactly_what_its_role_grants() {
    let sim = common::start_with(kube_sim::Config {
        auth: kube_sim::auth::AuthConfig {
            rbac: true,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    setup(&sim).await;
    let bot = sim
        .client_with_token(&sim.service_account_token("team", "bot"))
        .expect("bot client");
    let cms: Api<ConfigMap> = Api::namespaced(bot.clone(), "team");
    assert_eq!(
        cms.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    cms.get("visible").await.expect("get");
    let denied = status(
        cms.create(&PostParams::default(), &cm("new", "v"))
            .await
            .expect_err("create is not granted"),
    );
    assert_eq!((denied.code, denied.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        denied.message,
        "configmaps is forbidden: User \"system:serviceaccount:team:bot\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"team\""
    );
    let denied = status(
        cms.delete("visible", &DeleteParams::default())
            .await
            .expect_err("delete is not granted"),
    );
    assert_eq!(
        denied.message,
        "configmaps \"visible\" is forbidden: User \"system:serviceaccount:team:bot\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"team\""
    );
    let other: Api<ConfigMap> = Api::namespaced(bot.clone(), "default");
    assert_eq!(
        status(
            other
                .list(&ListParams::default())
                .await
                .expect_err("other ns")
        )
        .code,
        403
    );
    let nodes: Api<Node> = Api::all(bot.clone());
    assert_eq!(
        status(
            nodes
                .list(&ListParams::default())
                .await
                .expect_err("cluster scope")
        )
        .message,
        "nodes is forbidden: User \"system:serviceaccount:team:bot\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
    );
    // resourceNames: the patch reaches the store only for "web" (which does not exist: 404).
    let deploys: Api<Deployment> = Api::namespaced(bot.clone(), "team");
    let patch = Patch::Merge(json!({"spec": {"replicas": 2}}));
    assert_eq!(
        status(
            deploys
                .patch("web", &PatchParams::default(), &patch)
                .await
                .expect_err("absent")
        )
        .code,
        404
    );
    assert_eq!(
        status(
            deploys
                .patch("api", &PatchParams::default(), &patch)
                .await
                .expect_err("not named")
        )
        .code,
        403
    );
    // A token for a ServiceAccount that does not exist, and a made-up token: 401.
    let ghost = sim
        .client_with_token(&sim.service_account_token("team", "ghost"))
        .expect("client");
    let e = status(
        Api::<ConfigMap>::namespaced(ghost, "team")
            .list(&ListParams::default())
            .await
            .expect_err("unknown service account"),
    );
    assert_eq!(e.code, 401);
    // The generated kubeconfig's admin may do anything, and the counters name the users.
    Api::<ConfigMap>::namespaced(sim.client().expect("admin"), "team")
        .create(&PostParams::default(), &cm("by-admin", "v"))
        .await
        .expect("admin creates");
    let stats = sim.requests();
    assert_eq!(
        stats.count_where(|k| k.user == "system:serviceaccount:team:bot" && k.code == 403),
        5
    );
    assert!(stats.count_where(|k| k.user == "kube-sim-admin" && k.verb == "create") >= 5);

    // kubectl auth can-i agrees, through SelfSubjectAccessReview.
    if !capstan_testkit::require(
        "kubectl (for its kubectl part)",
        capstan_testkit::on_path("kubectl"),
    ) {
        sim.shutdown().await;
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // client-go sends no bearer token over plain HTTP: kubectl is the admin and asks as the
    // ServiceAccount by impersonation.
    let kubeconfig = dir.path().join("admin.yaml");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let cases: [(&[&str], bool); 8] = [
        (&["list", "configmaps"], true),
        (&["get", "configmaps/visible"], true),
        (&["create", "configmaps"], false),
        (&["delete", "configmaps"], false),
        (&["patch", "deployments.apps/web"], true),
        (&["patch", "deployments.apps/api"], false),
        (&["create", "pods", "--subresource=eviction"], true),
        (&["create", "pods"], false),
    ];
    for (args, want) in cases {
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args([
                "auth",
                "can-i",
                "--as",
                "system:serviceaccount:team:bot",
                "-n",
                "team",
            ])
            .args(args)
            .output()
            .await
            .expect("kubectl runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            (stdout.trim(), out.status.success()),
            (if want { "yes" } else { "no" }, want),
            "kubectl auth can-i {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["auth", "can-i", "list", "configmaps", "-n", "default"])
        .args(["--as", "system:serviceaccount:team:bot"])
        .output()
        .await
        .expect("kubectl runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
    // The admin itself may do anything.
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["auth", "can-i", "delete", "nodes"])
        .output()
        .await
        .expect("kubectl runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "yes");
    // The bot may not impersonate anyone.
    let token = sim.service_account_token("team", "bot");
    let addr = sim.addr();
    let body = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        write!(
            s,
            "GET /api/v1/namespaces/team/configmaps HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nImpersonate-User: alice\r\n\r\n"
        )
        .expect("request");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("response");
        out
    })
    .await
    .expect("raw request");
    let json_start = body.find("\r\n\r\n").expect("headers end") + 4;
    let e: kube::core::Status = serde_json::from_str(&body[json_start..]).expect("a Status body");
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        "users \"alice\" is forbidden: User \"system:serviceaccount:team:bot\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
    );
    sim.shutdown().await;
}
