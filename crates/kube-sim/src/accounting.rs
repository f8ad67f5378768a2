//! Request accounting: how many requests of each verb, resource, client and response code the
//! server answered, so a test can assert "steady state made zero writes" and a benchmark can report
//! requests per reconcile. Served as Prometheus text at `/metrics` and as a snapshot from the library.

use crate::request_info::RequestInfo;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// One counter's labels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    /// Non-resource URL path (`/version`, `/api`, ...); empty for resource requests.
    pub path: String,
    /// The client: the user agent's product (`kubectl`, `kube-rs`, `my-controller`), before the `/`.
    pub client: String,
    /// The authenticated user when authentication is on, else empty.
    pub user: String,
    pub code: u16,
}

impl RequestKey {
    pub fn new(info: &RequestInfo, user_agent: &str, user: &str, code: u16) -> Self {
        Self {
            verb: info.verb.clone(),
            group: info.api_group.clone(),
            resource: info.resource.clone(),
            subresource: info.subresource.clone(),
            path: if info.is_resource_request {
                String::new()
            } else {
                info.path.clone()
            },
            client: client_name(user_agent),
            user: user.to_string(),
            code,
        }
    }

    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) && self.path.is_empty()
    }
}

/// The product part of a user agent (`kubectl/v1.33.0 (linux/amd64)` -> `kubectl`).
pub fn client_name(user_agent: &str) -> String {
    let name = user_agent.split('/').next().unwrap_or("").trim();
    if name.is_empty() {
        "unknown".into()
    } else {
        name.chars().take(64).collect()
    }
}

/// A point-in-time copy of the counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestStats {
    pub counts: BTreeMap<RequestKey, u64>,
}

impl RequestStats {
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Requests whose labels satisfy `keep`.
    pub fn count_where(&self, keep: impl Fn(&RequestKey) -> bool) -> u64 {
        self.counts
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests of one verb on one resource (`"pods"` or `"pods/status"`), any group and code.
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        let (res, sub) = resource.split_once('/').unwrap_or((resource, ""));
        self.count_where(|k| k.verb == verb && k.resource == res && k.subresource == sub)
    }

    /// Writes (create, update, patch, delete, deletecollection) of any resource.
    pub fn writes(&self) -> u64 {
        self.count_where(RequestKey::is_write)
    }

    /// `verb resource[/sub] code -> n`, without clients, in a stable order (handy in assertions).
    pub fn by_verb_resource_code(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (k, n) in &self.counts {
            let what = if k.path.is_empty() {
                if k.subresource.is_empty() {
                    k.resource.clone()
                } else {
                    format!("{}/{}", k.resource, k.subresource)
                }
            } else {
                k.path.clone()
            };
            *out.entry(format!("{} {what} {}", k.verb, k.code))
                .or_insert(0) += n;
        }
        out
    }

    /// The difference `self - earlier`, for "what did this phase do".
    pub fn since(&self, earlier: &RequestStats) -> RequestStats {
        let mut counts = BTreeMap::new();
        for (k, n) in &self.counts {
            let before = earlier.counts.get(k).copied().unwrap_or(0);
            if *n > before {
                counts.insert(k.clone(), n - before);
            }
        }
        RequestStats { counts }
    }
}

/// The live counters of one server: hashed, as every request counts itself here; ordered only
/// when read.
#[derive(Debug, Default)]
pub struct RequestCounters {
    counts: Mutex<foldhash::HashMap<RequestKey, u64>>,
}

impl RequestCounters {
    pub fn record(&self, key: RequestKey) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *c.entry(key).or_insert(0) += 1;
    }

    pub fn snapshot(&self) -> RequestStats {
        RequestStats {
            counts: self
                .counts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(k, n)| (k.clone(), *n))
                .collect(),
        }
    }

    pub fn reset(&self) {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Prometheus text exposition of `apiserver_request_total`, labelled like kube-apiserver's plus
    /// `client` and `user`.
    pub fn prometheus_text(&self) -> String {
        render_prometheus(&self.snapshot())
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub fn render_prometheus(stats: &RequestStats) -> String {
    let mut out = String::from(
        "# HELP apiserver_request_total Counter of apiserver requests broken out for each verb, group, resource, subresource, client, user and HTTP response code.\n# TYPE apiserver_request_total counter\n",
    );
    for (k, n) in &stats.counts {
        let _ = writeln!(
            out,
            "apiserver_request_total{{verb=\"{}\",group=\"{}\",resource=\"{}\",subresource=\"{}\",path=\"{}\",client=\"{}\",user=\"{}\",code=\"{}\"}} {n}",
            escape_label(&k.verb.to_uppercase()),
            escape_label(&k.group),
            escape_label(&k.resource),
            escape_label(&k.subresource),
            escape_label(&k.path),
            escape_label(&k.client),
            escape_label(&k.user),
            k.code
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(method: &str, path: &str, code: u16) -> RequestKey {
        RequestKey::new(
            &RequestInfo::parse(method, path, None),
            "my-ctl/1.0 (linux)",
            "",
            code,
        )
    }

    #[test]
    fn counts_by_verb_resource_and_code() {
        let c = RequestCounters::default();
        c.record(key("GET", "/api/v1/namespaces/a/pods", 200));
        c.record(key("GET", "/api/v1/namespaces/b/pods", 200));
        c.record(key("POST", "/api/v1/namespaces/a/pods", 201));
        c.record(key("POST", "/api/v1/namespaces/a/pods", 409));
        c.record(key("PATCH", "/api/v1/namespaces/a/pods/p/status", 200));
        c.record(key("GET", "/version", 200));
        let s = c.snapshot();
        assert_eq!(s.total(), 6);
        assert_eq!(s.count("list", "pods"), 2);
        assert_eq!(s.count("create", "pods"), 2);
        assert_eq!(s.count("patch", "pods/status"), 1);
        assert_eq!(s.count("patch", "pods"), 0);
        assert_eq!(s.writes(), 3);
        assert_eq!(
            s.by_verb_resource_code().get("create pods 409").copied(),
            Some(1)
        );
        assert_eq!(
            s.by_verb_resource_code().get("get /version 200").copied(),
            Some(1)
        );
        let later = {
            c.record(key("DELETE", "/api/v1/namespaces/a/pods/p", 200));
            c.snapshot()
        };
        assert_eq!(later.since(&s).total(), 1);
        assert_eq!(later.since(&s).writes(), 1);
        c.reset();
        assert_eq!(c.snapshot().total(), 0);
    }

    #[test]
    fn prometheus_exposition() {
        let c = RequestCounters::default();
        c.record(key("POST", "/apis/apps/v1/namespaces/a/deployments", 201));
        c.record(key("POST", "/apis/apps/v1/namespaces/a/deployments", 201));
        let text = c.prometheus_text();
        assert!(text.contains("# TYPE apiserver_request_total counter\n"));
        assert!(text.contains(
            "apiserver_request_total{verb=\"CREATE\",group=\"apps\",resource=\"deployments\",subresource=\"\",path=\"\",client=\"my-ctl\",user=\"\",code=\"201\"} 2\n"
        ), "{text}");
    }

    #[test]
    fn client_names() {
        assert_eq!(
            client_name("kubectl/v1.33.1 (linux/amd64) kubernetes/abc"),
            "kubectl"
        );
        assert_eq!(client_name(""), "unknown");
        assert_eq!(client_name("plain"), "plain");
    }
}
