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
    client_name_of(user_agent).to_string()
}

/// [`client_name`], borrowed from the user agent.
fn client_name_of(user_agent: &str) -> &str {
    let name = user_agent.split('/').next().unwrap_or("").trim();
    match name.char_indices().nth(64) {
        _ if name.is_empty() => "unknown",
        Some((end, _)) => &name[..end],
        None => name,
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
/// when read. Each label set is found by its labels joined in a buffer the thread keeps, so
/// counting a request whose labels were seen before allocates nothing.
#[derive(Debug, Default)]
pub struct RequestCounters {
    counts: Mutex<foldhash::HashMap<Box<str>, (RequestKey, u64)>>,
}

impl RequestCounters {
    /// Counts one answered request.
    pub fn record(&self, info: &RequestInfo, user_agent: &str, user: &str, code: u16) {
        thread_local! {
            static JOINED: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        let path = if info.is_resource_request {
            ""
        } else {
            info.path.as_str()
        };
        let client = client_name_of(user_agent);
        JOINED.with_borrow_mut(|joined| {
            joined.clear();
            // NUL appears in none of the labels (paths and header values cannot hold it).
            for label in [
                info.verb.as_str(),
                &info.api_group,
                &info.resource,
                &info.subresource,
                path,
                client,
                user,
            ] {
                joined.push_str(label);
                joined.push('\0');
            }
            let _ = write!(joined, "{code}");
            let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            match c.get_mut(joined.as_str()) {
                Some((_, n)) => *n += 1,
                None => {
                    let key = RequestKey::new(info, user_agent, user, code);
                    c.insert(joined.as_str().into(), (key, 1));
                }
            }
        });
    }

    pub fn snapshot(&self) -> RequestStats {
        RequestStats {
            counts: self
                .counts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
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

    /// Counts one request of `my-ctl` as the server does.
    fn count(c: &RequestCounters, method: &str, path: &str, code: u16) {
        let info = RequestInfo::parse(method, path, None);
        c.record(&info, "my-ctl/1.0 (linux)", "", code);
    }

    #[test]
    fn counts_by_verb_resource_and_code() {
        let c = RequestCounters::default();
        count(&c, "GET", "/api/v1/namespaces/a/pods", 200);
        count(&c, "GET", "/api/v1/namespaces/b/pods", 200);
        count(&c, "POST", "/api/v1/namespaces/a/pods", 201);
        count(&c, "POST", "/api/v1/namespaces/a/pods", 409);
        count(&c, "PATCH", "/api/v1/namespaces/a/pods/p/status", 200);
        count(&c, "GET", "/version", 200);
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
            count(&c, "DELETE", "/api/v1/namespaces/a/pods/p", 200);
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
        count(&c, "POST", "/apis/apps/v1/namespaces/a/deployments", 201);
        count(&c, "POST", "/apis/apps/v1/namespaces/a/deployments", 201);
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
        let long = "é".repeat(70);
        assert_eq!(
            client_name(&long),
            "é".repeat(64),
            "64 characters, not bytes"
        );
    }

    #[test]
    fn each_label_set_is_its_own_counter() {
        let c = RequestCounters::default();
        let info = RequestInfo::parse("GET", "/api/v1/namespaces/a/pods", None);
        c.record(&info, "a/1", "alice", 200);
        c.record(&info, "a/2", "alice", 200);
        c.record(&info, "a/1", "bob", 200);
        c.record(&info, "b/1", "alice", 200);
        c.record(&info, "a/1", "alice", 500);
        let s = c.snapshot();
        assert_eq!(s.counts.len(), 4, "{s:?}");
        let alice_a = s.count_where(|k| k.client == "a" && k.user == "alice" && k.code == 200);
        assert_eq!(alice_a, 2, "one client across its versions");
    }
}
