//! Verb semantics of kube-apiserver over the store: create, update, patch, apply, delete (finalizers,
//! garbage collection, namespaces), get and list. No HTTP here: callers pass parsed options.
//! One file per verb family: `read`, `write`, `delete`, `admission`, `validation`.

mod admission;
mod delete;
mod read;
#[cfg(test)]
mod tests;
mod validation;
mod write;

pub use write::PreparedCreate;

use validation::{check_body_shape, check_type_meta, metadata_errors, name_errors};

use crate::apply::{self, Writer};
use crate::convert;
use crate::error::{ApiError, FieldError};
use crate::patch::{self, PatchError};
use crate::registry::{PublishedRegistry, Registry, ResourceInfo, StorageKey};
use crate::schema;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{ObjKey, ObjName, Store, Stored, obj_key};
use crate::util::{self, Random};
use serde_json::{Map, Value, json};
use std::sync::Arc;

pub type Result<T> = std::result::Result<T, ApiError>;

/// Which endpoint of an object a write goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    Main,
    Status,
}

impl Sub {
    fn name(self) -> &'static str {
        match self {
            Sub::Main => "",
            Sub::Status => "status",
        }
    }
}

/// Options shared by writes (`dryRun`, `fieldManager`, `fieldValidation`, `force`).
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_manager: String,
    pub field_validation: String,
    pub force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    /// `resourceVersionMatch=Exact`: the list as it was at this resourceVersion.
    pub resource_version_exact: Option<u64>,
}

pub struct ListResult {
    /// Each item's JSON, in the requested version (shared with the store, not copied).
    pub items: Vec<Stored>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

impl ListResult {
    /// The items as trees (Table output, partial metadata).
    pub fn values(&self) -> Vec<Arc<Value>> {
        self.items.iter().map(|s| Arc::new(s.value())).collect()
    }
}

/// Field names a field selector may use for a resource (custom resources: metadata only).
pub fn field_supported(info: &ResourceInfo, field: &str) -> bool {
    matches!(field, "metadata.name" | "metadata.namespace")
        || (!info.custom
            && (field.starts_with("spec.")
                || field.starts_with("status.")
                || field.starts_with("involvedObject.")
                || field.starts_with("regarding.")
                || matches!(
                    field,
                    "type" | "reason" | "source" | "reportingComponent" | "reportingController"
                )))
}

fn meta(obj: &Value) -> &Value {
    &obj["metadata"]
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata was just made an object")
}

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(String::from))
        .collect()
}

fn set_finalizers(obj: &mut Value, list: &[String]) {
    let m = meta_mut(obj);
    if list.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), json!(list));
    }
}

/// Everything but metadata and status: what bumps `generation`.
/// Without a status subresource, a custom resource's status is content like any other field.
fn spec_part(obj: &Value, status_is_separate: bool) -> Value {
    match obj {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    let meta_field = matches!(k.as_str(), "metadata" | "apiVersion" | "kind");
                    let separate_status = status_is_separate && k.as_str() == "status";
                    !meta_field && !separate_status
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        _ => Value::Null,
    }
}

const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

pub struct Cluster {
    pub store: Store,
    pub registry: Registry,
    /// `registry` as readers outside the lock see it; set by `rebuild_registry`.
    published_registry: PublishedRegistry,
    /// Shared with request handlers, which name and stamp new objects before taking the lock.
    pub random: Arc<Random>,
    /// Whether each namespace is terminating, by the stored version it was read from: every
    /// create asks, and decoding the namespace each time was a tenth of a create's cost.
    terminating_namespaces: std::cell::RefCell<std::collections::HashMap<String, (Stored, bool)>>,
}

impl Cluster {
    pub fn new(history: usize) -> Self {
        let mut c = Self {
            store: Store::new(history),
            registry: Registry::default(),
            published_registry: PublishedRegistry::default(),
            random: Arc::default(),
            terminating_namespaces: Default::default(),
        };
        let ns = c
            .registry
            .lookup("", "v1", "namespaces")
            .cloned()
            .expect("namespaces is built in");
        for name in SYSTEM_NAMESPACES {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            let opts = WriteOptions {
                field_manager: "kube-apiserver".into(),
                ..Default::default()
            };
            // Cannot fail: fresh store, valid names.
            let _ = c.create(&ns, "", body, &opts);
        }
        c
    }

    /// The registry as last rebuilt, for readers that do not hold the cluster's lock.
    pub fn published_registry(&self) -> PublishedRegistry {
        self.published_registry.clone()
    }

    /// Rebuilds the registry from the stored CRDs (after a CRD write or delete, or a recovery)
    /// and publishes it.
    pub fn rebuild_registry(&mut self) {
        let key = (
            "apiextensions.k8s.io".to_string(),
            "customresourcedefinitions".to_string(),
        );
        let crds: Vec<Value> = self
            .store
            .list(&key, None)
            .map(|(_, v)| v.value())
            .collect();
        self.registry.rebuild(crds.iter());
        self.published_registry.publish(self.registry.clone());
    }

    fn ns_key() -> StorageKey {
        (String::new(), "namespaces".into())
    }

    fn check_namespace(&self, info: &ResourceInfo, ns: &str, creating: bool) -> Result<()> {
        if !info.namespaced {
            return Ok(());
        }
        match self.store.get_stored(&Self::ns_key(), &(String::new(), ns.into())) {
            None => {
                self.terminating_namespaces.borrow_mut().remove(ns);
                Err(ApiError::not_found("", "namespaces", ns))
            }
            Some(n) if creating && self.is_terminating(ns, n) => Err(ApiError::forbidden(
                &info.group,
                &info.plural,
                "",
                &format!("unable to create new content in namespace {ns} because it is being terminated"),
            )
            .with_details(json!({"name": ns, "kind": "namespaces",
                "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]}))),
            Some(_) => Ok(()),
        }
    }

    /// Whether the namespace `stored` is terminating, decoded once per stored version.
    fn is_terminating(&self, ns: &str, stored: &Stored) -> bool {
        let mut memo = self.terminating_namespaces.borrow_mut();
        if let Some((seen, terminating)) = memo.get(ns)
            && seen.same_allocation(stored)
        {
            return *terminating;
        }
        let terminating = stored.is_terminating();
        memo.insert(ns.to_string(), (stored.clone(), terminating));
        terminating
    }

    fn obj_key_for(info: &ResourceInfo, ns: &str, name: &str) -> ObjKey {
        (
            if info.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.to_string(),
        )
    }
}
