//! kube-sim through the real kubectl (skipped with a message when kubectl is not installed).

mod common;

use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;

use common::kubectl::Kubectl;

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, shortNames: [wd], categories: [all]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Color, type: string, jsonPath: .spec.color}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            description: WidgetSpec is the desired state of a Widget.
            required: [size]
            properties:
              size: {type: integer, minimum: 1, maximum: 10, description: Size of the widget in units.}
              color: {type: string, enum: [red, blue], default: red}
              parts:
                type: array
                x-kubernetes-list-type: atomic
                items: {type: string}
          status:
            type: object
            properties:
              ready: {type: boolean}
"#;

const WIDGET: &str = r#"
apiVersion: example.com/v1
kind: Widget
metadata:
  name: w1
  labels: {app: demo}
spec:
  size: 3
"#;

macro_rules! require_kubectl {
    () => {
        if !Kubectl::available() {
            eprintln!("SKIPPED: kubectl is not installed; install kubectl (or Debian's kubernetes-client) to run this test");
            return;
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_with_crds_like_on_a_real_cluster() {
    require_kubectl!();
    let sim = common::start().await;
    let k = Kubectl::new(&sim);
    let crd = k.file("crd.yaml", CRD);
    // Default client-side validation (no --validate=false) needs /openapi.
    assert!(
        k.ok(&["apply", "-f", &crd])
            .await
            .contains("customresourcedefinition.apiextensions.k8s.io/widgets.example.com created")
    );
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.com",
        "--timeout=10s",
    ])
    .await;
    let widget = k.file("w.yaml", WIDGET);
    assert!(
        k.ok(&["apply", "-f", &widget])
            .await
            .contains("widget.example.com/w1 created")
    );
    assert!(k.ok(&["apply", "-f", &widget]).await.contains("unchanged"));

    // Strict field validation rejects unknown fields, as kube-apiserver does for kubectl.
    let unknown = k.file(
        "unknown.yaml",
        &WIDGET
            .replace("w1", "w9")
            .replace("size: 3", "size: 3\n  bogus: 1"),
    );
    let out = k.run(&["apply", "-f", &unknown]).await;
    assert!(!out.ok && out.stderr.contains("bogus"), "{}", out.stderr);
    // Schema violations are reported per field.
    let invalid = k.file(
        "invalid.yaml",
        &WIDGET
            .replace("w1", "w8")
            .replace("size: 3", "size: 30\n  color: pink"),
    );
    let out = k.run(&["apply", "-f", &invalid]).await;
    assert!(!out.ok, "invalid object accepted");
    assert!(
        out.stderr.contains(
            "spec.size: Invalid value: 30: spec.size in body should be less than or equal to 10"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("spec.color: Unsupported value: \"pink\""),
        "{}",
        out.stderr
    );

    // Table output with the CRD's printer columns.
    let table = k.ok(&["get", "widgets"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(header, ["NAME", "SIZE", "COLOR", "AGE"]);
    let row: Vec<&str> = lines.next().expect("row").split_whitespace().collect();
    assert_eq!(&row[..3], ["w1", "3", "red"]);

    let json: Value =
        serde_json::from_str(&k.ok(&["get", "wd", "w1", "-o", "json"]).await).expect("json");
    assert_eq!(json["spec"]["color"], "red", "defaulted");
    assert_eq!(
        k.ok(&["get", "widget", "w1", "-o", "jsonpath={.spec.size}"])
            .await,
        "3"
    );

    k.ok(&["label", "widget", "w1", "tier=gold"]).await;
    k.ok(&["annotate", "widget", "w1", "note=hello"]).await;
    assert_eq!(
        k.ok(&[
            "get",
            "widgets",
            "-l",
            "tier=gold",
            "-o",
            "jsonpath={.items[*].metadata.annotations.note}"
        ])
        .await,
        "hello"
    );

    k.ok(&[
        "patch",
        "widget",
        "w1",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"size":4}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "widget",
        "w1",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/size","value":5}]"#,
    ])
    .await;
    assert_eq!(
        k.ok(&[
            "get",
            "widget",
            "w1",
            "-o",
            "jsonpath={.spec.size}/{.metadata.generation}"
        ])
        .await,
        "5/3"
    );
    let out = k
        .run(&[
            "patch",
            "widget",
            "w1",
            "--type",
            "json",
            "-p",
            r#"[{"op":"test","path":"/spec/size","value":1}]"#,
        ])
        .await;
    assert!(!out.ok, "a failing JSON patch test must be rejected");

    // Strategic merge patch on a built-in: lists merged by key.
    let cm = k.file(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"1\"\n",
    );
    k.ok(&["apply", "-f", &cm]).await;
    k.ok(&[
        "patch",
        "configmap",
        "settings",
        "--type",
        "strategic",
        "-p",
        r#"{"data":{"b":"2"}}"#,
    ])
    .await;
    assert_eq!(
        k.ok(&["get", "cm", "settings", "-o", "jsonpath={.data.a}{.data.b}"])
            .await,
        "12"
    );
    let pod = k.file("pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: a\n    image: a:1\n  - name: b\n    image: b:1\n");
    k.ok(&["apply", "-f", &pod]).await;
    k.ok(&[
        "patch",
        "pod",
        "p",
        "-p",
        r#"{"spec":{"containers":[{"name":"b","image":"b:2"}]}}"#,
    ])
    .await;
    assert_eq!(
        k.ok(&[
            "get",
            "pod",
            "p",
            "-o",
            "jsonpath={.spec.containers[*].image}"
        ])
        .await,
        "a:1 b:2"
    );

    // Server-side apply by two managers: fields of each survive, a conflict needs --force-conflicts.
    let ssa1 = k.file(
        "ssa1.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata:\n  one: \"1\"\n",
    );
    let ssa2 = k.file(
        "ssa2.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata:\n  two: \"2\"\n",
    );
    k.ok(&[
        "apply",
        "--server-side",
        "--field-manager",
        "first",
        "-f",
        &ssa1,
    ])
    .await;
    k.ok(&[
        "apply",
        "--server-side",
        "--field-manager",
        "second",
        "-f",
        &ssa2,
    ])
    .await;
    k.ok(&[
        "apply",
        "--server-side",
        "--field-manager",
        "second",
        "-f",
        &ssa2,
    ])
    .await;
    assert_eq!(
        k.ok(&[
            "get",
            "cm",
            "shared",
            "-o",
            "jsonpath={.data.one}{.data.two}"
        ])
        .await,
        "12"
    );
    let clash = k.file(
        "ssa3.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata:\n  one: \"9\"\n",
    );
    let out = k
        .run(&[
            "apply",
            "--server-side",
            "--field-manager",
            "second",
            "-f",
            &clash,
        ])
        .await;
    assert!(
        !out.ok && out.stderr.contains("conflict with \"first\""),
        "{}",
        out.stderr
    );
    k.ok(&[
        "apply",
        "--server-side",
        "--field-manager",
        "second",
        "--force-conflicts",
        "-f",
        &clash,
    ])
    .await;
    assert_eq!(
        k.ok(&["get", "cm", "shared", "-o", "jsonpath={.data.one}"])
            .await,
        "9"
    );

    // Deletion with a finalizer: the object stays until the finalizer is removed.
    k.ok(&[
        "patch",
        "widget",
        "w1",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
    ])
    .await;
    k.ok(&["delete", "widget", "w1", "--wait=false"]).await;
    assert!(
        !k.ok(&[
            "get",
            "widget",
            "w1",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}"
        ])
        .await
        .is_empty()
    );
    k.ok(&[
        "patch",
        "widget",
        "w1",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ])
    .await;
    let out = k.run(&["get", "widget", "w1"]).await;
    assert!(!out.ok && out.stderr.contains("NotFound"), "{}", out.stderr);

    // Aggregated discovery: two requests (/api and /apis), no per-group-version fetches.
    let verbose = k.run(&["api-resources", "-v=6"]).await;
    let gets: Vec<&str> = verbose
        .stderr
        .lines()
        .filter(|l| l.contains("verb=\"GET\"") || l.contains("GET http"))
        .collect();
    assert!(
        !gets.is_empty() && gets.iter().all(|l| !l.contains("/apis/apps/v1")),
        "{}",
        verbose.stderr
    );
    let resources = k.ok(&["api-resources"]).await;
    assert!(
        resources
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["widgets", "wd", "example.com/v1", "true", "Widget"]),
        "{resources}"
    );
    assert!(resources.contains("customresourcedefinitions"));
    let explain = k.ok(&["explain", "widgets.spec.size"]).await;
    assert!(
        explain.contains("Size of the widget in units."),
        "{explain}"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_receives_events() {
    require_kubectl!();
    let sim = common::start().await;
    let k = Kubectl::new(&sim);
    let cm = k.file(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: watched\ndata:\n  a: \"1\"\n",
    );
    k.ok(&["apply", "-f", &cm]).await;
    let mut watch = k
        .command(&[
            "get",
            "configmaps",
            "-w",
            "--output-watch-events",
            "--request-timeout=20s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w starts");
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let mut events = vec![];
    let mut next_event = async || {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("kubectl prints the event in time")
            .expect("read")
            .expect("a line");
        line.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    events.push(next_event().await);
    // The initial list has been printed: changes from now on arrive through the watch.
    events.push(next_event().await);
    k.ok(&["label", "cm", "watched", "x=y"]).await;
    events.push(next_event().await);
    k.ok(&["delete", "cm", "watched"]).await;
    events.push(next_event().await);
    let _ = watch.start_kill();
    assert_eq!(events, ["EVENT", "ADDED", "MODIFIED", "DELETED"]);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_chunked_get_over_100_objects() {
    require_kubectl!();
    let sim = common::start().await;
    let k = Kubectl::new(&sim);
    let docs: String = (0..100)
        .map(|i| format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{i:03}\n  labels: {{bulk: \"yes\"}}\n"))
        .collect();
    let file = k.file("many.yaml", &docs);
    k.ok(&["create", "-f", &file]).await;
    let out = k
        .run(&[
            "get",
            "configmaps",
            "-l",
            "bulk=yes",
            "--chunk-size=10",
            "-v=6",
            "--no-headers",
        ])
        .await;
    assert!(out.ok, "{}", out.stderr);
    let names: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let want: Vec<String> = (0..100).map(|i| format!("c{i:03}")).collect();
    assert_eq!(names, want);
    let pages = out
        .stderr
        .lines()
        .filter(|l| l.contains("GET") && l.contains("limit=10"))
        .count();
    assert_eq!(pages, 10, "{}", out.stderr);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_generators_send_protobuf_bodies() {
    require_kubectl!();
    let sim = common::start().await;
    let k = Kubectl::new(&sim);
    k.ok(&["create", "namespace", "demo"]).await;
    k.ok(&[
        "create",
        "configmap",
        "cfg",
        "-n",
        "demo",
        "--from-literal=a=b",
    ])
    .await;
    k.ok(&[
        "create",
        "secret",
        "generic",
        "creds",
        "-n",
        "demo",
        "--from-literal=password=hunter2",
    ])
    .await;
    k.ok(&["create", "serviceaccount", "bot", "-n", "demo"])
        .await;
    assert_eq!(
        k.ok(&["get", "cm", "cfg", "-n", "demo", "-o", "jsonpath={.data.a}"])
            .await,
        "b"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "secret",
            "creds",
            "-n",
            "demo",
            "-o",
            "jsonpath={.type}:{.data.password}"
        ])
        .await,
        "Opaque:aHVudGVyMg=="
    );
    assert_eq!(
        k.ok(&["get", "ns", "demo", "-o", "jsonpath={.status.phase}"])
            .await,
        "Active"
    );
    k.ok(&["get", "sa", "bot", "-n", "demo"]).await;
    k.ok(&["delete", "ns", "demo"]).await;
    let out = k.run(&["get", "ns", "demo"]).await;
    assert!(!out.ok && out.stderr.contains("NotFound"), "{}", out.stderr);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_describe_shows_events_recorded_through_events_k8s_io() {
    require_kubectl!();
    let sim = common::start().await;
    let k = Kubectl::new(&sim);
    k.ok(&["apply", "-f", &k.file("crd.yaml", CRD)]).await;
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.com",
        "--timeout=10s",
    ])
    .await;
    k.ok(&["apply", "-f", &k.file("w.yaml", WIDGET)]).await;
    let uid = k
        .ok(&["get", "widget", "w1", "-o", "jsonpath={.metadata.uid}"])
        .await;
    let event = format!(
        "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata:\n  name: w1.1\neventTime: \"2026-01-01T00:00:00.000000Z\"\nreportingController: capstan-test\nreportingInstance: capstan-test-1\naction: Reconcile\nreason: Tested\nnote: hello from events.k8s.io\ntype: Normal\nregarding:\n  apiVersion: example.com/v1\n  kind: Widget\n  name: w1\n  namespace: default\n  uid: {uid}\n"
    );
    k.ok(&["apply", "-f", &k.file("event.yaml", &event)]).await;
    let described = k.ok(&["describe", "widget", "w1"]).await;
    let events = described.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events.contains("Tested") && events.contains("hello from events.k8s.io"),
        "{described}"
    );
    let listed = k.ok(&["get", "events"]).await;
    assert!(listed.contains("widget/w1"), "{listed}");
    sim.shutdown().await;
}
