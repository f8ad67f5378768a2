//! What a request does, as kube-apiserver's `RequestInfoFactory` sees it: the verb (`get`, `list`,
//! `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`), API group, namespace,
//! resource, subresource and name. Accounting, fault injection and RBAC all key on it.

/// A parsed request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// False for `/version`, `/healthz`, discovery and other non-resource URLs.
    pub is_resource_request: bool,
    /// Lower-case verb; for non-resource URLs the lower-case HTTP method (`get`, `post`, ...).
    pub verb: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub path: String,
    /// The path from the resource on (`resource`, `name`, `subresource`, anything after), as
    /// kube-apiserver's `RequestInfo.Parts`; the router refuses what it does not serve.
    pub parts: Vec<String>,
}

impl RequestInfo {
    /// Parses a method, path and query string (without the leading `?`).
    pub fn parse(method: &str, path: &str, query: Option<&str>) -> Self {
        let non_resource = || Self {
            verb: method.to_ascii_lowercase(),
            path: path.to_string(),
            ..Default::default()
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, mut rest): (&str, &str, &[&str]) = match parts.as_slice() {
            ["api", v, rest @ ..] if !rest.is_empty() => ("", v, rest),
            ["apis", g, v, rest @ ..] if !rest.is_empty() => (g, v, rest),
            _ => return non_resource(),
        };
        let mut info = Self {
            is_resource_request: true,
            api_group: group.to_string(),
            api_version: version.to_string(),
            path: path.to_string(),
            ..Default::default()
        };
        let mut legacy_watch = false;
        if rest.first() == Some(&"watch") {
            legacy_watch = true;
            rest = &rest[1..];
        }
        if rest.first() == Some(&"namespaces") && rest.len() > 1 {
            info.namespace = rest[1].to_string();
            // `namespaces/<ns>/status` and `/finalize` are subresources of the namespace itself.
            if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        info.parts = rest.iter().map(|p| p.to_string()).collect();
        match rest {
            [resource] => info.resource = resource.to_string(),
            [resource, name] => {
                info.resource = resource.to_string();
                info.name = name.to_string();
            }
            [resource, name, sub, ..] => {
                info.resource = resource.to_string();
                info.name = name.to_string();
                info.subresource = sub.to_string();
            }
            [] => return non_resource(),
        }
        // A Namespace's own namespace is its name (`/api/v1/namespaces/x` and `.../x/status`).
        if info.resource == "namespaces" && group.is_empty() {
            info.namespace = info.name.clone();
        }
        let watch_param = query.is_some_and(|q| {
            form_urlencoded::parse(q.as_bytes())
                .any(|(k, v)| k == "watch" && matches!(v.as_ref(), "true" | "1" | "True"))
        });
        info.verb = match (method, info.name.is_empty()) {
            ("GET" | "HEAD", _) if legacy_watch || watch_param => "watch",
            ("GET" | "HEAD", true) => "list",
            ("GET" | "HEAD", false) => "get",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "deletecollection",
            ("DELETE", false) => "delete",
            (other, _) => {
                return Self {
                    verb: other.to_ascii_lowercase(),
                    ..info
                };
            }
        }
        .to_string();
        info
    }

    /// `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// `resource` or `resource/subresource`, as RBAC rules name it.
    pub fn resource_with_subresource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// True when a watch resumes from a given resourceVersion (not "", not "0").
    pub fn resumes_watch(query: Option<&str>) -> bool {
        query.is_some_and(|q| {
            form_urlencoded::parse(q.as_bytes())
                .any(|(k, v)| k == "resourceVersion" && !v.is_empty() && v != "0")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(method: &str, path: &str, q: Option<&str>) -> RequestInfo {
        RequestInfo::parse(method, path, q)
    }

    #[test]
    fn verbs_follow_kube_apiserver() {
        let cases = [
            ("GET", "/api/v1/namespaces/default/pods", None, "list"),
            ("GET", "/api/v1/namespaces/default/pods/web", None, "get"),
            (
                "GET",
                "/api/v1/namespaces/default/pods",
                Some("watch=true&resourceVersion=5"),
                "watch",
            ),
            (
                "GET",
                "/api/v1/watch/namespaces/default/pods",
                None,
                "watch",
            ),
            ("POST", "/api/v1/namespaces/default/pods", None, "create"),
            ("PUT", "/api/v1/namespaces/default/pods/web", None, "update"),
            (
                "PATCH",
                "/api/v1/namespaces/default/pods/web",
                None,
                "patch",
            ),
            (
                "DELETE",
                "/api/v1/namespaces/default/pods/web",
                None,
                "delete",
            ),
            (
                "DELETE",
                "/api/v1/namespaces/default/pods",
                None,
                "deletecollection",
            ),
        ];
        for (m, path, q, verb) in cases {
            assert_eq!(p(m, path, q).verb, verb, "{m} {path}");
        }
    }

    #[test]
    fn groups_namespaces_and_subresources() {
        let i = p("POST", "/api/v1/namespaces/team/pods/web-1/eviction", None);
        assert_eq!(
            (
                i.api_group.as_str(),
                i.namespace.as_str(),
                i.resource_with_subresource().as_str(),
                i.name.as_str()
            ),
            ("", "team", "pods/eviction", "web-1")
        );
        let i = p(
            "PATCH",
            "/apis/apps/v1/namespaces/a/deployments/d/status",
            None,
        );
        assert_eq!(
            (
                i.api_group.as_str(),
                i.resource.as_str(),
                i.subresource.as_str()
            ),
            ("apps", "deployments", "status")
        );
        let i = p("GET", "/api/v1/namespaces/kube-system", None);
        assert_eq!(
            (i.resource.as_str(), i.name.as_str(), i.namespace.as_str()),
            ("namespaces", "kube-system", "kube-system")
        );
        let i = p(
            "GET",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            None,
        );
        assert_eq!((i.verb.as_str(), i.namespace.as_str()), ("list", ""));
        assert!(i.is_resource_request && !i.is_write());
    }

    #[test]
    fn subresources_and_deeper_parts_as_kube_apiserver_splits_them() {
        let i = p("GET", "/api/v1/namespaces/a/pods/web/log", None);
        assert_eq!(
            (i.resource.as_str(), i.name.as_str(), i.subresource.as_str()),
            ("pods", "web", "log")
        );
        // kube-apiserver keeps what follows the subresource in Parts (pods/proxy/<path>).
        let i = p("GET", "/api/v1/namespaces/a/pods/web/proxy/healthz", None);
        assert_eq!(i.subresource, "proxy");
        assert_eq!(i.parts, ["pods", "web", "proxy", "healthz"]);
        let i = p("PUT", "/api/v1/namespaces/x/finalize", None);
        assert_eq!(
            (
                i.resource.as_str(),
                i.name.as_str(),
                i.subresource.as_str(),
                i.verb.as_str()
            ),
            ("namespaces", "x", "finalize", "update")
        );
    }

    #[test]
    fn a_namespace_is_its_own_namespace() {
        for path in ["/api/v1/namespaces/team", "/api/v1/namespaces/team/status"] {
            let i = p("GET", path, None);
            assert_eq!(
                (i.resource.as_str(), i.name.as_str(), i.namespace.as_str()),
                ("namespaces", "team", "team"),
                "{path}"
            );
        }
        let i = p("GET", "/api/v1/namespaces", None);
        assert_eq!((i.namespace.as_str(), i.verb.as_str()), ("", "list"));
    }

    #[test]
    fn discovery_and_health_are_non_resource() {
        for path in [
            "/version",
            "/api",
            "/api/v1",
            "/apis/apps/v1",
            "/healthz",
            "/metrics",
        ] {
            let i = p("GET", path, None);
            assert!(!i.is_resource_request, "{path}");
            assert_eq!((i.verb.as_str(), i.path.as_str()), ("get", path));
        }
    }

    #[test]
    fn resume_detection() {
        assert!(RequestInfo::resumes_watch(Some(
            "watch=1&resourceVersion=17"
        )));
        assert!(!RequestInfo::resumes_watch(Some(
            "watch=1&resourceVersion=0"
        )));
        assert!(!RequestInfo::resumes_watch(Some("watch=1")));
        assert!(!RequestInfo::resumes_watch(None));
    }
}
