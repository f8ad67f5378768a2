//! Writes: create, update, patch and server-side apply, all ending in `commit` (resourceVersion
//! preconditions, generation, managedFields, the store's put).

use super::*;

impl Cluster {
    pub fn create(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Value> {
        self.create_stored(info, ns, body, opts)
            .map(|(created, _)| created)
    }

    /// `create`, also answering the stored JSON when it is the response's body as it is (the
    /// request's version is the storage version; not a dry run), so a server need not serialize
    /// the object a second time.
    pub fn create_stored(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<(Value, Option<Stored>)> {
        let prepared = PreparedCreate::new(info, ns, body, opts, &self.random)?;
        self.create_prepared(info, prepared, opts)
    }

    /// The part of a create that reads or changes the cluster: the namespace, a terminating
    /// CRD, a name taken, a Service's cluster IP, and the put.
    pub fn create_prepared(
        &mut self,
        info: &ResourceInfo,
        prepared: PreparedCreate,
        opts: &WriteOptions,
    ) -> Result<(Value, Option<Stored>)> {
        let PreparedCreate {
            ns,
            name,
            object,
            now,
        } = prepared;
        self.check_namespace(info, &ns, true)?;
        let key = info.storage_key();
        if info.custom && self.terminating_crd(&key).is_some() {
            return Err(ApiError::method_not_allowed(
                "create not allowed while custom resource definition is terminating",
            ));
        }
        if self
            .store
            .contains(&key, &Self::obj_key_for(info, &ns, &name))
        {
            return Err(ApiError::already_exists(&info.group, &info.plural, &name));
        }
        let body = match object? {
            Admitted::Final(body) => body,
            Admitted::NeedsClusterIp(mut body) => {
                self.allocate_cluster_ip(info, &mut body);
                finish_create(info, body, opts, &now)
            }
        };
        if opts.dry_run {
            return Ok((body, None));
        }
        // The name may be generated: only here is the request's object known.
        if let Some(journal) = self.store.journal_mut() {
            journal.target(&key, &Self::obj_key_for(info, &ns, &name));
        }
        let (created, json) = self.store.put_stored(&key, body);
        self.rebuild_registry_if_crd(info);
        if convert::needs_conversion(info, &created) {
            return Ok((Self::present_owned(info, created), None));
        }
        Ok((created, json))
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
        check_body_shape(info, &body)?;
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
            .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
        self.commit(info, &old, body, sub, opts, true)
    }

    /// The shared tail of every write to an existing object.
    pub(super) fn commit(
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
        Self::admit_custom(info, &mut new, opts)?;
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
            let lt = apply::ListTypes::from_schema(info.schema.as_deref());
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
        let (stored, _) = self.store.put_stored(&key, new);
        self.rebuild_registry_if_crd(info);
        Ok(Self::present_owned(info, stored))
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
        let old = self.store.get(&key, &Self::obj_key_for(info, ns, name));
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
        // The patched object is decoded into its kind as kube-apiserver does: a JSON patch can
        // leave any value anywhere, and a wrong type is refused naming the field (not stored,
        // where defaulting and every typed client would trip over it).
        if !info.custom {
            let api_version = info.api_version();
            crate::validation::admit(
                &api_version,
                &info.kind,
                &mut doc,
                &[],
                crate::validation::Mode::Ignore,
            )?;
        }
        // A patch carrying metadata.resourceVersion is a precondition; otherwise it is unconditional.
        Ok((self.commit(info, &old, doc, sub, opts, true)?, false))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn server_side_apply(
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
        let lt = apply::ListTypes::from_schema(info.schema.as_deref());
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

    pub(super) fn create_with_managed(
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
}

/// The part of a create that reads nothing of the cluster: the request's shape, its name, its
/// uid and timestamps, admission, defaults, conversion to the storage version and managedFields.
/// An HTTP create does it before taking the cluster's lock, so concurrent creates contend only
/// for what `create_prepared` checks and stores. Errors keep their order: those of the request's
/// shape and name at once (they come first), admission's after the namespace and name checks.
pub struct PreparedCreate {
    ns: String,
    name: String,
    object: Result<Admitted>,
    now: String,
}

/// An admitted object, ready to store or (a Service) waiting for its cluster IP.
enum Admitted {
    Final(Value),
    NeedsClusterIp(Value),
}

impl PreparedCreate {
    pub fn new(
        info: &ResourceInfo,
        ns: &str,
        mut body: Value,
        opts: &WriteOptions,
        random: &Random,
    ) -> Result<Self> {
        check_body_shape(info, &body)?;
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
            name = format!("{prefix}{}", random.name_suffix());
            meta_mut(&mut body).insert("name".into(), json!(name));
        }
        let mut errs = name_errors(info, &name);
        errs.extend(metadata_errors(&body));
        if !errs.is_empty() {
            return Err(ApiError::invalid(&info.group, &info.kind, &name, &errs));
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
            m.insert("uid".into(), json!(random.uuid()));
            m.insert("creationTimestamp".into(), json!(now));
            if info.has_generation {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        Cluster::reset_status_on_create(info, &mut body);
        let object = Self::admit(info, body, opts, &now);
        Ok(Self {
            ns: ns.to_string(),
            name,
            object,
            now,
        })
    }

    fn admit(
        info: &ResourceInfo,
        mut body: Value,
        opts: &WriteOptions,
        now: &str,
    ) -> Result<Admitted> {
        Cluster::admit_custom(info, &mut body, opts)?;
        Cluster::admit_crd(info, &mut body, None)?;
        crate::defaults::apply(info, &mut body);
        if Cluster::wants_cluster_ip(info, &body) {
            return Ok(Admitted::NeedsClusterIp(body));
        }
        Ok(Admitted::Final(finish_create(info, body, opts, now)))
    }
}

/// The storage version of a new object, with the creating manager's managedFields.
fn finish_create(info: &ResourceInfo, body: Value, opts: &WriteOptions, now: &str) -> Value {
    let mut body = convert::to_storage(info, body);
    apply::track_update(
        None,
        &mut body,
        &Cluster::writer(&info.api_version(), opts, Sub::Main, now),
        apply::ListTypes::from_schema(info.schema.as_deref()),
    );
    body
}
