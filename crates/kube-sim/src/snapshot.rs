//! Log compaction for persistence: once the event log outgrows the live data, every stored
//! object is written to a snapshot (written aside, fsync'd, renamed into place) and the log is
//! emptied; a start loads the snapshot and replays only the log records after its
//! resourceVersion, so versions continue where they were.

use crate::registry::StorageKey;
use crate::store::Store;
use serde_json::{Value, json};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

pub const SNAPSHOT_FILE: &str = "snapshot.jsonl";

/// The log is compacted once it is larger than this and than twice the last snapshot.
pub const COMPACT_MIN_BYTES: u64 = 1024 * 1024;

/// Writes the store's objects at its resourceVersion; returns the snapshot's size.
pub fn write(dir: &Path, store: &Store) -> std::io::Result<u64> {
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    let mut out = Vec::new();
    out.extend_from_slice(
        json!({"rv": store.resource_version()})
            .to_string()
            .as_bytes(),
    );
    out.push(b'\n');
    for ((group, resource), stored) in store.all() {
        let head = json!({"group": group, "resource": resource}).to_string();
        out.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
        out.extend_from_slice(b",\"object\":");
        out.extend_from_slice(stored.json());
        out.extend_from_slice(b"}\n");
    }
    let mut file = File::create(&tmp)?;
    file.write_all(&out)?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
    File::open(dir)?.sync_all()?;
    Ok(out.len() as u64)
}

/// A snapshot's resourceVersion, objects and size, if there is one.
pub type Loaded = (u64, Vec<(StorageKey, Value)>, u64);

pub fn read(dir: &Path) -> Result<Option<Loaded>, String> {
    let path = dir.join(SNAPSHOT_FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let mut lines = BufReader::new(file).split(b'\n');
    let head: Value = match lines.next() {
        Some(line) => serde_json::from_slice(&line.map_err(|e| e.to_string())?)
            .map_err(|e| format!("snapshot header: {e}"))?,
        None => return Err("empty snapshot".into()),
    };
    let rv = head["rv"].as_u64().ok_or("snapshot header without rv")?;
    let mut objects = Vec::new();
    for (i, line) in lines.enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        let mut v: Value =
            serde_json::from_slice(&line).map_err(|e| format!("snapshot object {}: {e}", i + 1))?;
        let key = (
            v["group"].as_str().unwrap_or_default().to_string(),
            v["resource"].as_str().unwrap_or_default().to_string(),
        );
        objects.push((key, v["object"].take()));
    }
    Ok(Some((rv, objects, size)))
}
