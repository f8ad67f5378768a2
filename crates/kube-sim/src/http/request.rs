//! Reading a request: query parameters, the body in its content type, and the options of each
//! verb (list, write, delete) with kube-apiserver's validation messages.

use crate::cluster::{DeleteOptions, ListOptions, PatchType, WriteOptions, field_supported};
use crate::error::ApiError;
use crate::registry::ResourceInfo;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::validation::{Decoded, decode_json};
use axum::body::Bytes;
use http::{HeaderMap, header};
use serde_json::{Value, json};

/// Query parameters (last value wins, as Go's `url.Values.Get` returns the first; clients send one).
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(q: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(q.unwrap_or("").as_bytes())
                .into_owned()
                .collect(),
        )
    }
    pub(crate) fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
    }
    /// Every value of a repeated parameter (exec's `command`).
    pub(crate) fn all(&self, k: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(a, _)| a == k)
            .map(|(_, v)| v.clone())
            .collect()
    }
    pub(crate) fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1" | "True"))
    }
}
pub(super) fn accept(headers: &HeaderMap) -> &str {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

pub(super) fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

pub(super) fn wants_partial(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=PartialObjectMetadata"))
}

pub(super) fn decode_body(headers: &HeaderMap, body: &Bytes) -> Result<Decoded, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if ct.contains("protobuf") {
        // Protobuf hook: built-in kinds decode; custom kinds answer 415 as kube-apiserver does.
        return crate::protobuf::decode(body)
            .map(Decoded::without_duplicates)
            .map_err(|e| match e {
                crate::protobuf::ProtoError::NotProtobuf(_)
                | crate::protobuf::ProtoError::NoMagic => {
                    ApiError::unsupported_media_type(ct, &["application/json", "application/yaml"])
                }
                e => ApiError::bad_request(e.to_string()),
            });
    }
    if ct.contains("yaml") {
        if let Ok(decoded) = decode_json(body) {
            return Ok(decoded);
        }
        let text = std::str::from_utf8(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
        return serde_saphyr::from_str::<Value>(text)
            .map(Decoded::without_duplicates)
            .map_err(|e| {
                ApiError::bad_request(format!("error converting YAML to JSON: yaml: {e}"))
            });
    }
    decode_json(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

pub(super) fn patch_type(headers: &HeaderMap) -> Result<PatchType, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let base = ct.split(';').next().unwrap_or("").trim();
    match base {
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
        _ => Err(ApiError::unsupported_media_type(
            ct,
            &[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
                "application/strategic-merge-patch+json",
            ],
        )),
    }
}

pub(super) fn default_manager(headers: &HeaderMap) -> String {
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    let m: String = ua
        .split('/')
        .next()
        .unwrap_or("unknown")
        .chars()
        .take(128)
        .collect();
    if m.is_empty() { "unknown".into() } else { m }
}

pub(super) fn write_options(
    query: &Query,
    headers: &HeaderMap,
    default_manager_for_apply: bool,
) -> WriteOptions {
    let field_manager = match query.get("fieldManager") {
        Some(m) if !m.is_empty() => m.to_string(),
        _ if default_manager_for_apply => String::new(),
        _ => default_manager(headers),
    };
    WriteOptions {
        dry_run: query.get("dryRun") == Some("All"),
        field_manager,
        field_validation: query.get("fieldValidation").unwrap_or("").to_string(),
        force: query.flag("force"),
    }
}

pub(super) fn list_options(info: &ResourceInfo, query: &Query) -> Result<ListOptions, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""), |f| {
        field_supported(info, f)
    })
    .map_err(|e| ApiError::bad_request(format!("{}: {e}", field_error_prefix(info))))?;
    let limit = match query.get("limit") {
        Some(l) if !l.is_empty() => Some(
            l.parse::<i64>()
                .map_err(|_| ApiError::bad_request("invalid limit"))?,
        ),
        _ => None,
    };
    Ok(ListOptions {
        labels,
        fields,
        limit: limit.filter(|l| *l > 0).map(|l| l as usize),
        continue_token: query
            .get("continue")
            .filter(|c| !c.is_empty())
            .map(String::from),
        resource_version_exact: None,
    })
}

/// `resourceVersion`/`resourceVersionMatch` rules of a list: `NotOlderThan` (and no match) is
/// served from the current state, `Exact` at that version (from the event history; `410` once
/// it is out of it, see `Cluster::list`); a version newer than the server's cannot be honoured.
/// Returns the exact version asked for.
pub(super) fn check_list_resource_version(
    query: &Query,
    current: u64,
) -> Result<Option<u64>, ApiError> {
    let rv = query.get("resourceVersion").unwrap_or("");
    let rv_match = query.get("resourceVersionMatch").unwrap_or("");
    if rv_match.is_empty() {
        return Ok(None);
    }
    let invalid = |detail: &str| {
        ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            &[crate::error::FieldError::forbidden(
                "resourceVersionMatch",
                detail,
            )],
        )
    };
    if rv.is_empty() {
        return Err(invalid(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if !matches!(rv_match, "Exact" | "NotOlderThan") {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            &[crate::error::FieldError::not_supported(
                "resourceVersionMatch",
                &json!(rv_match),
                &[json!("Exact"), json!("NotOlderThan"), json!("")],
            )],
        ));
    }
    let n: u64 = rv
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: \"{rv}\"")))?;
    if rv_match == "Exact" && n == 0 {
        return Err(invalid(
            "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ));
    }
    if n > current {
        return Err(ApiError::new(504, "Timeout", format!("Too large resource version: {n}, current: {current}"))
            .with_details(json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1})));
    }
    Ok((rv_match == "Exact").then_some(n))
}

pub(super) fn field_error_prefix(info: &ResourceInfo) -> String {
    format!("\"{}\" is not a known field selector", info.plural)
}
pub(super) fn delete_options(
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        propagation: query.get("propagationPolicy").map(String::from),
        dry_run: query.get("dryRun") == Some("All"),
        ..Default::default()
    };
    if !body.is_empty() {
        let v = decode_body(headers, body)?.value;
        if let Some(p) = v["propagationPolicy"].as_str() {
            opts.propagation = Some(p.into());
        }
        if v["orphanDependents"] == json!(true) {
            opts.propagation = Some("Orphan".into());
        }
        opts.precondition_uid = v["preconditions"]["uid"].as_str().map(String::from);
        opts.precondition_rv = v["preconditions"]["resourceVersion"]
            .as_str()
            .map(String::from);
        if v["dryRun"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "All"))
        {
            opts.dry_run = true;
        }
    }
    if let Some(p) = &opts.propagation
        && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
    {
        return Err(ApiError::invalid(
            "",
            "DeleteOptions",
            "",
            &[crate::error::FieldError::not_supported(
                "propagationPolicy",
                &json!(p),
                &[
                    json!("Foreground"),
                    json!("Background"),
                    json!("Orphan"),
                    json!("nil"),
                ],
            )],
        ));
    }
    Ok(opts)
}
