//! Deletion: finalizers and `deletionTimestamp`, preconditions, propagation (Background,
//! Foreground, Orphan) through the garbage collector, namespace and CRD teardown.

use super::*;

impl Cluster {
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
    pub(super) fn delete_object(
        &mut self,
        info: &ResourceInfo,
        key: &StorageKey,
        ok: &ObjKey,
        propagation: Option<&str>,
    ) -> Option<Arc<Value>> {
        let old = self.store.get(key, ok)?;
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
        self.store.get(key, ok).or(Some(stored))
    }

    pub(super) fn delete_dependent(
        &mut self,
        key: &StorageKey,
        ok: &ObjKey,
        propagation: Option<&str>,
    ) {
        let Some(info) = self.info_for_key(key) else {
            return;
        };
        self.delete_object(&info, key, ok, propagation);
    }

    pub(super) fn info_for_key(&self, key: &StorageKey) -> Option<ResourceInfo> {
        self.registry
            .all()
            .iter()
            .find(|r| r.group == key.0 && r.plural == key.1)
            .cloned()
    }

    pub(super) fn drop_finalizer(&mut self, key: &StorageKey, ok: &ObjKey, finalizer: &str) {
        let Some(obj) = self.store.get(key, ok) else {
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

    pub(super) fn orphan_dependents(&mut self, uid: &str) {
        for (dk, dok) in self.store.dependents_of(uid) {
            if let Some(dep) = self.store.get(&dk, &dok) {
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

    pub(super) fn finish_foreground(&mut self, uid: &str) {
        if !self.store.dependents_of(uid).is_empty() {
            return;
        }
        if let Some((k, ok)) = self.store.locate_uid(uid)
            && let Some(o) = self.store.get(&k, &ok)
            && finalizers(&o).iter().any(|f| f == "foregroundDeletion")
        {
            self.drop_finalizer(&k, &ok, "foregroundDeletion");
        }
    }

    pub(super) fn finish_namespace(&mut self, ns: &str) {
        let nk = Self::ns_key();
        let nok = (String::new(), ns.to_string());
        let Some(nsobj) = self.store.get(&nk, &nok) else {
            return;
        };
        if meta(&nsobj)["deletionTimestamp"].is_null() {
            return;
        }
        let empty = self
            .store
            .storage_keys()
            .iter()
            .all(|k| self.store.list(k, Some(ns)).next().is_none());
        if empty && finalizers(&nsobj).is_empty() {
            self.remove_now(&nk, &nok);
        }
    }

    /// Once a CRD is gone, nothing of its resource may remain.
    pub(super) fn purge_crd_objects(&mut self, crd: &Value) {
        let key = crd_storage_key(crd);
        for ok in self.store.keys_of(&key) {
            self.remove_now(&key, &ok);
        }
    }

    /// The terminating CRD that serves a storage key, if any.
    pub(super) fn terminating_crd(&self, instances: &StorageKey) -> Option<ObjKey> {
        self.store
            .list_values(&crd_key(), None)
            .find(|(_, c)| {
                crd_storage_key(c) == *instances && !meta(c)["deletionTimestamp"].is_null()
            })
            .map(|(k, _)| k.to_obj_key())
    }

    /// Removes a terminating CRD whose last instance is gone.
    pub(super) fn finish_crd(&mut self, instances: &StorageKey) {
        let Some(cok) = self.terminating_crd(instances) else {
            return;
        };
        let done = self.store.count(instances) == 0
            && self
                .store
                .get(&crd_key(), &cok)
                .is_some_and(|c| finalizers(&c).is_empty());
        if done {
            self.remove_now(&crd_key(), &cok);
        }
    }

    /// Removes an object from storage and runs the follow-ups: garbage collection of dependents
    /// (background propagation), foreground owners, terminating namespaces, CRD deregistration.
    pub(super) fn remove_now(&mut self, key: &StorageKey, ok: &ObjKey) -> Option<Arc<Value>> {
        let gone = self.store.remove(key, ok)?;
        let uid = meta(&gone)["uid"].as_str().unwrap_or_default().to_string();
        for (dk, dok) in self.store.dependents_of(&uid) {
            let Some(dep) = self.store.get(&dk, &dok) else {
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
            self.rebuild_registry();
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
        for obj in matched.values() {
            let (n, name) = obj_key(&obj);
            if opts.dry_run {
                items.push((*obj).clone());
                continue;
            }
            // Each item is the request's own write in turn; what its deletion collects is not.
            if let Some(journal) = self.store.journal_mut() {
                journal.target(&info.storage_key(), &(n.clone(), name.clone()));
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
