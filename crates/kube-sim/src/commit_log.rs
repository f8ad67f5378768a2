//! The open event log of a data directory, with group commit: a write appends its record under
//! the cluster lock (so log order is resourceVersion order), and its request waits, outside the
//! lock, for one fsync that covers every record appended so far: concurrent writes share an
//! fsync instead of queueing one each behind the lock.
//!
//! A record that cannot be written is cut away and refuses its write; an fsync that fails fails
//! every request it covered, cuts the log back to its last fsync'd length and refuses every later
//! write until a restart (after a failed fsync the kernel may have dropped the pages, so nothing
//! written since can be trusted to reach the disk). A disk cannot be made to fail an fsync on
//! demand, so the fault machinery (`fsyncFailAfter` in `/_sim/faults`) can fail the N-th one.

use crate::store::{Event, Store};
use std::fs::File;
use std::io::{Seek, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// The log's state, shared by the store's sink (appends, compaction) and the group commit.
pub(crate) struct Log {
    file: Arc<File>,
    path: PathBuf,
    dir: PathBuf,
    /// Bytes of complete records written (fsync'd or not).
    len: u64,
    /// Bytes of complete records known to be on disk.
    synced_len: u64,
    /// Records appended since the start: a write's ticket is this count after its records.
    appended: u64,
    /// Every ticket up to this one is on disk.
    synced: u64,
    /// Bumped by each compaction: an fsync that began before it says nothing about `len`.
    generation: u64,
    /// Size of the last snapshot: about the live data.
    snapshot_len: u64,
    /// fsyncs issued for writes (the group commit's batches).
    fsyncs: u64,
    /// Why the log refuses every write since a failed fsync.
    failed: Option<String>,
    /// Injected fault: the fsync this many from now fails with EIO (1 = the next).
    fail_fsync_in: Option<u64>,
}

impl Log {
    /// A log whose first `len` bytes are complete records already on disk.
    pub(crate) fn new(
        file: File,
        path: PathBuf,
        dir: PathBuf,
        len: u64,
        snapshot_len: u64,
    ) -> Self {
        Self {
            file: Arc::new(file),
            path,
            dir,
            len,
            synced_len: len,
            appended: 0,
            synced: 0,
            generation: 0,
            snapshot_len,
            fsyncs: 0,
            failed: None,
            fail_fsync_in: None,
        }
    }

    /// Writes one record (not yet fsync'd: `GroupCommit::durable` does that for its request).
    pub(crate) fn append(&mut self, ev: &Event) -> Result<(), String> {
        if let Some(why) = &self.failed {
            return Err(why.clone());
        }
        let record = crate::persistence::encode(ev);
        match (&*self.file).write_all(&record) {
            Ok(()) => {
                self.len += record.len() as u64;
                self.appended += 1;
                Ok(())
            }
            Err(e) => {
                // Cut the partial record away so the log stays valid for the next start.
                let restored = self.truncate(self.len);
                tracing::error!(path = %self.path.display(), error = %e, restored = restored.is_ok(), "cannot persist a write; refusing it");
                Err(format!(
                    "cannot persist the write to {}: {e}",
                    self.path.display()
                ))
            }
        }
    }

    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)?;
        (&*self.file).seek(std::io::SeekFrom::Start(len))?;
        Ok(())
    }

    /// Once the log outgrows the live data: snapshot, then empty the log. A crash between the
    /// two leaves log records the snapshot covers; replay skips them. The snapshot is fsync'd,
    /// so every record appended so far is then on disk.
    pub(crate) fn compact(&mut self, store: &Store) {
        let threshold = crate::snapshot::COMPACT_MIN_BYTES.max(2 * self.snapshot_len);
        if self.len <= threshold || self.failed.is_some() {
            return;
        }
        let compacted = crate::snapshot::write(&self.dir, store).and_then(|size| {
            self.truncate(0)?;
            self.file.sync_all()?;
            Ok(size)
        });
        match compacted {
            Ok(size) => {
                tracing::info!(dir = %self.dir.display(), log_bytes = self.len, snapshot_bytes = size, "compacted the event log into a snapshot");
                self.len = 0;
                self.synced_len = 0;
                self.synced = self.appended;
                self.generation += 1;
                self.snapshot_len = size;
            }
            // The log is still whole: compaction is retried after the next write.
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot compact the event log")
            }
        }
    }
}

/// Makes a request's writes durable: one fsync per batch of concurrent writes (see the module
/// header).
pub struct GroupCommit {
    log: Arc<Mutex<Log>>,
    /// Held by the request whose fsync is running; the requests queued on it usually find
    /// their records covered by it when their turn comes.
    turn: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let log = self.log();
        f.debug_struct("GroupCommit")
            .field("path", &log.path)
            .field("appended", &log.appended)
            .field("synced", &log.synced)
            .field("fsyncs", &log.fsyncs)
            .finish()
    }
}

impl GroupCommit {
    pub(crate) fn new(log: Arc<Mutex<Log>>) -> Self {
        Self {
            log,
            turn: tokio::sync::Mutex::new(()),
        }
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ticket of every record appended so far: read it after a write, then wait for it.
    pub fn appended(&self) -> u64 {
        self.log().appended
    }

    /// fsyncs issued for writes since the start (each covers a batch of writes).
    pub fn fsyncs(&self) -> u64 {
        self.log().fsyncs
    }

    /// Makes the `nth` fsync for writes from now fail with EIO, as a failing disk's would (the
    /// `fsyncFailAfter` fault); `None` clears it. Only the fsync is skipped: what follows (cut
    /// back, refusals) is the real failure path.
    pub fn fail_fsync(&self, nth: Option<u64>) {
        self.log().fail_fsync_in = nth;
    }

    /// `Some(outcome)` once `ticket` is settled: on disk, or refused by a failed fsync.
    fn settled(log: &Log, ticket: u64) -> Option<Result<(), String>> {
        if log.synced >= ticket {
            Some(Ok(()))
        } else {
            log.failed.clone().map(Err)
        }
    }

    /// Waits until every record up to `ticket` is on disk, fsyncing them (and whatever else was
    /// appended meanwhile) if no running fsync covers them. `Err` (the request must fail) when
    /// the fsync that covered them failed.
    pub async fn durable(&self, ticket: u64) -> Result<(), String> {
        if let Some(outcome) = Self::settled(&self.log(), ticket) {
            return outcome;
        }
        let _turn = self.turn.lock().await;
        let (target, target_len, generation, file, injected) = {
            let mut log = self.log();
            if let Some(outcome) = Self::settled(&log, ticket) {
                return outcome;
            }
            let injected = match log.fail_fsync_in {
                Some(n) if n <= 1 => {
                    log.fail_fsync_in = None;
                    true
                }
                Some(n) => {
                    log.fail_fsync_in = Some(n - 1);
                    false
                }
                None => false,
            };
            let file = log.file.clone();
            (log.appended, log.len, log.generation, file, injected)
        };
        let synced = if injected {
            const EIO: i32 = 5;
            Err(std::io::Error::from_raw_os_error(EIO))
        } else {
            tokio::task::spawn_blocking(move || file.sync_data())
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        };
        let mut log = self.log();
        log.fsyncs += 1;
        match synced {
            Ok(()) => {
                log.synced = log.synced.max(target);
                if log.generation == generation {
                    log.synced_len = log.synced_len.max(target_len);
                }
                Ok(())
            }
            Err(e) => {
                let why = format!(
                    "cannot persist the write to {}: fsync failed: {e}; every write is refused \
                     until kube-sim is restarted",
                    log.path.display()
                );
                let back_to = log.synced_len;
                let restored = log.truncate(back_to);
                log.len = back_to;
                tracing::error!(path = %log.path.display(), error = %e, restored = restored.is_ok(), "fsync of the event log failed; refusing every write until a restart");
                log.failed = Some(why.clone());
                Err(why)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cluster::{Cluster, WriteOptions};
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn concurrent_writes_share_fsyncs_and_each_waits_for_one() {
        const WRITES: usize = 40;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cluster = Cluster::new(1000);
        let commit = crate::persistence::open(dir.path(), &mut cluster, 1000).expect("open");
        let info = cluster
            .registry
            .lookup("", "v1", "configmaps")
            .cloned()
            .expect("built in");
        let cluster = Arc::new(Mutex::new(cluster));
        let writers: Vec<_> = (0..WRITES)
            .map(|i| {
                let (cluster, commit, info) = (cluster.clone(), commit.clone(), info.clone());
                tokio::spawn(async move {
                    let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": format!("cm-{i}")}, "data": {"i": i.to_string()}});
                    cluster
                        .lock()
                        .expect("lock")
                        .create(&info, "default", body, &WriteOptions::default())
                        .expect("create");
                    let ticket = commit.appended();
                    commit.durable(ticket).await.expect("durable");
                    ticket
                })
            })
            .collect();
        for w in writers {
            let ticket = w.await.expect("writer");
            assert!(ticket >= 1);
        }
        let fsyncs = commit.fsyncs();
        assert!(fsyncs >= 1, "the writes were fsync'd");
        assert!(
            fsyncs < WRITES as u64,
            "{WRITES} concurrent writes took {fsyncs} fsyncs: they were not batched"
        );
        // Every write is on disk in resourceVersion order.
        let (records, _) =
            crate::persistence::read_log(&dir.path().join(crate::persistence::LOG_FILE))
                .expect("log");
        let rvs: Vec<u64> = records.iter().map(|r| r.rv).collect();
        assert!(rvs.windows(2).all(|w| w[1] == w[0] + 1), "{rvs:?}");
        assert_eq!(
            records
                .iter()
                .filter(|r| r.resource == "configmaps")
                .count(),
            WRITES
        );
    }

    #[tokio::test]
    async fn a_ticket_already_on_disk_needs_no_fsync() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cluster = Cluster::new(100);
        let commit = crate::persistence::open(dir.path(), &mut cluster, 100).expect("open");
        commit
            .durable(commit.appended())
            .await
            .expect("nothing to do");
        assert_eq!(commit.fsyncs(), 0);
    }
}
