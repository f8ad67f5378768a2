//! Nothing acknowledged is lost (issue 15): with `--data-dir` on a full disk a write whose
//! record cannot be made durable fails (500) instead of a 201, and the log stays valid for the
//! next start; a tail torn inside a multi-byte character is dropped at start; a corrupt record
//! in the middle is refused with its byte offset.

mod common;

use kube_sim::cluster::{Cluster, WriteOptions};
use kube_sim::persistence::{self, LOG_FILE, PersistenceError};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const CMS: &str = "/api/v1/namespaces/default/configmaps";

/// Mounts a 1 MiB tmpfs (root only). Where that cannot be done the test is skipped with a
/// line saying so, unless CAPSTAN_REQUIRE_ALL_TESTS=1 makes it a failure.
fn small_tmpfs(dir: &Path) -> bool {
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        assert!(
            std::env::var("CAPSTAN_REQUIRE_ALL_TESTS").as_deref() != Ok("1"),
            "cannot mount a tmpfs (root needed) and CAPSTAN_REQUIRE_ALL_TESTS=1"
        );
        eprintln!(
            "SKIP a_full_disk_fails_writes_and_loses_nothing_acknowledged: cannot mount a tmpfs here (needs root)"
        );
    }
    mounted
}

struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

#[tokio::test]
async fn a_full_disk_fails_writes_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    if !small_tmpfs(dir.path()) {
        return;
    }
    let _unmount = Unmount(dir.path());
    let config = || persisted_in(dir.path());
    let sim = common::start_with(config()).await;
    let filler = "x".repeat(40 * 1024);
    let mut acknowledged = BTreeSet::new();
    let mut refused = 0;
    for i in 0..60 {
        let name = format!("cm-{i:02}");
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": {"fill": filler}});
        let (code, status) = common::post_json(&sim, CMS, &body.to_string()).await;
        match code {
            201 => {
                acknowledged.insert(name);
            }
            500 => {
                refused += 1;
                let message = status["message"].as_str().unwrap_or_default();
                assert!(message.contains("cannot persist the write"), "{message}");
            }
            other => panic!("unexpected {other}: {status}"),
        }
    }
    assert!(
        refused > 0,
        "1 MiB cannot hold 60 x 40 KiB: some writes must fail"
    );
    assert!(!acknowledged.is_empty());
    // A refused write is not visible either.
    assert_eq!(common::count(&sim, CMS).await, acknowledged.len());
    sim.shutdown().await;

    let again = common::start_with(config()).await;
    let names = configmap_names(&again).await;
    assert_eq!(
        names, acknowledged,
        "exactly the acknowledged writes survive"
    );
    again.shutdown().await;
}

/// The ConfigMaps a (restarted) server holds.
async fn configmap_names(sim: &kube_sim::KubeSim) -> BTreeSet<String> {
    let (_, list) = common::raw_json(sim, "GET", CMS, "application/json", "").await;
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str().map(String::from))
        .collect()
}

fn configmaps(c: &Cluster) -> kube_sim::registry::ResourceInfo {
    c.registry
        .lookup("", "v1", "configmaps")
        .cloned()
        .expect("built in")
}

fn cm(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}})
}

#[test]
fn a_tail_torn_inside_a_character_is_dropped_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Cluster::new(100);
    persistence::open(dir.path(), &mut c, 100).expect("open");
    let info = configmaps(&c);
    c.create(&info, "default", cm("a", "plain"), &WriteOptions::default())
        .expect("a");
    let rv = c.store.resource_version();
    c.create(&info, "default", cm("b", "café"), &WriteOptions::default())
        .expect("b");
    drop(c);
    let path = dir.path().join(LOG_FILE);
    let log = std::fs::read(&path).expect("log");
    let e_acute = log
        .windows(2)
        .rposition(|w| w == [0xC3, 0xA9])
        .expect("the é of the last record");
    std::fs::write(&path, &log[..=e_acute]).expect("tear inside the character");

    let mut again = Cluster::new(100);
    persistence::open(dir.path(), &mut again, 100).expect("a torn tail is not an error");
    assert_eq!(again.store.resource_version(), rv);
    assert!(again.get(&info, "default", "a").is_ok());
    assert!(
        again.get(&info, "default", "b").is_err(),
        "the torn record is dropped"
    );
    again
        .create(&info, "default", cm("c", "après"), &WriteOptions::default())
        .expect("writes go on");
    drop(again);
    let (records, _) = persistence::read_log(&path).expect("valid again");
    assert_eq!(records.last().map(|r| r.rv), Some(rv + 1));
}

#[test]
fn a_corrupt_record_in_the_middle_is_refused_with_its_byte_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Cluster::new(100);
    persistence::open(dir.path(), &mut c, 100).expect("open");
    let info = configmaps(&c);
    c.create(&info, "default", cm("a", "1"), &WriteOptions::default())
        .expect("a");
    c.create(&info, "default", cm("b", "2"), &WriteOptions::default())
        .expect("b");
    drop(c);
    let path = dir.path().join(LOG_FILE);
    let mut log = std::fs::read(&path).expect("log");
    let text = String::from_utf8(log.clone()).expect("utf-8");
    // The record that created `a`, followed by more records: corruption, not a torn tail.
    let mut offset = 0;
    let mut line_start = None;
    for line in text.split_inclusive('\n') {
        if line.contains("\"name\":\"a\"") {
            line_start = Some(offset);
            break;
        }
        offset += line.len();
    }
    let line_start = line_start.expect("the record of a");
    log[line_start] = b'#';
    std::fs::write(&path, &log).expect("corrupt");
    let err = persistence::open(dir.path(), &mut Cluster::new(100), 100).expect_err("refused");
    match &err {
        PersistenceError::Corrupt { offset, .. } => assert_eq!(*offset, line_start as u64),
        other => panic!("expected corruption, got {other}"),
    }
    assert!(
        err.to_string()
            .contains(&format!("(byte offset {line_start})")),
        "{err}"
    );
}

#[test]
fn compaction_keeps_the_state_and_resource_versions_continue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Cluster::new(100);
    persistence::open(dir.path(), &mut c, 100).expect("open");
    let info = configmaps(&c);
    let filler = "y".repeat(4096);
    c.create(&info, "default", cm("kept", "0"), &WriteOptions::default())
        .expect("create");
    // A heartbeat-like stream of updates to one object: the log grows, the live data does not.
    for round in 1..=600 {
        let mut obj = (*c.get(&info, "default", "kept").expect("get")).clone();
        obj["data"] = json!({"v": round.to_string(), "fill": filler});
        c.update(
            &info,
            "default",
            "kept",
            obj,
            kube_sim::cluster::Sub::Main,
            &WriteOptions::default(),
        )
        .expect("update");
    }
    c.create(&info, "default", cm("last", "x"), &WriteOptions::default())
        .expect("create");
    let rv = c.store.resource_version();
    drop(c);
    let log_len = std::fs::metadata(dir.path().join(LOG_FILE))
        .expect("log")
        .len();
    assert!(
        log_len < 2 * 1024 * 1024,
        "600 x 4 KiB of updates were compacted away: the log holds {log_len} B"
    );
    assert!(dir.path().join(kube_sim::snapshot::SNAPSHOT_FILE).exists());

    let mut again = Cluster::new(100);
    persistence::open(dir.path(), &mut again, 100).expect("reopen");
    assert_eq!(again.store.resource_version(), rv);
    let kept = again.get(&info, "default", "kept").expect("kept");
    assert_eq!(kept["data"]["v"], "600");
    assert_eq!(kept["metadata"]["resourceVersion"], (rv - 1).to_string());
    assert!(again.get(&info, "default", "last").is_ok());
    let created = again
        .create(&info, "default", cm("after", "x"), &WriteOptions::default())
        .expect("after");
    assert_eq!(created["metadata"]["resourceVersion"], (rv + 1).to_string());
    drop(again);
    let mut third = Cluster::new(100);
    persistence::open(dir.path(), &mut third, 100).expect("third start");
    assert_eq!(third.store.resource_version(), rv + 1);
    assert!(third.get(&info, "default", "after").is_ok());
}

/// Group commit: many creates at once share fsyncs, and every one answered 201 is there after a
/// restart from the data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acknowledged_creates_survive_a_restart() {
    const CREATES: usize = 64;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || persisted_in(dir.path());
    let sim = common::start_with(config()).await;
    let results = futures::future::join_all((0..CREATES).map(|i| {
        let sim = &sim;
        async move {
            let name = format!("cm-{i:03}");
            let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name}, "data": {"i": i.to_string()}});
            let (code, _) = common::post_json(sim, CMS, &body.to_string()).await;
            (name, code)
        }
    }))
    .await;
    let acknowledged: BTreeSet<String> = results
        .into_iter()
        .filter(|(_, code)| *code == 201)
        .map(|(name, _)| name)
        .collect();
    assert_eq!(acknowledged.len(), CREATES, "every create succeeds");
    sim.shutdown().await;

    let again = common::start_with(config()).await;
    let names = configmap_names(&again).await;
    assert_eq!(names, acknowledged, "every acknowledged create survives");
    again.shutdown().await;
}

/// kube-sim persisting to `dir`.
fn persisted_in(dir: &std::path::Path) -> kube_sim::Config {
    kube_sim::Config {
        data_dir: Some(dir.to_path_buf()),
        ..Default::default()
    }
}

fn configmap(name: &str) -> String {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": name}})
        .to_string()
}

/// A failed fsync (injected with `fsyncFailAfter`: a disk cannot be made to fail one on demand)
/// fails every write of its batch, cuts the log back and refuses every later write until a
/// restart, after which exactly the acknowledged writes exist in a valid log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_fails_its_batch_and_refuses_writes_until_a_restart() {
    const BATCH: usize = 16;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || persisted_in(dir.path());
    let sim = common::start_with(config()).await;
    let mut acknowledged = BTreeSet::new();
    for name in ["before-1", "before-2"] {
        let (code, status) = common::post_json(&sim, CMS, &configmap(name)).await;
        assert_eq!(code, 201, "{status}");
        acknowledged.insert(name.to_owned());
    }

    let (code, status) = common::post_json(&sim, "/_sim/faults", r#"{"fsyncFailAfter": 0}"#).await;
    assert_eq!(code, 400, "{status}");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("fsyncFailAfter")),
        "{status}"
    );
    // The third fsync from now fails: two more acknowledged writes, then the failing batch.
    let (code, status) = common::post_json(&sim, "/_sim/faults", r#"{"fsyncFailAfter": 3}"#).await;
    assert_eq!(code, 200, "{status}");
    for name in ["after-1", "after-2"] {
        let (code, status) = common::post_json(&sim, CMS, &configmap(name)).await;
        assert_eq!(code, 201, "{status}");
        acknowledged.insert(name.to_owned());
    }

    // A batch of concurrent creates: the first fsync among them fails, and every one of them is
    // covered by it or refused after it.
    let batch = futures::future::join_all((0..BATCH).map(|i| {
        let sim = &sim;
        async move {
            let name = format!("batch-{i:02}");
            common::post_json(sim, CMS, &configmap(&name)).await
        }
    }))
    .await;
    for (code, status) in &batch {
        assert_eq!(*code, 500, "a write of the failed batch: {status}");
    }
    let messages: Vec<&str> = batch
        .iter()
        .map(|(_, status)| status["message"].as_str().unwrap_or_default())
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("fsync failed: Input/output error")),
        "{messages:?}"
    );

    // Later writes of every kind are refused, saying why and until when.
    let later = [
        ("POST", CMS.to_owned(), configmap("later")),
        ("DELETE", format!("{CMS}/before-1"), String::new()),
    ];
    for (method, path, body) in later {
        let (code, status) = common::raw_json(&sim, method, &path, "application/json", &body).await;
        assert_eq!(
            code, 500,
            "{method} {path} after the failed fsync: {status}"
        );
        let message = status["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("fsync failed") && message.contains("until kube-sim is restarted"),
            "{method} {path}: {message}"
        );
    }
    sim.shutdown().await;

    let (records, _) = persistence::read_log(&dir.path().join(LOG_FILE)).expect("a valid log");
    let rvs: Vec<u64> = records.iter().map(|r| r.rv).collect();
    assert!(rvs.windows(2).all(|w| w[1] == w[0] + 1), "{rvs:?}");

    let again = common::start_with(config()).await;
    assert_eq!(
        configmap_names(&again).await,
        acknowledged,
        "exactly the acknowledged writes survive"
    );
    let (code, status) = common::post_json(&again, CMS, &configmap("restarted")).await;
    assert_eq!(code, 201, "writes resume after a restart: {status}");
    again.shutdown().await;
}
