//! `metav1.Status` failures, shaped exactly as kube-apiserver writes them.

use serde_json::{Map, Value, json};

/// One field cause of an `Invalid` (422) error (`metav1.StatusCause`).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`, ...
    pub reason: &'static str,
    /// Dotted path, as `field.Path.String()` (`spec.items[0].name`).
    pub field: String,
    /// The error body (`Invalid value: 3: must be ...`), without the field.
    pub message: String,
}

impl FieldError {
    pub fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        Self {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {}: {detail}", go_value(value)),
        }
    }
    pub fn type_invalid(field: &str, actual_type: &str, detail: &str) -> Self {
        Self {
            reason: "FieldValueTypeInvalid",
            field: field.into(),
            message: format!("Invalid value: \"{actual_type}\": {detail}"),
        }
    }
    pub fn required(field: &str) -> Self {
        Self {
            reason: "FieldValueRequired",
            field: field.into(),
            message: "Required value".into(),
        }
    }
    pub fn required_detail(field: &str, detail: &str) -> Self {
        Self {
            reason: "FieldValueRequired",
            field: field.into(),
            message: format!("Required value: {detail}"),
        }
    }
    pub fn not_supported(field: &str, value: &Value, supported: &[Value]) -> Self {
        let list: Vec<String> = supported.iter().map(go_value).collect();
        Self {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                go_value(value),
                list.join(", ")
            ),
        }
    }
    pub fn forbidden(field: &str, detail: &str) -> Self {
        Self {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }
    pub fn too_long(field: &str, max: u64) -> Self {
        Self {
            reason: "FieldValueTooLong",
            field: field.into(),
            message: format!("Too long: may not be more than {max} bytes"),
        }
    }
    pub fn too_many(field: &str, actual: usize, max: u64) -> Self {
        Self {
            reason: "FieldValueTooMany",
            field: field.into(),
            message: format!("Too many: {actual}: must have at most {max} items"),
        }
    }
    /// `field.Error.Error()`: `<field>: <body>`.
    pub fn render(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

/// Formats a value the way `field.Error` prints it (`%q` for strings, `%v` otherwise).
pub fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        Value::Null => "\"null\"".into(),
        other => other.to_string(),
    }
}

/// A failed request, rendered as a `Status` object.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
}

/// What a `details` names: the plural resource (or kind for Invalid) and its group.
fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut m = Map::new();
    if !name.is_empty() {
        m.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        m.insert("group".into(), json!(group));
    }
    if !kind.is_empty() {
        m.insert("kind".into(), json!(kind));
    }
    Value::Object(m)
}

/// `resource.group` or `resource` for the core group, as `GroupResource.String()`.
pub fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
        }
    }
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(resource, group)),
        )
        .with_details(details(name, group, resource))
    }
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(resource, group)),
        )
        .with_details(details(name, group, resource))
    }
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(resource, group)
            ),
        )
        .with_details(details(name, group, resource))
    }
    pub fn stale(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    /// 422 Invalid with one cause per field error, as `errors.NewInvalid`.
    pub fn invalid(group: &str, kind: &str, name: &str, errs: &[FieldError]) -> Self {
        let qualified_kind = qualified(kind, group);
        let aggregate = match errs {
            [] => String::new(),
            [one] => one.render(),
            many => format!(
                "[{}]",
                many.iter()
                    .map(FieldError::render)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let message = if aggregate.is_empty() {
            format!("{qualified_kind} \"{name}\" is invalid")
        } else {
            format!("{qualified_kind} \"{name}\" is invalid: {aggregate}")
        };
        let mut d = details(name, group, kind);
        let causes: Vec<Value> = errs
            .iter()
            .map(|e| json!({"reason": e.reason, "message": e.message, "field": e.field}))
            .collect();
        if let Value::Object(m) = &mut d {
            m.insert("causes".into(), Value::Array(causes));
        }
        Self::new(422, "Invalid", message).with_details(d)
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }
    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
        .with_details(json!({"causes": [{"reason": "UnsupportedMediaType", "message": content_type}]}))
    }
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    pub fn forbidden(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let what = if name.is_empty() {
            qualified(resource, group)
        } else {
            format!("{} \"{name}\"", qualified(resource, group))
        };
        Self::new(403, "Forbidden", format!("{what} is forbidden: {why}"))
            .with_details(details(name, group, resource))
    }
    pub fn resource_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }
    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
        .with_details(json!({"causes": [{"message": message}]}))
    }

    /// The `Status` object body.
    pub fn to_status(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), json!("Status"));
        m.insert("apiVersion".into(), json!("v1"));
        m.insert("metadata".into(), json!({}));
        m.insert("status".into(), json!("Failure"));
        m.insert("message".into(), json!(self.message));
        m.insert("reason".into(), json!(self.reason));
        if let Some(d) = &self.details {
            m.insert("details".into(), d.clone());
        }
        m.insert("code".into(), json!(self.code));
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_kube_apiserver() {
        let e = ApiError::not_found("", "pods", "web");
        assert_eq!(
            e.to_status(),
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                   "message":"pods \"web\" not found","reason":"NotFound",
                   "details":{"name":"web","kind":"pods"},"code":404})
        );
        let e = ApiError::not_found("example.com", "widgets", "w");
        assert_eq!(e.message, "widgets.example.com \"w\" not found");
    }

    #[test]
    fn invalid_aggregates_causes() {
        let errs = vec![
            FieldError::required("spec.size"),
            FieldError::not_supported("spec.color", &json!("pink"), &[json!("red"), json!("blue")]),
        ];
        let e = ApiError::invalid("example.com", "Widget", "w", &errs);
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Widget.example.com \"w\" is invalid: [spec.size: Required value, spec.color: Unsupported value: \"pink\": supported values: \"red\", \"blue\"]"
        );
        let causes = &e.to_status()["details"]["causes"];
        assert_eq!(causes[1]["reason"], "FieldValueNotSupported");
        assert_eq!(causes[0]["field"], "spec.size");
    }
}
