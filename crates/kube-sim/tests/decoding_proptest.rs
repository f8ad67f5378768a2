//! Request decoding over generated bodies (issue 15): arbitrary bytes as JSON, YAML and
//! protobuf, mutated protobuf encodings of real objects, and real objects with one field made
//! the wrong type, a huge or negative number or a deep nest, all POSTed through the real HTTP
//! path (decoding, field validation, defaulting, validation, storage). The server never panics
//! or answers 5xx, and a refused field is named in the error.

use proptest::prelude::*;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One raw HTTP/1.0 request with arbitrary bytes: (status, body); status 0 when the server dropped
/// the connection without an answer (a panic in the handler).
fn post(addr: SocketAddr, path: &str, content_type: &str, body: &[u8]) -> (u16, String) {
    send(addr, "POST", path, content_type, body)
}

fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write head");
    s.write_all(body).expect("write body");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

fn message(body: &str) -> String {
    serde_json::from_str::<Value>(body).unwrap_or(Value::Null)["message"]
        .as_str()
        .unwrap_or(body)
        .to_string()
}

/// A running server for a whole property (the runtime serves it from its own threads).
struct Server {
    runtime: tokio::runtime::Runtime,
    sim: Option<kube_sim::KubeSim>,
}

impl Server {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let sim = runtime
            .block_on(kube_sim::KubeSim::start(kube_sim::Config::default()))
            .expect("kube-sim starts");
        Self {
            runtime,
            sim: Some(sim),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.sim.as_ref().expect("running").addr()
    }

    /// The server still answers after everything it was sent.
    fn assert_alive(mut self) {
        let (code, body) = post(self.addr(), "/api/v1/namespaces", "application/json", b"{");
        assert_eq!(code, 400, "{body}");
        if let Some(sim) = self.sim.take() {
            self.runtime.block_on(sim.shutdown());
        }
    }
}

/// The collection each kind is created in.
fn collection(kind: &str) -> &'static str {
    match kind {
        "ConfigMap" => "/api/v1/namespaces/default/configmaps",
        "Secret" => "/api/v1/namespaces/default/secrets",
        "Pod" => "/api/v1/namespaces/default/pods",
        "Service" => "/api/v1/namespaces/default/services",
        _ => "/apis/apps/v1/namespaces/default/deployments",
    }
}

const COLLECTIONS: [&str; 3] = [
    "/api/v1/namespaces/default/configmaps",
    "/api/v1/namespaces/default/pods",
    "/apis/apps/v1/namespaces/default/deployments",
];

const CONTENT_TYPES: [&str; 4] = [
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/merge-patch+json",
];

/// A valid object of each kind the properties mutate, named `name`.
fn base(kind: &str, name: &str) -> Value {
    let meta = json!({"name": name, "labels": {"app": "p"}});
    match kind {
        "ConfigMap" => json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {"k": "v"}}),
        "Secret" => json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta,
            "type": "Opaque", "stringData": {"k": "v"}}),
        "Pod" => json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"hostNetwork": false, "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "c", "image": "nginx", "ports": [{"containerPort": 80}]}]}}),
        "Service" => json!({"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"type": "ClusterIP", "selector": {"app": "p"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
        _ => json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 1, "paused": false, "selector": {"matchLabels": {"app": "p"}},
                "template": {"metadata": {"labels": {"app": "p"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx",
                        "ports": [{"containerPort": 80}]}]}}}}),
    }
}

/// (kind, path to a field of `base(kind)`, the name its error must give): the fields a property
/// makes ill-typed. A map's value is named by the map, as Go's decoder does
/// (`Go struct field ObjectMeta.metadata.labels of type string`).
const FIELDS: &[(&str, &str, &str)] = &[
    ("ConfigMap", "data.k", "data"),
    ("ConfigMap", "data", "data"),
    ("ConfigMap", "metadata.labels.app", "labels"),
    ("ConfigMap", "metadata.labels", "labels"),
    ("ConfigMap", "metadata.name", "name"),
    ("Secret", "stringData.k", "stringData"),
    ("Secret", "type", "type"),
    ("Pod", "spec.hostNetwork", "hostNetwork"),
    (
        "Pod",
        "spec.terminationGracePeriodSeconds",
        "terminationGracePeriodSeconds",
    ),
    ("Pod", "spec.containers", "containers"),
    ("Pod", "spec.containers.0.name", "name"),
    (
        "Pod",
        "spec.containers.0.ports.0.containerPort",
        "containerPort",
    ),
    ("Service", "spec.ports.0.port", "port"),
    ("Service", "spec.ports", "ports"),
    ("Service", "spec.type", "type"),
    ("Service", "spec.selector", "selector"),
    ("Deployment", "spec.replicas", "replicas"),
    ("Deployment", "spec.paused", "paused"),
    ("Deployment", "spec.selector.matchLabels", "matchLabels"),
    (
        "Deployment",
        "spec.template.spec.containers.0.image",
        "image",
    ),
    (
        "Deployment",
        "spec.template.spec.containers.0.ports.0.containerPort",
        "containerPort",
    ),
];

/// Values of every JSON type, numbers out of every range, and nests deep enough to matter.
fn wrong_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("x")),
        Just(json!("")),
        Just(json!(true)),
        Just(json!(1.5)),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(i64::MIN)),
        Just(json!(u64::MAX)),
        Just(json!(1e300)),
        Just(json!(-1e300)),
        Just(json!(2_147_483_648_i64)),
        Just(json!({"a": 1})),
        Just(json!([1, "a"])),
        Just(json!([])),
        (1usize..100).prop_map(|depth| {
            let mut v = json!(1);
            for i in 0..depth {
                v = if i % 2 == 0 {
                    json!([v])
                } else {
                    json!({"a": v})
                };
            }
            v
        }),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,40}".prop_map(Value::from),
    ]
}

fn set(obj: &mut Value, path: &str, v: Value) {
    let mut at = obj;
    for seg in path.split('.') {
        at = match seg.parse::<usize>() {
            Ok(i) => &mut at[i],
            Err(_) => &mut at[seg],
        };
    }
    *at = v;
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[test]
fn arbitrary_bytes_are_refused_cleanly() {
    let server = Server::start();
    let addr = server.addr();
    proptest!(config(200), |(
        body in proptest::collection::vec(any::<u8>(), 0..512),
        magic in any::<bool>(),
        ct in 0..CONTENT_TYPES.len(),
        at in 0..COLLECTIONS.len(),
    )| {
        let mut bytes = if magic { b"k8s\0".to_vec() } else { vec![] };
        bytes.extend_from_slice(&body);
        let (code, answer) = post(addr, COLLECTIONS[at], CONTENT_TYPES[ct], &bytes);
        prop_assert!((400..500).contains(&code) || code == 201, "{code} for {bytes:?}: {answer}");
    });
    server.assert_alive();
}

#[test]
fn deep_nesting_is_refused_in_json_and_yaml() {
    let server = Server::start();
    let addr = server.addr();
    let names = AtomicUsize::new(0);
    proptest!(config(60), |(
        depth in prop_oneof![1usize..200, 200usize..20_000],
        brackets in any::<bool>(),
        ct in 0..2usize,
    )| {
        let name = format!("deep-{}", names.fetch_add(1, Ordering::Relaxed));
        let (open, close) = if brackets { ("[", "]") } else { ("{\"a\":", "}") };
        let nest = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        let body = format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"{name}\",\"annotations\":{{\"a\":{nest}}}}},\"data\":{{\"k\":{nest}}}}}"
        );
        let (code, answer) = post(addr, COLLECTIONS[0], CONTENT_TYPES[ct], body.as_bytes());
        prop_assert!((400..500).contains(&code), "{code} at depth {depth}: {answer}");
    });
    server.assert_alive();
}

#[test]
fn mutated_protobuf_objects_never_crash_the_decoder() {
    let server = Server::start();
    let addr = server.addr();
    let names = AtomicUsize::new(0);
    proptest!(config(200), |(
        kind in prop::sample::select(vec!["ConfigMap", "Secret", "Pod", "Service", "Deployment"]),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    )| {
        let name = format!("pb-{}", names.fetch_add(1, Ordering::Relaxed));
        let mut bytes = kube_sim::protobuf::encode(&base(kind, &name)).expect("encodes");
        for (at, b) in flips {
            // Past the 4-byte magic, so the body is still read as protobuf.
            let i = 4 + at.index(bytes.len() - 4);
            bytes[i] = b;
        }
        if truncate {
            bytes.truncate(4 + cut.index(bytes.len() - 4));
        }
        let (code, answer) = post(addr, collection(kind), "application/vnd.kubernetes.protobuf", &bytes);
        prop_assert!(
            (400..500).contains(&code) || (200..300).contains(&code),
            "{code} for {kind} {bytes:?}: {answer}"
        );
    });
    server.assert_alive();
}

#[test]
fn an_ill_typed_field_is_refused_naming_it() {
    let server = Server::start();
    let addr = server.addr();
    let names = AtomicUsize::new(0);
    proptest!(config(300), |(
        field in prop::sample::select(FIELDS.to_vec()),
        value in wrong_value(),
    )| {
        let (kind, path, named) = field;
        let name = format!("typed-{}", names.fetch_add(1, Ordering::Relaxed));
        let mut obj = base(kind, &name);
        set(&mut obj, path, value.clone());
        let body = serde_json::to_vec(&obj).expect("serializes");
        let (code, answer) = post(addr, collection(kind), "application/json", &body);
        prop_assert!(code != 0 && code < 500, "{code} for {kind} {path}={value}: {answer}");
        if code >= 400 && !(code == 409 && path == "metadata.name") {
            let message = message(&answer);
            prop_assert!(
                message.contains(named),
                "{code} for {kind} {path}={value} does not name {named}: {message}"
            );
        }
    });
    server.assert_alive();
}

#[test]
fn generated_patches_are_applied_or_refused_naming_the_field() {
    let server = Server::start();
    let addr = server.addr();
    for kind in ["ConfigMap", "Secret", "Pod", "Service", "Deployment"] {
        let body = serde_json::to_vec(&base(kind, "target")).expect("serializes");
        let (code, answer) = post(addr, collection(kind), "application/json", &body);
        assert_eq!(code, 201, "{answer}");
    }
    proptest!(config(400), |(
        field in prop::sample::select(FIELDS.to_vec()),
        value in wrong_value(),
        style in 0..3usize,
    )| {
        let (kind, path, named) = field;
        if path == "metadata.name" {
            return Ok(());
        }
        let (ct, patch) = match style {
            // The whole object as the patch, with the one field changed.
            0 | 1 => {
                let mut p = base(kind, "target");
                set(&mut p, path, value.clone());
                let ct = if style == 0 {
                    "application/merge-patch+json"
                } else {
                    "application/strategic-merge-patch+json"
                };
                (ct, p)
            }
            _ => (
                "application/json-patch+json",
                json!([{"op": "replace", "path": format!("/{}", path.replace('.', "/")), "value": value}]),
            ),
        };
        let body = serde_json::to_vec(&patch).expect("serializes");
        let target = format!("{}/target", collection(kind));
        let (code, answer) = send(addr, "PATCH", &target, ct, &body);
        prop_assert!(code != 0 && code < 500, "{code} for {ct} {kind} {patch}: {answer}");
        // A patch that does not apply gets kube-apiserver's generic message, with the path
        // in the Status causes.
        if code >= 400 {
            prop_assert!(
                answer.contains(named),
                "{code} for {ct} {kind} {patch} does not name {named}: {answer}"
            );
        }
    });
    server.assert_alive();
}

/// Found by the property above: a patch that leaves ill-typed list items behind is refused
/// naming the field, not a panic in defaulting.
#[test]
fn a_patch_that_makes_containers_numbers_is_refused() {
    let server = Server::start();
    let addr = server.addr();
    let body = serde_json::to_vec(&base("Pod", "p")).expect("serializes");
    assert_eq!(
        post(addr, collection("Pod"), "application/json", &body).0,
        201
    );
    for patch in [
        json!([{"op": "replace", "path": "/spec/containers", "value": [1, "a"]}]),
        json!([{"op": "replace", "path": "/spec/containers/0", "value": 7}]),
        json!([{"op": "replace", "path": "/spec", "value": [true]}]),
    ] {
        let (code, answer) = send(
            addr,
            "PATCH",
            &format!("{}/p", collection("Pod")),
            "application/json-patch+json",
            patch.to_string().as_bytes(),
        );
        assert!((400..500).contains(&code), "{code} for {patch}: {answer}");
        assert!(answer.contains("spec"), "{answer}");
    }
    server.assert_alive();
}
