//! A newcomer's first kubectl commands against kube-sim: kubectl's typed clients send protobuf
//! bodies (`kubectl create ...`, `run`, `drain`'s evictions, DeleteOptions) and ask for protobuf
//! answers; every built-in group is discoverable. kubectl must be installed: these tests fail,
//! not skip, without it.

mod common;

use common::kubectl::Kubectl;
use std::time::Duration;

async fn sim_with_workloads() -> kube_sim::KubeSim {
    common::start_with(kube_sim::Config {
        simulate_workloads: true,
        ..Default::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_of_every_kind_a_newcomer_tries() {
    let sim = sim_with_workloads().await;
    let k = Kubectl::new(&sim);
    for (args, printed) in [
        (
            &["create", "deployment", "web", "--image=nginx"][..],
            "deployment.apps/web created",
        ),
        (
            &["create", "job", "once", "--image=busybox"],
            "job.batch/once created",
        ),
        (
            &[
                "create",
                "cronjob",
                "tick",
                "--image=busybox",
                "--schedule=*/5 * * * *",
            ],
            "cronjob.batch/tick created",
        ),
        (
            &["create", "service", "clusterip", "web", "--tcp=80:8080"],
            "service/web created",
        ),
        (
            &[
                "create",
                "role",
                "reader",
                "--verb=get,list",
                "--resource=pods",
            ],
            "role.rbac.authorization.k8s.io/reader created",
        ),
        (
            &[
                "create",
                "rolebinding",
                "reader",
                "--role=reader",
                "--user=bob",
            ],
            "rolebinding.rbac.authorization.k8s.io/reader created",
        ),
        (
            &[
                "create",
                "priorityclass",
                "high",
                "--value=1000",
                "--description=important",
            ],
            "priorityclass.scheduling.k8s.io/high created",
        ),
        (
            &[
                "create",
                "poddisruptionbudget",
                "web",
                "--selector=app=web",
                "--min-available=1",
            ],
            "poddisruptionbudget.policy/web created",
        ),
        (
            &["run", "solo", "--image=nginx", "--port=80", "--env=A=b"],
            "pod/solo created",
        ),
    ] {
        let out = k.ok(args).await;
        assert_eq!(out.trim(), printed, "kubectl {args:?}");
    }
    // What the protobuf bodies carried arrived as JSON with kube-apiserver's field names.
    let deploy = k.json(&["get", "deployment", "web"]).await;
    assert_eq!(
        deploy["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx"
    );
    assert_eq!(deploy["spec"]["selector"]["matchLabels"]["app"], "web");
    let job = k.json(&["get", "job", "once"]).await;
    assert_eq!(job["spec"]["template"]["spec"]["restartPolicy"], "Never");
    let cron = k.json(&["get", "cronjob", "tick"]).await;
    assert_eq!(cron["spec"]["schedule"], "*/5 * * * *");
    let svc = k.json(&["get", "service", "web"]).await;
    assert_eq!(svc["spec"]["ports"][0]["port"], 80);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080);
    let role = k.json(&["get", "role", "reader"]).await;
    assert_eq!(
        role["rules"][0]["verbs"],
        serde_json::json!(["get", "list"])
    );
    let binding = k.json(&["get", "rolebinding", "reader"]).await;
    assert_eq!(binding["subjects"][0]["name"], "bob");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    let pc = k.json(&["get", "priorityclass", "high"]).await;
    assert_eq!(
        (pc["value"].as_i64(), pc["description"].as_str()),
        (Some(1000), Some("important"))
    );
    let pdb = k.json(&["get", "pdb", "web"]).await;
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    let pod = k.json(&["get", "pod", "solo"]).await;
    let c = &pod["spec"]["containers"][0];
    assert_eq!(
        (
            c["ports"][0]["containerPort"].as_i64(),
            &c["env"][0]["value"]
        ),
        (Some(80), &serde_json::json!("b"))
    );
    // Typed reads in protobuf (kubectl asks for it first) print like JSON ones.
    let names = k
        .ok(&["get", "cronjobs,jobs,pdb,priorityclass", "-o", "name"])
        .await;
    for n in [
        "cronjob.batch/tick",
        "job.batch/once",
        "poddisruptionbudget.policy/web",
        "priorityclass.scheduling.k8s.io/high",
    ] {
        assert!(names.contains(n), "{n} in {names}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_rollout_cordon_drain_and_foreground_delete() {
    let sim = sim_with_workloads().await;
    let k = Kubectl::new(&sim);
    k.ok(&["create", "deployment", "web", "--image=nginx"])
        .await;
    assert_eq!(
        k.ok(&["scale", "deployment", "web", "--replicas=3"])
            .await
            .trim(),
        "deployment.apps/web scaled"
    );
    assert_eq!(
        k.ok(&["rollout", "restart", "deployment", "web"])
            .await
            .trim(),
        "deployment.apps/web restarted"
    );
    let status = k
        .ok(&["rollout", "status", "deployment", "web", "--timeout=30s"])
        .await;
    assert!(status.contains("successfully rolled out"), "{status}");
    let undo = k.run(&["rollout", "undo", "deployment", "web"]).await;
    assert!(
        undo.ok && undo.stdout.starts_with("deployment.apps/web"),
        "{} {}",
        undo.stdout,
        undo.stderr
    );

    let node = k.file(
        "node.yaml",
        "apiVersion: v1\nkind: Node\nmetadata: {name: worker-1}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: lone, namespace: default}\nspec:\n  nodeName: worker-1\n  containers: [{name: c, image: nginx}]\n",
    );
    k.ok(&["apply", "-f", &node]).await;
    assert_eq!(
        k.ok(&["cordon", "worker-1"]).await.trim(),
        "node/worker-1 cordoned"
    );
    let n = k.json(&["get", "node", "worker-1"]).await;
    assert_eq!(n["spec"]["unschedulable"], true);
    // The pod has no controller: drain refuses without --force, as against a real cluster.
    let refused = k.run(&["drain", "worker-1", "--timeout=20s"]).await;
    assert!(
        !refused.ok
            && refused
                .stderr
                .contains("cannot delete Pods that declare no controller"),
        "{}",
        refused.stderr
    );
    let drained = k
        .ok(&["drain", "worker-1", "--force", "--timeout=20s"])
        .await;
    assert!(
        drained.contains("pod/lone evicted") && drained.contains("node/worker-1 drained"),
        "{drained}"
    );
    assert!(
        !k.run(&["get", "pod", "lone"]).await.ok,
        "the evicted pod is gone"
    );

    let deleted = k
        .ok(&[
            "delete",
            "deployment",
            "web",
            "--cascade=foreground",
            "--timeout=30s",
        ])
        .await;
    assert_eq!(deleted.trim(), "deployment.apps \"web\" deleted");
    for _ in 0..50 {
        if k.ok(&["get", "replicasets,deployments", "-o", "name"])
            .await
            .trim()
            .is_empty()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("foreground deletion left the deployment or its replicasets behind");
}

/// `kubectl api-resources` against kube-apiserver 1.33 (kind cluster, default feature gates),
/// less what kube-sim does not serve: `bindings`, `componentstatuses`, and the create-only
/// reviews of authentication.k8s.io and authorization.k8s.io.
const API_RESOURCES_1_33: &str = "
configmaps cm v1 true ConfigMap
endpoints ep v1 true Endpoints
events ev v1 true Event
limitranges limits v1 true LimitRange
namespaces ns v1 false Namespace
nodes no v1 false Node
persistentvolumeclaims pvc v1 true PersistentVolumeClaim
persistentvolumes pv v1 false PersistentVolume
pods po v1 true Pod
podtemplates - v1 true PodTemplate
replicationcontrollers rc v1 true ReplicationController
resourcequotas quota v1 true ResourceQuota
secrets - v1 true Secret
serviceaccounts sa v1 true ServiceAccount
services svc v1 true Service
mutatingwebhookconfigurations - admissionregistration.k8s.io/v1 false MutatingWebhookConfiguration
validatingadmissionpolicies - admissionregistration.k8s.io/v1 false ValidatingAdmissionPolicy
validatingadmissionpolicybindings - admissionregistration.k8s.io/v1 false ValidatingAdmissionPolicyBinding
validatingwebhookconfigurations - admissionregistration.k8s.io/v1 false ValidatingWebhookConfiguration
customresourcedefinitions crd,crds apiextensions.k8s.io/v1 false CustomResourceDefinition
apiservices - apiregistration.k8s.io/v1 false APIService
controllerrevisions - apps/v1 true ControllerRevision
daemonsets ds apps/v1 true DaemonSet
deployments deploy apps/v1 true Deployment
replicasets rs apps/v1 true ReplicaSet
statefulsets sts apps/v1 true StatefulSet
horizontalpodautoscalers hpa autoscaling/v2 true HorizontalPodAutoscaler
cronjobs cj batch/v1 true CronJob
jobs - batch/v1 true Job
certificatesigningrequests csr certificates.k8s.io/v1 false CertificateSigningRequest
leases - coordination.k8s.io/v1 true Lease
endpointslices - discovery.k8s.io/v1 true EndpointSlice
events ev events.k8s.io/v1 true Event
flowschemas - flowcontrol.apiserver.k8s.io/v1 false FlowSchema
prioritylevelconfigurations - flowcontrol.apiserver.k8s.io/v1 false PriorityLevelConfiguration
ingressclasses - networking.k8s.io/v1 false IngressClass
ingresses ing networking.k8s.io/v1 true Ingress
ipaddresses ip networking.k8s.io/v1 false IPAddress
networkpolicies netpol networking.k8s.io/v1 true NetworkPolicy
servicecidrs - networking.k8s.io/v1 false ServiceCIDR
runtimeclasses - node.k8s.io/v1 false RuntimeClass
poddisruptionbudgets pdb policy/v1 true PodDisruptionBudget
clusterrolebindings - rbac.authorization.k8s.io/v1 false ClusterRoleBinding
clusterroles - rbac.authorization.k8s.io/v1 false ClusterRole
rolebindings - rbac.authorization.k8s.io/v1 true RoleBinding
roles - rbac.authorization.k8s.io/v1 true Role
priorityclasses pc scheduling.k8s.io/v1 false PriorityClass
csidrivers - storage.k8s.io/v1 false CSIDriver
csinodes - storage.k8s.io/v1 false CSINode
csistoragecapacities - storage.k8s.io/v1 true CSIStorageCapacity
storageclasses sc storage.k8s.io/v1 false StorageClass
volumeattachments - storage.k8s.io/v1 false VolumeAttachment
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_resources_lists_every_built_in_group() {
    let sim = common::start().await;
    let k = Kubectl::new(&sim);
    let out = k.ok(&["api-resources", "--no-headers"]).await;
    let got: Vec<String> = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Rows without short names have four columns.
            if f.len() == 4 {
                format!("{} - {} {} {}", f[0], f[1], f[2], f[3])
            } else {
                f.join(" ")
            }
        })
        .collect();
    let want: Vec<&str> = API_RESOURCES_1_33.trim().lines().collect();
    assert_eq!(got, want);
    // kubectl explain walks built-in schemas (from the OpenAPI v3 components).
    let explained = k
        .ok(&["explain", "deployment.spec.template.spec.hostNetwork"])
        .await;
    assert!(
        explained.contains("FIELD: hostNetwork <boolean>"),
        "{explained}"
    );
    let explained = k.ok(&["explain", "cronjob.spec"]).await;
    assert!(explained.contains("schedule\t<string>"), "{explained}");
    // Each of them answers a list through kubectl's typed, protobuf-preferring client.
    k.ok(&[
        "get",
        "jobs,cronjobs,ingresses,networkpolicies,statefulsets,daemonsets,hpa,endpointslices,storageclasses,priorityclasses,runtimeclasses",
        "-A",
    ])
    .await;
}

const SHARED: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: shared}
spec:
  replicas: 2
  selector: {matchLabels: {app: shared}}
  template:
    metadata: {labels: {app: shared}}
    spec:
      containers: [{name: c, image: nginx:1.25, ports: [{containerPort: 80}]}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_shares_fields_applied_with_the_same_value() {
    let sim = common::start().await;
    let k = Kubectl::new(&sim);
    let same = k.file("same.yaml", SHARED);
    for manager in ["alice", "bob"] {
        let out = k
            .ok(&[
                "apply",
                "--server-side",
                "--field-manager",
                manager,
                "-f",
                &same,
            ])
            .await;
        assert_eq!(out.trim(), "deployment.apps/shared serverside-applied");
    }
    let d = k
        .json(&["get", "deployment", "shared", "--show-managed-fields"])
        .await;
    let image_owners: Vec<&str> = d["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter(|e| {
            !e["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
                ["k:{\"name\":\"c\"}"]["f:image"]
                .is_null()
        })
        .filter_map(|e| e["manager"].as_str())
        .collect();
    assert_eq!(image_owners, ["alice", "bob"]);

    let other = k.file("other.yaml", &SHARED.replace("nginx:1.25", "nginx:1.26"));
    let refused = k
        .run(&[
            "apply",
            "--server-side",
            "--field-manager",
            "carol",
            "-f",
            &other,
        ])
        .await;
    assert!(!refused.ok);
    assert!(
        refused.stderr.contains("Apply failed with 2 conflicts")
            && refused.stderr.contains(
                "conflict with \"alice\" using apps/v1: .spec.template.spec.containers[name=\"c\"].image"
            )
            && refused.stderr.contains("conflict with \"bob\""),
        "{}",
        refused.stderr
    );
    k.ok(&[
        "apply",
        "--server-side",
        "--field-manager",
        "carol",
        "--force-conflicts",
        "-f",
        &other,
    ])
    .await;
    let d = k.json(&["get", "deployment", "shared"]).await;
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.26"
    );
}

const TYPO: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: typo}
spec:
  replicas: 1
  replica: 2
  selector: {matchLabels: {app: typo}}
  template:
    metadata: {labels: {app: typo}}
    spec:
      containers: [{name: c, image: nginx, imagePullPolice: Always}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_ill_typed_fields_of_built_in_kinds_get_the_servers_messages() {
    let sim = common::start().await;
    let k = Kubectl::new(&sim);
    let typo = k.file("typo.yaml", TYPO);
    // kubectl's default --validate=strict is the server's fieldValidation=Strict.
    let refused = k.run(&["apply", "-f", &typo]).await;
    assert!(!refused.ok);
    assert!(
        refused.stderr.contains(
            "Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: unknown field \"spec.replica\", unknown field \"spec.template.spec.containers[0].imagePullPolice\""
        ),
        "{}",
        refused.stderr
    );
    // --validate=warn: created, with the server's warnings, and the unknown fields not stored.
    let warned = k.run(&["apply", "--validate=warn", "-f", &typo]).await;
    assert!(warned.ok, "{}", warned.stderr);
    assert!(
        warned
            .stderr
            .contains("Warning: unknown field \"spec.replica\""),
        "{}",
        warned.stderr
    );
    let d = k.json(&["get", "deployment", "typo"]).await;
    assert!(d["spec"].get("replica").is_none());
    assert_eq!(d["spec"]["replicas"], 1);

    let bad = k.file(
        "bad.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad}\ndata: {port: 8080}\n",
    );
    let refused = k.run(&["apply", "-f", &bad]).await;
    assert!(
        refused.stderr.contains(
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ConfigMap.data of type string"
        ),
        "{}",
        refused.stderr
    );
    let (code, status) = common::raw_json(
        &sim,
        "POST",
        "/api/v1/namespaces/default/secrets?fieldValidation=Ignore",
        "application/json",
        r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"not base64!"}}"#,
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")));
    assert_eq!(
        status["message"],
        "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data at input byte 3"
    );
    // A field given twice in JSON text is a strict decoding error too (the e2e conformance case).
    let (code, status) = common::raw_json(
        &sim,
        "POST",
        "/apis/apps/v1/namespaces/default/deployments?fieldValidation=Strict",
        "application/json",
        r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"dup","unknownMeta":"foo"},
            "spec":{"selector":{"matchLabels":{"app":"x"}},"paused":false,"paused":true,
                    "template":{"metadata":{"labels":{"app":"x"}},"spec":{"containers":[{"name":"c","image":"nginx"}]}}}}"#,
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        status["message"],
        "Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: duplicate field \"spec.paused\", unknown field \"metadata.unknownMeta\""
    );
}
