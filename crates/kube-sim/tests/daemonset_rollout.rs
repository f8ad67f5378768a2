//! `kubectl rollout history` and `kubectl rollout undo` of a DaemonSet, with the real kubectl:
//! they read the ControllerRevisions the simulated DaemonSet controller keeps (one per pod
//! template, owned by the DaemonSet, selected by its selector) and patch a revision's `data` back
//! onto the DaemonSet. kubectl is called unconditionally.

mod common;

use common::kubectl::Kubectl;
use serde_json::Value;

/// The images of the daemon pods (not being deleted), sorted.
fn daemon_images(pods: &Value) -> Vec<String> {
    let mut images: Vec<String> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["labels"]["app"] == "agent")
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| {
            p["spec"]["containers"][0]["image"]
                .as_str()
                .map(String::from)
        })
        .collect();
    images.sort();
    images
}

/// `kubectl rollout history` rows (REVISION, CHANGE-CAUSE) after its header.
fn history_rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .skip_while(|l| !l.starts_with("REVISION"))
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_history_lists_daemonset_revisions_and_undo_restores_the_first_image() {
    let sim = common::start_simulating("127.12.6.0/24", Default::default()).await;
    let k = Kubectl::new(&sim);
    let manifest = k.file(
        "agent.yaml",
        r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: a, image: "agent:1"}]}
"#,
    );
    k.ok(&["apply", "-f", &manifest]).await;
    k.wait_json(&["get", "pods"], "a daemon agent:1 on each node", |l| {
        daemon_images(l) == ["agent:1", "agent:1"]
    })
    .await;

    // The controller copies the DaemonSet's annotations into the revision it makes.
    k.ok(&[
        "annotate",
        "ds/agent",
        "kubernetes.io/change-cause=upgrade to 2",
    ])
    .await;
    k.ok(&["set", "image", "ds/agent", "a=agent:2"]).await;
    k.wait_json(&["get", "pods"], "the daemons rolled to agent:2", |l| {
        daemon_images(l) == ["agent:2", "agent:2"]
    })
    .await;

    // Each revision as the controller writes it: `<ds>-<hash>`, owned by the DaemonSet, the
    // hash label shared with the pods made from it, the template as a replacing patch.
    let revisions = k
        .wait_json(
            &["get", "controllerrevisions", "-l", "app=agent"],
            "two revisions, the second with the change cause",
            |l| {
                l["items"].as_array().is_some_and(|i| {
                    i.len() == 2
                        && i.iter().any(|r| {
                            r["metadata"]["annotations"]["kubernetes.io/change-cause"]
                                == "upgrade to 2"
                        })
                })
            },
        )
        .await;
    let ds = k.json(&["get", "ds", "agent"]).await;
    let pods = k.json(&["get", "pods", "-l", "app=agent"]).await;
    for r in revisions["items"].as_array().into_iter().flatten() {
        let hash = r["metadata"]["labels"]["controller-revision-hash"]
            .as_str()
            .expect("hash label");
        assert_eq!(r["metadata"]["name"], format!("agent-{hash}"));
        assert_eq!(r["metadata"]["ownerReferences"][0]["kind"], "DaemonSet");
        assert_eq!(
            r["metadata"]["ownerReferences"][0]["uid"],
            ds["metadata"]["uid"]
        );
        assert_eq!(r["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(r["data"]["spec"]["template"]["$patch"], "replace");
        let image = &r["data"]["spec"]["template"]["spec"]["containers"][0]["image"];
        let expected = if r["revision"] == 2 {
            "agent:2"
        } else {
            "agent:1"
        };
        assert_eq!(image, expected, "{r:#}");
        if r["revision"] == 2 {
            for p in pods["items"].as_array().into_iter().flatten() {
                assert_eq!(p["metadata"]["labels"]["controller-revision-hash"], hash);
            }
        }
    }

    let history = k.ok(&["rollout", "history", "ds/agent"]).await;
    assert!(history.starts_with("daemonset.apps/agent"), "{history}");
    assert_eq!(
        history_rows(&history),
        [vec!["1", "<none>"], vec!["2", "upgrade", "to", "2"]],
        "{history}"
    );
    let first = k
        .ok(&["rollout", "history", "ds/agent", "--revision=1"])
        .await;
    assert!(first.contains("agent:1"), "{first}");

    assert_eq!(
        k.ok(&["rollout", "undo", "ds/agent"]).await.trim(),
        "daemonset.apps/agent rolled back"
    );
    let ds = k.json(&["get", "ds", "agent"]).await;
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"],
        "agent:1"
    );
    k.wait_json(&["get", "pods"], "the daemons back on agent:1", |l| {
        daemon_images(l) == ["agent:1", "agent:1"]
    })
    .await;
    // The first template is current again: its revision is renumbered past the second.
    let after = k
        .wait_json(
            &["get", "controllerrevisions", "-l", "app=agent"],
            "revision 1 renumbered 3",
            |l| {
                let mut numbers: Vec<i64> = l["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r["revision"].as_i64())
                    .collect();
                numbers.sort();
                numbers == [2, 3]
            },
        )
        .await;
    let three = after["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["revision"] == 3)
        .expect("revision 3");
    assert_eq!(
        three["data"]["spec"]["template"]["spec"]["containers"][0]["image"],
        "agent:1"
    );
    let history = k.ok(&["rollout", "history", "ds/agent"]).await;
    assert_eq!(
        history_rows(&history)
            .iter()
            .map(|r| r[0].as_str())
            .collect::<Vec<_>>(),
        ["2", "3"],
        "{history}"
    );
    sim.shutdown().await;
}
