//! A data directory: acknowledged writes survive kill -9 and resource versions continue.

use super::*;
use std::sync::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};

struct Served {
    child: tokio::process::Child,
    client: kube::Client,
}

async fn serve(dir: &std::path::Path) -> Served {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kube-sim starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .await
        .expect("banner");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("URL in the banner")
        .trim_end_matches(';')
        .to_string();
    let mut config = kube::Config::new(url.parse().expect("URL"));
    config.default_namespace = "default".into();
    Served {
        child,
        client: kube::Client::try_from(config).expect("client"),
    }
}

fn rv_of(c: &ConfigMap) -> u64 {
    c.metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .expect("numeric resourceVersion")
}

#[tokio::test]
async fn acknowledged_writes_survive_kill_9_and_versions_continue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = serve(dir.path()).await;
    let cms: Api<ConfigMap> = Api::namespaced(first.client.clone(), "default");
    cms.create(&PostParams::default(), &cm("counter", "0"))
        .await
        .expect("counter");
    // Acknowledged creates (name, rv) and the last acknowledged counter value.
    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let counter_acked = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..3 {
        let (cms, acked, counter_acked) = (cms.clone(), acked.clone(), counter_acked.clone());
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w{w}-{i}");
                match cms.create(&PostParams::default(), &cm(&name, "v")).await {
                    Ok(c) => acked.lock().expect("not poisoned").push((name, rv_of(&c))),
                    Err(_) => return,
                }
                if w == 0 {
                    let patch = Patch::Merge(json!({"data": {"k": i.to_string()}}));
                    match cms.patch("counter", &PatchParams::default(), &patch).await {
                        Ok(_) => counter_acked.store(i, Ordering::SeqCst),
                        Err(_) => return,
                    }
                }
            }
        }));
    }
    // Kill -9 in the middle of the burst.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while acked.lock().expect("not poisoned").len() < 150 {
        assert!(tokio::time::Instant::now() < deadline, "writes too slow");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut child = first.child;
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
    for w in writers {
        w.await.expect("writer ends on the first error");
    }
    let acked = acked.lock().expect("not poisoned").clone();
    let max_rv = acked.iter().map(|(_, rv)| *rv).max().expect("some writes");

    let second = serve(dir.path()).await;
    let cms: Api<ConfigMap> = Api::namespaced(second.client.clone(), "default");
    let list = cms.list(&ListParams::default()).await.expect("list");
    let stored: BTreeMap<String, u64> = list
        .items
        .iter()
        .map(|c| (c.name_any(), rv_of(c)))
        .collect();
    for (name, rv) in &acked {
        assert!(
            stored.get(name).is_some_and(|s| s >= rv),
            "acknowledged {name} at {rv} is missing after the restart"
        );
    }
    let counter = stored_counter(&list.items);
    assert!(
        counter >= counter_acked.load(Ordering::SeqCst),
        "the counter went back"
    );
    let list_rv: u64 = list
        .metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .expect("list RV");
    assert!(list_rv >= max_rv);
    let after = cms
        .create(&PostParams::default(), &cm("after-restart", "v"))
        .await
        .expect("write after restart");
    assert!(rv_of(&after) > list_rv, "resourceVersions continue upwards");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(second.client.clone());
    namespaces
        .get("kube-system")
        .await
        .expect("built-ins survive");
    // A watch from a version before the crash resumes from the replayed history.
    let (first_name, first_rv) = acked[0].clone();
    let events = cms
        .watch(
            &kube::api::WatchParams::default().timeout(1),
            &first_rv.to_string(),
        )
        .await
        .expect("watch");
    futures::pin_mut!(events);
    match events.next().await.expect("an event").expect("decodes") {
        kube::api::WatchEvent::Added(c) | kube::api::WatchEvent::Modified(c) => {
            assert!(rv_of(&c) > first_rv);
            assert_ne!(c.name_any(), first_name);
        }
        kube::api::WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("unexpected {other:?}"),
    }
    drop(second);
}

fn stored_counter(items: &[ConfigMap]) -> usize {
    items
        .iter()
        .find(|c| c.name_any() == "counter")
        .and_then(|c| c.data.as_ref()?.get("k")?.parse().ok())
        .expect("counter value")
}
