//! Bodies built with `k8s-pb`'s prost types (an encoder we did not write) decode to the JSON
//! kube-apiserver would store, and our encoding decodes back with prost.

use k8s_pb::api::apps::v1 as apps;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::json;

use super::*;

fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let u = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    [b"k8s\0".to_vec(), u.encode_to_vec()].concat()
}

#[test]
fn delete_options_as_helm_sends_them_decode() {
    let opts = meta::DeleteOptions {
        propagation_policy: Some("Background".into()),
        grace_period_seconds: Some(0),
        preconditions: Some(meta::Preconditions {
            uid: Some("1234".into()),
            resource_version: None,
        }),
        dry_run: vec!["All".into()],
        ..Default::default()
    };
    let v = decode(&envelope("v1", "DeleteOptions", opts.encode_to_vec())).expect("decodes");
    assert_eq!(
        v,
        json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
               "preconditions": {"uid": "1234"}, "propagationPolicy": "Background", "dryRun": ["All"]})
    );
}

#[test]
fn a_deployment_from_kubectl_create_decodes_with_its_special_types() {
    use k8s_pb::api::core::v1 as core;
    let d = apps::Deployment {
        metadata: Some(meta::ObjectMeta {
            name: Some("web".into()),
            namespace: Some(String::new()),
            labels: [("app".to_string(), "web".to_string())].into(),
            creation_timestamp: Some(meta::Time::default()),
            ..Default::default()
        }),
        spec: Some(apps::DeploymentSpec {
            replicas: Some(0),
            selector: Some(meta::LabelSelector {
                match_labels: [("app".to_string(), "web".to_string())].into(),
                ..Default::default()
            }),
            strategy: Some(apps::DeploymentStrategy {
                r#type: Some("RollingUpdate".into()),
                rolling_update: Some(apps::RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString {
                        r#type: Some(1),
                        int_val: Some(0),
                        str_val: Some("25%".into()),
                    }),
                    max_surge: Some(IntOrString {
                        r#type: Some(0),
                        int_val: Some(1),
                        str_val: Some(String::new()),
                    }),
                }),
            }),
            template: Some(core::PodTemplateSpec {
                metadata: None,
                spec: Some(core::PodSpec {
                    containers: vec![core::Container {
                        name: Some("nginx".into()),
                        image: Some("nginx".into()),
                        ports: vec![core::ContainerPort {
                            container_port: Some(80),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }),
        status: Some(apps::DeploymentStatus::default()),
    };
    let v = decode(&envelope("apps/v1", "Deployment", d.encode_to_vec())).expect("decodes");
    assert_eq!(
        v,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "labels": {"app": "web"}},
               "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                        "strategy": {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 1}},
                        "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx",
                                                              "ports": [{"containerPort": 80}]}]}}},
               "status": {}})
    );
}

#[test]
fn encoded_objects_lists_and_watch_frames_decode_with_prost() {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "c", "namespace": "default", "resourceVersion": "7",
                                 "creationTimestamp": "2024-05-01T10:00:00Z"},
                    "data": {"a": "1"}, "binaryData": {"b": "aGVsbG8="}});
    let body = encode(&cm).expect("encodes");
    let u = Unknown::decode(&body[4..]).expect("envelope");
    assert_eq!(
        u.type_meta.and_then(|t| t.kind).as_deref(),
        Some("ConfigMap")
    );
    let got = k8s_pb::api::core::v1::ConfigMap::decode(u.raw.unwrap_or_default().as_slice())
        .expect("configmap");
    let m = got.metadata.expect("metadata");
    assert_eq!(m.resource_version.as_deref(), Some("7"));
    assert_eq!(
        m.creation_timestamp.and_then(|t| t.seconds),
        Some(1_714_557_600)
    );
    assert_eq!(
        got.binary_data.get("b").map(Vec::as_slice),
        Some(&b"hello"[..])
    );
    assert_eq!(decode(&body).expect("round trip"), cm);

    let list = json!({"apiVersion": "v1", "kind": "ConfigMapList",
                      "metadata": {"resourceVersion": "9", "continue": "x"}, "items": [cm]});
    let u = Unknown::decode(&encode(&list).expect("list")[4..]).expect("envelope");
    let l = k8s_pb::api::core::v1::ConfigMapList::decode(u.raw.unwrap_or_default().as_slice())
        .expect("list");
    assert_eq!(l.items.len(), 1);
    assert_eq!(l.metadata.and_then(|m| m.r#continue).as_deref(), Some("x"));

    let frame = encode_watch_frame("ADDED", &cm).expect("frame");
    let len = u32::from_be_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
    assert_eq!(len, frame.len() - 4);
    let ev = meta::WatchEvent::decode(&frame[4..]).expect("watch event");
    assert_eq!(ev.r#type.as_deref(), Some("ADDED"));
    let inner = ev.object.and_then(|o| o.raw).expect("raw object");
    assert_eq!(decode(&inner).expect("inner"), cm);
}

#[test]
fn custom_kinds_and_garbage_are_errors_not_panics() {
    let w = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
    assert!(matches!(encode(&w), Err(ProtoError::NotProtobuf(_))));
    assert!(!has_message("example.com/v1", "Widget"));
    assert_eq!(decode(b"{}"), Err(ProtoError::NoMagic));
    for body in [
        &b"k8s\0\x0a\xff"[..],
        b"k8s\0\x12\x05ab",
        b"k8s\0\x0f",
        b"k8s\0\x0a\x02\x12",
    ] {
        assert!(decode(body).is_err(), "{body:?}");
    }
    // Deep nesting is refused, not recursed into.
    let mut deep = vec![];
    for _ in 0..200 {
        let mut outer = vec![0x0a];
        crate::protobuf::wire::put_varint(&mut outer, deep.len() as u64);
        outer.extend(deep);
        deep = outer;
    }
    assert!(decode(&envelope("v1", "Status", deep)).is_err());
}
