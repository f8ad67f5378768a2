//! Protobuf over HTTP, with bodies built by `k8s-pb`'s prost types (an encoder we did not write):
//! Helm's DeleteOptions, protobuf answers a client-go typed client reads, and custom resources
//! refused with kube-apiserver's 415.

mod common;

use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use kube_sim::protobuf::envelope;
use prost::Message;
use std::io::{Read, Write};

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// One HTTP/1.0 exchange with a binary body; returns (status, content type, body).
async fn exchange(
    sim: &kube_sim::KubeSim,
    method: &str,
    path: &str,
    content_type: &str,
    accept: &str,
    body: Vec<u8>,
) -> (u16, String, Vec<u8>) {
    let addr = sim.addr();
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nAccept: {accept}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .expect("timeout");
        s.write_all(&[head.into_bytes(), body].concat())
            .expect("write");
        let mut out = vec![];
        let _ = s.read_to_end(&mut out);
        let split = out
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        let head = String::from_utf8_lossy(&out[..split]).to_string();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let ct = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-type: ")
                    .map(str::to_string)
            })
            .unwrap_or_default();
        (status, ct, out[split + 4..].to_vec())
    })
    .await
    .expect("request task")
}

#[tokio::test]
async fn helm_uninstalls_with_protobuf_delete_options() {
    let sim = common::start().await;
    let (code, _) = common::raw(
        &sim,
        "POST",
        "/api/v1/namespaces/default/secrets",
        "application/json",
        r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"sh.helm.release.v1.demo.v1","finalizers":[]},"data":{"release":"aGk="}}"#,
    )
    .await;
    assert_eq!(code, 201);
    let opts = meta::DeleteOptions {
        propagation_policy: Some("Background".into()),
        ..Default::default()
    };
    let (code, ct, body) = exchange(
        &sim,
        "DELETE",
        "/api/v1/namespaces/default/secrets/sh.helm.release.v1.demo.v1",
        PROTOBUF,
        "application/json",
        envelope("v1", "DeleteOptions", opts.encode_to_vec().as_slice()),
    )
    .await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert!(ct.starts_with("application/json"), "{ct}");
    assert_eq!(
        common::count(&sim, "/api/v1/namespaces/default/secrets").await,
        0
    );
    // A bad propagation policy is named, as from a JSON body.
    let bad = meta::DeleteOptions {
        propagation_policy: Some("Sideways".into()),
        ..Default::default()
    };
    let (code, _, body) = exchange(
        &sim,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/kube-root-ca.crt",
        PROTOBUF,
        "application/json",
        envelope("v1", "DeleteOptions", bad.encode_to_vec().as_slice()),
    )
    .await;
    assert_eq!(code, 422, "{}", String::from_utf8_lossy(&body));
    let status: serde_json::Value = serde_json::from_slice(&body).expect("a JSON Status");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("Unsupported value: \"Sideways\"")),
        "{status}"
    );
}

#[tokio::test]
async fn typed_clients_get_protobuf_objects_and_lists() {
    let sim = common::start().await;
    let cm = k8s_pb::api::core::v1::ConfigMap {
        metadata: Some(meta::ObjectMeta {
            name: Some("settings".into()),
            ..Default::default()
        }),
        data: [("mode".to_string(), "fast".to_string())].into(),
        ..Default::default()
    };
    let accept = "application/vnd.kubernetes.protobuf,application/json";
    let (code, ct, body) = exchange(
        &sim,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        PROTOBUF,
        accept,
        envelope("v1", "ConfigMap", cm.encode_to_vec().as_slice()),
    )
    .await;
    assert_eq!((code, ct.as_str()), (201, PROTOBUF));
    assert_eq!(&body[..4], b"k8s\0");
    let u = Unknown::decode(&body[4..]).expect("an Unknown envelope");
    let created = k8s_pb::api::core::v1::ConfigMap::decode(u.raw.unwrap_or_default().as_slice())
        .expect("a ConfigMap");
    let m = created.metadata.expect("metadata");
    assert_eq!(m.namespace.as_deref(), Some("default"));
    assert!(m.uid.is_some_and(|u| !u.is_empty()));
    assert!(
        m.creation_timestamp
            .and_then(|t| t.seconds)
            .is_some_and(|s| s > 0)
    );
    assert_eq!(created.data.get("mode").map(String::as_str), Some("fast"));

    let (code, ct, body) = exchange(
        &sim,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        "",
        accept,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, PROTOBUF));
    let u = Unknown::decode(&body[4..]).expect("an Unknown envelope");
    assert_eq!(
        u.type_meta.and_then(|t| t.kind).as_deref(),
        Some("ConfigMapList")
    );
    let list = k8s_pb::api::core::v1::ConfigMapList::decode(u.raw.unwrap_or_default().as_slice())
        .expect("a list");
    assert!(
        list.items
            .iter()
            .any(|c| c.metadata.as_ref().and_then(|m| m.name.as_deref()) == Some("settings"))
    );
}

#[tokio::test]
async fn custom_resources_refuse_protobuf_like_kube_apiserver() {
    let sim = common::start().await;
    let crd = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.example.com"},
      "spec":{"group":"example.com","scope":"Namespaced","names":{"kind":"Widget","plural":"widgets"},
      "versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}"#;
    let (code, _) = common::raw(
        &sim,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        "application/json",
        crd,
    )
    .await;
    assert_eq!(code, 201);
    let fake = envelope(
        "example.com/v1",
        "Widget",
        &meta::ObjectMeta::default().encode_to_vec(),
    );
    let (code, _, body) = exchange(
        &sim,
        "POST",
        "/apis/example.com/v1/namespaces/default/widgets",
        PROTOBUF,
        PROTOBUF,
        fake,
    )
    .await;
    let status: serde_json::Value = serde_json::from_slice(&body).expect("a JSON Status");
    assert_eq!(code, 415);
    assert_eq!(status["reason"], "UnsupportedMediaType");
    assert_eq!(
        status["message"],
        "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml"
    );
    // A list asked for in protobuf first comes back as JSON (client-go's fallback).
    let (code, ct, _) = exchange(
        &sim,
        "GET",
        "/apis/example.com/v1/namespaces/default/widgets",
        "",
        "application/vnd.kubernetes.protobuf, */*",
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, "application/json"));
    // A truncated built-in body is a 400 naming protobuf, not a panic.
    let (code, _, body) = exchange(
        &sim,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        PROTOBUF,
        "application/json",
        b"k8s\0\x0a\x7f".to_vec(),
    )
    .await;
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("protobuf"));
}

#[tokio::test]
async fn watches_stream_length_prefixed_protobuf_events() {
    let sim = common::start().await;
    let (code, _) = common::raw(
        &sim,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"watched"},"data":{"a":"1"}}"#,
    )
    .await;
    assert_eq!(code, 201);
    let (code, ct, body) = exchange(
        &sim,
        "GET",
        "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0&timeoutSeconds=1",
        "",
        "application/vnd.kubernetes.protobuf;stream=watch, application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(ct, "application/vnd.kubernetes.protobuf;stream=watch");
    let mut events = vec![];
    let mut rest = body.as_slice();
    while rest.len() >= 4 {
        let len = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let ev = meta::WatchEvent::decode(&rest[4..4 + len]).expect("a WatchEvent frame");
        let raw = ev.object.and_then(|o| o.raw).expect("an object");
        let u = Unknown::decode(&raw[4..]).expect("an enveloped object");
        let cm = k8s_pb::api::core::v1::ConfigMap::decode(u.raw.unwrap_or_default().as_slice())
            .expect("a ConfigMap");
        events.push((
            ev.r#type.unwrap_or_default(),
            cm.metadata.and_then(|m| m.name).unwrap_or_default(),
        ));
        rest = &rest[4 + len..];
    }
    assert!(rest.is_empty(), "no partial frame");
    assert!(
        events.contains(&("ADDED".to_string(), "watched".to_string())),
        "{events:?}"
    );
}

/// Fields of Go-inlined structs (a Probe's `handler`, a Volume's `volumeSource`) have no JSON name
/// of their own: a protobuf Pod keeps them through decode, validation, storage and encode.
#[tokio::test]
async fn a_protobuf_pod_keeps_its_probe_handler_and_volume_source_both_ways() {
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
    let sim = common::start().await;
    let probe = core::Probe {
        handler: Some(core::ProbeHandler {
            http_get: Some(core::HttpGetAction {
                path: Some("/healthz".into()),
                port: Some(IntOrString {
                    r#type: Some(0),
                    int_val: Some(8080),
                    str_val: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        period_seconds: Some(3),
        ..Default::default()
    };
    let pod = core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: Some("inlined".into()),
            ..Default::default()
        }),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: Some("app".into()),
                image: Some("app:1".into()),
                liveness_probe: Some(probe),
                volume_mounts: vec![core::VolumeMount {
                    name: Some("scratch".into()),
                    mount_path: Some("/scratch".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            volumes: vec![core::Volume {
                name: Some("scratch".into()),
                volume_source: Some(core::VolumeSource {
                    empty_dir: Some(core::EmptyDirVolumeSource {
                        medium: Some("Memory".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let (code, _, body) = exchange(
        &sim,
        "POST",
        "/api/v1/namespaces/default/pods?fieldValidation=Strict",
        PROTOBUF,
        "application/json",
        envelope("v1", "Pod", pod.encode_to_vec().as_slice()),
    )
    .await;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
    let stored: serde_json::Value = serde_json::from_slice(&body).expect("JSON answer");
    let c = &stored["spec"]["containers"][0];
    let http_get = &c["livenessProbe"]["httpGet"];
    assert_eq!(http_get["path"], "/healthz", "{stored:#}");
    assert_eq!(http_get["port"], 8080, "{stored:#}");
    assert!(c["livenessProbe"].get("handler").is_none(), "{stored:#}");
    assert!(stored["spec"]["volumes"][0].get("volumeSource").is_none());
    // Defaulting adds no nulls for lists the pod does not have.
    assert!(c.get("ports").is_none() && stored["spec"].get("initContainers").is_none());
    assert_eq!(
        stored["spec"]["volumes"][0]["emptyDir"],
        serde_json::json!({"medium": "Memory"}),
        "{stored:#}"
    );

    let (code, ct, body) = exchange(
        &sim,
        "GET",
        "/api/v1/namespaces/default/pods/inlined",
        "",
        PROTOBUF,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, PROTOBUF));
    let u = Unknown::decode(&body[4..]).expect("an Unknown envelope");
    let got = core::Pod::decode(u.raw.unwrap_or_default().as_slice()).expect("a Pod");
    let spec = got.spec.expect("spec");
    let http_get = spec.containers[0]
        .liveness_probe
        .as_ref()
        .and_then(|p| p.handler.as_ref())
        .and_then(|h| h.http_get.as_ref())
        .expect("the probe's httpGet survives encoding");
    assert_eq!(http_get.path.as_deref(), Some("/healthz"));
    assert_eq!(http_get.port.as_ref().and_then(|p| p.int_val), Some(8080));
    let empty_dir = spec.volumes[0]
        .volume_source
        .as_ref()
        .and_then(|s| s.empty_dir.as_ref())
        .expect("the volume's emptyDir survives encoding");
    assert_eq!(empty_dir.medium.as_deref(), Some("Memory"));
}
