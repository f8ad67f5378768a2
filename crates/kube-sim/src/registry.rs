//! The table of served resources: built-in kinds plus those defined by CustomResourceDefinitions.

use serde_json::Value;

/// A column of `kubectl get` output (`additionalPrinterColumns`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// Everything the server needs to know about one resource in one version.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceInfo {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Subresources besides the main endpoint: `status`, `scale`, `eviction`.
    pub subresources: Vec<String>,
    /// Objects carry `metadata.generation`, bumped on spec changes.
    pub has_generation: bool,
    /// Defined by a CRD (validation, pruning, no strategic merge patch).
    pub custom: bool,
    /// The CRD's `openAPIV3Schema` for this version, shared: every request clones its
    /// `ResourceInfo`, and a deep copy of a large schema per request dominated CRD writes.
    pub schema: Option<std::sync::Arc<Value>>,
    pub printer_columns: Vec<PrinterColumn>,
    /// The storage version (all versions share one store).
    pub storage_version: String,
}

/// Where objects of a resource are stored: group and plural, independent of version.
pub type StorageKey = (String, String);

impl ResourceInfo {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    pub fn storage_key(&self) -> StorageKey {
        // events.k8s.io/v1 Events are stored with core Events, as kube-apiserver does.
        if self.group == "events.k8s.io" && self.plural == "events" {
            return (String::new(), "events".into());
        }
        (self.group.clone(), self.plural.clone())
    }
    /// `storage_key() == *key`, without allocating (hot in watch fan-out).
    pub fn stored_under(&self, key: &StorageKey) -> bool {
        if self.group == "events.k8s.io" && self.plural == "events" {
            return key.0.is_empty() && key.1 == "events";
        }
        key.0 == self.group && key.1 == self.plural
    }
    /// `api_version() == s`, without allocating.
    pub fn is_api_version(&self, s: &str) -> bool {
        if self.group.is_empty() {
            return s == self.version;
        }
        s.len() == self.group.len() + 1 + self.version.len()
            && s.starts_with(self.group.as_str())
            && s.ends_with(self.version.as_str())
            && s.as_bytes()[self.group.len()] == b'/'
    }
    pub fn has_status(&self) -> bool {
        self.subresources.iter().any(|s| s == "status")
    }
    pub fn verbs(&self) -> Vec<&'static str> {
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }
}

/// Every resource kube-apiserver 1.33 serves by default (besides the create-only reviews and
/// `bindings`), in discovery order: group version kind plural scope short-names categories
/// subresources generation (`-` for none; lists comma-separated; `gen` when spec changes bump
/// `metadata.generation`).
const BUILTINS: &str = "
- v1 Namespace namespaces cluster ns - status,finalize -
- v1 Node nodes cluster no - status -
- v1 Pod pods ns po all status,eviction -
- v1 ConfigMap configmaps ns cm - - -
- v1 Secret secrets ns - - - -
- v1 Service services ns svc all status -
- v1 ServiceAccount serviceaccounts ns sa - - -
- v1 Event events ns ev - - -
- v1 Endpoints endpoints ns ep - - -
- v1 LimitRange limitranges ns limits - - -
- v1 PersistentVolume persistentvolumes cluster pv - status -
- v1 PersistentVolumeClaim persistentvolumeclaims ns pvc - status -
- v1 PodTemplate podtemplates ns - - - -
- v1 ReplicationController replicationcontrollers ns rc all status,scale gen
- v1 ResourceQuota resourcequotas ns quota - status -
admissionregistration.k8s.io v1 MutatingWebhookConfiguration mutatingwebhookconfigurations cluster - api-extensions - gen
admissionregistration.k8s.io v1 ValidatingWebhookConfiguration validatingwebhookconfigurations cluster - api-extensions - gen
admissionregistration.k8s.io v1 ValidatingAdmissionPolicy validatingadmissionpolicies cluster - api-extensions status gen
admissionregistration.k8s.io v1 ValidatingAdmissionPolicyBinding validatingadmissionpolicybindings cluster - api-extensions - gen
apiextensions.k8s.io v1 CustomResourceDefinition customresourcedefinitions cluster crd,crds api-extensions status gen
apiregistration.k8s.io v1 APIService apiservices cluster - api-extensions status -
apps v1 ControllerRevision controllerrevisions ns - - - -
apps v1 DaemonSet daemonsets ns ds all status gen
apps v1 Deployment deployments ns deploy all status,scale gen
apps v1 ReplicaSet replicasets ns rs all status,scale gen
apps v1 StatefulSet statefulsets ns sts all status,scale gen
autoscaling v2 HorizontalPodAutoscaler horizontalpodautoscalers ns hpa all status gen
batch v1 CronJob cronjobs ns cj all status gen
batch v1 Job jobs ns - all status gen
certificates.k8s.io v1 CertificateSigningRequest certificatesigningrequests cluster csr - status -
coordination.k8s.io v1 Lease leases ns - - - -
discovery.k8s.io v1 EndpointSlice endpointslices ns - - - -
events.k8s.io v1 Event events ns ev - - -
flowcontrol.apiserver.k8s.io v1 FlowSchema flowschemas cluster - - status gen
flowcontrol.apiserver.k8s.io v1 PriorityLevelConfiguration prioritylevelconfigurations cluster - - status gen
networking.k8s.io v1 IngressClass ingressclasses cluster - - - -
networking.k8s.io v1 Ingress ingresses ns ing - status gen
networking.k8s.io v1 IPAddress ipaddresses cluster ip - - -
networking.k8s.io v1 NetworkPolicy networkpolicies ns netpol - - gen
networking.k8s.io v1 ServiceCIDR servicecidrs cluster - - status -
node.k8s.io v1 RuntimeClass runtimeclasses cluster - - - -
policy v1 PodDisruptionBudget poddisruptionbudgets ns pdb - status gen
rbac.authorization.k8s.io v1 ClusterRoleBinding clusterrolebindings cluster - - - -
rbac.authorization.k8s.io v1 ClusterRole clusterroles cluster - - - -
rbac.authorization.k8s.io v1 RoleBinding rolebindings ns - - - -
rbac.authorization.k8s.io v1 Role roles ns - - - -
scheduling.k8s.io v1 PriorityClass priorityclasses cluster pc - - -
storage.k8s.io v1 CSIDriver csidrivers cluster - - - -
storage.k8s.io v1 CSINode csinodes cluster - - - -
storage.k8s.io v1 CSIStorageCapacity csistoragecapacities ns - - - -
storage.k8s.io v1 StorageClass storageclasses cluster sc - - -
storage.k8s.io v1 VolumeAttachment volumeattachments cluster - - status -
";

fn col(name: &str, type_: &str, json_path: &str, priority: i64) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        format: String::new(),
        description: String::new(),
        priority,
        json_path: json_path.into(),
    }
}

/// Where kube-apiserver's printer puts Age among a built-in's columns (see `http::table`).
pub const AGE_COLUMN: &str = "#age";

fn age() -> PrinterColumn {
    col("Age", "date", AGE_COLUMN, 0)
}

/// Default printer columns of a few built-ins (after Name, and before Age unless they place it).
fn builtin_columns(group: &str, plural: &str) -> Vec<PrinterColumn> {
    // `#...` paths are computed cells (see `http::table::computed`), as kube-apiserver's printers do.
    match (group, plural) {
        ("", "namespaces") => vec![col("Status", "string", ".status.phase", 0)],
        ("", "pods") => vec![
            col("Ready", "string", "#pod-ready", 0),
            col("Status", "string", "#pod-status", 0),
            col("Restarts", "string", "#pod-restarts", 0),
            age(),
            col("IP", "string", "#none.status.podIP", 1),
            col("Node", "string", "#none.spec.nodeName", 1),
            col(
                "Nominated Node",
                "string",
                "#none.status.nominatedNodeName",
                1,
            ),
            col("Readiness Gates", "string", "#pod-readiness-gates", 1),
        ],
        ("", "nodes") => vec![
            col("Status", "string", "#node-status", 0),
            col("Roles", "string", "#node-roles", 0),
            age(),
            col("Version", "string", ".status.nodeInfo.kubeletVersion", 0),
            col(
                "Internal-IP",
                "string",
                "#none.status.addresses[?(@.type==\"InternalIP\")].address",
                1,
            ),
            col(
                "External-IP",
                "string",
                "#none.status.addresses[?(@.type==\"ExternalIP\")].address",
                1,
            ),
            col("OS-Image", "string", "#unknown.status.nodeInfo.osImage", 1),
            col(
                "Kernel-Version",
                "string",
                "#unknown.status.nodeInfo.kernelVersion",
                1,
            ),
            col(
                "Container-Runtime",
                "string",
                "#unknown.status.nodeInfo.containerRuntimeVersion",
                1,
            ),
        ],
        ("", "configmaps") => vec![col("Data", "integer", ".data.#count", 0)],
        ("", "secrets") => vec![
            col("Type", "string", ".type", 0),
            col("Data", "integer", ".data.#count", 0),
        ],
        ("", "services") => vec![
            col("Type", "string", ".spec.type", 0),
            col("Cluster-IP", "string", ".spec.clusterIP", 0),
            col("External-IP", "string", "#svc-external", 0),
            col("Port(s)", "string", "#svc-ports", 0),
        ],
        ("", "events") => vec![
            col("Type", "string", ".type", 0),
            col("Reason", "string", ".reason", 0),
            col("Object", "string", "#event-object", 0),
            col("Message", "string", ".message", 0),
        ],
        ("apps", "deployments") => vec![
            col("Ready", "string", "#deploy-ready", 0),
            col("Up-to-date", "integer", "#0.status.updatedReplicas", 0),
            col("Available", "integer", "#0.status.availableReplicas", 0),
        ],
        ("apps", "replicasets") => vec![
            col("Desired", "integer", "#0.spec.replicas", 0),
            col("Current", "integer", "#0.status.replicas", 0),
            col("Ready", "integer", "#0.status.readyReplicas", 0),
        ],
        ("apps", "daemonsets") => vec![
            col("Desired", "integer", "#0.status.desiredNumberScheduled", 0),
            col("Current", "integer", "#0.status.currentNumberScheduled", 0),
            col("Ready", "integer", "#0.status.numberReady", 0),
            col(
                "Up-to-date",
                "integer",
                "#0.status.updatedNumberScheduled",
                0,
            ),
            col("Available", "integer", "#0.status.numberAvailable", 0),
            col("Node Selector", "string", "#node-selector", 0),
        ],
        ("batch", "jobs") => vec![
            col("Status", "string", "#job-status", 0),
            col("Completions", "string", "#job-completions", 0),
            col("Duration", "string", "#job-duration", 0),
        ],
        ("batch", "cronjobs") => vec![
            col("Schedule", "string", ".spec.schedule", 0),
            col("Timezone", "string", "#cronjob-timezone", 0),
            col("Suspend", "boolean", "#cronjob-suspend", 0),
            col("Active", "integer", "#cronjob-active", 0),
            col("Last Schedule", "string", "#cronjob-last-schedule", 0),
        ],
        ("coordination.k8s.io", "leases") => {
            vec![col("Holder", "string", ".spec.holderIdentity", 0)]
        }
        _ => vec![],
    }
}

/// The built-in resources, in discovery order.
pub fn builtin_resources() -> Vec<ResourceInfo> {
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .filter(|x| *x != "-")
            .map(String::from)
            .collect()
    };
    BUILTINS
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [
                group,
                version,
                kind,
                plural,
                scope,
                short,
                categories,
                subs,
                generation,
            ] = f.as_slice()
            else {
                return None;
            };
            let group = if *group == "-" { "" } else { group };
            Some(ResourceInfo {
                group: group.into(),
                version: (*version).into(),
                kind: (*kind).into(),
                list_kind: format!("{kind}List"),
                plural: (*plural).into(),
                singular: kind.to_lowercase(),
                namespaced: *scope == "ns",
                short_names: list(short),
                categories: list(categories),
                subresources: list(subs),
                has_generation: *generation == "gen",
                custom: false,
                schema: None,
                printer_columns: builtin_columns(group, plural),
                storage_version: (*version).into(),
            })
        })
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The resources a CustomResourceDefinition serves, one per served version.
pub fn crd_resources(crd: &Value) -> Vec<ResourceInfo> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let (Some(group), Some(kind), Some(plural)) = (
        spec["group"].as_str(),
        names["kind"].as_str(),
        names["plural"].as_str(),
    ) else {
        return vec![];
    };
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let storage_version = versions
        .iter()
        .find(|v| v["storage"].as_bool() == Some(true))
        .or(versions.first())
        .and_then(|v| v["name"].as_str())
        .unwrap_or_default()
        .to_string();
    versions
        .iter()
        .filter(|v| v["served"].as_bool() != Some(false))
        .filter_map(|v| {
            let version = v["name"].as_str()?.to_string();
            let mut subresources = vec![];
            if v["subresources"].get("status").is_some() {
                subresources.push("status".to_string());
            }
            if v["subresources"].get("scale").is_some() {
                subresources.push("scale".to_string());
            }
            let printer_columns = v["additionalPrinterColumns"]
                .as_array()
                .map(|cols| {
                    cols.iter()
                        .map(|c| PrinterColumn {
                            name: c["name"].as_str().unwrap_or_default().into(),
                            type_: c["type"].as_str().unwrap_or("string").into(),
                            format: c["format"].as_str().unwrap_or_default().into(),
                            description: c["description"].as_str().unwrap_or_default().into(),
                            priority: c["priority"].as_i64().unwrap_or(0),
                            json_path: c["jsonPath"].as_str().unwrap_or_default().into(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            Some(ResourceInfo {
                group: group.into(),
                version,
                kind: kind.into(),
                list_kind: names["listKind"]
                    .as_str()
                    .map(String::from)
                    .unwrap_or_else(|| format!("{kind}List")),
                plural: plural.into(),
                singular: names["singular"]
                    .as_str()
                    .map(String::from)
                    .unwrap_or_else(|| kind.to_lowercase()),
                namespaced: spec["scope"].as_str() != Some("Cluster"),
                short_names: strings(&names["shortNames"]),
                categories: strings(&names["categories"]),
                subresources,
                has_generation: true,
                custom: true,
                schema: v["schema"]
                    .get("openAPIV3Schema")
                    .cloned()
                    .map(std::sync::Arc::new),
                printer_columns,
                storage_version: storage_version.clone(),
            })
        })
        .collect()
}

/// The registry as last rebuilt, readable without the cluster's lock. Every request resolves its
/// resource before it takes that lock for the verb; taking it twice per request doubled the
/// lock's contention under concurrent writes. The cluster publishes each rebuild while it holds
/// its own lock, so a reader sees the registry of some moment, as it did when it copied the
/// resource out from under the lock.
#[derive(Debug, Clone, Default)]
pub struct PublishedRegistry(std::sync::Arc<std::sync::RwLock<std::sync::Arc<Registry>>>);

impl PublishedRegistry {
    pub fn get(&self) -> std::sync::Arc<Registry> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn publish(&self, registry: Registry) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = std::sync::Arc::new(registry);
    }
}

/// The served resources; rebuilt whenever a CRD changes.
#[derive(Debug, Clone)]
pub struct Registry {
    resources: Vec<ResourceInfo>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            resources: builtin_resources(),
        }
    }
}

impl Registry {
    /// Rebuilds the table from the built-ins and the given CRD objects.
    pub fn rebuild<'a>(&mut self, crds: impl Iterator<Item = &'a Value>) {
        let mut resources = builtin_resources();
        for crd in crds {
            // A CRD being deleted keeps serving until it is gone, as on a real server.
            for r in crd_resources(crd) {
                if !resources
                    .iter()
                    .any(|x| x.group == r.group && x.version == r.version && x.plural == r.plural)
                {
                    resources.push(r);
                }
            }
        }
        self.resources = resources;
    }

    pub fn all(&self) -> &[ResourceInfo] {
        &self.resources
    }

    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceInfo> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// Finds the resource of an `apiVersion` + `kind` (owner references, embedded objects).
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceInfo> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
    }

    /// Whether the group/version is served at all.
    pub fn has_group_version(&self, group: &str, version: &str) -> bool {
        self.resources
            .iter()
            .any(|r| r.group == group && r.version == version)
    }

    /// Groups in discovery order with their versions (first listed is preferred).
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = vec![];
        for r in &self.resources {
            if r.group.is_empty() {
                continue;
            }
            match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, versions)) => {
                    if !versions.contains(&r.version) {
                        versions.push(r.version.clone());
                    }
                }
                None => out.push((r.group.clone(), vec![r.version.clone()])),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn crd_serves_each_served_version() {
        let crd = json!({"spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "shortNames": ["wd"]},
            "versions": [
                {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                 "schema": {"openAPIV3Schema": {"type": "object"}}},
                {"name": "v2", "served": false, "storage": false}]}});
        let rs = crd_resources(&crd);
        assert_eq!(rs.len(), 1);
        assert_eq!(rs[0].list_kind, "WidgetList");
        assert_eq!(rs[0].singular, "widget");
        assert!(rs[0].has_status() && rs[0].namespaced && rs[0].custom);
        let mut reg = Registry::default();
        reg.rebuild([crd].iter());
        assert!(reg.lookup("example.com", "v1", "widgets").is_some());
        assert_eq!(
            reg.by_kind("apps/v1", "Deployment")
                .map(|r| r.plural.as_str()),
            Some("deployments")
        );
        let w = reg.lookup("example.com", "v1", "widgets").expect("widgets");
        assert!(
            w.is_api_version("example.com/v1")
                && !w.is_api_version("example.com/v2")
                && !w.is_api_version("v1")
        );
        assert!(w.stored_under(&w.storage_key()));
        let ev = reg.lookup("events.k8s.io", "v1", "events").expect("events");
        assert!(ev.stored_under(&(String::new(), "events".into())));
    }
}
