//! `fieldsV1`, the wire form of a field set in `metadata.managedFields`: a tree of `f:`/`k:`/`v:`
//! keys whose leaves are empty objects (a keyed list item also has `.`).

use serde_json::{Map, Value, json};

use super::{FieldSet, ListType, ListTypes, Path, Seg, key_json, owned_roots};

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
