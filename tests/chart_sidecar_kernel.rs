//! The sidecars' kernel backend under the credentials the chart really gives it. The chart is
//! installed with Helm's library (standalone sidecar pod, both sidecars on the kernel backend);
//! each rendered container's command, args and security context are run the way runc applies
//! them: `setpriv` sets the uid/gid, the bounding set (drop ALL, add what the chart adds), no
//! inheritable or ambient capability (Kubernetes sets none), no_new_privs for
//! `allowPrivilegeEscalation: false`, then execs the binary inside a fresh network namespace (the
//! pod's). Each sidecar must change a route there through gRPC; the same credentials with UID
//! 65532 must make it refuse to start, naming CAP_NET_ADMIN.

use std::path::Path;
use std::time::Duration;

use capstan_proto::router::SliceGwConContext;
use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_proto::sidecar::SliceGwConnectionContext;
use capstan_proto::sidecar::gw_sidecar_service_client::GwSidecarServiceClient;
use capstan_scenarios::helm;
use capstan_scenarios::tools::binary;
use capstan_testkit::process::{BinaryUnderTest, TestingError};
use capstan_testkit::{on_path, require};
use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint};

const NS: &str = "capstan-system";
const UNPRIVILEGED_UID: u64 = 65532;

/// The process credentials a container gets from runc, as the rendered pod spec sets them.
#[derive(Debug, Clone)]
struct Credentials {
    uid: u64,
    gid: u64,
    /// Capabilities added to an empty set (the chart always drops ALL), e.g. `["NET_ADMIN"]`.
    added: Vec<String>,
    no_new_privs: bool,
}

impl Credentials {
    /// Container settings override the pod's; the kubelet refuses runAsNonRoot with UID 0.
    fn of(pod: &Value, container: &Value) -> Self {
        let pod_sc = &pod["securityContext"];
        let sc = &container["securityContext"];
        let pick = |field: &str| {
            let value = &sc[field];
            if value.is_null() {
                pod_sc[field].clone()
            } else {
                value.clone()
            }
        };
        let uid = pick("runAsUser").as_u64().expect("runAsUser set");
        let gid = pick("runAsGroup").as_u64().expect("runAsGroup set");
        assert!(
            !(pick("runAsNonRoot") == json!(true) && uid == 0),
            "the kubelet would refuse to start {}: runAsNonRoot with UID 0",
            container["name"]
        );
        assert_eq!(
            sc["capabilities"]["drop"],
            json!(["ALL"]),
            "{} drops every capability",
            container["name"]
        );
        let added = sc["capabilities"]["add"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c.as_str().expect("capability name").to_owned())
            .collect();
        Self {
            uid,
            gid,
            added,
            no_new_privs: sc["allowPrivilegeEscalation"] == json!(false),
        }
    }

    /// `setpriv` flags applying these credentials before exec.
    fn setpriv_args(&self) -> Vec<String> {
        let mut bounding = "-all".to_owned();
        for capability in &self.added {
            bounding.push_str(&format!(",+{}", capability.to_lowercase()));
        }
        let mut args = vec![
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
            "--clear-groups".to_owned(),
            format!("--bounding-set={bounding}"),
            "--inh-caps=-all".to_owned(),
        ];
        if self.no_new_privs {
            args.push("--no-new-privs".to_owned());
        }
        args
    }
}

/// A network namespace standing for the pod's, deleted on drop.
struct PodNetns {
    name: String,
}

impl PodNetns {
    fn create(tag: &str) -> Self {
        let netns = Self {
            name: format!("capstan-cred-{}-{tag}", std::process::id()),
        };
        ip(&["netns", "add", &netns.name]);
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// A veth pair with `name` addressed `address` and both ends up.
    fn link(&self, name: &str, address: &str) {
        let peer = format!("{name}-peer");
        self.ip(&["link", "add", name, "type", "veth", "peer", "name", &peer]);
        self.ip(&["addr", "add", address, "dev", name]);
        self.ip(&["link", "set", name, "up"]);
        self.ip(&["link", "set", &peer, "up"]);
    }

    /// `ip route show exact DST`, read independently of the sidecars.
    fn route(&self, dst: &str) -> String {
        self.ip(&["route", "show", "exact", dst])
    }

    /// A gRPC channel to `127.0.0.1:port` inside the namespace.
    async fn channel(&self, port: u16) -> Channel {
        let path = Path::new("/run/netns").join(&self.name);
        Endpoint::from_static("http://pod.invalid")
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    let stream = tokio::task::spawn_blocking(move || connect_in(&path, port))
                        .await
                        .map_err(std::io::Error::other)??;
                    stream.set_nonblocking(true)?;
                    let stream = tokio::net::TcpStream::from_std(stream)?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .expect("gRPC connection into the pod's namespace")
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Connects on a thread of its own that joins the namespace (a socket belongs to the namespace
/// it was created in; the thread then ends, so no pooled thread stays in it).
fn connect_in(netns: &Path, port: u16) -> std::io::Result<std::net::TcpStream> {
    let netns = netns.to_path_buf();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&netns)?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        std::net::TcpStream::connect(("127.0.0.1", port))
    })
    .join()
    .map_err(|_| std::io::Error::other("connect thread panicked"))?
}

fn ip(args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The rendered container `name` of the standalone sidecar Deployment, and its pod spec.
fn container<'a>(release: &'a Value, name: &str) -> (&'a Value, &'a Value) {
    let pod = release["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "capstan-sidecars")
        .map(|d| &d["spec"]["template"]["spec"])
        .expect("the standalone sidecar Deployment is rendered");
    let container = pod["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"));
    (pod, container)
}

/// Runs the rendered container in `netns` under `credentials`: its command (the image's
/// /usr/local/bin is this build's target folder), its args, its fieldRef env.
async fn run_container(
    netns: &PodNetns,
    container: &Value,
    credentials: &Credentials,
) -> Result<BinaryUnderTest, TestingError> {
    let command = container["command"][0].as_str().expect("command");
    let name = command.rsplit('/').next().expect("binary name");
    let program = binary("sidecar-shim", name);
    let mut args = vec!["netns".to_owned(), "exec".to_owned(), netns.name.clone()];
    args.push("setpriv".to_owned());
    args.extend(credentials.setpriv_args());
    args.push(program.display().to_string());
    args.extend(
        container["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_owned()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    BinaryUnderTest::spawn_with_env(
        "ip",
        &args,
        &[("POD_NAME", "sidecars-0"), ("POD_NAMESPACE", NS)],
    )
    .await
}

fn grpc_port(container: &Value, port_name: &str) -> u16 {
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == port_name)
        .and_then(|p| p["containerPort"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or_else(|| panic!("no port {port_name}"))
}

async fn stop(mut bin: BinaryUnderTest) {
    bin.sigterm().expect("SIGTERM");
    let status = bin.wait_exit(Duration::from_secs(15)).await.expect("exits");
    assert!(status.success(), "{}", bin.output().join("\n"));
}

/// With UID 65532 and otherwise the same credentials, the sidecar must not start.
async fn refuses_without_net_admin(container: &Value, credentials: &Credentials) {
    let unprivileged = Credentials {
        uid: UNPRIVILEGED_UID,
        ..credentials.clone()
    };
    let netns = PodNetns::create("nonroot");
    match run_container(&netns, container, &unprivileged).await {
        Err(TestingError::ExitedEarly { status, output }) => {
            assert!(
                status.is_some_and(|s| !s.success()),
                "{}: {status:?}",
                container["name"]
            );
            assert!(
                output.contains("needs CAP_NET_ADMIN") && output.contains("EPERM"),
                "{} as UID {UNPRIVILEGED_UID} must name CAP_NET_ADMIN:\n{output}",
                container["name"]
            );
        }
        Err(other) => panic!("{}: {other:?}", container["name"]),
        Ok(bin) => panic!(
            "{} started as UID {UNPRIVILEGED_UID} with {:?}:\n{}",
            container["name"],
            unprivileged.setpriv_args(),
            bin.output().join("\n")
        ),
    }
}

/// Values with the controllers off (they play no part here) and `sidecars`.
fn sidecars_only(sidecars: Value) -> Value {
    json!({
        "controllers": {
            "machineclass-controller": {"enabled": false},
            "machineset-controller": {"enabled": false},
            "nodeslo-controller": {"enabled": false}
        },
        "sidecars": sidecars
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_sidecars_work_under_the_charts_credentials_and_not_as_non_root() {
    if !require(
        "root, to create network namespaces",
        capstan_testkit::root(),
    ) || !require("iproute2", on_path("ip"))
        || !require("setpriv (util-linux)", on_path("setpriv"))
        || !helm::available().await
    {
        return;
    }
    let cluster = helm::cluster().await;
    let kernel = sidecars_only(json!({
        "router": {"backend": "kernel"},
        "gateway": {"backend": "kernel"},
        "standalone": {"enabled": true}
    }));
    let release = match helm::install(&cluster, "capstan", NS, &kernel).await {
        Ok(release) => release,
        Err(e) => panic!("install failed: {e:?}"),
    };
    let (pod, router) = container(&release, "router-sidecar");
    let (_, gateway) = container(&release, "gw-sidecar");
    let router_credentials = Credentials::of(pod, router);
    let gateway_credentials = Credentials::of(pod, gateway);
    assert_eq!(router_credentials.added, ["NET_ADMIN"]);
    assert_eq!(gateway_credentials.added, ["NET_ADMIN"]);
    assert!(router_credentials.no_new_privs && gateway_credentials.no_new_privs);
    for c in [router, gateway] {
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    }

    // Both containers in one pod namespace, as in the standalone Deployment.
    let netns = PodNetns::create("pod");
    netns.link("nsm0", "10.1.1.1/24");
    netns.link("vpn0", "10.9.0.1/24");
    let router_bin = run_container(&netns, router, &router_credentials)
        .await
        .expect("router-sidecar starts under the chart's credentials");
    let gateway_bin = run_container(&netns, gateway, &gateway_credentials)
        .await
        .expect("gw-sidecar starts under the chart's credentials");
    let output = || {
        format!(
            "--- router ---\n{}\n--- gateway ---\n{}",
            router_bin.output().join("\n"),
            gateway_bin.output().join("\n")
        )
    };

    let mut router_client =
        SliceRouterSidecarServiceClient::new(netns.channel(grpc_port(router, "router-grpc")).await);
    router_client
        .update_slice_gw_connection_context(SliceGwConContext {
            remote_slice_gw_nsm_subnet: "10.2.0.0/16".into(),
            local_nsm_gw_peer_ip_list: vec!["10.1.1.2".into()],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("router-sidecar route change: {e}\n{}", output()));
    let route = netns.route("10.2.0.0/16");
    assert!(route.contains("via 10.1.1.2"), "{route}\n{}", output());

    let mut gateway_client =
        GwSidecarServiceClient::new(netns.channel(grpc_port(gateway, "gw-grpc")).await);
    gateway_client
        .update_connection_context(SliceGwConnectionContext {
            remote_slice_gw_vpn_ip: "10.9.0.2".into(),
            remote_slice_gw_nsm_subnet: "10.3.0.0/16".into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("gw-sidecar route change: {e}\n{}", output()));
    let route = netns.route("10.3.0.0/16");
    assert!(route.contains("via 10.9.0.2"), "{route}\n{}", output());
    stop(router_bin).await;
    stop(gateway_bin).await;

    refuses_without_net_admin(router, &router_credentials).await;
    refuses_without_net_admin(gateway, &gateway_credentials).await;

    // The memory backend (the default) keeps the pod's UID 65532 and no capability at all.
    let memory = sidecars_only(json!({"standalone": {"enabled": true}}));
    let release = match helm::install(&cluster, "capstan", "memory", &memory).await {
        Ok(release) => release,
        Err(e) => panic!("install failed: {e:?}"),
    };
    for name in ["router-sidecar", "gw-sidecar"] {
        let (pod, c) = container(&release, name);
        let credentials = Credentials::of(pod, c);
        assert_eq!(credentials.uid, UNPRIVILEGED_UID, "{name}");
        assert!(credentials.added.is_empty(), "{name}: {credentials:?}");
    }
}
