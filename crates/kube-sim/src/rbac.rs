//! RBAC authorization evaluated from stored Roles, ClusterRoles, RoleBindings and
//! ClusterRoleBindings, with kube-apiserver's rule semantics (verbs and `*`, apiGroups, resources
//! with `*`, `resource/subresource`, `*/subresource`, resourceNames, nonResourceURLs with a trailing
//! `*`), and its `403 Forbidden` messages. Aggregated ClusterRoles are not expanded.
//!
//! Like the default bootstrap policy, every authenticated user may read discovery, version and
//! health endpoints and create SelfSubjectAccessReviews/RulesReviews; `system:masters` may do anything.

use crate::error::ApiError;
use crate::request_info::RequestInfo;
use crate::store::Store;
use serde_json::{Value, json};

pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// An authenticated identity.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    pub fn new(name: &str, groups: &[&str]) -> Self {
        Self {
            name: name.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    /// The identity of a ServiceAccount token.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            uid: String::new(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    pub fn anonymous() -> Self {
        Self::new("system:anonymous", &["system:unauthenticated"])
    }

    pub fn in_group(&self, g: &str) -> bool {
        self.groups.iter().any(|x| x == g)
    }
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn has(list: &[&str], want: &str) -> bool {
    list.iter().any(|x| *x == "*" || *x == want)
}

/// Whether one PolicyRule allows a request.
pub fn rule_allows(rule: &Value, req: &RequestInfo) -> bool {
    if !has(&strings(&rule["verbs"]), &req.verb) {
        return false;
    }
    if !req.is_resource_request {
        return strings(&rule["nonResourceURLs"]).iter().any(|u| {
            *u == "*"
                || *u == req.path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| req.path.starts_with(prefix))
        });
    }
    if !has(&strings(&rule["apiGroups"]), &req.api_group) {
        return false;
    }
    let combined = req.resource_with_subresource();
    let resources_ok = strings(&rule["resources"]).iter().any(|r| {
        *r == "*"
            || *r == combined
            || (!req.subresource.is_empty() && *r == format!("*/{}", req.subresource))
            || (!req.subresource.is_empty() && *r == format!("{}/*", req.resource))
    });
    if !resources_ok {
        return false;
    }
    let names = strings(&rule["resourceNames"]);
    names.is_empty() || (!req.name.is_empty() && names.contains(&req.name.as_str()))
}

fn subject_matches(subject: &Value, user: &UserInfo, binding_ns: &str) -> bool {
    let name = subject["name"].as_str().unwrap_or_default();
    match subject["kind"].as_str() {
        Some("User") => name == user.name,
        Some("Group") => user.in_group(name),
        Some("ServiceAccount") => {
            let ns = subject["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_ns);
            user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn bound(binding: &Value, user: &UserInfo, binding_ns: &str) -> bool {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| subject_matches(s, user, binding_ns))
}

fn rbac(resource: &str) -> (String, String) {
    (RBAC_GROUP.to_string(), resource.to_string())
}

/// The rules that apply to `user` in `namespace` ("" for cluster-wide only).
pub fn rules_for(store: &Store, user: &UserInfo, namespace: &str) -> Vec<Value> {
    let mut rules = Vec::new();
    let role_rules = |kind: &str, ns: &str, name: &str| -> Vec<Value> {
        let found = match kind {
            "ClusterRole" => store.get(&rbac("clusterroles"), &(String::new(), name.into())),
            "Role" => store.get(&rbac("roles"), &(ns.into(), name.into())),
            _ => None,
        };
        found
            .and_then(|r| r["rules"].as_array().cloned())
            .unwrap_or_default()
    };
    for (_, crb) in store.list_values(&rbac("clusterrolebindings"), None) {
        if bound(&crb, user, "") && crb["roleRef"]["kind"] == "ClusterRole" {
            let name = crb["roleRef"]["name"].as_str().unwrap_or_default();
            rules.extend(role_rules("ClusterRole", "", name));
        }
    }
    if !namespace.is_empty() {
        for (_, rb) in store.list_values(&rbac("rolebindings"), Some(namespace)) {
            if bound(&rb, user, namespace) {
                let kind = rb["roleRef"]["kind"].as_str().unwrap_or_default();
                let name = rb["roleRef"]["name"].as_str().unwrap_or_default();
                rules.extend(role_rules(kind, namespace, name));
            }
        }
    }
    rules
}

/// Requests every authenticated user may make (the bootstrap discovery and basic-user roles).
fn always_allowed(user: &UserInfo, req: &RequestInfo) -> bool {
    if user.in_group("system:masters") {
        return true;
    }
    let authenticated = user.in_group("system:authenticated");
    if !req.is_resource_request {
        let public = ["/healthz", "/livez", "/readyz", "/version"];
        let discovery = ["/api", "/apis", "/openapi"];
        let path = req.path.trim_end_matches('/');
        let matches = |prefixes: &[&str]| {
            prefixes
                .iter()
                .any(|p| path == *p || path.starts_with(&format!("{p}/")))
        };
        return req.verb == "get" && (matches(&public) || (authenticated && matches(&discovery)));
    }
    authenticated
        && req.api_group == "authorization.k8s.io"
        && req.verb == "create"
        && matches!(
            req.resource.as_str(),
            "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
        )
}

/// The RBAC decision for a request.
pub fn allowed(store: &Store, user: &UserInfo, req: &RequestInfo) -> bool {
    if always_allowed(user, req) {
        return true;
    }
    rules_for(store, user, &req.namespace)
        .iter()
        .any(|r| rule_allows(r, req))
}

/// kube-apiserver's 403 for a denied request.
pub fn forbidden(user: &UserInfo, req: &RequestInfo) -> ApiError {
    if !req.is_resource_request {
        return ApiError::new(
            403,
            "Forbidden",
            format!(
                "forbidden: User \"{}\" cannot {} path \"{}\"",
                user.name, req.verb, req.path
            ),
        )
        .with_details(json!({}));
    }
    let scope = if req.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", req.namespace)
    };
    let why = format!(
        "User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
        user.name,
        req.verb,
        req.resource_with_subresource(),
        req.api_group
    );
    ApiError::forbidden(&req.api_group, &req.resource, &req.name, &why)
}

/// The request a SelfSubjectAccessReview's `spec` asks about.
pub fn review_request(spec: &Value) -> RequestInfo {
    let r = &spec["resourceAttributes"];
    if r.is_object() {
        let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        return RequestInfo {
            is_resource_request: true,
            verb: s("verb"),
            api_group: s("group"),
            api_version: s("version"),
            namespace: s("namespace"),
            resource: s("resource"),
            subresource: s("subresource"),
            name: s("name"),
            ..Default::default()
        };
    }
    let n = &spec["nonResourceAttributes"];
    RequestInfo {
        verb: n["verb"].as_str().unwrap_or_default().to_string(),
        path: n["path"].as_str().unwrap_or_default().to_string(),
        ..Default::default()
    }
}

fn pb_varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(out);
        }
    }
    None
}

/// The length-delimited fields of a protobuf message (other wire types are skipped).
fn pb_fields(buf: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let key = pb_varint(buf, &mut pos)?;
        match key & 7 {
            0 => {
                pb_varint(buf, &mut pos)?;
            }
            1 => pos += 8,
            5 => pos += 4,
            2 => {
                let len = usize::try_from(pb_varint(buf, &mut pos)?).ok()?;
                let end = pos.checked_add(len).filter(|e| *e <= buf.len())?;
                out.push((key >> 3, &buf[pos..end]));
                pos = end;
            }
            _ => return None,
        }
    }
    Some(out)
}

/// A SelfSubjectAccessReview sent as `application/vnd.kubernetes.protobuf` (kubectl does), as JSON.
pub fn decode_review_protobuf(body: &[u8]) -> Option<Value> {
    let envelope = pb_fields(body.strip_prefix(b"k8s\0")?)?;
    let raw = envelope.iter().find(|(n, _)| *n == 2)?.1;
    let spec_bytes = pb_fields(raw)?.into_iter().find(|(n, _)| *n == 2)?.1;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut spec = serde_json::Map::new();
    for (n, b) in pb_fields(spec_bytes)? {
        let names: &[&str] = match n {
            1 => &[
                "namespace",
                "verb",
                "group",
                "version",
                "resource",
                "subresource",
                "name",
            ],
            2 => &["path", "verb"],
            _ => continue,
        };
        let mut attrs = serde_json::Map::new();
        for (f, v) in pb_fields(b)? {
            if let Some(name) = usize::try_from(f)
                .ok()
                .and_then(|f| names.get(f.checked_sub(1)?))
            {
                attrs.insert((*name).into(), json!(text(v)));
            }
        }
        let key = if n == 1 {
            "resourceAttributes"
        } else {
            "nonResourceAttributes"
        };
        spec.insert(key.into(), Value::Object(attrs));
    }
    Some(
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "metadata": {}, "spec": Value::Object(spec)}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str) -> RequestInfo {
        RequestInfo::parse(method, path, None)
    }

    #[test]
    fn rules_match_like_kube_apiserver() {
        let rule = json!({"apiGroups": [""], "resources": ["configmaps", "pods/log"], "verbs": ["get", "list"]});
        assert!(rule_allows(
            &rule,
            &req("GET", "/api/v1/namespaces/a/configmaps/x")
        ));
        assert!(rule_allows(
            &rule,
            &req("GET", "/api/v1/namespaces/a/configmaps")
        ));
        assert!(!rule_allows(
            &rule,
            &req("DELETE", "/api/v1/namespaces/a/configmaps/x")
        ));
        assert!(!rule_allows(
            &rule,
            &req("GET", "/api/v1/namespaces/a/pods/p")
        ));
        assert!(rule_allows(
            &rule,
            &req("GET", "/api/v1/namespaces/a/pods/p/log")
        ));
        assert!(!rule_allows(
            &rule,
            &req("GET", "/apis/apps/v1/namespaces/a/deployments")
        ));

        let named = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"], "resourceNames": ["only"]});
        assert!(rule_allows(
            &named,
            &req("PUT", "/apis/apps/v1/namespaces/a/deployments/only")
        ));
        assert!(!rule_allows(
            &named,
            &req("PUT", "/apis/apps/v1/namespaces/a/deployments/other")
        ));
        assert!(
            !rule_allows(
                &named,
                &req("GET", "/apis/apps/v1/namespaces/a/deployments")
            ),
            "a list has no name"
        );

        let sub = json!({"apiGroups": ["apps"], "resources": ["*/status"], "verbs": ["patch"]});
        assert!(rule_allows(
            &sub,
            &req("PATCH", "/apis/apps/v1/namespaces/a/deployments/d/status")
        ));
        assert!(!rule_allows(
            &sub,
            &req("PATCH", "/apis/apps/v1/namespaces/a/deployments/d")
        ));

        let urls = json!({"nonResourceURLs": ["/metrics", "/logs/*"], "verbs": ["get"]});
        assert!(rule_allows(&urls, &req("GET", "/metrics")));
        assert!(rule_allows(&urls, &req("GET", "/logs/kube.log")));
        assert!(!rule_allows(&urls, &req("GET", "/version")));
    }

    #[test]
    fn forbidden_messages_match_kube_apiserver() {
        let sa = UserInfo::service_account("team", "bot");
        let e = forbidden(&sa, &req("DELETE", "/api/v1/namespaces/team/configmaps/x"));
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "configmaps \"x\" is forbidden: User \"system:serviceaccount:team:bot\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"team\""
        );
        let e = forbidden(&sa, &req("GET", "/apis/apps/v1/deployments"));
        assert_eq!(
            e.message,
            "deployments.apps is forbidden: User \"system:serviceaccount:team:bot\" cannot list resource \"deployments\" in API group \"apps\" at the cluster scope"
        );
        let e = forbidden(&sa, &req("POST", "/api/v1/namespaces/team/pods/p/eviction"));
        assert!(
            e.message
                .contains("cannot create resource \"pods/eviction\""),
            "{}",
            e.message
        );
        let e = forbidden(&sa, &req("GET", "/metrics"));
        assert_eq!(
            e.message,
            "forbidden: User \"system:serviceaccount:team:bot\" cannot get path \"/metrics\""
        );
    }

    #[test]
    fn bindings_grant_roles_to_users_groups_and_service_accounts() {
        let mut store = Store::new(100);
        store.put(&rbac("roles"), json!({"metadata": {"namespace": "team", "name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}));
        store.put(
            &rbac("rolebindings"),
            json!({"metadata": {"namespace": "team", "name": "bot-reads"},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot"}]}),
        );
        store.put(
            &rbac("clusterroles"),
            json!({"metadata": {"name": "node-reader"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]}),
        );
        store.put(
            &rbac("clusterrolebindings"),
            json!({"metadata": {"name": "ops-nodes"},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "node-reader"},
            "subjects": [{"kind": "Group", "name": "ops"}]}),
        );

        let bot = UserInfo::service_account("team", "bot");
        assert!(allowed(
            &store,
            &bot,
            &req("GET", "/api/v1/namespaces/team/configmaps")
        ));
        assert!(!allowed(
            &store,
            &bot,
            &req("GET", "/api/v1/namespaces/other/configmaps")
        ));
        assert!(!allowed(
            &store,
            &bot,
            &req("POST", "/api/v1/namespaces/team/configmaps")
        ));
        assert!(!allowed(&store, &bot, &req("GET", "/api/v1/nodes/n1")));
        let other_bot = UserInfo::service_account("other", "bot");
        assert!(!allowed(
            &store,
            &other_bot,
            &req("GET", "/api/v1/namespaces/team/configmaps")
        ));

        let alice = UserInfo::new("alice", &["ops", "system:authenticated"]);
        assert!(allowed(&store, &alice, &req("GET", "/api/v1/nodes/n1")));
        assert!(!allowed(&store, &alice, &req("DELETE", "/api/v1/nodes/n1")));
        assert!(allowed(&store, &alice, &req("GET", "/apis")), "discovery");
        assert!(allowed(
            &store,
            &alice,
            &req(
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
            )
        ));
        assert!(!allowed(
            &store,
            &UserInfo::anonymous(),
            &req("GET", "/apis")
        ));
        assert!(allowed(
            &store,
            &UserInfo::anonymous(),
            &req("GET", "/version")
        ));
        let root = UserInfo::new("admin", &["system:masters"]);
        assert!(allowed(&store, &root, &req("DELETE", "/api/v1/nodes/n1")));
    }

    #[test]
    fn protobuf_access_reviews_decode() {
        // k8s\0 + Unknown{typeMeta{apiVersion, kind}, raw: SSAR{spec{resourceAttributes{...}}}}
        fn field(n: u8, b: &[u8]) -> Vec<u8> {
            let mut out = vec![(n << 3) | 2, b.len() as u8];
            out.extend_from_slice(b);
            out
        }
        let attrs = [
            field(1, b"team"),
            field(2, b"create"),
            field(5, b"pods"),
            field(6, b"eviction"),
        ]
        .concat();
        let spec = field(1, &attrs);
        let ssar = [field(1, b""), field(2, &spec)].concat();
        let type_meta = [
            field(1, b"authorization.k8s.io/v1"),
            field(2, b"SelfSubjectAccessReview"),
        ]
        .concat();
        let body = [b"k8s\0".to_vec(), field(1, &type_meta), field(2, &ssar)].concat();
        let review = decode_review_protobuf(&body).expect("decodes");
        assert_eq!(
            review["spec"]["resourceAttributes"],
            json!({"namespace": "team", "verb": "create", "resource": "pods", "subresource": "eviction"})
        );
        assert!(decode_review_protobuf(b"not protobuf").is_none());
    }

    #[test]
    fn access_review_specs() {
        let r = review_request(
            &json!({"resourceAttributes": {"namespace": "a", "verb": "create", "resource": "pods", "subresource": "eviction"}}),
        );
        assert_eq!(
            (
                r.verb.as_str(),
                r.resource_with_subresource().as_str(),
                r.namespace.as_str()
            ),
            ("create", "pods/eviction", "a")
        );
        let r =
            review_request(&json!({"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}));
        assert!(!r.is_resource_request);
        assert_eq!(r.path, "/metrics");
    }
}
