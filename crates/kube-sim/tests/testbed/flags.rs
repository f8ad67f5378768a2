//! The `kube-sim serve` binary takes every testbed feature from its flags.

use super::*;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test]
async fn the_binary_takes_every_testbed_feature_from_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "alice-token,alice,1001,\"viewers,dev\"\n").expect("tokens");
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["serve", "--addr", "127.0.0.1:0", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .arg("--token-file")
        .arg(&tokens)
        .args(["--authorization-mode", "RBAC", "--simulate-workloads"])
        .args(["--pod-cidr", "127.42.0.0/24", "--faults"])
        .arg(r#"{"seed":5,"errors":[{"verbs":["delete"],"resources":["secrets"],"rate":1.0,"code":500}]}"#)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kube-sim starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .await
        .expect("banner");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    let url = config.cluster_url.to_string();
    let admin = kube::Client::try_from(config).expect("admin client");

    // The admin of the written kubeconfig may do anything.
    let role: ClusterRole = serde_json::from_value(json!({"metadata": {"name": "cm-viewer"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}))
    .expect("role");
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": "viewers"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cm-viewer"},
        "subjects": [{"kind": "Group", "name": "viewers", "apiGroup": "rbac.authorization.k8s.io"}]}))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");

    // alice (token file) gets what her group is bound to.
    let mut alice_config = kube::Config::new(url.parse().expect("url"));
    alice_config.auth_info =
        serde_json::from_value(json!({"token": "alice-token"})).expect("auth info");
    let alice = kube::Client::try_from(alice_config).expect("alice");
    let cms: Api<ConfigMap> = Api::namespaced(alice.clone(), "default");
    cms.list(&ListParams::default()).await.expect("alice lists");
    let denied = cms
        .create(&PostParams::default(), &cm("x", "v"))
        .await
        .expect_err("alice may not create");
    assert!(
        matches!(denied, kube::Error::Api(s) if s.code == 403 && s.message.contains("User \"alice\" cannot create"))
    );

    // --faults: deleting secrets always fails with 500.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}})).expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create");
    let e = secrets
        .delete("s", &DeleteParams::default())
        .await
        .expect_err("injected");
    assert!(matches!(e, kube::Error::Api(s) if s.code == 500 && s.reason == "InternalError"));

    // --simulate-workloads with --pod-cidr: a bare Pod runs with an IP from the pool.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let ip = loop {
        let p = pods.get("p").await.expect("get");
        if let Some(ip) = p.status.and_then(|s| s.pod_ip) {
            break ip;
        }
        assert!(tokio::time::Instant::now() < deadline, "pod never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(ip, "127.42.0.1");

    // /metrics names the users.
    let metrics = admin
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("request"),
        )
        .await
        .expect("metrics");
    assert!(
        metrics.contains("user=\"alice\",code=\"403\"} 1"),
        "{metrics}"
    );
    child.start_kill().expect("kill");
    child.wait().await.expect("reaped");
}
