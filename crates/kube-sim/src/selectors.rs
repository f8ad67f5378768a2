//! Label and field selectors, parsed and matched as `k8s.io/apimachinery/pkg/labels` and `fields` do.

use serde_json::Value;

use crate::store::Stored;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, vec![]);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_set(rest: &str, whole: &str) -> Result<Vec<String>, SelectorError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            SelectorError(format!(
                "unable to parse requirement: found '{whole}', expected: '('"
            ))
        })?;
    inner
        .split(',')
        .map(|v| {
            let v = v.trim();
            if valid_value(v) {
                Ok(v.to_string())
            } else {
                Err(SelectorError(format!("invalid label value: \"{v}\"")))
            }
        })
        .collect()
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = vec![];
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in split_top(s) {
            let p = part.trim();
            let key_err = |k: &str| {
                SelectorError(format!(
                    "unable to parse requirement: invalid label key \"{k}\""
                ))
            };
            let req = if let Some(k) = p.strip_prefix('!') {
                let k = k.trim();
                if !valid_key(k) {
                    return Err(key_err(k));
                }
                LabelReq::NotExists(k.into())
            } else if let Some((k, v)) = p.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some(idx) = p.find(" notin ").or_else(|| p.find(" notin(")) {
                let (k, rest) = p.split_at(idx);
                LabelReq::NotIn(k.trim().into(), parse_set(&rest[" notin".len()..], p)?)
            } else if let Some(idx) = p.find(" in ").or_else(|| p.find(" in(")) {
                let (k, rest) = p.split_at(idx);
                LabelReq::In(k.trim().into(), parse_set(&rest[" in".len()..], p)?)
            } else {
                if !valid_key(p) {
                    return Err(key_err(p));
                }
                LabelReq::Exists(p.into())
            };
            match &req {
                LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => {
                    if !valid_key(k) {
                        return Err(key_err(k));
                    }
                    if !valid_value(v) {
                        return Err(SelectorError(format!("invalid label value: \"{v}\"")));
                    }
                }
                LabelReq::In(k, _) | LabelReq::NotIn(k, _) if !valid_key(k) => {
                    return Err(key_err(k));
                }
                _ => {}
            }
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Matches an object's `metadata.labels`.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        self.matches_by(|k| labels.get(k).and_then(Value::as_str))
    }

    /// Matches the labels `get` reads by key.
    pub fn matches_by<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v),
            LabelReq::NotEq(k, v) => get(k) != Some(v),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// Whether `labels` and `fields` both select a stored object: only its labels are decoded when
/// no field is asked for.
pub fn selects_stored(labels: &LabelSelector, fields: &FieldSelector, obj: &Stored) -> bool {
    if fields.is_empty() {
        let stored = obj.labels();
        return labels.matches_by(|key| stored.get(key).map(String::as_str));
    }
    let tree = obj.value();
    labels.matches(&tree) && fields.matches(&tree)
}

/// A parsed field selector (`=`, `==`, `!=` on dotted paths).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses and checks the field names against those the resource supports.
    pub fn parse(s: &str, supported: impl Fn(&str) -> bool) -> Result<Self, SelectorError> {
        let mut reqs = vec![];
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in s.split(',') {
            let part = part.trim();
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            if !supported(field) {
                return Err(SelectorError(format!("field label not supported: {field}")));
            }
            reqs.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The single `metadata.name=x` requirement, if that is all the selector asks (fast path).
    pub fn exact_name(&self) -> Option<&str> {
        match self.0.as_slice() {
            [(f, true, v)] if f == "metadata.name" => Some(v),
            _ => None,
        }
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let mut cur = obj;
            for seg in field.split('.') {
                cur = &cur[seg];
            }
            let actual = match cur {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        for (sel, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web, api)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("missing!=x", true),
            ("app=web,tier in (back)", false),
            ("app in (web),tier notin (back,x)", true),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).expect(sel).matches(&o),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("app=we b").is_err());
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        let any = |_: &str| true;
        assert!(
            FieldSelector::parse("metadata.name=a,spec.nodeName==n1", any)
                .expect("parse")
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("metadata.namespace!=ns", any)
                .expect("parse")
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("status.phase=", any)
                .expect("parse")
                .matches(&o)
        );
        assert!(FieldSelector::parse("spec.x=1", |f| f.starts_with("metadata.")).is_err());
        assert_eq!(
            FieldSelector::parse("metadata.name=a", any)
                .expect("parse")
                .exact_name(),
            Some("a")
        );
    }
}
