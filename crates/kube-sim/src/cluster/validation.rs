//! Validation of object metadata as kube-apiserver's apimachinery does it (names, labels,
//! annotations, finalizers), with its literal messages, and of a body's type against its URL.

use super::*;

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

pub(super) fn name_errors(info: &ResourceInfo, name: &str) -> Vec<FieldError> {
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
pub(super) fn metadata_errors(obj: &Value) -> Vec<FieldError> {
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

/// A create or update body: a JSON object whose type meta, when given, names the resource of
/// the URL.
pub(super) fn check_body_shape(info: &ResourceInfo, body: &Value) -> Result<()> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be an object",
        ));
    }
    check_type_meta(info, body)
}

/// The body's `apiVersion`/`kind`, when given, must name the resource of the URL.
pub(super) fn check_type_meta(info: &ResourceInfo, body: &Value) -> Result<()> {
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
