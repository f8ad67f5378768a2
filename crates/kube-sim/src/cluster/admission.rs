//! Admission: what a write gets before it is stored (custom resource schemas, CRD checks, Service
//! cluster IPs, status reset on create) and the managedFields writer every write uses.

use super::*;

impl Cluster {
    pub(super) fn writer<'a>(
        info_av: &'a str,
        opts: &'a WriteOptions,
        sub: Sub,
        time: &'a str,
    ) -> Writer<'a> {
        Writer {
            manager: &opts.field_manager,
            api_version: info_av,
            subresource: sub.name(),
            time,
        }
    }

    /// Pruning, defaulting and validation of custom resources; `Strict` rejects unknown fields.
    pub(super) fn admit_custom(
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
        // Metadata is validated separately: take it out for the schema walk rather than copy
        // the rest of the object (maps are sorted, so putting it back changes nothing).
        let metadata = obj.as_object_mut().and_then(|m| m.remove("metadata"));
        let mut errs = schema::validate(schema, obj, "");
        if let (Some(metadata), Some(m)) = (metadata, obj.as_object_mut()) {
            m.insert("metadata".to_string(), metadata);
        }
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
    pub(super) fn admit_crd(
        info: &ResourceInfo,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<()> {
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

    /// Whether `obj` is a Service that needs an address: of type ClusterIP, NodePort or
    /// LoadBalancer, without one asked for.
    pub(super) fn wants_cluster_ip(info: &ResourceInfo, obj: &Value) -> bool {
        info.group.is_empty()
            && info.plural == "services"
            && obj["spec"]["type"] != "ExternalName"
            && obj["spec"]["clusterIP"].as_str().is_none_or(str::is_empty)
    }

    /// Services that want one get a free address from 10.96.0.0/16.
    pub(super) fn allocate_cluster_ip(&self, info: &ResourceInfo, obj: &mut Value) {
        if !Self::wants_cluster_ip(info, obj) {
            return;
        }
        let taken: std::collections::HashSet<String> = self
            .store
            .list_values(&info.storage_key(), None)
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

    pub(super) fn rebuild_registry_if_crd(&mut self, info: &ResourceInfo) {
        if info.group == "apiextensions.k8s.io" && info.plural == "customresourcedefinitions" {
            self.rebuild_registry();
        }
    }

    pub(super) fn reset_status_on_create(info: &ResourceInfo, obj: &mut Value) {
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
            // Counts Go serializes even when zero (no `omitempty`).
            ("apps", "daemonsets") => {
                m.insert(
                    "status".into(),
                    json!({"currentNumberScheduled": 0, "numberMisscheduled": 0,
                           "desiredNumberScheduled": 0, "numberReady": 0}),
                );
            }
            ("apps", "replicasets") | ("", "replicationcontrollers") => {
                m.insert("status".into(), json!({"replicas": 0}));
            }
            ("apps" | "batch", _) | ("", "services") => {
                m.insert("status".into(), json!({}));
            }
            _ => {}
        }
    }
}
