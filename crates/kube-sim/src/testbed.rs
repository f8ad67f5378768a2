//! The testbed in front of the API: request accounting, fault injection and the admin endpoints
//! (`/metrics`, `/_sim/...`), checked by the router's one handler before the request pipeline,
//! plus the `KubeSim` methods that drive them from a test.
//!
//! Admin endpoints (JSON):
//! - `GET|POST|DELETE /_sim/faults`: read, replace (a [`FaultConfig`]) or clear the faults;
//! - `POST /_sim/partition` `{"seconds": 2.5}` / `DELETE /_sim/partition`;
//! - `POST /_sim/watches/cut` ends every open watch; `POST /_sim/watches/gone` `{"count": 1}`
//!   answers the next resumptions with `410 Gone`;
//! - `GET|DELETE /_sim/requests`: the request counters, or reset them;
//! - `POST /_sim/nodes` `{"name": "n1", "labels": {...}}` adds a Ready, heartbeating node;
//!   `PUT /_sim/nodes/<name>` `{"ready": false}` stops (or restarts) its kubelet.

use crate::accounting::{RequestCounters, RequestStats};
use crate::auth::Authenticator;
use crate::error::ApiError;
use crate::faults::{FaultConfig, FaultInjector};
use crate::rbac::{self, UserInfo};
use crate::request_info::RequestInfo;
use crate::shared::{Shared, WatchEnd};
use crate::workloads::{Nodes, WorkloadError};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::Response;
use futures::StreamExt;
use http::{Method, StatusCode, header};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// Accounting, faults and admin state of one server.
pub struct Testbed {
    pub counters: RequestCounters,
    pub faults: FaultInjector,
    pub(crate) nodes: Arc<Nodes>,
    pub(crate) kubelet: Arc<crate::kubelet::Kubelet>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) auth: Authenticator,
}

#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    #[error(transparent)]
    Workloads(#[from] WorkloadError),
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
    #[error(transparent)]
    Persistence(#[from] crate::persistence::PersistenceError),
    #[error(transparent)]
    Kubelet(#[from] crate::kubelet::KubeletError),
}

impl Testbed {
    /// Sets up the testbed for a server about to serve `shared`, and starts its background tasks.
    pub fn start(config: &crate::Config, shared: Arc<Shared>) -> Result<Arc<Self>, TestbedError> {
        // Fail early on a bad pool rather than in the background.
        crate::workloads::IpPool::parse(&config.workloads.pod_cidr)?;
        if let Some(dir) = &config.data_dir {
            let commit = crate::persistence::open(dir, &mut shared.lock(), config.history_size)?;
            let _ = shared.group_commit.set(commit);
        }
        let tb = Arc::new(Self {
            counters: RequestCounters::default(),
            faults: FaultInjector::new(config.faults.clone()),
            nodes: Arc::new(Nodes::default()),
            kubelet: Arc::new(crate::kubelet::Kubelet::new(config.kubelet.clone())?),
            shared: shared.clone(),
            auth: Authenticator::new(&config.auth)?,
        });
        tb.configure_faults(config.faults.clone());
        crate::workloads::spawn(
            shared,
            crate::workloads::Simulation {
                options: config.workloads.clone(),
                nodes: tb.nodes.clone(),
                kubelet: tb.kubelet.clone(),
                template_hashes: Default::default(),
            },
            config.simulate_workloads,
        );
        Ok(tb)
    }

    /// The server's router: every request goes to [`handle`].
    pub fn router(self: &Arc<Self>) -> axum::Router {
        axum::Router::new()
            .fallback(handle)
            .with_state(self.clone())
    }

    /// The `user:` entry of the generated kubeconfig (the admin token when authentication is on).
    pub(crate) fn kubeconfig_user(&self) -> String {
        match self.auth.admin_token() {
            Some(t) => format!("{{token: {t}}}"),
            None => "{}".into(),
        }
    }

    /// Gives a client configuration the admin token when authentication is on.
    pub(crate) fn authorize_client(&self, config: &mut kube::Config) {
        if let Some(t) = self.auth.admin_token() {
            config.auth_info = auth_info(t);
        }
    }

    pub fn cut_watches(&self) {
        self.shared.end_watches(WatchEnd::Cut);
    }

    /// Replaces the fault configuration: the request faults, and the event log's fsync fault
    /// (with a data directory).
    pub fn configure_faults(&self, config: FaultConfig) {
        if let Some(commit) = self.shared.group_commit.get() {
            commit.fail_fsync(config.fsync_fail_after);
        }
        self.faults.configure(config);
    }

    pub fn partition_for(&self, d: Duration) {
        self.faults.partition_for(d);
        self.cut_watches();
    }
}

fn json_response(code: u16, body: &Value) -> Response {
    let mut r = Response::new(Body::from(serde_json::to_vec(body).unwrap_or_default()));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

pub(crate) fn status_response(err: &ApiError) -> Response {
    json_response(err.code, &err.to_status())
}

/// A response whose body fails at once: hyper aborts the connection, as a network fault would.
fn dropped_connection() -> Response {
    let failing = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("kube-sim: partitioned"))
    });
    Response::new(Body::from_stream(failing))
}

/// A watch answered with one `410 Gone` ERROR event, as kube-apiserver does for a compacted RV.
fn watch_gone(query: Option<&str>) -> Response {
    let rv = query
        .and_then(|q| {
            form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == "resourceVersion")
                .map(|(_, v)| v.into_owned())
        })
        .unwrap_or_default();
    let err = ApiError::gone(format!("too old resource version: {rv} ({rv})"));
    let mut line = serde_json::to_vec(&json!({"type": "ERROR", "object": err.to_status()}))
        .unwrap_or_default();
    line.push(b'\n');
    let mut r = Response::new(Body::from(line));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Ends a watch stream after `max_events` events (lines; a chunk may carry several) or after
/// `max_age` (cutting every watch at once is `Shared::end_watches`).
fn limit_watch(resp: Response, max_events: Option<u64>, max_age: Option<Duration>) -> Response {
    struct Limit {
        stream: axum::body::BodyDataStream,
        sent: u64,
        max_events: Option<u64>,
        deadline: Option<tokio::time::Instant>,
    }
    let (parts, body) = resp.into_parts();
    let state = Limit {
        stream: body.into_data_stream(),
        sent: 0,
        max_events,
        deadline: max_age.map(|d| tokio::time::Instant::now() + d),
    };
    let limited = futures::stream::unfold(state, |mut st| async move {
        if st.max_events.is_some_and(|m| st.sent >= m) {
            return None;
        }
        let deadline = st.deadline;
        let expire = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => futures::future::pending::<()>().await,
            }
        };
        let mut item = tokio::select! {
            item = st.stream.next() => item,
            _ = expire => None,
        }?;
        if let (Some(max), Ok(chunk)) = (st.max_events, &mut item) {
            *chunk = first_lines(chunk, max - st.sent);
            st.sent += chunk.iter().filter(|b| **b == b'\n').count() as u64;
        } else {
            st.sent += 1;
        }
        Some((item, st))
    });
    Response::from_parts(parts, Body::from_stream(limited))
}

/// At most the first `n` newline-terminated lines of a chunk.
fn first_lines(chunk: &Bytes, n: u64) -> Bytes {
    let mut seen = 0;
    for (i, b) in chunk.iter().enumerate() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return chunk.slice(..=i);
            }
        }
    }
    chunk.clone()
}

async fn admin(tb: &Testbed, method: &Method, path: &str, body: Bytes) -> Response {
    let parse = |body: &Bytes| -> Result<Value, ApiError> {
        if body.is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))
    };
    match (method, path) {
        (&Method::GET, "/_sim/faults") => json_response(200, &json!(tb.faults.config())),
        (&Method::POST | &Method::PUT, "/_sim/faults") => {
            let parsed = std::str::from_utf8(&body)
                .map_err(|e| ApiError::bad_request(format!("invalid fault configuration: {e}")))
                .and_then(|text| {
                    FaultConfig::from_json(text).map_err(|e| ApiError::bad_request(e.to_string()))
                });
            match parsed {
                Ok(c) if c.fsync_fail_after.is_some() && tb.shared.group_commit.get().is_none() => {
                    status_response(&ApiError::bad_request(
                        "invalid fault configuration: fsyncFailAfter: kube-sim runs without \
                         --data-dir, so there is no fsync to fail",
                    ))
                }
                Ok(c) => {
                    tb.configure_faults(c);
                    json_response(200, &json!(tb.faults.config()))
                }
                Err(e) => status_response(&e),
            }
        }
        (&Method::DELETE, "/_sim/faults") => {
            tb.configure_faults(FaultConfig::default());
            tb.faults.heal_partition();
            json_response(200, &json!(tb.faults.config()))
        }
        (&Method::POST, "/_sim/partition") => match parse(&body) {
            Ok(v) => {
                let secs = match &v["seconds"] {
                    Value::Null => Some(1.0),
                    s => s.as_f64(),
                };
                let checked = match secs {
                    None => Err("seconds: must be a number".to_string()),
                    Some(s) => crate::faults::check_seconds("seconds", s).map_err(|e| match e {
                        crate::faults::FaultConfigError::Invalid { field, why } => {
                            format!("{field}: {why}")
                        }
                        other => other.to_string(),
                    }),
                };
                match checked {
                    Ok(d) => {
                        tb.partition_for(d);
                        json_response(200, &json!({"partitionedSeconds": d.as_secs_f64()}))
                    }
                    Err(why) => {
                        status_response(&ApiError::bad_request(format!("invalid partition: {why}")))
                    }
                }
            }
            Err(e) => status_response(&e),
        },
        (&Method::DELETE, "/_sim/partition") => {
            tb.faults.heal_partition();
            json_response(200, &json!({}))
        }
        (&Method::POST, "/_sim/watches/cut") => {
            tb.cut_watches();
            json_response(200, &json!({}))
        }
        (&Method::POST, "/_sim/watches/gone") => match parse(&body) {
            Ok(v) => {
                let n = v["count"].as_u64().unwrap_or(1);
                tb.faults
                    .force_watch_gone(u32::try_from(n).unwrap_or(u32::MAX));
                json_response(200, &json!({"count": n}))
            }
            Err(e) => status_response(&e),
        },
        (&Method::POST, "/_sim/nodes") => match parse(&body) {
            Ok(v) => {
                let Some(name) = v["name"].as_str().filter(|n| !n.is_empty()) else {
                    return status_response(&ApiError::bad_request("a node needs a \"name\""));
                };
                let labels: std::collections::BTreeMap<String, String> = v["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect();
                match tb.nodes.add(&mut tb.shared.lock(), name, &labels) {
                    Ok(()) => json_response(201, &json!({"name": name})),
                    Err(e) => status_response(&ApiError::internal(e.to_string())),
                }
            }
            Err(e) => status_response(&e),
        },
        (&Method::PUT, p) if p.starts_with("/_sim/nodes/") => match parse(&body) {
            Ok(v) => {
                let name = p.trim_start_matches("/_sim/nodes/");
                let ready = v["ready"].as_bool().unwrap_or(true);
                match tb.nodes.set_ready(&mut tb.shared.lock(), name, ready) {
                    Ok(()) => json_response(200, &json!({"name": name, "ready": ready})),
                    Err(e) => status_response(&ApiError::internal(e.to_string())),
                }
            }
            Err(e) => status_response(&e),
        },
        (&Method::GET, "/_sim/requests") => {
            let counts: Vec<Value> = tb
                .counters
                .snapshot()
                .counts
                .iter()
                .map(|(k, n)| {
                    json!({"verb": k.verb, "group": k.group, "resource": k.resource,
                           "subresource": k.subresource, "path": k.path, "client": k.client,
                           "user": k.user, "code": k.code, "count": n})
                })
                .collect();
            json_response(200, &json!({"requests": counts}))
        }
        (&Method::DELETE, "/_sim/requests") => {
            tb.counters.reset();
            json_response(200, &json!({}))
        }
        _ => status_response(&ApiError::resource_not_found()),
    }
}

const MAX_ADMIN_BODY: usize = 1024 * 1024;

/// The one entry point of every request: the testbed's endpoints and checks, then the pod
/// streams or the API pipeline ([`crate::http::stream::serve`]). Plain calls rather than axum
/// middleware layers, which cost a boxed future and a service clone per request per layer.
async fn handle(State(tb): State<Arc<Testbed>>, req: Request) -> Response {
    let path = req.uri().path();
    let query = req.uri().query().map(String::from);
    if path == "/metrics" && req.method() == Method::GET {
        let mut r = Response::new(Body::from(tb.counters.prometheus_text()));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return r;
    }
    if path.starts_with("/_sim/") {
        // The testbed's controls are the cluster admin's: with authentication on, only a
        // `system:masters` token (401 without credentials, 403 for anyone else).
        if tb.auth.enabled() {
            // No credentials is no one here: the plain-HTTP admin default (kubectl sends no
            // token over HTTP) is for the API, not for the testbed's switches.
            if !req.headers().contains_key(header::AUTHORIZATION) {
                return status_response(&ApiError::new(401, "Unauthorized", "Unauthorized"));
            }
            let user = match authenticate(&tb, &req) {
                Ok(u) => u,
                Err(e) => return status_response(&e),
            };
            if !user.in_group("system:masters") {
                let info = RequestInfo::parse(req.method().as_str(), path, query.as_deref());
                return status_response(&rbac::forbidden(&user, &info));
            }
        }
        let method = req.method().clone();
        let path = path.to_string();
        let body = match axum::body::to_bytes(req.into_body(), MAX_ADMIN_BODY).await {
            Ok(b) => b,
            Err(e) => return status_response(&ApiError::bad_request(e.to_string())),
        };
        return admin(&tb, &method, &path, body).await;
    }
    if tb.faults.partitioned() {
        return dropped_connection();
    }
    let info = RequestInfo::parse(req.method().as_str(), path, query.as_deref());
    // A header value shares the request's bytes: kept past the request without a copy.
    let user_agent = req.headers().get(header::USER_AGENT).cloned();
    let user_agent = user_agent
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let user = match authenticate(&tb, &req) {
        Ok(u) => u,
        Err(e) => {
            let resp = status_response(&e);
            tb.counters.record(&info, user_agent, "", e.code);
            return resp;
        }
    };
    let user_name = if tb.auth.enabled() {
        user.name.as_str()
    } else {
        ""
    };
    let resp = respond(&tb, &info, query.as_deref(), &user, req).await;
    tb.counters
        .record(&info, user_agent, user_name, resp.status().as_u16());
    resp
}

/// The identity of a request: the admin when authentication is off; impersonation applied.
fn authenticate(tb: &Testbed, req: &Request) -> Result<UserInfo, ApiError> {
    if !tb.auth.enabled() {
        return Ok(crate::auth::admin());
    }
    let headers = req.headers();
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let store = &tb.shared.lock().store;
    let user = tb.auth.authenticate(authorization, store)?;
    let Some(target) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
    else {
        return Ok(user);
    };
    let groups: Vec<&str> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    // Impersonating needs the `impersonate` verb on the target, as on kube-apiserver.
    let check = match target
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        Some((ns, name)) => RequestInfo {
            is_resource_request: true,
            verb: "impersonate".into(),
            namespace: ns.into(),
            resource: "serviceaccounts".into(),
            name: name.into(),
            ..Default::default()
        },
        None => RequestInfo {
            is_resource_request: true,
            verb: "impersonate".into(),
            resource: "users".into(),
            name: target.into(),
            ..Default::default()
        },
    };
    if tb.auth.rbac && !rbac::allowed(store, &user, &check) {
        return Err(rbac::forbidden(&user, &check));
    }
    Ok(crate::auth::impersonated(target, &groups))
}

fn is_access_review(info: &RequestInfo) -> bool {
    info.is_resource_request
        && info.api_group == "authorization.k8s.io"
        && info.resource == "selfsubjectaccessreviews"
        && info.name.is_empty()
}

/// `SelfSubjectAccessReview`: may the caller do what the spec describes?
async fn access_review(tb: &Testbed, user: &UserInfo, req: Request) -> Response {
    let body = match axum::body::to_bytes(req.into_body(), MAX_ADMIN_BODY).await {
        Ok(b) => b,
        Err(e) => return status_response(&ApiError::bad_request(e.to_string())),
    };
    let protobuf = body.starts_with(b"k8s\0");
    let parsed = if protobuf {
        rbac::decode_review_protobuf(&body).ok_or_else(|| "invalid protobuf".to_string())
    } else {
        serde_json::from_slice::<Value>(&body).map_err(|e| e.to_string())
    };
    let mut review: Value = match parsed {
        Ok(v) => v,
        Err(e) => {
            return status_response(&ApiError::bad_request(format!(
                "couldn't get version/kind; json parse error: {e}"
            )));
        }
    };
    let asked = rbac::review_request(&review["spec"]);
    let allowed = !tb.auth.rbac || rbac::allowed(&tb.shared.lock().store, user, &asked);
    let mut status = json!({"allowed": allowed});
    if allowed && tb.auth.rbac {
        status["reason"] = json!("allowed by RBAC");
    }
    review["metadata"] = json!({"creationTimestamp": null});
    review["status"] = status;
    json_response(201, &review)
}

async fn respond(
    tb: &Testbed,
    info: &RequestInfo,
    query: Option<&str>,
    user: &UserInfo,
    req: Request,
) -> Response {
    if tb.auth.rbac && !rbac::allowed(&tb.shared.lock().store, user, info) {
        return status_response(&rbac::forbidden(user, info));
    }
    if is_access_review(info) && req.method() == Method::POST {
        return access_review(tb, user, req).await;
    }
    let resumes = info.verb == "watch" && RequestInfo::resumes_watch(query);
    let decision = tb.faults.decide(info, resumes);
    if !decision.latency.is_zero() {
        tokio::time::sleep(decision.latency).await;
    }
    if let Some(err) = decision.error {
        let mut r = status_response(&err.to_api_error(info));
        if let Some(s) = err.retry_after_seconds
            && let Ok(v) = http::HeaderValue::from_str(&s.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    } else if decision.watch_gone {
        watch_gone(query)
    } else {
        let r = crate::http::stream::serve(&tb.shared, &tb.kubelet, req, info).await;
        if info.verb == "watch" && r.status() == StatusCode::OK {
            let (events, age) = tb.faults.watch_limits();
            limit_watch(r, events, age)
        } else {
            r
        }
    }
}

fn auth_info(token: &str) -> kube::config::AuthInfo {
    // AuthInfo holds a SecretString; deserializing avoids a direct dependency on secrecy.
    serde_json::from_value(json!({ "token": token })).unwrap_or_default()
}

/// Testbed controls on a running server.
impl crate::KubeSim {
    /// A token authenticating as the ServiceAccount `namespace/name` (while it exists).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        self.testbed.auth.service_account_token(namespace, name)
    }

    /// A kube-rs client that authenticates with `token`.
    pub fn client_with_token(&self, token: &str) -> Result<kube::Client, crate::Error> {
        let uri = self
            .url()
            .parse()
            .map_err(|e: http::uri::InvalidUri| crate::Error::Client(e.to_string()))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        if let Some(tls) = &self.tls {
            config.root_cert = Some(vec![tls.ca_der.clone()]);
        }
        config.auth_info = auth_info(token);
        kube::Client::try_from(config).map_err(|e| crate::Error::Client(e.to_string()))
    }

    /// A kubeconfig (YAML) like [`crate::KubeSim::kubeconfig_yaml`] whose user has `token`
    /// (kubectl sends it only over HTTPS: see `Config::tls`).
    pub fn kubeconfig_yaml_with_token(&self, token: &str) -> String {
        let admin_user = format!("  user: {}\n", self.testbed.kubeconfig_user());
        self.kubeconfig_yaml()
            .replacen(&admin_user, &format!("  user: {{token: {token}}}\n"), 1)
    }

    /// A snapshot of the request counters.
    pub fn requests(&self) -> RequestStats {
        self.testbed.counters.snapshot()
    }

    /// Zeroes the request counters.
    pub fn reset_requests(&self) {
        self.testbed.counters.reset();
    }

    /// Starts journaling every later successful write of resource `group`/`resource` ("" group:
    /// core; the plural, as in `("slo.koordinator.sh", "nodeslos")`): each object a write
    /// changed, with the writer's User-Agent and the object's labels before and after (see
    /// [`crate::ObjectWrite`]). Adds to the resources journaled before; clears nothing.
    pub fn journal_writes(&self, group: &str, resource: &str) {
        let mut cluster = self.testbed.shared.lock();
        cluster
            .store
            .start_journal()
            .journal((group.to_string(), resource.to_string()));
    }

    /// A copy of the writes journaled since the start or the last clear, in `seq` order.
    pub fn object_writes(&self) -> Vec<crate::ObjectWrite> {
        let cluster = self.testbed.shared.lock();
        cluster
            .store
            .journal()
            .map(|j| j.writes().to_vec())
            .unwrap_or_default()
    }

    /// Forgets the journaled writes (the journaled resources stay; `seq` goes on).
    pub fn clear_object_writes(&self) {
        if let Some(journal) = self.testbed.shared.lock().store.journal_mut() {
            journal.clear();
        }
    }

    /// Replaces the fault configuration (and restarts its random sequence).
    pub fn set_faults(&self, config: FaultConfig) {
        self.testbed.configure_faults(config);
    }

    /// Injects nothing any more and heals a partition.
    pub fn clear_faults(&self) {
        self.testbed.configure_faults(FaultConfig::default());
        self.testbed.faults.heal_partition();
    }

    /// The server drops every connection attempt and open watch for `d`.
    pub fn partition_for(&self, d: Duration) {
        self.testbed.partition_for(d);
    }

    pub fn heal_partition(&self) {
        self.testbed.faults.heal_partition();
    }

    /// Ends every open watch stream cleanly; clients resume from their last resourceVersion.
    pub fn cut_watches(&self) {
        self.testbed.cut_watches();
    }

    /// Creates a Ready node (kubelet-like: conditions, addresses, capacity) that heartbeats.
    pub fn add_node(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), WorkloadError> {
        let tb = &self.testbed;
        tb.nodes.add(&mut tb.shared.lock(), name, labels)
    }

    /// Stops (`false`: Ready becomes Unknown, no heartbeats) or restarts a node's kubelet.
    pub fn set_node_ready(&self, name: &str, ready: bool) -> Result<(), WorkloadError> {
        let tb = &self.testbed;
        tb.nodes.set_ready(&mut tb.shared.lock(), name, ready)
    }

    /// The next `n` watch resumptions (watches with a resourceVersion) get `410 Gone`.
    pub fn force_watch_gone(&self, n: u32) {
        self.testbed.faults.force_watch_gone(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_event_limit_counts_lines_not_chunks() {
        let chunk = Bytes::from_static(b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n");
        assert_eq!(first_lines(&chunk, 1), Bytes::from_static(b"{\"a\":1}\n"));
        assert_eq!(
            first_lines(&chunk, 2),
            Bytes::from_static(b"{\"a\":1}\n{\"b\":2}\n")
        );
        assert_eq!(first_lines(&chunk, 5), chunk);
    }
}
