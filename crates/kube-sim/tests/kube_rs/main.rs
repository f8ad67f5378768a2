//! kube-sim through kube-rs: Api CRUD on built-ins and CRDs, watcher + reflector, finalizer helper,
//! events Recorder, a Controller run, and watch semantics.

#[path = "../common/mod.rs"]
mod common;
mod crud;
mod lifecycle;
mod runtime;
mod watch;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::runtime::events::{Event as KEvent, EventType, Recorder, Reporter};
use kube::runtime::{
    Controller, WatchStreamExt, controller::Action, finalizer, reflector, watcher,
};
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}))
    .expect("valid ConfigMap")
}

fn api_status(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "shortNames": ["wd"]},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "required": ["size"], "properties": {
                        "size": {"type": "integer", "minimum": 1},
                        "color": {"type": "string", "enum": ["red", "blue"], "default": "red"}}},
                    "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}}}}]}
    }))
    .expect("valid CRD")
}
