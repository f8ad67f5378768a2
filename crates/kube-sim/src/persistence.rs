//! Persistence (`--data-dir`): an append-only log of every store event (one JSON line each),
//! written while the write still holds the cluster lock (log order is resourceVersion order) and
//! fsync'd by group commit (`commit_log`) before its response goes out; replayed in order at
//! start. Replaying through the store reproduces every resourceVersion
//! (each event advances it by exactly one), so versions continue upwards after a restart and
//! watches resume from the replayed history or get `410 Gone`.
//!
//! A write whose record cannot be made durable (a full disk) is refused: the log is cut back to
//! its last complete record and the request fails, so nothing is acknowledged that a restart
//! would not find. A last record cut short by a crash (mid-record or mid-character) was never
//! acknowledged: replay drops it, truncates it away and logs what it dropped; a bad record
//! followed by more data is corruption, refused with its byte offset.

use crate::cluster::Cluster;
use crate::commit_log::{GroupCommit, Log};
use crate::store::{Event, EventType, Store, obj_key};
use serde_json::{Value, json};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub const LOG_FILE: &str = "events.jsonl";

#[derive(Debug, thiserror::Error)]
pub enum PersistenceError {
    #[error("cannot use data directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("corrupt event log {path} at line {line} (byte offset {offset}): {why}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        offset: u64,
        why: String,
    },
}

/// One log line: the event's fields around the object's stored JSON (not re-serialized).
pub fn encode(ev: &Event) -> Vec<u8> {
    let head = json!({
        "rv": ev.rv,
        "type": ev.type_.as_str(),
        "group": ev.key.0,
        "resource": ev.key.1,
    })
    .to_string();
    let object = ev.object.json();
    let mut line = Vec::with_capacity(head.len() + object.len() + 16);
    // `{"group":..,"resource":..,"rv":..,"type":..` then `,"object":<json>}`.
    line.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    line.extend_from_slice(b",\"object\":");
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    line
}

/// A decoded log line.
#[derive(Debug, PartialEq)]
pub struct Record {
    pub rv: u64,
    pub type_: EventType,
    pub group: String,
    pub resource: String,
    pub object: Value,
}

pub fn decode(line: &[u8]) -> Result<Record, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let type_ = match v["type"].as_str() {
        Some("ADDED") => EventType::Added,
        Some("MODIFIED") => EventType::Modified,
        Some("DELETED") => EventType::Deleted,
        other => return Err(format!("unknown event type {other:?}")),
    };
    Ok(Record {
        rv: v["rv"].as_u64().ok_or("missing rv")?,
        type_,
        group: v["group"].as_str().unwrap_or_default().to_string(),
        resource: v["resource"]
            .as_str()
            .ok_or("missing resource")?
            .to_string(),
        object: v["object"].clone(),
    })
}

/// Reads the complete records of a log and the byte length they span (a torn tail is excluded).
pub fn read_log(path: &Path) -> Result<(Vec<Record>, u64), PersistenceError> {
    let io = |source| PersistenceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], 0)),
        Err(e) => return Err(io(e)),
    };
    let mut reader = BufReader::new(file);
    let mut records = Vec::new();
    let mut valid_len = 0u64;
    let mut buf = Vec::new();
    let mut line_no = 0;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let torn = |why: &str| {
            tracing::warn!(
                path = %path.display(),
                line = line_no,
                offset = valid_len,
                bytes = n,
                "dropping the torn last record of the event log ({why}); it was never acknowledged"
            );
        };
        if !buf.ends_with(b"\n") {
            // Cut short by a crash (mid-record, maybe mid-character): never acknowledged.
            torn("no line end");
            break;
        }
        match decode(&buf[..buf.len() - 1]) {
            Ok(r) => {
                records.push(r);
                valid_len += n as u64;
            }
            Err(why) => {
                // A bad last record is a torn write; a bad record followed by more is corruption.
                let mut rest = Vec::new();
                reader.read_until(b'\n', &mut rest).map_err(io)?;
                if rest.is_empty() {
                    torn(&why);
                    break;
                }
                return Err(PersistenceError::Corrupt {
                    path: path.to_path_buf(),
                    line: line_no,
                    offset: valid_len,
                    why,
                });
            }
        }
    }
    Ok((records, valid_len))
}

/// Rebuilds the store from a log: replaying every event in order reproduces its resourceVersion.
/// `store` is empty or holds a snapshot; records it already covers are skipped.
pub fn replay(
    cluster: &mut Cluster,
    mut store: Store,
    records: Vec<Record>,
    path: &Path,
) -> Result<(), PersistenceError> {
    let covered = store.resource_version();
    for (i, r) in records.into_iter().enumerate() {
        if r.rv <= covered {
            continue;
        }
        if r.rv != store.resource_version() + 1 {
            return Err(PersistenceError::Corrupt {
                path: path.to_path_buf(),
                line: i + 1,
                offset: 0,
                why: format!(
                    "resourceVersion {} does not follow {}",
                    r.rv,
                    store.resource_version()
                ),
            });
        }
        let key = (r.group, r.resource);
        match r.type_ {
            EventType::Added | EventType::Modified => {
                store.put(&key, r.object);
            }
            EventType::Deleted => {
                if store.remove(&key, &obj_key(&r.object)).is_none() {
                    return Err(PersistenceError::Corrupt {
                        path: path.to_path_buf(),
                        line: i + 1,
                        offset: 0,
                        why: "deletion of an object that does not exist".into(),
                    });
                }
            }
        }
    }
    cluster.store = store;
    cluster.rebuild_registry();
    Ok(())
}

/// Opens (or creates) the data directory: replays the log into `cluster` (or, for a new log,
/// writes the cluster's initial objects), then appends every later event to the log before it is
/// published. A request is acknowledged once the returned group commit says its records are on
/// disk (`GroupCommit::durable`).
pub fn open(
    dir: &Path,
    cluster: &mut Cluster,
    history: usize,
) -> Result<Arc<GroupCommit>, PersistenceError> {
    let io = |source| PersistenceError::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let path = dir.join(LOG_FILE);
    let mut store = Store::new(history);
    let mut snapshot_len = 0;
    let snapshot = crate::snapshot::read(dir).map_err(|why| PersistenceError::Corrupt {
        path: dir.join(crate::snapshot::SNAPSHOT_FILE),
        line: 0,
        offset: 0,
        why,
    })?;
    let from_snapshot = snapshot.is_some();
    if let Some((rv, objects, size)) = snapshot {
        for (key, obj) in objects {
            store.restore(&key, obj);
        }
        store.restored_at(rv);
        snapshot_len = size;
    }
    let (records, valid_len) = read_log(&path)?;
    let fresh = records.is_empty() && !from_snapshot;
    if !fresh {
        replay(cluster, store, records, &path)?;
    }
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    file.set_len(valid_len).map_err(io)?;
    file.seek(std::io::SeekFrom::End(0)).map_err(io)?;
    if fresh {
        // The built-in namespaces were created before the log existed.
        let seeded = cluster
            .store
            .events_since(1)
            .map_err(|_| PersistenceError::Corrupt {
                path: path.clone(),
                line: 0,
                offset: 0,
                why: "the initial objects are no longer in the event history".into(),
            })?;
        for ev in seeded {
            file.write_all(&encode(&ev)).map_err(io)?;
        }
        file.sync_all().map_err(io)?;
    }
    if let Ok(d) = File::open(dir) {
        // Make the log's directory entry durable too.
        let _ = d.sync_all();
    }
    let len = file.metadata().map_err(io)?.len();
    let log = Arc::new(Mutex::new(Log::new(
        file,
        path.clone(),
        dir.to_path_buf(),
        len,
        snapshot_len,
    )));
    let appender = log.clone();
    cluster.store.set_sink(Box::new(move |ev: &Event| {
        appender
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(ev)
    }));
    let compactor = log.clone();
    cluster.store.set_compactor(Box::new(move |store: &Store| {
        compactor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .compact(store);
    }));
    Ok(Arc::new(GroupCommit::new(log)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{DeleteOptions, Sub, WriteOptions};

    fn configmaps(c: &Cluster) -> crate::registry::ResourceInfo {
        c.registry
            .lookup("", "v1", "configmaps")
            .cloned()
            .expect("built in")
    }

    fn cm(name: &str, v: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"k": v}})
    }

    #[test]
    fn a_restart_replays_every_write_and_continues_resource_versions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = Cluster::new(100);
        open(dir.path(), &mut c, 100).expect("open");
        let info = configmaps(&c);
        let opts = WriteOptions::default();
        c.create(&info, "default", cm("a", "1"), &opts).expect("a");
        c.create(&info, "default", cm("b", "1"), &opts).expect("b");
        let mut a = (*c
            .store
            .get(&info.storage_key(), &("default".into(), "a".into()))
            .expect("a"))
        .clone();
        a["data"]["k"] = json!("2");
        c.update(&info, "default", "a", a, Sub::Main, &opts)
            .expect("update");
        c.delete(&info, "default", "b", &DeleteOptions::default())
            .expect("delete");
        let rv = c.store.resource_version();
        let ns_uid = c
            .store
            .get(
                &(String::new(), "namespaces".into()),
                &(String::new(), "default".into()),
            )
            .expect("ns")["metadata"]["uid"]
            .clone();
        drop(c);

        let mut again = Cluster::new(100);
        open(dir.path(), &mut again, 100).expect("reopen");
        assert_eq!(again.store.resource_version(), rv);
        let a = again
            .store
            .get(&info.storage_key(), &("default".into(), "a".into()))
            .expect("a survives");
        assert_eq!(a["data"]["k"], "2");
        assert!(
            again
                .store
                .get(&info.storage_key(), &("default".into(), "b".into()))
                .is_none()
        );
        assert_eq!(
            again
                .store
                .get(
                    &(String::new(), "namespaces".into()),
                    &(String::new(), "default".into())
                )
                .expect("ns")["metadata"]["uid"],
            ns_uid,
            "built-in namespaces keep their identity"
        );
        again
            .create(&info, "default", cm("c", "1"), &WriteOptions::default())
            .expect("c");
        assert_eq!(again.store.resource_version(), rv + 1);
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_truncated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = Cluster::new(100);
        open(dir.path(), &mut c, 100).expect("open");
        let info = configmaps(&c);
        c.create(&info, "default", cm("a", "1"), &WriteOptions::default())
            .expect("a");
        let rv = c.store.resource_version();
        drop(c);
        let path = dir.path().join(LOG_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).expect("log");
        f.write_all(b"{\"rv\":99,\"type\":\"ADD")
            .expect("torn write");
        drop(f);
        let mut again = Cluster::new(100);
        open(dir.path(), &mut again, 100).expect("reopen");
        assert_eq!(again.store.resource_version(), rv);
        again
            .create(&info, "default", cm("b", "1"), &WriteOptions::default())
            .expect("b");
        drop(again);
        let (records, _) = read_log(&path).expect("readable");
        assert_eq!(records.last().map(|r| r.rv), Some(rv + 1));
    }

    #[test]
    fn corruption_in_the_middle_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(LOG_FILE);
        std::fs::write(&path, "not json\n{\"rv\":2}\n").expect("write");
        assert!(matches!(
            read_log(&path),
            Err(PersistenceError::Corrupt {
                line: 1,
                offset: 0,
                ..
            })
        ));
    }
}
