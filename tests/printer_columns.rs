//! `kubectl get` of each Capstan CRD prints the columns the CRD declares, read through kube-sim's
//! Table answer as a user sees them. MCM's Machine, MachineSet and MachineDeployment columns are
//! MCM's; MachineClass, NodeSLO and
//! WorkerSliceGwRecycler have none in their reference CRDs, so theirs are ours (see capstan-apis).

use std::process::Command;

use capstan_testkit_sim::SimCluster;

const OBJECTS: &str = r#"
apiVersion: machine.sapcloud.io/v1alpha1
kind: MachineClass
metadata: {name: m5-large, namespace: default}
provider: aws
providerSpec: {ami: ami-1}
nodeTemplate:
  instanceType: m5.large
  region: eu-west-1
  zone: eu-west-1a
  capacity: {cpu: "2", gpu: "0", memory: 8Gi}
---
apiVersion: slo.koordinator.sh/v1alpha1
kind: NodeSLO
metadata: {name: node-a}
spec:
  resourceUsedThresholdWithBE:
    enable: true
    cpuSuppressThresholdPercent: 65
    memoryEvictThresholdPercent: 70
  cpuBurstStrategy: {policy: auto}
---
apiVersion: worker.kubeslice.io/v1alpha1
kind: WorkerSliceGwRecycler
metadata: {name: red-gw-0-0, namespace: default}
spec:
  sliceName: red
  sliceGwServer: red-server
  sliceGwClient: red-client
  state: slicerouter_updated
  request: verify_new_deployment_created
  gwPair: {serverId: red-server-0-0, clientId: red-client-0-0}
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: MachineDeployment
metadata: {name: pool-a, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {name: pool-a}}
  template:
    metadata: {labels: {name: pool-a}}
    spec: {class: {kind: MachineClass, name: m5-large}}
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: MachineSet
metadata: {name: pool-a-5d8f7, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {name: pool-a, machine-template-hash: 5d8f7}}
  template:
    metadata: {labels: {name: pool-a, machine-template-hash: 5d8f7}}
    spec: {class: {kind: MachineClass, name: m5-large}}
"#;

struct Kubectl<'a>(&'a SimCluster);

impl Kubectl<'_> {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .env("KUBECONFIG", self.0.kubeconfig_path())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl starts");
        let mut input = child.stdin.take().expect("kubectl stdin");
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .expect("kubectl reads stdin");
        drop(input);
        let out = child.wait_with_output().expect("kubectl runs");
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The header and the single object's row of `kubectl get <what>`, split on runs of 2+ spaces
    /// (kubectl's column separator; headers such as "CPU SUPPRESS %" hold single spaces).
    fn table(&self, args: &[&str]) -> Vec<(String, String)> {
        let text = self.run(args, None);
        let mut lines = text.lines();
        let header = lines.next().expect("a header line");
        let row = lines.next().expect("one object's row");
        assert_eq!(lines.next(), None, "one object only: {text}");
        // Cells start where the header's columns start (values hold no double spaces either).
        let starts: Vec<usize> = column_starts(header);
        let cell = |line: &str, i: usize| {
            let end = starts.get(i + 1).copied().unwrap_or(usize::MAX);
            line.get(starts[i]..end.min(line.len()))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        (0..starts.len())
            .map(|i| (cell(header, i), cell(row, i)))
            .collect()
    }
}

fn column_starts(header: &str) -> Vec<usize> {
    let bytes = header.as_bytes();
    (0..bytes.len())
        .filter(|&i| bytes[i] != b' ' && (i == 0 || (i >= 2 && &bytes[i - 2..i] == b"  ")))
        .collect()
}

fn without_age(columns: Vec<(String, String)>) -> Vec<(String, String)> {
    let (age, rest): (Vec<_>, Vec<_>) = columns.into_iter().partition(|(h, _)| h == "AGE");
    assert_eq!(age.len(), 1, "an AGE column");
    assert!(!age[0].1.is_empty(), "AGE has a value");
    rest
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(h, v)| ((*h).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_shows_each_crds_columns() {
    if !capstan_testkit::require("kubectl", capstan_testkit::on_path("kubectl")) {
        return;
    }
    let cluster = SimCluster::start().await;
    let kubectl = Kubectl(&cluster);
    kubectl.run(&["apply", "-f", "-"], Some(OBJECTS));

    // The default view, by short name, then the wide view with the priority-1 columns.
    assert_eq!(
        without_age(kubectl.table(&["get", "mcc", "-n", "default"])),
        pairs(&[
            ("NAME", "m5-large"),
            ("PROVIDER", "aws"),
            ("INSTANCE TYPE", "m5.large"),
            ("REGION", "eu-west-1"),
        ])
    );
    assert_eq!(
        without_age(kubectl.table(&["get", "machineclasses", "-n", "default", "-o", "wide"])),
        pairs(&[
            ("NAME", "m5-large"),
            ("PROVIDER", "aws"),
            ("INSTANCE TYPE", "m5.large"),
            ("REGION", "eu-west-1"),
            ("ZONE", "eu-west-1a"),
        ])
    );
    assert_eq!(
        without_age(kubectl.table(&["get", "nodeslos", "-o", "wide"])),
        pairs(&[
            ("NAME", "node-a"),
            ("THRESHOLD", "true"),
            ("CPU SUPPRESS %", "65"),
            ("MEMORY EVICT %", "70"),
            ("CPU BURST", "auto"),
        ])
    );
    assert_eq!(
        without_age(kubectl.table(&["get", "workerslicegwrecyclers", "-n", "default"])),
        pairs(&[
            ("NAME", "red-gw-0-0"),
            ("STATE", "slicerouter_updated"),
            ("SLICE", "red"),
            ("SERVER GATEWAY", "red-server"),
            ("CLIENT GATEWAY", "red-client"),
        ])
    );
    // MCM's MachineDeployment and MachineSet columns, by MCM's short names; `kubectl scale`
    // goes through the scale subresource.
    kubectl.run(
        &["scale", "mcd", "pool-a", "-n", "default", "--replicas=5"],
        None,
    );
    assert_eq!(
        without_age(kubectl.table(&["get", "mcd", "-n", "default"])),
        pairs(&[
            ("NAME", "pool-a"),
            ("READY", ""),
            ("DESIRED", "5"),
            ("UP-TO-DATE", ""),
            ("AVAILABLE", ""),
        ])
    );
    assert_eq!(
        without_age(kubectl.table(&["get", "mcs", "-n", "default"])),
        pairs(&[
            ("NAME", "pool-a-5d8f7"),
            ("DESIRED", "2"),
            ("CURRENT", ""),
            ("READY", ""),
        ])
    );
    // The client's answer shows in the wide view once it writes status.
    kubectl.run(
        &[
            "patch",
            "workerslicegwrecycler",
            "red-gw-0-0",
            "-n",
            "default",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"client":{"response":"new_deployment_created"}}}"#,
        ],
        None,
    );
    let wide = without_age(kubectl.table(&[
        "get",
        "workerslicegwrecyclers",
        "-n",
        "default",
        "-o",
        "wide",
    ]));
    assert_eq!(
        wide[wide.len() - 2..],
        pairs(&[
            ("REQUEST", "verify_new_deployment_created"),
            ("RESPONSE", "new_deployment_created"),
        ])
    );
}
