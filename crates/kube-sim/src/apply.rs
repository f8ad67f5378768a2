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

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedEntry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub subresource: String,
    pub time: String,
    pub fields: FieldSet,
}

/// Writes a segment's `fieldsV1` key (`f:name`, `k:{...}`, `v:...`) into `out`.
fn write_seg_name(out: &mut String, seg: &Seg) {
    let (prefix, name) = match seg {
        Seg::Field(f) => ("f:", f),
        Seg::Key(k) => ("k:", k),
        Seg::Val(v) => ("v:", v),
    };
    out.clear();
    out.push_str(prefix);
    out.push_str(name);
}

/// Encodes a field set as `fieldsV1`. Paths share their prefixes, so a key is allocated only
/// where a new node is inserted.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    let mut name = String::new();
    for path in set {
        let mut cur = &mut root;
        for (i, seg) in path.iter().enumerate() {
            write_seg_name(&mut name, seg);
            if !cur.contains_key(&name) {
                cur.insert(name.clone(), Value::Object(Map::new()));
            }
            let Some(Value::Object(m)) = cur.get_mut(&name) else {
                break;
            };
            cur = m;
            if i == path.len() - 1 && matches!(seg, Seg::Key(_)) {
                cur.insert(".".into(), json!({}));
            }
        }
    }
    Value::Object(root)
}

/// Decodes `fieldsV1` into a field set.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    fn walk(v: &Value, path: Path, out: &mut FieldSet) {
        let Value::Object(m) = v else { return };
        if m.is_empty() && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, c) in m {
            let seg = if k == "." {
                out.insert(path.clone());
                continue;
            } else if let Some(f) = k.strip_prefix("f:") {
                Seg::Field(f.into())
            } else if let Some(j) = k.strip_prefix("k:") {
                Seg::Key(j.into())
            } else if let Some(j) = k.strip_prefix("v:") {
                Seg::Val(j.into())
            } else {
                continue;
            };
            let mut p = path.clone();
            p.push(seg);
            walk(c, p, out);
        }
    }
    walk(v, vec![], &mut out);
    out
}

pub fn read_managed(obj: &Value) -> Vec<ManagedEntry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| ManagedEntry {
            manager: e["manager"].as_str().unwrap_or_default().into(),
            operation: e["operation"].as_str().unwrap_or("Update").into(),
            api_version: e["apiVersion"].as_str().unwrap_or_default().into(),
            subresource: e["subresource"].as_str().unwrap_or_default().into(),
            time: e["time"].as_str().unwrap_or_default().into(),
            fields: from_fields_v1(&e["fieldsV1"]),
        })
        .collect()
}

pub fn write_managed(obj: &mut Value, entries: &[ManagedEntry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let w = Writer {
                manager: &e.manager,
                api_version: &e.api_version,
                subresource: &e.subresource,
                time: &e.time,
            };
            managed_fields_entry(&w, &e.operation, to_fields_v1(&e.fields))
        })
        .collect();
    set_managed_fields(obj, list);
}

/// Sets `metadata.managedFields` to `list` (removes it when empty).
fn set_managed_fields(obj: &mut Value, list: Vec<Value>) {
    if !obj["metadata"].is_object() {
        if !obj.is_object() {
            return;
        }
        obj["metadata"] = json!({});
    }
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if list.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

/// One `managedFields` item as kube-apiserver writes it.
fn managed_fields_entry(w: &Writer<'_>, operation: &str, fields_v1: Value) -> Value {
    let mut m = Map::new();
    m.insert("manager".into(), json!(w.manager));
    m.insert("operation".into(), json!(operation));
    m.insert("apiVersion".into(), json!(w.api_version));
    m.insert("time".into(), json!(w.time));
    m.insert("fieldsType".into(), json!("FieldsV1"));
    m.insert("fieldsV1".into(), fields_v1);
    if !w.subresource.is_empty() {
        m.insert("subresource".into(), json!(w.subresource));
    }
    Value::Object(m)
}

/// `to_fields_v1(&fields_of(obj, lt))` in one walk, without the intermediate set of paths: the
/// `fieldsV1` of a new object, which every create computes.
pub fn fields_v1_of(obj: &Value, lt: ListTypes<'_>) -> Value {
    let mut root = Map::new();
    for (mut path, v) in owned_roots(obj) {
        let mut node = &mut root;
        for seg in &path {
            node = child(node, seg);
        }
        fields_v1_into(v, &mut path, lt, node);
    }
    Value::Object(root)
}

/// The `fieldsV1` node under `node` for one path segment, made empty if new.
fn child<'m>(node: &'m mut Map<String, Value>, seg: &Seg) -> &'m mut Map<String, Value> {
    let mut name = String::new();
    write_seg_name(&mut name, seg);
    match node
        .entry(name)
        .or_insert_with(|| Value::Object(Map::new()))
    {
        Value::Object(m) => m,
        _ => unreachable!("fieldsV1 nodes are objects"),
    }
}

/// Adds the fields `v` sets to `node`, the `fieldsV1` node of `path`: what `collect` finds,
/// written where `to_fields_v1` would put it (a leaf is an empty node; a keyed item has `.`).
fn fields_v1_into(v: &Value, path: &mut Path, lt: ListTypes<'_>, node: &mut Map<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                let seg = Seg::Field(k.clone());
                let next = child(node, &seg);
                path.push(seg);
                fields_v1_into(c, path, lt, next);
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => match lt.of(path, items) {
            ListType::Map(keys) => {
                for item in items {
                    let seg = Seg::Key(key_json(&keys, item));
                    let next = child(node, &seg);
                    next.insert(".".into(), json!({}));
                    path.push(seg);
                    fields_v1_into(item, path, lt, next);
                    path.pop();
                }
            }
            ListType::Set => {
                for item in items {
                    child(node, &Seg::Val(item.to_string()));
                }
            }
            ListType::Atomic => {}
        },
        _ => {}
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`fields_changed_from`] computes in one walk, the way it was computed before: every
    /// leaf path of `new`, and those whose lookup from the top differs between the two objects.
    fn changes_by_lookup(old: &Value, new: &Value, lt: ListTypes<'_>) -> (FieldSet, FieldSet) {
        let all = fields_of(new, lt);
        let changed = all
            .iter()
            .filter(|p| get_path(old, p) != get_path(new, p))
            .cloned()
            .collect();
        (all, changed)
    }

    #[test]
    fn the_one_walk_finds_the_changes_that_looking_each_path_up_finds() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"app": "a"}, "finalizers": ["x", "y"],
                         "resourceVersion": "7"},
            "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}],
                                     "args": ["--a", "1"]}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "c", "ready": false, "restartCount": 0}]}});
        let mut running = pod.clone();
        running["status"] = json!({"phase": "Running", "podIP": "127.10.0.2", "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0,
                                   "state": {"running": {"startedAt": "now"}}}]});
        let mut relabelled = pod.clone();
        relabelled["metadata"]["labels"] = json!({"app": "b", "tier": "web"});
        relabelled["metadata"]["finalizers"] = json!(["y", "z"]);
        relabelled["spec"]["containers"][0]["args"] = json!(["--a", "2"]);
        let mut emptied = pod.clone();
        emptied["status"] = json!({});
        emptied["spec"]["containers"] = json!([]);
        let mut retyped = pod.clone();
        retyped["status"]["conditions"] = json!("not a list");
        retyped["spec"] = json!([1, 2]);
        for (old, new) in [
            (&pod, &pod),
            (&pod, &running),
            (&running, &pod),
            (&pod, &relabelled),
            (&pod, &emptied),
            (&emptied, &pod),
            (&pod, &retyped),
            (&retyped, &pod),
        ] {
            let lt = ListTypes::builtin();
            assert_eq!(
                fields_changed_from(old, new, lt),
                changes_by_lookup(old, new, lt),
                "from {old} to {new}"
            );
        }
        // A custom resource's own list types, from its schema.
        let schema = json!({"properties": {"spec": {"properties": {
            "ports": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "proto"],
                      "items": {"properties": {"port": {}, "proto": {}, "name": {}}}},
            "tags": {"x-kubernetes-list-type": "set"},
            "steps": {}}}}});
        let lt = ListTypes::from_schema(Some(&schema));
        let a = json!({"spec": {"ports": [{"port": 1, "proto": "TCP", "name": "a"},
                                          {"port": 1, "proto": "UDP", "name": "b"}],
                                "tags": ["x", 1, {"k": "v"}], "steps": ["one", "two"]}});
        let b = json!({"spec": {"ports": [{"port": 1, "proto": "UDP", "name": "c"},
                                          {"port": 2, "proto": "TCP"}],
                                "tags": [1, "y", {"k": "v"}], "steps": ["one"]}});
        for (old, new) in [(&a, &b), (&b, &a), (&a, &a)] {
            assert_eq!(
                fields_changed_from(old, new, lt),
                changes_by_lookup(old, new, lt),
                "from {old} to {new}"
            );
        }
    }

    #[test]
    fn a_new_objects_fields_v1_in_one_walk_is_the_set_of_its_paths_encoded() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"app": "a"}, "annotations": {},
                         "finalizers": ["x", "y", "x"], "uid": "u", "resourceVersion": "7"},
            "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}],
                                     "args": ["--a", "1"], "env": []},
                                    {"name": "d", "image": "j", "resources": {}}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "default"}, "data": {"k": "v", "e": ""}});
        let bare = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
        let retyped = json!({"metadata": "not an object", "spec": [1, 2], "status": null});
        for obj in [&pod, &config_map, &bare, &retyped, &json!("not an object")] {
            let lt = ListTypes::builtin();
            assert_eq!(
                fields_v1_of(obj, lt),
                to_fields_v1(&fields_of(obj, lt)),
                "{obj}"
            );
        }
        let schema = json!({"properties": {"spec": {"properties": {
            "ports": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "proto"],
                      "items": {"properties": {"port": {}, "proto": {}, "name": {},
                        "hosts": {"x-kubernetes-list-type": "set"}}}},
            "tags": {"x-kubernetes-list-type": "set"},
            "steps": {}}}}});
        let lt = ListTypes::from_schema(Some(&schema));
        let custom = json!({"spec": {"ports": [{"port": 1, "proto": "TCP", "name": "a", "hosts": ["h"]},
                                               {"port": 1, "proto": "UDP"}],
                                     "tags": ["x", 1, {"k": "v"}], "steps": ["one", "two"]}});
        assert_eq!(
            fields_v1_of(&custom, lt),
            to_fields_v1(&fields_of(&custom, lt))
        );
        // What a create records, spelled out (structured-merge-diff's encoding).
        assert_eq!(
            fields_v1_of(&config_map, ListTypes::builtin()),
            json!({"f:data": {"f:e": {}, "f:k": {}}})
        );
        assert_eq!(
            fields_v1_of(&custom, lt)["f:spec"]["f:ports"]["k:{\"port\":1,\"proto\":\"TCP\"}"],
            json!({".": {}, "f:hosts": {"v:\"h\"": {}}, "f:name": {}, "f:port": {}, "f:proto": {}})
        );
    }

    fn writer(m: &str) -> Writer<'_> {
        Writer {
            manager: m,
            api_version: "v1",
            subresource: "",
            time: "2024-01-01T00:00:00Z",
        }
    }

    #[test]
    fn two_managers_keep_their_fields_and_conflict_on_shared_ones() {
        let a = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": "1"}}, "data": {"x": "1"}});
        let obj =
            apply(None, &a, &writer("alice"), false, ListTypes::builtin()).expect("first apply");
        let b = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"b": "2"}}, "data": {"y": "2"}});
        let obj = apply(Some(&obj), &b, &writer("bob"), false, ListTypes::builtin())
            .expect("disjoint apply");
        assert_eq!(obj["data"], json!({"x": "1", "y": "2"}));
        assert_eq!(obj["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        // Alice drops her label: it goes; Bob's stays.
        let a2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"x": "1"}});
        let obj = apply(
            Some(&obj),
            &a2,
            &writer("alice"),
            false,
            ListTypes::builtin(),
        )
        .expect("re-apply");
        assert_eq!(obj["metadata"]["labels"], json!({"b": "2"}));
        // Bob setting Alice's field to another value conflicts unless forced.
        let b2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"x": "9", "y": "2"}});
        let err = apply(Some(&obj), &b2, &writer("bob"), false, ListTypes::builtin())
            .expect_err("conflict");
        assert_eq!(
            err.message(),
            "Apply failed with 1 conflict: conflict with \"alice\" using v1: .data.x"
        );
        let forced =
            apply(Some(&obj), &b2, &writer("bob"), true, ListTypes::builtin()).expect("forced");
        assert_eq!(forced["data"]["x"], "9");
        let owners = read_managed(&forced);
        let alice = owners.iter().find(|e| e.manager == "alice");
        assert!(alice.is_none_or(|e| {
            !e.fields
                .contains(&vec![Seg::Field("data".into()), Seg::Field("x".into())])
        }));
    }

    #[test]
    fn the_same_value_applied_by_two_managers_is_shared_not_a_conflict() {
        let live_defaulted = |mut obj: Value| {
            // What defaulting adds to a container after the first apply.
            obj["spec"]["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
            obj
        };
        let manifest = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                              "spec": {"containers": [{"name": "c", "image": "nginx:1.25"}]}});
        let obj = apply(
            None,
            &manifest,
            &writer("alice"),
            false,
            ListTypes::builtin(),
        )
        .expect("first apply");
        let obj = live_defaulted(obj);
        let obj = apply(
            Some(&obj),
            &manifest,
            &writer("bob"),
            false,
            ListTypes::builtin(),
        )
        .expect("the same values are shared");
        let image = vec![
            Seg::Field("spec".into()),
            Seg::Field("containers".into()),
            Seg::Key(r#"{"name":"c"}"#.into()),
            Seg::Field("image".into()),
        ];
        let owners: Vec<String> = read_managed(&obj)
            .into_iter()
            .filter(|e| e.fields.contains(&image))
            .map(|e| e.manager)
            .collect();
        assert_eq!(owners, ["alice", "bob"]);
        let mut changed = manifest.clone();
        changed["spec"]["containers"][0]["image"] = json!("nginx:1.26");
        let err = apply(
            Some(&obj),
            &changed,
            &writer("carol"),
            false,
            ListTypes::builtin(),
        )
        .expect_err("a different value conflicts with both owners");
        assert_eq!(
            err.message(),
            "Apply failed with 2 conflicts: conflict with \"alice\" using v1: .spec.containers[name=\"c\"].image\n conflict with \"bob\" using v1: .spec.containers[name=\"c\"].image"
        );
    }

    #[test]
    fn keyed_lists_are_owned_per_item_and_round_trip_fields_v1() {
        let a = json!({"spec": {"containers": [{"name": "a", "image": "1"}]}});
        let set = fields_of(&a, ListTypes::builtin());
        let v1 = to_fields_v1(&set);
        assert_eq!(
            v1,
            json!({"f:spec": {"f:containers": {"k:{\"name\":\"a\"}": {".": {}, "f:image": {}, "f:name": {}}}}})
        );
        assert_eq!(from_fields_v1(&v1), set);
        let obj = apply(None, &a, &writer("a"), false, ListTypes::builtin()).expect("apply");
        let b = json!({"spec": {"containers": [{"name": "b", "image": "2"}]}});
        let obj = apply(Some(&obj), &b, &writer("b"), false, ListTypes::builtin()).expect("apply");
        assert_eq!(obj["spec"]["containers"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn updates_take_ownership_of_changed_fields() {
        let old = apply(
            None,
            &json!({"data": {"x": "1"}}),
            &writer("alice"),
            false,
            ListTypes::builtin(),
        )
        .expect("apply");
        let mut new = old.clone();
        new["data"]["x"] = json!("2");
        track_update(
            Some(&old),
            &mut new,
            &writer("editor"),
            ListTypes::builtin(),
        );
        let entries = read_managed(&new);
        assert_eq!(entries.len(), 1, "{new}");
        assert_eq!(entries[0].manager, "editor");
    }

    #[test]
    fn custom_resources_follow_their_schema_list_types() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "routes": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["dest", "port"],
                       "items": {"type": "object", "properties": {"dest": {"type": "string"}, "port": {"type": "integer"}, "via": {"type": "string"}}}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "conditions": {"type": "array", "items": {"type": "object"}}}}}});
        let lt = ListTypes::from_schema(Some(&schema));
        let a = json!({"spec": {"routes": [{"dest": "x", "port": 1, "via": "a"}], "tags": ["t1"], "conditions": [{"type": "A"}]}});
        let obj = apply(None, &a, &writer("alice"), false, lt).expect("apply");
        let b = json!({"spec": {"routes": [{"dest": "x", "port": 2, "via": "b"}], "tags": ["t2"]}});
        let obj = apply(Some(&obj), &b, &writer("bob"), false, lt).expect("disjoint keys");
        assert_eq!(
            obj["spec"]["routes"].as_array().map(Vec::len),
            Some(2),
            "{obj}"
        );
        assert_eq!(obj["spec"]["tags"], json!(["t2", "t1"]));
        let fields = fields_of(&a, lt);
        assert!(fields.contains(&vec![
            Seg::Field("spec".into()),
            Seg::Field("routes".into()),
            Seg::Key(r#"{"dest":"x","port":1}"#.into())
        ]));
        // Without a list type, a custom resource's list is atomic (unlike built-in conditions).
        assert!(fields.contains(&vec![
            Seg::Field("spec".into()),
            Seg::Field("conditions".into())
        ]));
    }
}
