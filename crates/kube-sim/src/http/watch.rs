//! Watch streaming: newline-delimited `{"type","object"}` events over a chunked response.

use super::table::to_table;
use crate::cluster::Cluster;
use crate::error::ApiError;
use crate::registry::ResourceInfo;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::shared::WatchEnd;
use crate::store::{Event, EventType, Stored};
use bytes::Bytes;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What one watcher sees.
pub struct WatchFilter {
    pub info: ResourceInfo,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub table: bool,
    /// Frames in Kubernetes' protobuf watch framing instead of JSON lines (`crate::protobuf`).
    pub protobuf: bool,
}

impl WatchFilter {
    /// Whether the watcher sees an object (in `namespace`); decodes only to apply selectors.
    fn matches_stored(&self, namespace: &str, obj: &Stored) -> bool {
        if let Some(ns) = &self.namespace
            && namespace != ns
        {
            return false;
        }
        if self.labels.is_empty() && self.fields.is_empty() {
            return true;
        }
        crate::selectors::selects_stored(&self.labels, &self.fields, obj)
    }

    /// Appends the line for a stored object: its bytes as they are when no conversion, Table or
    /// protobuf is asked for (one serialization shared by every watcher), else rendered.
    fn stored_line_into(&self, type_: &str, obj: &Stored, out: &mut Vec<u8>) {
        let same_version = obj
            .api_version()
            .is_some_and(|av| self.info.is_api_version(&av));
        if self.table || !same_version || self.protobuf {
            self.line_into(type_, &obj.value(), out);
        } else {
            Self::raw_line_into(type_, out, |out| out.extend_from_slice(obj.json()));
        }
    }

    /// Appends one `{"type","object"}` line for `obj`, converted and tabled as asked.
    fn line_into(&self, type_: &str, obj: &Value, out: &mut Vec<u8>) {
        if self.protobuf {
            // Protobuf watch hook: one length-prefixed WatchEvent frame.
            let obj = crate::convert::from_storage(&self.info, obj);
            out.extend(crate::protobuf::encode_watch_frame(type_, &obj).unwrap_or_default());
            return;
        }
        let obj = if self.table {
            to_table(
                &self.info,
                &[Arc::new(crate::convert::from_storage(&self.info, obj))],
                json!({}),
                true,
                "Object",
            )
        } else if crate::convert::needs_conversion(&self.info, obj) {
            crate::convert::from_storage(&self.info, obj)
        } else {
            Self::raw_line_into(type_, out, |out| {
                let _ = serde_json::to_writer(&mut *out, obj);
            });
            return;
        };
        let _ = serde_json::to_writer(&mut *out, &json!({"type": type_, "object": obj}));
        out.push(b'\n');
    }

    fn raw_line_into(type_: &str, out: &mut Vec<u8>, object: impl FnOnce(&mut Vec<u8>)) {
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(type_.as_bytes());
        out.extend_from_slice(b"\",\"object\":");
        object(out);
        out.extend_from_slice(b"}\n");
    }

    /// Appends the line for an event to `out`, applying selectors (leaving the selector is a
    /// DELETED); returns whether the watcher sees the event at all.
    pub fn render_into(&self, ev: &Event, out: &mut Vec<u8>) -> bool {
        if !self.info.stored_under(&ev.key) {
            return false;
        }
        let namespace = ev.object_key.namespace();
        let now = self.matches_stored(namespace, &ev.object);
        let before = ev.prev.as_ref().map(|p| self.matches_stored(namespace, p));
        let type_ = match (ev.type_, before, now) {
            (EventType::Deleted, Some(true), _) => EventType::Deleted,
            (EventType::Deleted, _, _) => return false,
            (EventType::Added, _, true) => EventType::Added,
            (EventType::Modified, Some(true), true) => EventType::Modified,
            (EventType::Modified, Some(false) | None, true) => EventType::Added,
            (EventType::Modified, Some(true), false) => {
                let mut prev = ev.prev.as_ref().map(Stored::value).unwrap_or_default();
                prev["metadata"]["resourceVersion"] = json!(ev.rv.to_string());
                self.line_into("DELETED", &prev, out);
                return true;
            }
            _ => return false,
        };
        self.stored_line_into(type_.as_str(), &ev.object, out);
        true
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.info.kind, "apiVersion": self.info.api_version(), "metadata": meta});
        if self.protobuf {
            return Bytes::from(
                crate::protobuf::encode_watch_frame("BOOKMARK", &obj).unwrap_or_default(),
            );
        }
        let mut out =
            serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).unwrap_or_default();
        out.push(b'\n');
        Bytes::from(out)
    }
}

fn error_line(err: &ApiError, protobuf: bool) -> Bytes {
    if protobuf {
        let frame = crate::protobuf::encode_watch_frame("ERROR", &err.to_status());
        return Bytes::from(frame.unwrap_or_default());
    }
    let mut out = serde_json::to_vec(&json!({"type": "ERROR", "object": err.to_status()}))
        .unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

pub struct WatchRequest {
    pub resource_version: Option<String>,
    pub send_initial_events: bool,
    pub allow_bookmarks: bool,
    pub timeout: Duration,
    pub bookmark_interval: Duration,
}

/// What ends a watch early: server shutdown, or `Shared::end_watches`.
pub struct Ends {
    pub shutdown: CancellationToken,
    pub ended: tokio::sync::watch::Receiver<Option<WatchEnd>>,
}

struct WatchState {
    pending: VecDeque<Bytes>,
    rx: broadcast::Receiver<Arc<Event>>,
    filter: WatchFilter,
    last_rv: u64,
    /// Created once: a timer per event would cost more than the event.
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    bookmarks: Option<tokio::time::Interval>,
    ends: Ends,
    finished: bool,
}

/// A watch chunk grows up to about this size before it is sent.
const BATCH_BYTES: usize = 64 * 1024;

fn flush(batch: &mut Vec<u8>, pending: &mut VecDeque<Bytes>) {
    if !batch.is_empty() {
        pending.push_back(Bytes::from(std::mem::take(batch)));
    }
}

fn flush_full(batch: &mut Vec<u8>, pending: &mut VecDeque<Bytes>) {
    if batch.len() >= BATCH_BYTES {
        flush(batch, pending);
    }
}

impl WatchState {
    /// Renders a live event unless it was already covered by the initial events.
    fn take(&mut self, ev: &Event, batch: &mut Vec<u8>) {
        if ev.rv > self.last_rv {
            self.last_rv = ev.rv;
            self.filter.render_into(ev, batch);
        }
    }
}

/// Starts a watch under the cluster lock: the initial events are computed and the live
/// subscription is taken atomically, so no event is lost or repeated.
pub fn start(
    cluster: &Cluster,
    filter: WatchFilter,
    req: &WatchRequest,
    ends: Ends,
) -> Result<impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + use<>, ApiError>
{
    let (rx, now_rv) = cluster.store.subscribe();
    let mut pending = VecDeque::new();
    let mut finished = false;
    let rv_param = req.resource_version.as_deref().unwrap_or("");
    let snapshot = |pending: &mut VecDeque<Bytes>| {
        let mut batch = Vec::new();
        for (ok, obj) in cluster
            .store
            .list(&filter.info.storage_key(), filter.namespace.as_deref())
        {
            if filter.matches_stored(ok.namespace(), obj) {
                filter.stored_line_into("ADDED", obj, &mut batch);
                flush_full(&mut batch, pending);
            }
        }
        flush(&mut batch, pending);
    };
    if req.send_initial_events {
        snapshot(&mut pending);
        pending.push_back(filter.bookmark(now_rv, true));
    } else if rv_param.is_empty() || rv_param == "0" {
        snapshot(&mut pending);
    } else {
        let rv: u64 = rv_param.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid resource version: \"{rv_param}\""))
        })?;
        match cluster.store.events_since(rv) {
            Ok(events) => {
                let mut batch = Vec::new();
                for event in &events {
                    filter.render_into(event, &mut batch);
                    flush_full(&mut batch, &mut pending);
                }
                flush(&mut batch, &mut pending);
            }
            Err(oldest) => {
                pending.push_back(error_line(
                    &ApiError::gone(format!(
                        "too old resource version: {rv} ({})",
                        oldest.saturating_sub(1)
                    )),
                    filter.protobuf,
                ));
                finished = true;
            }
        }
    }
    let bookmarks = req.allow_bookmarks.then(|| {
        let mut i = tokio::time::interval_at(
            Instant::now() + req.bookmark_interval,
            req.bookmark_interval,
        );
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let state = WatchState {
        pending,
        rx,
        filter,
        last_rv: now_rv,
        deadline: Box::pin(tokio::time::sleep(req.timeout)),
        bookmarks,
        ends,
        finished,
    };
    Ok(futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(b) = st.pending.pop_front() {
                return Some((Ok(b), st));
            }
            if st.finished {
                return None;
            }
            enum Next {
                Stop,
                Bookmark,
                Expired,
                Event(Result<Arc<Event>, broadcast::error::RecvError>),
            }
            let next = {
                let WatchState {
                    rx,
                    bookmarks,
                    ends,
                    deadline,
                    ..
                } = &mut st;
                let tick = async move {
                    match bookmarks.as_mut() {
                        Some(i) => {
                            i.tick().await;
                        }
                        None => futures::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    _ = ends.shutdown.cancelled() => Next::Stop,
                    _ = ends.ended.changed() => match *ends.ended.borrow_and_update() {
                        Some(WatchEnd::Expire) => Next::Expired,
                        _ => Next::Stop,
                    },
                    _ = deadline.as_mut() => Next::Stop,
                    _ = tick => Next::Bookmark,
                    r = rx.recv() => Next::Event(r),
                }
            };
            match next {
                Next::Stop => return None,
                Next::Expired => {
                    let err = ApiError::gone(format!(
                        "too old resource version: {} ({})",
                        st.last_rv,
                        st.last_rv + 1
                    ));
                    st.pending.push_back(error_line(&err, st.filter.protobuf));
                    st.finished = true;
                }
                Next::Bookmark => {
                    let line = st.filter.bookmark(st.last_rv, false);
                    st.pending.push_back(line);
                }
                Next::Event(Ok(ev)) => {
                    // Everything already published goes out in one chunk: one write and one
                    // wake-up per batch instead of per event.
                    let mut batch = Vec::new();
                    st.take(&ev, &mut batch);
                    while batch.len() < BATCH_BYTES {
                        match st.rx.try_recv() {
                            Ok(ev) => st.take(&ev, &mut batch),
                            Err(broadcast::error::TryRecvError::Empty) => break,
                            // Lagged: send what is in order, then close; the client resumes
                            // from its last resourceVersion. Closed: the server is stopping.
                            Err(_) => {
                                st.finished = true;
                                break;
                            }
                        }
                    }
                    if !batch.is_empty() {
                        return Some((Ok(Bytes::from(batch)), st));
                    }
                }
                // A watcher too slow to keep up is closed; the client resumes from its last RV.
                Next::Event(Err(_)) => return None,
            }
        }
    }))
}
