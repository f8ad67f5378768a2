//! Flag and environment parsing. Each case runs in a child copy of this test binary with a
//! controlled environment, because the environment is process-global (and `set_var` is unsafe).

use std::process::Command;

use capstan_runtime::cli::{CommonArgs, LogFormat};
use capstan_testkit::process::COMMON_ENV_VARS;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "cli-test")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
}

const CHILD_MARKER: &str = "CAPSTAN_CLI_TEST_CHILD";

/// Runs `test` in a child with only `envs` among the common variables; returns true in the child.
fn in_child(test: &str, envs: &[(&str, &str)]) -> bool {
    if std::env::var_os(CHILD_MARKER).is_some() {
        return true;
    }
    let mut command = Command::new(std::env::current_exe().expect("test binary path"));
    command
        .args([test, "--exact", "--test-threads=1"])
        .env(CHILD_MARKER, "1");
    for var in COMMON_ENV_VARS {
        command.env_remove(var);
    }
    command.envs(envs.iter().copied());
    let output = command.output().expect("child runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child {test} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    false
}

fn parse(args: &[&str]) -> Result<CommonArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("cli-test").chain(args.iter().copied())).map(|c| c.common)
}

#[test]
fn defaults() {
    if !in_child("defaults", &[]) {
        return;
    }
    let args = parse(&[]).expect("parses");
    assert_eq!(args.kubeconfig, None);
    assert_eq!(args.metrics_addr, "0.0.0.0:8080".parse().expect("addr"));
    assert_eq!(args.log_format, LogFormat::Text);
    assert_eq!(args.log_level, "info");
    assert_eq!(args.otlp_endpoint, None);
    assert!(!args.leader.leader_elect);
    assert_eq!(
        args.leader.lease_name_or("machineclass-controller"),
        "machineclass-controller"
    );
    assert_eq!(args.leader.lease_namespace, "default");
    assert_eq!(args.leader.lease_duration_seconds, 15);
    assert_eq!(args.leader.lease_grace_seconds, 5);
    assert!(
        !args.leader.holder_identity().is_empty(),
        "falls back to the host name"
    );
    args.leader.validate().expect("defaults are valid");
    assert_eq!(
        args,
        CommonArgs::default(),
        "Default matches the flag defaults"
    );
}

#[test]
fn flags() {
    if !in_child("flags", &[]) {
        return;
    }
    let args = parse(&[
        "--kubeconfig",
        "/etc/kube/config",
        "--metrics-addr",
        "127.0.0.1:0",
        "--log-format",
        "json",
        "--log-level",
        "info,kube=debug",
        "--otlp-endpoint",
        "http://collector:4317",
        "--leader-elect",
        "--lease-name",
        "mcm",
        "--lease-namespace",
        "capstan-system",
        "--lease-duration-seconds",
        "20",
        "--lease-grace-seconds",
        "4",
        "--lease-identity",
        "replica-a",
    ])
    .expect("parses");
    assert_eq!(
        args.kubeconfig.as_deref(),
        Some(std::path::Path::new("/etc/kube/config"))
    );
    assert_eq!(args.metrics_addr.port(), 0, "port 0 is allowed");
    assert_eq!(args.log_format, LogFormat::Json);
    assert_eq!(args.log_level, "info,kube=debug");
    assert_eq!(args.otlp_endpoint.as_deref(), Some("http://collector:4317"));
    assert!(args.leader.leader_elect, "a bare --leader-elect means true");
    assert_eq!(args.leader.lease_name_or("ignored"), "mcm");
    assert_eq!(args.leader.lease_namespace, "capstan-system");
    assert_eq!(args.leader.lease_duration_seconds, 20);
    assert_eq!(args.leader.lease_grace_seconds, 4);
    assert_eq!(args.leader.holder_identity(), "replica-a");

    assert!(
        !parse(&["--leader-elect=false"])
            .expect("parses")
            .leader
            .leader_elect
    );
    assert!(
        parse(&["--leader-elect=true"])
            .expect("parses")
            .leader
            .leader_elect
    );
    assert!(parse(&["--log-format", "xml"]).is_err());
    assert!(parse(&["--metrics-addr", "localhost"]).is_err());
}

#[test]
fn environment() {
    let envs = [
        ("KUBECONFIG", "/from/env"),
        ("METRICS_ADDR", "127.0.0.1:9999"),
        ("LOG_FORMAT", "json"),
        ("LOG_LEVEL", "debug"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4317"),
        ("LEADER_ELECT", "true"),
        ("LEASE_NAME", "nodeslo"),
        ("POD_NAMESPACE", "koordinator-system"),
        ("POD_NAME", "nodeslo-7f9c-abcde"),
        ("LEASE_DURATION_SECONDS", "30"),
        ("LEASE_GRACE_SECONDS", "10"),
    ];
    if !in_child("environment", &envs) {
        return;
    }
    let args = parse(&[]).expect("parses");
    assert_eq!(
        args.kubeconfig.as_deref(),
        Some(std::path::Path::new("/from/env"))
    );
    assert_eq!(args.metrics_addr, "127.0.0.1:9999".parse().expect("addr"));
    assert_eq!(args.log_format, LogFormat::Json);
    assert_eq!(args.log_level, "debug");
    assert_eq!(args.otlp_endpoint.as_deref(), Some("http://otel:4317"));
    assert!(args.leader.leader_elect);
    assert_eq!(args.leader.lease_name_or("default-name"), "nodeslo");
    assert_eq!(args.leader.lease_namespace, "koordinator-system");
    assert_eq!(args.leader.holder_identity(), "nodeslo-7f9c-abcde");
    assert_eq!(args.leader.lease_duration_seconds, 30);
    assert_eq!(args.leader.lease_grace_seconds, 10);

    // A flag wins over its variable.
    let args = parse(&["--metrics-addr", "127.0.0.1:0", "--log-format", "text"]).expect("parses");
    assert_eq!(args.metrics_addr.port(), 0);
    assert_eq!(args.log_format, LogFormat::Text);
}

#[test]
fn leader_elect_accepts_boolish_env_values() {
    if !in_child(
        "leader_elect_accepts_boolish_env_values",
        &[("LEADER_ELECT", "1")],
    ) {
        return;
    }
    assert!(parse(&[]).expect("parses").leader.leader_elect);
}

#[test]
fn invalid_lease_timing_is_rejected() {
    if !in_child("invalid_lease_timing_is_rejected", &[]) {
        return;
    }
    let args = parse(&[
        "--lease-duration-seconds",
        "5",
        "--lease-grace-seconds",
        "5",
    ])
    .expect("parses");
    assert!(args.leader.validate().is_err());
    let args = parse(&["--lease-grace-seconds", "0"]).expect("parses");
    assert!(args.leader.validate().is_err());
}

#[tokio::test]
async fn kube_client_reads_an_explicit_kubeconfig() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("config");
    std::fs::write(
        &path,
        r#"apiVersion: v1
kind: Config
clusters:
- name: sim
  cluster:
    server: http://127.0.0.1:1
contexts:
- name: sim
  context:
    cluster: sim
    user: dev
    namespace: capstan
current-context: sim
users:
- name: dev
  user:
    token: dev-token
"#,
    )
    .expect("writes kubeconfig");
    let mut args = parse(&[]).expect("parses");
    args.kubeconfig = Some(path);
    let client = args.kube_client().await.expect("client from kubeconfig");
    assert_eq!(client.default_namespace(), "capstan");

    args.kubeconfig = Some(dir.path().join("missing"));
    let Err(error) = args.kube_client().await else {
        panic!("a missing kubeconfig must fail");
    };
    assert!(
        matches!(error, capstan_runtime::RuntimeError::KubeconfigRead { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn kube_client_merges_a_kubeconfig_path_list() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clusters = dir.path().join("clusters");
    let users = dir.path().join("users");
    // The current context is named in the first file and defined in the second: only a merge
    // resolves it.
    std::fs::write(
        &clusters,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: hub\n  cluster:\n    server: http://127.0.0.1:1\ncurrent-context: hub\n",
    )
    .expect("writes");
    std::fs::write(
        &users,
        "apiVersion: v1\nkind: Config\ncontexts:\n- name: hub\n  context:\n    cluster: hub\n    user: admin\n    namespace: kubeslice-demo\nusers:\n- name: admin\n  user:\n    token: t\n",
    )
    .expect("writes");
    let list = std::env::join_paths([&clusters, &users]).expect("joinable");
    let mut args = parse(&[]).expect("parses");
    args.kubeconfig = Some(list.into());
    let client = args.kube_client().await.expect("merged kubeconfig");
    assert_eq!(client.default_namespace(), "kubeslice-demo");
}
