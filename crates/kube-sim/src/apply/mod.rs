//! Server-side apply and field ownership (`metadata.managedFields`), pragmatically:
//! a field set is the set of leaf paths a manager owns; lists of objects with a merge key are
//! owned per item (`k:{"name":"x"}`), lists of finalizers per value, other lists atomically.

use crate::patch::{builtin_merge_key, is_set_list};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Seg {
    Field(String),
    /// A list item by its key, as compact JSON (`{"name":"a"}`).
    Key(String),
    /// A set-list item by value, as JSON.
    Val(String),
}

pub type Path = Vec<Seg>;
pub type FieldSet = BTreeSet<Path>;

/// Metadata fields that are owned (the rest is server-managed identity).
const OWNED_METADATA: &[&str] = &["labels", "annotations", "finalizers", "ownerReferences"];

/// How a list merges: per item by key fields, per value (a set), or as one value.
#[derive(Debug, Clone, PartialEq)]
pub enum ListType {
    Map(Vec<String>),
    Set,
    Atomic,
}

/// Decides list types: from a custom resource's structural schema (`x-kubernetes-list-type`,
/// `x-kubernetes-list-map-keys`; atomic when unset, as kube-apiserver), or from the
/// `patchMergeKey`s of built-in kinds. `metadata` lists follow ObjectMeta in both cases.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListTypes<'a> {
    schema: Option<&'a Value>,
}

impl<'a> ListTypes<'a> {
    pub fn builtin() -> Self {
        Self { schema: None }
    }

    pub fn from_schema(schema: Option<&'a Value>) -> Self {
        Self { schema }
    }

    /// The type of the list at `path` (a path to the list field itself).
    pub fn of(&self, path: &[Seg], items: &[Value]) -> ListType {
        let field = match path.last() {
            Some(Seg::Field(f)) => f.as_str(),
            _ => "",
        };
        let in_metadata = matches!(path.first(), Some(Seg::Field(f)) if f == "metadata");
        match self.schema {
            Some(schema) if !in_metadata => {
                let mut cur = schema;
                for seg in path {
                    cur = match seg {
                        Seg::Field(f) => match cur["properties"].get(f) {
                            Some(p) => p,
                            None if cur["additionalProperties"].is_object() => {
                                &cur["additionalProperties"]
                            }
                            None => return ListType::Atomic,
                        },
                        Seg::Key(_) | Seg::Val(_) => &cur["items"],
                    };
                }
                match cur["x-kubernetes-list-type"].as_str() {
                    Some("map") => {
                        let keys: Vec<String> = cur["x-kubernetes-list-map-keys"]
                            .as_array()
                            .map(|k| {
                                k.iter()
                                    .filter_map(|k| k.as_str().map(String::from))
                                    .collect()
                            })
                            .unwrap_or_default();
                        if keys.is_empty() || !items.iter().all(Value::is_object) {
                            ListType::Atomic
                        } else {
                            ListType::Map(keys)
                        }
                    }
                    Some("set") => ListType::Set,
                    _ => ListType::Atomic,
                }
            }
            _ => {
                if items.iter().all(Value::is_object)
                    && let Some(key) = builtin_merge_key(field, items)
                {
                    ListType::Map(vec![key.to_string()])
                } else if is_set_list(field) {
                    ListType::Set
                } else {
                    ListType::Atomic
                }
            }
        }
    }
}

fn key_json(keys: &[String], item: &Value) -> String {
    let m: Map<String, Value> = keys.iter().map(|k| (k.clone(), item[k].clone())).collect();
    Value::Object(m).to_string()
}

fn same_key(keys: &[String], a: &Value, b: &Value) -> bool {
    keys.iter().all(|k| a[k] == b[k])
}

/// The top-level values an object's owners own, with their paths: every field but `apiVersion`
/// and `kind`, and of `metadata` only [`OWNED_METADATA`].
fn owned_roots(obj: &Value) -> Vec<(Path, &Value)> {
    let mut roots = Vec::new();
    if let Value::Object(m) = obj {
        for (k, v) in m {
            match k.as_str() {
                "apiVersion" | "kind" => {}
                "metadata" => {
                    for f in OWNED_METADATA {
                        if let Some(v) = v.get(*f) {
                            let path = vec![Seg::Field("metadata".into()), Seg::Field((*f).into())];
                            roots.push((path, v));
                        }
                    }
                }
                _ => roots.push((vec![Seg::Field(k.clone())], v)),
            }
        }
    }
    roots
}

/// The leaf paths a value sets.
pub fn fields_of(obj: &Value, lt: ListTypes<'_>) -> FieldSet {
    let mut out = FieldSet::new();
    for (path, v) in owned_roots(obj) {
        collect(v, path, lt, &mut out);
    }
    out
}

fn collect(v: &Value, path: Path, lt: ListTypes<'_>, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                let mut p = path.clone();
                p.push(Seg::Field(k.clone()));
                collect(c, p, lt, out);
            }
        }
        Value::Array(items) if !items.is_empty() => match lt.of(&path, items) {
            ListType::Map(keys) => {
                for item in items {
                    let mut p = path.clone();
                    p.push(Seg::Key(key_json(&keys, item)));
                    out.insert(p.clone());
                    collect(item, p, lt, out);
                }
            }
            ListType::Set => {
                for item in items {
                    let mut p = path.clone();
                    p.push(Seg::Val(item.to_string()));
                    out.insert(p);
                }
            }
            ListType::Atomic => {
                out.insert(path);
            }
        },
        _ => {
            out.insert(path);
        }
    }
}

/// The leaf paths `new` sets (as [`fields_of`]), and those of them whose value `old` does not
/// hold at the same path: one walk of both trees, each list item matched by its key as it goes,
/// where looking every path up in both from the top parsed each item key back from JSON.
fn fields_changed_from(old: &Value, new: &Value, lt: ListTypes<'_>) -> (FieldSet, FieldSet) {
    let mut walk = ChangeWalk {
        lt,
        all: FieldSet::new(),
        changed: FieldSet::new(),
    };
    for (path, v) in owned_roots(new) {
        // A root path is fields only: a cheap lookup.
        walk.collect(get_path(old, &path), v, path);
    }
    (walk.all, walk.changed)
}

struct ChangeWalk<'a> {
    lt: ListTypes<'a>,
    all: FieldSet,
    changed: FieldSet,
}

impl ChangeWalk<'_> {
    /// Records `path` (the node `new`), changed unless `old` holds the same value there.
    fn leaf(&mut self, old: Option<&Value>, new: &Value, path: Path) {
        if old != Some(new) {
            self.changed.insert(path.clone());
        }
        self.all.insert(path);
    }

    /// [`collect`] of `new`, with `old` the value at the same path in the old object.
    fn collect(&mut self, old: Option<&Value>, new: &Value, path: Path) {
        match new {
            Value::Object(m) if !m.is_empty() => {
                for (k, c) in m {
                    let mut p = path.clone();
                    p.push(Seg::Field(k.clone()));
                    self.collect(old.and_then(|o| o.get(k)), c, p);
                }
            }
            Value::Array(items) if !items.is_empty() => {
                let old_items = old.and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
                match self.lt.of(&path, items) {
                    ListType::Map(keys) => {
                        for item in items {
                            let mut p = path.clone();
                            p.push(Seg::Key(key_json(&keys, item)));
                            let old_item = old_items.iter().find(|o| same_key(&keys, o, item));
                            self.leaf(old_item, item, p.clone());
                            self.collect(old_item, item, p);
                        }
                    }
                    ListType::Set => {
                        for item in items {
                            let mut p = path.clone();
                            p.push(Seg::Val(item.to_string()));
                            self.leaf(old_items.iter().find(|o| *o == item), item, p);
                        }
                    }
                    ListType::Atomic => self.leaf(old, new, path),
                }
            }
            _ => self.leaf(old, new, path),
        }
    }
}

/// The value at a path, if present.
pub fn get_path<'a>(v: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path {
        cur = match seg {
            Seg::Field(f) => cur.get(f)?,
            Seg::Key(k) => {
                let key: Map<String, Value> = serde_json::from_str(k).ok()?;
                cur.as_array()?
                    .iter()
                    .find(|i| key.iter().all(|(kk, kv)| &i[kk] == kv))?
            }
            Seg::Val(j) => {
                let want: Value = serde_json::from_str(j).ok()?;
                cur.as_array()?.iter().find(|i| **i == want)?
            }
        };
    }
    Some(cur)
}

fn remove_path(v: &mut Value, path: &[Seg]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for seg in parent {
        let next = match seg {
            Seg::Field(f) => cur.get_mut(f),
            Seg::Key(k) => {
                let Ok(key) = serde_json::from_str::<Map<String, Value>>(k) else {
                    return;
                };
                cur.as_array_mut().and_then(|a| {
                    a.iter_mut()
                        .find(|i| key.iter().all(|(kk, kv)| &i[kk] == kv))
                })
            }
            Seg::Val(_) => None,
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    match last {
        Seg::Field(f) => {
            if let Some(m) = cur.as_object_mut() {
                m.remove(f);
            }
        }
        Seg::Key(k) => {
            if let (Ok(key), Some(a)) = (
                serde_json::from_str::<Map<String, Value>>(k),
                cur.as_array_mut(),
            ) {
                a.retain(|i| !key.iter().all(|(kk, kv)| &i[kk] == kv));
            }
        }
        Seg::Val(j) => {
            if let (Ok(want), Some(a)) = (serde_json::from_str::<Value>(j), cur.as_array_mut()) {
                a.retain(|i| *i != want);
            }
        }
    }
}

/// Merges an applied configuration into the live object (maps recursively, keyed lists by key).
fn merge_applied(live: &mut Value, applied: &Value, path: &mut Path, lt: ListTypes<'_>) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, av) in a {
                match l.get_mut(k) {
                    Some(lv) if !av.is_null() => {
                        path.push(Seg::Field(k.clone()));
                        merge_applied(lv, av, path, lt);
                        path.pop();
                    }
                    _ => {
                        l.insert(k.clone(), av.clone());
                    }
                }
            }
        }
        (l @ Value::Array(_), Value::Array(a)) => {
            let existing = l.as_array().cloned().unwrap_or_default();
            match lt.of(path, a) {
                ListType::Map(keys) if existing.iter().all(Value::is_object) => {
                    let mut out = vec![];
                    for item in a {
                        match existing.iter().find(|e| same_key(&keys, e, item)) {
                            Some(e) => {
                                let mut merged = e.clone();
                                path.push(Seg::Key(key_json(&keys, item)));
                                merge_applied(&mut merged, item, path, lt);
                                path.pop();
                                out.push(merged);
                            }
                            None => out.push(item.clone()),
                        }
                    }
                    for e in existing {
                        if !a.iter().any(|i| same_key(&keys, i, &e)) {
                            out.push(e);
                        }
                    }
                    *l = Value::Array(out);
                }
                ListType::Set => {
                    let mut out = a.clone();
                    for e in existing {
                        if !out.contains(&e) {
                            out.push(e);
                        }
                    }
                    *l = Value::Array(out);
                }
                _ => *l = applied.clone(),
            }
        }
        (l, a) => *l = a.clone(),
    }
}

mod fields_v1;
mod managed;
#[cfg(test)]
mod tests;

pub use fields_v1::{fields_v1_of, from_fields_v1, to_fields_v1};
pub use managed::{ManagedEntry, read_managed, write_managed};
use managed::{managed_fields_entry, set_managed_fields};

fn render_path(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            // structured-merge-diff's PathElement: `[name="c"]`, `[containerPort=80,protocol="TCP"]`.
            Seg::Key(k) => {
                let fields = serde_json::from_str::<Map<String, Value>>(k).unwrap_or_default();
                let parts: Vec<String> = fields.iter().map(|(n, v)| format!("{n}={v}")).collect();
                s.push_str(&format!("[{}]", parts.join(",")));
            }
            Seg::Val(v) => s.push_str(&format!("[={v}]")),
        }
    }
    s
}

/// An apply that touches fields owned by other managers with different values.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflicts(pub Vec<(String, String, String)>);

impl Conflicts {
    /// kube-apiserver's message: `Apply failed with N conflict(s): conflict with "m" using v1: .spec.x`.
    pub fn message(&self) -> String {
        let n = self.0.len();
        if let [(manager, api_version, field)] = self.0.as_slice() {
            return format!(
                "Apply failed with 1 conflict: conflict with \"{manager}\" using {api_version}: {field}"
            );
        }
        let mut s = format!("Apply failed with {n} conflicts:");
        for (manager, api_version, field) in &self.0 {
            s.push_str(&format!(
                " conflict with \"{manager}\" using {api_version}: {field}\n"
            ));
        }
        s.trim_end().to_string()
    }
    pub fn causes(&self) -> Vec<Value> {
        self.0
            .iter()
            .map(|(m, av, f)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\" using {av}"), "field": f}))
            .collect()
    }
}

/// Context of one write for ownership tracking.
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub subresource: &'a str,
    pub time: &'a str,
}

fn entry_for<'e>(
    entries: &'e mut Vec<ManagedEntry>,
    w: &Writer<'_>,
    operation: &str,
) -> &'e mut ManagedEntry {
    let pos = entries.iter().position(|e| {
        e.manager == w.manager && e.operation == operation && e.subresource == w.subresource
    });
    let pos = pos.unwrap_or_else(|| {
        entries.push(ManagedEntry {
            manager: w.manager.into(),
            operation: operation.into(),
            api_version: w.api_version.into(),
            subresource: w.subresource.into(),
            time: w.time.into(),
            fields: FieldSet::new(),
        });
        entries.len() - 1
    });
    let e = &mut entries[pos];
    e.time = w.time.into();
    e.api_version = w.api_version.into();
    e
}

/// Server-side apply of `applied` onto `live` (or a new object). Returns the merged object with updated
/// `managedFields`, or the conflicts when `force` is false.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    w: &Writer<'_>,
    force: bool,
    lt: ListTypes<'_>,
) -> Result<Value, Conflicts> {
    let mut entries = live.map(read_managed).unwrap_or_default();
    let new_set = fields_of(applied, lt);
    let prev_set = entries
        .iter()
        .find(|e| {
            e.manager == w.manager && e.operation == "Apply" && e.subresource == w.subresource
        })
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let empty = Value::Object(Map::new());
    let base = live.unwrap_or(&empty);
    let mut conflicts = vec![];
    for e in entries.iter_mut().filter(|e| e.manager != w.manager) {
        let clashing: Vec<Path> = e
            .fields
            .intersection(&new_set)
            // As structured-merge-diff: only values conflict. A map or list item present in both
            // (its `.` entry) is shared, whatever fields defaulting added to the live one.
            .filter(|p| match get_path(applied, p) {
                Some(Value::Object(_)) => false,
                a => get_path(base, p) != a,
            })
            .cloned()
            .collect();
        if force {
            for p in &clashing {
                e.fields.remove(p);
            }
        } else {
            conflicts.extend(
                clashing
                    .iter()
                    .map(|p| (e.manager.clone(), e.api_version.clone(), render_path(p))),
            );
        }
    }
    if !conflicts.is_empty() {
        return Err(Conflicts(conflicts));
    }
    let mut result = base.clone();
    for removed in prev_set.difference(&new_set) {
        let owned_elsewhere = entries
            .iter()
            .filter(|e| !(e.manager == w.manager && e.operation == "Apply"))
            .any(|e| e.fields.iter().any(|p| p.starts_with(removed)));
        if !owned_elsewhere {
            remove_path(&mut result, removed);
        }
    }
    let mut applied_body = applied.clone();
    if let Some(m) = applied_body.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
    }
    merge_applied(&mut result, &applied_body, &mut vec![], lt);
    entry_for(&mut entries, w, "Apply").fields = new_set;
    write_managed(&mut result, &entries);
    Ok(result)
}

/// Records ownership of the fields an ordinary write (create, update, patch) changed.
pub fn track_update(old: Option<&Value>, new: &mut Value, w: &Writer<'_>, lt: ListTypes<'_>) {
    let Some(old) = old else {
        // A new object: its writer owns every field it sets.
        let fields_v1 = fields_v1_of(new, lt);
        let entries = match fields_v1.as_object().is_some_and(|m| !m.is_empty()) {
            true => vec![managed_fields_entry(w, "Update", fields_v1)],
            false => vec![],
        };
        set_managed_fields(new, entries);
        return;
    };
    let mut entries = read_managed(old);
    let (new_fields, changed) = fields_changed_from(old, new, lt);
    // Fields that no longer exist are owned by nobody.
    for e in entries.iter_mut() {
        e.fields
            .retain(|p| new_fields.contains(p) && !changed.contains(p));
    }
    if !changed.is_empty() {
        entry_for(&mut entries, w, "Update").fields.extend(changed);
    }
    write_managed(new, &entries);
}
