//! The chart's Grafana dashboards and PrometheusRule alerts name only metrics the binaries export.
//!
//! The chart is installed with Helm's library (dashboards and alerts on) into kube-sim; every
//! PromQL query of each controller's dashboard ConfigMap and rule group is read from what Helm
//! rendered, and each metric it names must be in the `/metrics` of that controller's real binary,
//! started against kube-sim and given a little work. prometheus-client leaves a family out of the
//! exposition until it has a child (a gw-recycler that recycled nothing shows no transitions), so
//! a name not scraped must at least be the family name the binary registers (its string in the
//! executable); the scrape proves the rest, and the list of names only found that way is printed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use capstan_scenarios::helm;
use capstan_scenarios::tools::binary;
use capstan_testkit::eventually;
use capstan_testkit::process::{BinaryUnderTest, http_get};
use capstan_testkit_sim::{SimCluster, wait_ready};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "capstan-system";
const CONTROLLERS: [&str; 4] = [
    "gw-recycler",
    "machineclass-controller",
    "machineset-controller",
    "nodeslo-controller",
];

// ---- PromQL: the metric names a query reads -------------------------------------------------

/// PromQL keywords whose parenthesised list holds label names (`by (le)`, `on (pod)`).
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// The other words that are PromQL syntax, not series (functions are recognised by the `(` that
/// follows them; aggregations may take `by (..)` first).
const OTHER_KEYWORDS: [&str; 16] = [
    "bool",
    "and",
    "or",
    "unless",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
];

/// The metric names in a PromQL expression (Grafana's `$variables` and label matchers skipped).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let skip_group = |i: &mut usize, open: char, close: char| {
        let mut depth = 0;
        while *i < chars.len() {
            match chars[*i] {
                '"' => skip_string(&chars, i),
                c if c == open => depth += 1,
                c if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        *i += 1;
                        return;
                    }
                }
                _ => {}
            }
            *i += 1;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' => {
                skip_string(&chars, &mut i);
                i += 1;
            }
            '{' => skip_group(&mut i, '{', '}'),
            '[' => skip_group(&mut i, '[', ']'),
            '$' => {
                i += 1;
                while i < chars.len() && is_word(chars[i]) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (is_word(chars[i]) || chars[i] == '.' || chars[i] == '-') {
                    i += 1;
                }
            }
            c if is_word(c) => {
                let start = i;
                while i < chars.len() && is_word(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let called = chars.get(next) == Some(&'(');
                if LABEL_LISTS.contains(&word.as_str()) && called {
                    i = next;
                    skip_group(&mut i, '(', ')');
                } else if !called
                    && !LABEL_LISTS.contains(&word.as_str())
                    && !OTHER_KEYWORDS.contains(&word.as_str())
                {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Leaves `i` on the closing quote of the string that starts at `i`.
fn skip_string(chars: &[char], i: &mut usize) {
    *i += 1;
    while *i < chars.len() && chars[*i] != '"' {
        if chars[*i] == '\\' {
            *i += 1;
        }
        *i += 1;
    }
}

/// A Grafana variable query `label_values(<series>, <label>)` reads `<series>`.
fn variable_series(query: &str) -> Option<&str> {
    let inner = query.strip_prefix("label_values(")?.strip_suffix(')')?;
    Some(inner.rsplit_once(',').map_or(inner, |(series, _)| series))
}

#[test]
fn metric_names_skip_functions_labels_ranges_and_variables() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.95, sum by (le, controller) (rate(a_bucket{x=~"$ns", y="by(z)"}[$__rate_interval]))) / on(pod) group_left() b_total > bool 1e-3"#
        ),
        BTreeSet::from(["a_bucket".to_owned(), "b_total".to_owned()])
    );
    assert_eq!(
        metric_names(r#"count_values("phase", m) - max by (namespace) (n) * 100"#),
        BTreeSet::from(["m".to_owned(), "n".to_owned()])
    );
    assert_eq!(
        variable_series(r#"label_values(capstan_build_info{service="x"}, namespace)"#),
        Some(r#"capstan_build_info{service="x"}"#)
    );
}

// ---- What the binaries export ---------------------------------------------------------------

/// The sample names an exposition can hold: each family's samples by its `# TYPE` (present even
/// before a family has children), and every sample line seen.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

async fn scrape(bin: &BinaryUnderTest) -> String {
    http_get(bin.admin_addr(), "/metrics")
        .await
        .expect("GET /metrics")
        .body
}

/// The name a sample's family is registered under (`x_total` -> `x`, `x_info` -> `x`, and
/// `x_seconds_bucket` -> `x`: the unit is registered apart from the name).
fn family(sample: &str) -> &str {
    let name = ["_total", "_bucket", "_sum", "_count", "_info"]
        .iter()
        .find_map(|suffix| sample.strip_suffix(suffix))
        .unwrap_or(sample);
    name.strip_suffix("_seconds").unwrap_or(name)
}

/// What one binary exports: the scraped sample names, and the executable's bytes.
struct Exports {
    scraped: BTreeSet<String>,
    executable: Vec<u8>,
}

impl Exports {
    fn scraped(&self, name: &str) -> bool {
        self.scraped.contains(name)
    }

    /// The family is registered under this name (a `"name"` literal in the executable).
    fn registered(&self, name: &str) -> bool {
        let needle = family(name).as_bytes();
        self.executable.windows(needle.len()).any(|w| w == needle)
    }
}

/// Each controller's binary on `cluster`, after some work, and its `/metrics`.
async fn exports(cluster: &SimCluster) -> BTreeMap<&'static str, Exports> {
    let client = cluster.client.clone();
    // Work for each: a Node (a NodeSLO to write), a MachineClass (a finalizer to add), a
    // MachineDeployment (a MachineSet and its Machines to create; machineset-controller runs last,
    // so machineclass-controller never sees them).
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node-a"}})).expect("Node"),
        )
        .await
        .expect("Node created");
    Api::<capstan_apis::machine::MachineClass>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
                "metadata": {"name": "small"}, "provider": "sim", "providerSpec": {}
            }))
            .expect("MachineClass"),
        )
        .await
        .expect("MachineClass created");
    Api::<capstan_apis::machine::MachineDeployment>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
                "metadata": {"name": "pool-a"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"name": "pool-a"}},
                    "template": {
                        "metadata": {"labels": {"name": "pool-a"}},
                        "spec": {"class": {"kind": "MachineClass", "name": "small"}}
                    }
                }
            }))
            .expect("MachineDeployment"),
        )
        .await
        .expect("MachineDeployment created");

    let hub = cluster.kubeconfig_path();
    let runs: [(&'static str, Vec<&str>); 4] = [
        ("nodeslo-controller", vec!["--config-namespace", "default"]),
        ("machineclass-controller", vec!["--namespace", "default"]),
        (
            "gw-recycler",
            vec![
                "--hub-kubeconfig",
                hub,
                "--hub-namespace",
                "default",
                "--namespace",
                "default",
            ],
        ),
        ("machineset-controller", vec!["--namespace", "default"]),
    ];
    let mut exported = BTreeMap::new();
    for (program, args) in runs {
        let path = binary(program, program);
        let bin = cluster.spawn(&path.display().to_string(), &args).await;
        wait_ready(&bin).await;
        // The controller did its work once its reconcile counter has a sample (machineset-controller
        // also once its gauges were refreshed from the MachineSet it created).
        let done: &[&str] = match program {
            "gw-recycler" => &[],
            "machineset-controller" => &[
                "capstan_controller_reconciles_total{",
                "mcm_machine_set_status_replicas{",
            ],
            _ => &["capstan_controller_reconciles_total{"],
        };
        let text = eventually(
            &format!("{program} reconciled"),
            Duration::from_secs(30),
            || async {
                let text = scrape(&bin).await;
                done.iter().all(|d| text.contains(d)).then_some(text)
            },
        )
        .await;
        let executable = std::fs::read(&path).expect("read the executable");
        exported.insert(
            program,
            Exports {
                scraped: exported_names(&text),
                executable,
            },
        );
    }
    exported
}

// ---- The chart ------------------------------------------------------------------------------

/// Each controller's queries, from the rendered dashboards and rule groups.
fn queries(objects: &[Value]) -> BTreeMap<String, Vec<String>> {
    let mut queries: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for object in objects {
        let component = object["metadata"]["labels"]["app.kubernetes.io/component"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match object["kind"].as_str() {
            Some("ConfigMap") if object["metadata"]["labels"]["grafana_dashboard"] == "1" => {
                let file = &object["data"][format!("{component}.json")];
                let dashboard: Value = serde_json::from_str(file.as_str().unwrap_or_default())
                    .unwrap_or_else(|e| panic!("{component}'s dashboard is not JSON: {e}"));
                let found = queries.entry(component).or_default();
                for panel in dashboard["panels"].as_array().into_iter().flatten() {
                    for target in panel["targets"].as_array().into_iter().flatten() {
                        found.push(target["expr"].as_str().expect("expr").to_owned());
                    }
                }
                for variable in dashboard["templating"]["list"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    if variable["type"] == "query" {
                        let query = variable["query"].as_str().expect("variable query");
                        found.push(variable_series(query).expect("label_values(..)").to_owned());
                    }
                }
            }
            Some("PrometheusRule") => {
                for group in object["spec"]["groups"].as_array().into_iter().flatten() {
                    let found = queries
                        .entry(group["name"].as_str().expect("group name").to_owned())
                        .or_default();
                    for rule in group["rules"].as_array().into_iter().flatten() {
                        found.push(rule["expr"].as_str().expect("rule expr").to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_and_alert_query_names_a_metric_the_binaries_export() {
    if !helm::available().await {
        return;
    }
    let chart_cluster = helm::cluster().await;
    chart_cluster.create_namespaces(&["kubeslice-system"]).await;
    capstan_testkit::install_crds(
        &chart_cluster.client,
        [helm::monitoring_crd("PrometheusRule")],
    )
    .await
    .expect("PrometheusRule CRD established");
    let values = json!({
        "controllers": {"gw-recycler": {"enabled": true}},
        "hub": {"kubeconfigSecret": "hub", "namespace": "kubeslice-demo"},
        "dashboards": {"enabled": true},
        "prometheusRule": {"enabled": true, "labels": {"release": "prometheus"}},
    });
    let release = helm::install(&chart_cluster, "capstan", NS, &values)
        .await
        .unwrap_or_else(|e| panic!("install failed: {e:?}"));

    // The dashboards are where Grafana's sidecar looks: ConfigMaps labelled grafana_dashboard=1.
    let labelled = Api::<ConfigMap>::namespaced(chart_cluster.client.clone(), NS)
        .list(&ListParams::default().labels("grafana_dashboard=1"))
        .await
        .expect("list ConfigMaps");
    let mut dashboard_names: Vec<String> = labelled
        .items
        .iter()
        .map(|c| c.metadata.name.clone().unwrap_or_default())
        .collect();
    dashboard_names.sort();
    assert_eq!(
        dashboard_names,
        CONTROLLERS.map(|c| format!("capstan-{c}-dashboard")),
        "one dashboard per enabled controller"
    );

    let objects = release["objects"].as_array().cloned().unwrap_or_default();
    let queries = queries(&objects);
    assert_eq!(
        queries.keys().map(String::as_str).collect::<Vec<_>>(),
        CONTROLLERS,
        "queries of every controller, from its dashboard and its rule group"
    );

    let exported = exports(&SimCluster::start().await).await;
    let mut unknown = Vec::new();
    let mut scraped = BTreeSet::new();
    let mut only_registered = BTreeSet::new();
    for (component, exprs) in &queries {
        let exported = &exported[component.as_str()];
        for expr in exprs {
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{component}: no metric found in {expr}");
            for name in names {
                if exported.scraped(&name) {
                    scraped.insert(format!("{component}: {name}"));
                } else if exported.registered(&name) {
                    only_registered.insert(format!("{component}: {name}"));
                } else {
                    unknown.push(format!("{component}: {name} (in {expr})"));
                }
            }
        }
    }
    eprintln!("scraped: {scraped:#?}\nregistered, no sample yet: {only_registered:#?}");
    // Most names are proven by the scrape itself (nodeslo and machineclass did their work).
    assert!(
        scraped.len() > only_registered.len(),
        "{scraped:?} {only_registered:?}"
    );
    assert!(
        unknown.is_empty(),
        "queries name metrics the binaries do not export:\n{}",
        unknown.join("\n")
    );
}
