//! Verb semantics of kube-apiserver over the store: create, update, patch, apply, delete (finalizers,
//! garbage collection, namespaces), get and list. No HTTP here: callers pass parsed options.

use crate::apply::{self, Writer};
use crate::convert;
use crate::error::{ApiError, FieldError};
use crate::patch::{self, PatchError};
use crate::registry::{Registry, ResourceInfo, StorageKey};
use crate::schema;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{ObjKey, Store, obj_key};
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
}

pub struct ListResult {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
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

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn name_errors(info: &ResourceInfo, name: &str) -> Vec<FieldError> {
    let v = Value::String(name.into());
    if info.plural == "namespaces" && info.group.is_empty() {
        if !is_label(name) {
            return vec![FieldError::invalid("metadata.name", &v, DNS1123_LABEL_MSG)];
        }
    } else if name.len() > 253 || !name.split('.').all(is_label) {
        return vec![FieldError::invalid(
            "metadata.name",
            &v,
            DNS1123_SUBDOMAIN_MSG,
        )];
    }
    vec![]
}

const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_label_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && s.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && s.as_bytes().last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A qualified name (`prefix/name`), as label and annotation keys must be.
fn is_qualified_name(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(is_label)
                && is_label_part(name)
        }
        None => is_label_part(key),
    }
}

/// `metadata.labels` and `metadata.annotations` keys and values, as `ValidateObjectMeta` checks them.
fn metadata_errors(obj: &Value) -> Vec<FieldError> {
    let mut errs = vec![];
    if let Some(labels) = obj["metadata"]["labels"].as_object() {
        for (k, v) in labels {
            if !is_qualified_name(k) {
                errs.push(FieldError::invalid(
                    "metadata.labels",
                    &json!(k),
                    QUALIFIED_NAME_MSG,
                ));
            }
            match v.as_str() {
                Some(s) if s.is_empty() || is_label_part(s) => {}
                _ => errs.push(FieldError::invalid("metadata.labels", v, LABEL_VALUE_MSG)),
            }
        }
    }
    if let Some(annotations) = obj["metadata"]["annotations"].as_object() {
        for k in annotations.keys() {
            if !is_qualified_name(k) {
                errs.push(FieldError::invalid(
                    "metadata.annotations",
                    &json!(k),
                    QUALIFIED_NAME_MSG,
                ));
            }
        }
    }
    errs
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
    pub random: Random,
}

impl Cluster {
    pub fn new(history: usize) -> Self {
        let mut c = Self {
            store: Store::new(history),
            registry: Registry::default(),
            random: Random::default(),
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

    fn ns_key() -> StorageKey {
        (String::new(), "namespaces".into())
    }

    fn check_namespace(&self, info: &ResourceInfo, ns: &str, creating: bool) -> Result<()> {
        if !info.namespaced {
            return Ok(());
        }
        match self.store.get(&Self::ns_key(), &(String::new(), ns.into())) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(n) if creating && !meta(n)["deletionTimestamp"].is_null() => Err(ApiError::forbidden(
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

    /// Renders a stored object in the requested version.
    pub fn present(info: &ResourceInfo, obj: &Arc<Value>) -> Arc<Value> {
        if !convert::needs_conversion(info, obj) {
            return obj.clone();
        }
        Arc::new(convert::from_storage(info, obj))
    }

    pub fn get(&self, info: &ResourceInfo, ns: &str, name: &str) -> Result<Arc<Value>> {
        self.store
            .get(&info.storage_key(), &Self::obj_key_for(info, ns, name))
            .map(|o| Self::present(info, o))
            .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))
    }

    pub fn list(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<ListResult> {
        let key = info.storage_key();
        let ns = ns.filter(|n| !n.is_empty() && info.namespaced);
        let (mut rv, mut after) = (self.store.resource_version(), None);
        if let Some(token) = &opts.continue_token {
            let decoded = util::hex_decode(token).ok_or_else(|| {
                ApiError::bad_request(
                    "continue key is not valid: illegal base64 data at input byte 0",
                )
            })?;
            let mut parts = decoded.splitn(3, '|');
            let (Some(r), Some(n), Some(m)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(ApiError::bad_request(
                    "continue key is not valid: incorrect encoded start resourceVersion",
                ));
            };
            rv = r
                .parse()
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            after = Some((n.to_string(), m.to_string()));
        }
        let mut items = vec![];
        let mut next = None;
        let mut remaining = 0usize;
        let exact_name = opts.fields.exact_name();
        for (k, obj) in self.store.list(&key, ns) {
            if let Some(a) = &after
                && k <= a
            {
                continue;
            }
            if exact_name.is_some_and(|n| n != k.1) {
                continue;
            }
            if !opts.labels.matches(obj) || !opts.fields.matches(obj) {
                continue;
            }
            if let Some(limit) = opts.limit
                && items.len() >= limit
            {
                if next.is_none() {
                    let last: &Arc<Value> =
                        items.last().expect("limit > 0 means an item was taken");
                    let (ln, lm) = obj_key(last);
                    next = Some(util::hex_encode(&format!("{rv}|{ln}|{lm}")));
                }
                remaining += 1;
                continue;
            }
            items.push(Self::present(info, obj));
        }
        Ok(ListResult {
            items,
            resource_version: rv,
            remaining: next.as_ref().map(|_| remaining),
            continue_token: next,
        })
    }

    fn writer<'a>(info_av: &'a str, opts: &'a WriteOptions, sub: Sub, time: &'a str) -> Writer<'a> {
        Writer {
            manager: &opts.field_manager,
            api_version: info_av,
            subresource: sub.name(),
            time,
        }
    }

    /// Pruning, defaulting and validation of custom resources; `Strict` rejects unknown fields.
    fn admit_custom(
        &self,
        info: &ResourceInfo,
        obj: &mut Value,
        opts: &WriteOptions,
    ) -> Result<Vec<String>> {
        let Some(schema) = &info.schema else {
            return Ok(vec![]);
        };
        let pruned = schema::prune(schema, obj);
        let name = meta(obj)["name"].as_str().unwrap_or_default().to_string();
        if !pruned.is_empty() && opts.field_validation == "Strict" {
            let fields: Vec<String> = pruned
                .iter()
                .map(|p| format!("unknown field \"{p}\""))
                .collect();
            return Err(ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                info.kind,
                info.api_version(),
                info.kind,
                fields.join(", ")
            )));
        }
        schema::apply_defaults(schema, obj);
        let mut errs = schema::validate(schema, &spec_and_status(obj), "");
        errs.retain(|e| {
            !e.field.starts_with("metadata")
                && !e.field.starts_with("apiVersion")
                && !e.field.starts_with("kind")
        });
        if !errs.is_empty() {
            return Err(ApiError::invalid(&info.group, &info.kind, &name, &errs));
        }
        Ok(pruned)
    }

    /// CRDs get their conditions and accepted names at once, as the real controllers do within moments.
    fn admit_crd(info: &ResourceInfo, obj: &mut Value, old: Option<&Value>) -> Result<()> {
        if !(info.group == "apiextensions.k8s.io" && info.plural == "customresourcedefinitions") {
            return Ok(());
        }
        let name = meta(obj)["name"].as_str().unwrap_or_default().to_string();
        let errs = schema::validate_crd(obj);
        if !errs.is_empty() {
            return Err(ApiError::invalid(&info.group, &info.kind, &name, &errs));
        }
        let mut names = obj["spec"]["names"].clone();
        let kind = names["kind"].as_str().unwrap_or_default().to_string();
        if names["singular"].is_null() {
            names["singular"] = json!(kind.to_lowercase());
            obj["spec"]["names"]["singular"] = json!(kind.to_lowercase());
        }
        if names["listKind"].is_null() {
            names["listKind"] = json!(format!("{kind}List"));
            obj["spec"]["names"]["listKind"] = json!(format!("{kind}List"));
        }
        let now = util::now_rfc3339();
        let since = |t: &str| {
            old.and_then(|o| {
                o["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == t)
                    .map(|c| c["lastTransitionTime"].clone())
            })
            .unwrap_or(json!(now))
        };
        let storage: Vec<Value> = obj["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["storage"] == true)
            .map(|v| v["name"].clone())
            .collect();
        let mut stored = old
            .and_then(|o| o["status"]["storedVersions"].as_array().cloned())
            .unwrap_or_default();
        for s in storage {
            if !stored.contains(&s) {
                stored.push(s);
            }
        }
        let mut conditions = vec![
            json!({"type": "NamesAccepted", "status": "True", "lastTransitionTime": since("NamesAccepted"), "reason": "NoConflicts", "message": "no conflicts found"}),
            json!({"type": "Established", "status": "True", "lastTransitionTime": since("Established"), "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}),
        ];
        if !meta(obj)["deletionTimestamp"].is_null() {
            conditions.push(json!({"type": "Terminating", "status": "True", "lastTransitionTime": now, "reason": "InstanceDeletionInProgress", "message": "CustomResource deletion is in progress"}));
        }
        obj["status"] =
            json!({"conditions": conditions, "acceptedNames": names, "storedVersions": stored});
        Ok(())
    }

    /// Services of type ClusterIP/NodePort/LoadBalancer get a free address from 10.96.0.0/16.
    fn allocate_cluster_ip(&self, info: &ResourceInfo, obj: &mut Value) {
        if !(info.group.is_empty() && info.plural == "services")
            || obj["spec"]["type"] == "ExternalName"
            || obj["spec"]["clusterIP"]
                .as_str()
                .is_some_and(|ip| !ip.is_empty())
        {
            return;
        }
        let taken: std::collections::HashSet<String> = self
            .store
            .list(&info.storage_key(), None)
            .filter_map(|(_, s)| s["spec"]["clusterIP"].as_str().map(String::from))
            .collect();
        for _ in 0..1000 {
            let n = self.random.next_u64();
            let ip = format!("10.96.{}.{}", (n >> 8) % 256, (n % 254) + 1);
            if !taken.contains(&ip) {
                obj["spec"]["clusterIP"] = json!(ip);
                obj["spec"]["clusterIPs"] = json!([ip]);
                return;
            }
        }
    }

    fn rebuild_registry_if_crd(&mut self, info: &ResourceInfo) {
        if info.group == "apiextensions.k8s.io" && info.plural == "customresourcedefinitions" {
            let key = info.storage_key();
            let crds: Vec<Value> = self
                .store
                .list(&key, None)
                .map(|(_, v)| (**v).clone())
                .collect();
            self.registry.rebuild(crds.iter());
        }
    }

    fn reset_status_on_create(info: &ResourceInfo, obj: &mut Value) {
        let Some(m) = obj.as_object_mut() else { return };
        match (info.group.as_str(), info.plural.as_str()) {
            ("", "pods") => {
                m.insert(
                    "status".into(),
                    json!({"phase": "Pending", "qosClass": "BestEffort"}),
                );
            }
            ("", "namespaces") => {
                m.insert("status".into(), json!({"phase": "Active"}));
                if !m.get("spec").is_some_and(|s| s["finalizers"].is_array()) {
                    m.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
                }
            }
            ("", "nodes") => {}
            _ if info.custom && info.has_status() => {
                m.remove("status");
            }
            ("apps", _) | ("", "services") => {
                m.insert("status".into(), json!({}));
            }
            _ => {}
        }
    }

    pub fn create(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        mut body: Value,
        opts: &WriteOptions,
    ) -> Result<Value> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be an object",
            ));
        }
        check_type_meta(info, &body)?;
        body["apiVersion"] = json!(info.api_version());
        body["kind"] = json!(info.kind);
        let body_ns = meta(&body)["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if info.namespaced {
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta_mut(&mut body).insert("namespace".into(), json!(ns));
        } else {
            meta_mut(&mut body).remove("namespace");
        }
        let mut name = meta(&body)["name"].as_str().unwrap_or_default().to_string();
        if name.is_empty() {
            let Some(prefix) = meta(&body)["generateName"]
                .as_str()
                .filter(|p| !p.is_empty())
            else {
                return Err(ApiError::invalid(
                    &info.group,
                    &info.kind,
                    "",
                    &[FieldError::required_detail(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            };
            name = format!("{prefix}{}", self.random.name_suffix());
            meta_mut(&mut body).insert("name".into(), json!(name));
        }
        let mut errs = name_errors(info, &name);
        errs.extend(metadata_errors(&body));
        if !errs.is_empty() {
            return Err(ApiError::invalid(&info.group, &info.kind, &name, &errs));
        }
        self.check_namespace(info, ns, true)?;
        let key = info.storage_key();
        if info.custom && self.terminating_crd(&key).is_some() {
            return Err(ApiError::method_not_allowed(
                "create not allowed while custom resource definition is terminating",
            ));
        }
        if self
            .store
            .get(&key, &Self::obj_key_for(info, ns, &name))
            .is_some()
        {
            return Err(ApiError::already_exists(&info.group, &info.plural, &name));
        }
        let now = util::now_rfc3339();
        {
            let m = meta_mut(&mut body);
            for k in [
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
            ] {
                m.remove(k);
            }
            m.insert("uid".into(), json!(self.random.uuid()));
            m.insert("creationTimestamp".into(), json!(now));
            if info.has_generation {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        Self::reset_status_on_create(info, &mut body);
        self.admit_custom(info, &mut body, opts)?;
        Self::admit_crd(info, &mut body, None)?;
        crate::defaults::apply(info, &mut body);
        self.allocate_cluster_ip(info, &mut body);
        let mut body = convert::to_storage(info, body);
        apply::track_update(
            None,
            &mut body,
            &Self::writer(&info.api_version(), opts, Sub::Main, &now),
            apply::ListTypes::from_schema(info.schema.as_ref()),
        );
        if opts.dry_run {
            return Ok(body);
        }
        let stored = self.store.put(&key, body);
        self.rebuild_registry_if_crd(info);
        Ok((*Self::present(info, &stored)).clone())
    }

    /// PUT: full replacement with optimistic concurrency.
    pub fn update(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        body: Value,
        sub: Sub,
        opts: &WriteOptions,
    ) -> Result<Value> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be an object",
            ));
        }
        check_type_meta(info, &body)?;
        let body_name = meta(&body)["name"].as_str().unwrap_or_default();
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if info.namespaced
            && let Some(bns) = meta(&body)["namespace"].as_str()
            && !bns.is_empty()
            && bns != ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        // A missing namespace means a missing object here, as on kube-apiserver.
        let old = self
            .store
            .get(&info.storage_key(), &Self::obj_key_for(info, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
        self.commit(info, &old, body, sub, opts, true)
    }

    /// The shared tail of every write to an existing object.
    fn commit(
        &mut self,
        info: &ResourceInfo,
        old: &Arc<Value>,
        mut new: Value,
        sub: Sub,
        opts: &WriteOptions,
        track: bool,
    ) -> Result<Value> {
        let name = meta(old)["name"].as_str().unwrap_or_default().to_string();
        let old_rv = meta(old)["resourceVersion"].as_str().unwrap_or_default();
        if let Some(rv) = meta(&new)["resourceVersion"].as_str()
            && !rv.is_empty()
            && rv != old_rv
        {
            return Err(ApiError::stale(&info.group, &info.plural, &name));
        }
        if sub == Sub::Status {
            // The status endpoint changes status only.
            let status = new.get("status").cloned();
            let mut merged = (**old).clone();
            match status {
                Some(s) => merged["status"] = s,
                None => {
                    if let Some(m) = merged.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            if let Some(mf) = meta(&new).get("managedFields").cloned() {
                meta_mut(&mut merged).insert("managedFields".into(), mf);
            }
            new = merged;
        } else if info.has_status() {
            match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        new["apiVersion"] = json!(info.api_version());
        new["kind"] = json!(info.kind);
        crate::defaults::apply(info, &mut new);
        if info.group.is_empty() && info.plural == "services" && new["spec"].is_object() {
            // An allocated cluster IP stays when an update leaves it out.
            for k in ["clusterIP", "clusterIPs"] {
                if new["spec"].get(k).is_none()
                    && let Some(v) = old["spec"].get(k)
                {
                    new["spec"][k] = v.clone();
                }
            }
        }
        let mut new = convert::to_storage(info, new);
        {
            let om = meta(old).clone();
            let m = meta_mut(&mut new);
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
                "resourceVersion",
            ] {
                match om.get(k) {
                    Some(v) => m.insert(k.into(), v.clone()),
                    None => m.remove(k),
                };
            }
            m.remove("selfLink");
            if !m.contains_key("managedFields")
                && let Some(mf) = om.get("managedFields")
            {
                m.insert("managedFields".into(), mf.clone());
            }
        }
        let meta_errs = metadata_errors(&new);
        if !meta_errs.is_empty() {
            return Err(ApiError::invalid(
                &info.group,
                &info.kind,
                &name,
                &meta_errs,
            ));
        }
        let deleting = !meta(old)["deletionTimestamp"].is_null();
        if deleting {
            let before = finalizers(old);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    &info.group,
                    &info.kind,
                    &name,
                    &[FieldError::forbidden(
                        "metadata.finalizers",
                        &format!(
                            "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                            added
                                .iter()
                                .map(|a| format!("{a:?}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )],
                ));
            }
        }
        self.admit_custom(info, &mut new, opts)?;
        Self::admit_crd(info, &mut new, Some(old))?;
        let status_is_separate = info.has_status() || !info.custom;
        if info.has_generation
            && spec_part(&new, status_is_separate) != spec_part(old, status_is_separate)
        {
            let g = meta(old)["generation"].as_i64().unwrap_or(0) + 1;
            meta_mut(&mut new).insert("generation".into(), json!(g));
        }
        let now = util::now_rfc3339();
        if track {
            let av = info.api_version();
            let lt = apply::ListTypes::from_schema(info.schema.as_ref());
            apply::track_update(Some(old), &mut new, &Self::writer(&av, opts, sub, &now), lt);
        }
        if new == **old {
            return Ok((*Self::present(info, old)).clone());
        }
        if opts.dry_run {
            return Ok(new);
        }
        let key = info.storage_key();
        if deleting && finalizers(&new).is_empty() {
            meta_mut(&mut new).insert("resourceVersion".into(), json!(old_rv));
            let stored = self.store.put(&key, new);
            let gone = self.remove_now(&key, &obj_key(&stored));
            return Ok(gone.map(|g| (*g).clone()).unwrap_or_default());
        }
        let stored = self.store.put(&key, new);
        self.rebuild_registry_if_crd(info);
        Ok((*Self::present(info, &stored)).clone())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        patch_type: PatchType,
        body: &Value,
        sub: Sub,
        opts: &WriteOptions,
    ) -> Result<(Value, bool)> {
        if patch_type == PatchType::Apply {
            self.check_namespace(info, ns, true)?;
        }
        let key = info.storage_key();
        let old = self
            .store
            .get(&key, &Self::obj_key_for(info, ns, name))
            .cloned();
        if patch_type == PatchType::Apply {
            return self.server_side_apply(info, ns, name, old, body, sub, opts);
        }
        let old = old.ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
        let mut doc = Self::present(info, &old).as_ref().clone();
        let result = match patch_type {
            PatchType::Json => patch::json_patch(&mut doc, body),
            PatchType::Merge => patch::merge_patch(&mut doc, body),
            PatchType::Strategic if info.custom => {
                return Err(ApiError::unsupported_media_type(
                    "application/strategic-merge-patch+json",
                    &[
                        "application/json-patch+json",
                        "application/merge-patch+json",
                        "application/apply-patch+yaml",
                    ],
                ));
            }
            PatchType::Strategic => patch::strategic_merge_patch(&mut doc, body),
            PatchType::Apply => unreachable!("handled above"),
        };
        match result {
            Ok(()) => {}
            Err(PatchError::Malformed(m)) => return Err(ApiError::bad_request(m)),
            // kube-apiserver's errors.NewGenericServerResponse(422, ...) for a patch that does not apply.
            Err(PatchError::Failed(m)) => {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "the server rejected our request due to an error in our request",
                )
                .with_details(
                    json!({"causes": [{"reason": "UnexpectedServerResponse", "message": m}]}),
                ));
            }
        }
        if meta(&doc)["name"].as_str() != Some(name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta(&doc)["name"].as_str().unwrap_or_default()
            )));
        }
        // A patch carrying metadata.resourceVersion is a precondition; otherwise it is unconditional.
        Ok((self.commit(info, &old, doc, sub, opts, true)?, false))
    }

    #[allow(clippy::too_many_arguments)]
    fn server_side_apply(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        old: Option<Arc<Value>>,
        body: &Value,
        sub: Sub,
        opts: &WriteOptions,
    ) -> Result<(Value, bool)> {
        if opts.field_manager.is_empty() {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                &[FieldError::required_detail(
                    "fieldManager",
                    "is required for apply patch",
                )],
            ));
        }
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "error decoding YAML: the apply patch must be an object",
            ));
        }
        check_type_meta(info, body)?;
        if body["apiVersion"].is_null() || body["kind"].is_null() {
            return Err(ApiError::bad_request("invalid object type: /, Kind="));
        }
        let mut applied = body.clone();
        if let Some(m) = applied.as_object_mut()
            && info.has_status()
        {
            match sub {
                Sub::Main => {
                    m.remove("status");
                }
                Sub::Status => m.retain(|k, _| {
                    matches!(k.as_str(), "status" | "apiVersion" | "kind" | "metadata")
                }),
            }
        }
        if let Some(m) = applied["metadata"].as_object_mut() {
            m.retain(|k, _| {
                matches!(
                    k.as_str(),
                    "name"
                        | "namespace"
                        | "labels"
                        | "annotations"
                        | "finalizers"
                        | "ownerReferences"
                        | "generateName"
                )
            });
        }
        let now = util::now_rfc3339();
        let av = info.api_version();
        let w = Self::writer(&av, opts, sub, &now);
        let lt = apply::ListTypes::from_schema(info.schema.as_ref());
        let merged = apply::apply(old.as_deref(), &applied, &w, opts.force, lt).map_err(|c| {
            ApiError::new(409, "Conflict", c.message()).with_details(json!({"causes": c.causes()}))
        })?;
        match old {
            None => {
                let mut merged = merged;
                meta_mut(&mut merged).insert("name".into(), json!(name));
                let mut create_opts = opts.clone();
                create_opts.field_manager = opts.field_manager.clone();
                let managed = meta(&merged)["managedFields"].clone();
                let mut created =
                    self.create_with_managed(info, ns, merged, &create_opts, managed)?;
                if let Some(m) = created.as_object_mut() {
                    m.entry("apiVersion").or_insert(json!(av));
                }
                Ok((created, true))
            }
            Some(old) => Ok((self.commit(info, &old, merged, sub, opts, false)?, false)),
        }
    }

    fn create_with_managed(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        body: Value,
        opts: &WriteOptions,
        managed: Value,
    ) -> Result<Value> {
        let mut dry = opts.clone();
        dry.dry_run = true;
        let mut obj = self.create(info, ns, body, &dry)?;
        meta_mut(&mut obj).insert("managedFields".into(), managed);
        if opts.dry_run {
            return Ok(obj);
        }
        let stored = self.store.put(&info.storage_key(), obj);
        self.rebuild_registry_if_crd(info);
        Ok((*stored).clone())
    }

    pub fn delete(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value> {
        // A missing namespace means a missing object here, as on kube-apiserver.
        let key = info.storage_key();
        let ok = Self::obj_key_for(info, ns, name);
        let old = self
            .store
            .get(&key, &ok)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
        if let Some(uid) = &opts.precondition_uid
            && meta(&old)["uid"].as_str() != Some(uid.as_str())
        {
            return Err(ApiError::conflict(
                &info.group,
                &info.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta(&old)["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && meta(&old)["resourceVersion"].as_str() != Some(rv.as_str())
        {
            return Err(ApiError::conflict(
                &info.group,
                &info.plural,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta(&old)["resourceVersion"].as_str().unwrap_or_default()
                ),
            ));
        }
        if opts.dry_run {
            return Ok((*old).clone());
        }
        Ok(self
            .delete_object(info, &key, &ok, opts.propagation.as_deref())
            .map(|v| (*v).clone())
            .unwrap_or_default())
    }

    /// Starts or completes deletion of one object, following finalizers and propagation.
    fn delete_object(
        &mut self,
        info: &ResourceInfo,
        key: &StorageKey,
        ok: &ObjKey,
        propagation: Option<&str>,
    ) -> Option<Arc<Value>> {
        let old = self.store.get(key, ok)?.clone();
        let is_namespace = key.0.is_empty() && key.1 == "namespaces";
        let is_crd = key.0 == "apiextensions.k8s.io" && key.1 == "customresourcedefinitions";
        let mut fins = finalizers(&old);
        let already = !meta(&old)["deletionTimestamp"].is_null();
        let extra = match propagation {
            Some("Foreground") => Some("foregroundDeletion"),
            Some("Orphan") => Some("orphan"),
            _ => None,
        };
        if let Some(f) = extra
            && !already
            && !fins.iter().any(|x| x == f)
        {
            fins.push(f.to_string());
        }
        if fins.is_empty() && !is_namespace && !is_crd {
            return self.remove_now(key, ok);
        }
        let mut updated = (*old).clone();
        if !already {
            let m = meta_mut(&mut updated);
            m.insert("deletionTimestamp".into(), json!(util::now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            if m.get("generation").is_some() {
                let g = m["generation"].as_i64().unwrap_or(0) + 1;
                m.insert("generation".into(), json!(g));
            }
        }
        set_finalizers(&mut updated, &fins);
        if is_namespace {
            updated["status"]["phase"] = json!("Terminating");
        }
        if is_crd {
            let _ = Self::admit_crd(info, &mut updated, Some(&old));
        }
        let stored = if updated != *old {
            self.store.put(key, updated)
        } else {
            old
        };
        let uid = meta(&stored)["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if fins.iter().any(|f| f == "orphan") {
            self.orphan_dependents(&uid);
            self.drop_finalizer(key, ok, "orphan");
        }
        if fins.iter().any(|f| f == "foregroundDeletion") {
            for (dk, dok) in self.store.dependents_of(&uid) {
                self.delete_dependent(&dk, &dok, Some("Foreground"));
            }
            self.finish_foreground(&uid);
        }
        if is_namespace {
            let ns = ok.1.clone();
            for sk in self.store.storage_keys() {
                for (n, name) in self.store.keys_of(&sk) {
                    if n == ns {
                        self.delete_dependent(&sk, &(n, name), None);
                    }
                }
            }
            self.finish_namespace(&ns);
        }
        if is_crd {
            // Instances are deleted like any object (their finalizers hold them); the CRD goes
            // once none is left, as the CRD finalizer controller does.
            let instances = crd_storage_key(&stored);
            for iok in self.store.keys_of(&instances) {
                self.delete_dependent(&instances, &iok, None);
            }
            self.finish_crd(&instances);
        }
        self.store.get(key, ok).cloned().or(Some(stored))
    }

    fn delete_dependent(&mut self, key: &StorageKey, ok: &ObjKey, propagation: Option<&str>) {
        let Some(info) = self.info_for_key(key) else {
            return;
        };
        self.delete_object(&info, key, ok, propagation);
    }

    fn info_for_key(&self, key: &StorageKey) -> Option<ResourceInfo> {
        self.registry
            .all()
            .iter()
            .find(|r| r.group == key.0 && r.plural == key.1)
            .cloned()
    }

    fn drop_finalizer(&mut self, key: &StorageKey, ok: &ObjKey, finalizer: &str) {
        let Some(obj) = self.store.get(key, ok).cloned() else {
            return;
        };
        let mut fins = finalizers(&obj);
        fins.retain(|f| f != finalizer);
        if fins.is_empty() && !meta(&obj)["deletionTimestamp"].is_null() {
            self.remove_now(key, ok);
        } else {
            let mut updated = (*obj).clone();
            set_finalizers(&mut updated, &fins);
            self.store.put(key, updated);
        }
    }

    fn orphan_dependents(&mut self, uid: &str) {
        for (dk, dok) in self.store.dependents_of(uid) {
            if let Some(dep) = self.store.get(&dk, &dok).cloned() {
                let mut updated = (*dep).clone();
                if let Some(refs) = updated["metadata"]["ownerReferences"].as_array_mut() {
                    refs.retain(|r| r["uid"].as_str() != Some(uid));
                    if refs.is_empty() {
                        meta_mut(&mut updated).remove("ownerReferences");
                    }
                }
                self.store.put(&dk, updated);
            }
        }
    }

    fn finish_foreground(&mut self, uid: &str) {
        if !self.store.dependents_of(uid).is_empty() {
            return;
        }
        if let Some((k, ok)) = self.store.locate_uid(uid).cloned()
            && let Some(o) = self.store.get(&k, &ok)
            && finalizers(o).iter().any(|f| f == "foregroundDeletion")
        {
            self.drop_finalizer(&k, &ok, "foregroundDeletion");
        }
    }

    fn finish_namespace(&mut self, ns: &str) {
        let nk = Self::ns_key();
        let nok = (String::new(), ns.to_string());
        let Some(nsobj) = self.store.get(&nk, &nok) else {
            return;
        };
        if meta(nsobj)["deletionTimestamp"].is_null() {
            return;
        }
        let empty = self
            .store
            .storage_keys()
            .iter()
            .all(|k| self.store.list(k, Some(ns)).next().is_none());
        if empty && finalizers(nsobj).is_empty() {
            self.remove_now(&nk, &nok);
        }
    }

    /// Once a CRD is gone, nothing of its resource may remain.
    fn purge_crd_objects(&mut self, crd: &Value) {
        let key = crd_storage_key(crd);
        for ok in self.store.keys_of(&key) {
            self.remove_now(&key, &ok);
        }
    }

    /// The terminating CRD that serves a storage key, if any.
    fn terminating_crd(&self, instances: &StorageKey) -> Option<ObjKey> {
        self.store
            .list(&crd_key(), None)
            .find(|(_, c)| {
                crd_storage_key(c) == *instances && !meta(c)["deletionTimestamp"].is_null()
            })
            .map(|(k, _)| k.clone())
    }

    /// Removes a terminating CRD whose last instance is gone.
    fn finish_crd(&mut self, instances: &StorageKey) {
        let Some(cok) = self.terminating_crd(instances) else {
            return;
        };
        let done = self.store.count(instances) == 0
            && self
                .store
                .get(&crd_key(), &cok)
                .is_some_and(|c| finalizers(c).is_empty());
        if done {
            self.remove_now(&crd_key(), &cok);
        }
    }

    /// Removes an object from storage and runs the follow-ups: garbage collection of dependents
    /// (background propagation), foreground owners, terminating namespaces, CRD deregistration.
    fn remove_now(&mut self, key: &StorageKey, ok: &ObjKey) -> Option<Arc<Value>> {
        let gone = self.store.remove(key, ok)?;
        let uid = meta(&gone)["uid"].as_str().unwrap_or_default().to_string();
        for (dk, dok) in self.store.dependents_of(&uid) {
            let Some(dep) = self.store.get(&dk, &dok).cloned() else {
                continue;
            };
            let live_owner = meta(&dep)["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["uid"].as_str())
                .any(|u| u != uid && self.store.locate_uid(u).is_some());
            if !live_owner {
                self.delete_dependent(&dk, &dok, None);
            }
        }
        for owner in meta(&gone)["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(ouid) = owner["uid"].as_str() {
                self.finish_foreground(ouid);
            }
        }
        if !ok.0.is_empty() {
            self.finish_namespace(&ok.0.clone());
        }
        if !key.0.is_empty() && self.store.count(key) == 0 {
            self.finish_crd(key);
        }
        if key.0 == "apiextensions.k8s.io" && key.1 == "customresourcedefinitions" {
            self.purge_crd_objects(&gone);
            let crds: Vec<Value> = self
                .store
                .list(key, None)
                .map(|(_, v)| (**v).clone())
                .collect();
            self.registry.rebuild(crds.iter());
        }
        Some(gone)
    }

    pub fn delete_collection(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        list: &ListOptions,
        opts: &DeleteOptions,
    ) -> Result<Value> {
        let matched = self.list(
            info,
            ns,
            &ListOptions {
                limit: None,
                continue_token: None,
                ..list.clone()
            },
        )?;
        let mut items = vec![];
        for obj in matched.items {
            let (n, name) = obj_key(&obj);
            if opts.dry_run {
                items.push((*obj).clone());
                continue;
            }
            if let Some(v) = self.delete_object(
                info,
                &info.storage_key(),
                &(n, name),
                opts.propagation.as_deref(),
            ) {
                items.push((*v).clone());
            }
        }
        Ok(
            json!({"kind": info.list_kind, "apiVersion": info.api_version(),
                  "metadata": {"resourceVersion": self.store.resource_version().to_string()}, "items": items}),
        )
    }
}

fn crd_key() -> StorageKey {
    (
        String::from("apiextensions.k8s.io"),
        String::from("customresourcedefinitions"),
    )
}

/// Where a CRD's instances are stored.
fn crd_storage_key(crd: &Value) -> StorageKey {
    (
        crd["spec"]["group"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        crd["spec"]["names"]["plural"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// The body's `apiVersion`/`kind`, when given, must name the resource of the URL.
fn check_type_meta(info: &ResourceInfo, body: &Value) -> Result<()> {
    if let Some(kind) = body["kind"].as_str()
        && !kind.is_empty()
        && kind != info.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            info.kind
        )));
    }
    if let Some(av) = body["apiVersion"].as_str()
        && !av.is_empty()
        && av.rsplit_once('/').map_or("", |(g, _)| g) != info.group
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            info.api_version()
        )));
    }
    Ok(())
}

/// The part of a custom resource the schema validates (metadata is validated separately).
fn spec_and_status(obj: &Value) -> Value {
    match obj {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != "metadata")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(status_subresource: bool) -> Value {
        let mut version = json!({"name": "v1", "served": true, "storage": true,
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
        if status_subresource {
            version["subresources"] = json!({"status": {}});
        }
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": "gadgets.example.com"},
               "spec": {"group": "example.com", "scope": "Namespaced",
                        "names": {"kind": "Gadget", "plural": "gadgets"}, "versions": [version]}})
    }

    fn generation_after_status_change(status_subresource: bool) -> i64 {
        let mut c = Cluster::new(100);
        let opts = WriteOptions {
            field_manager: "test".into(),
            ..Default::default()
        };
        let crds = c
            .registry
            .lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .cloned()
            .expect("crds");
        c.create(&crds, "", crd(status_subresource), &opts)
            .expect("crd");
        let gadgets = c
            .registry
            .lookup("example.com", "v1", "gadgets")
            .cloned()
            .expect("served");
        let obj = json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}, "spec": {"a": 1}});
        let created = c.create(&gadgets, "default", obj, &opts).expect("create");
        let mut changed = created.clone();
        changed["status"] = json!({"ready": true});
        let sub = if status_subresource {
            Sub::Status
        } else {
            Sub::Main
        };
        let updated = c
            .update(&gadgets, "default", "g", changed, sub, &opts)
            .expect("update");
        assert_eq!(updated["status"]["ready"], true);
        updated["metadata"]["generation"]
            .as_i64()
            .expect("generation")
    }

    #[test]
    fn status_changes_bump_generation_only_without_a_status_subresource() {
        assert_eq!(generation_after_status_change(true), 1);
        assert_eq!(generation_after_status_change(false), 2);
    }

    #[test]
    fn deleting_a_crd_waits_for_instance_finalizers() {
        let mut c = Cluster::new(100);
        let opts = WriteOptions {
            field_manager: "test".into(),
            ..Default::default()
        };
        let crds = c
            .registry
            .lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .cloned()
            .expect("crds");
        c.create(&crds, "", crd(true), &opts).expect("crd");
        let gadgets = c
            .registry
            .lookup("example.com", "v1", "gadgets")
            .cloned()
            .expect("served");
        let held = json!({"apiVersion": "example.com/v1", "kind": "Gadget",
            "metadata": {"name": "held", "finalizers": ["example.com/cleanup"]}});
        c.create(&gadgets, "default", held, &opts).expect("held");
        c.create(
            &gadgets,
            "default",
            json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "free"}}),
            &opts,
        )
        .expect("free");

        c.delete(&crds, "", "gadgets.example.com", &DeleteOptions::default())
            .expect("delete crd");
        let crd_obj = c
            .get(&crds, "", "gadgets.example.com")
            .expect("terminating CRD stays");
        assert!(
            crd_obj["status"]["conditions"]
                .as_array()
                .expect("conditions")
                .iter()
                .any(|c| c["type"] == "Terminating")
        );
        assert!(
            c.get(&gadgets, "default", "free").is_err(),
            "instances without finalizers go at once"
        );
        let held = c
            .get(&gadgets, "default", "held")
            .expect("held by its finalizer");
        assert!(!held["metadata"]["deletionTimestamp"].is_null());
        let refused = c
            .create(&gadgets, "default", json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "new"}}), &opts)
            .expect_err("no creates while terminating");
        assert_eq!(refused.code, 405);

        let mut released = (*held).clone();
        released["metadata"]["finalizers"] = json!([]);
        c.update(&gadgets, "default", "held", released, Sub::Main, &opts)
            .expect("release");
        assert!(
            c.get(&crds, "", "gadgets.example.com").is_err(),
            "CRD removed with its last instance"
        );
        assert!(
            c.registry.lookup("example.com", "v1", "gadgets").is_none(),
            "no longer served"
        );
    }
}
