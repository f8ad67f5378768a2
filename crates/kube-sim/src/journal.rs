//! The object write journal: the successful writes of the resources a test names, one entry per
//! object a write changed, with the writing client's User-Agent and the object's labels before
//! and after. A test proves with it which client wrote which object (sharded replicas write only
//! the objects their shard label gives them), which request counters, grouped by verb and
//! client, cannot tell.
//!
//! The store offers every change it applies to [`Journal::observe`], the one place both the
//! stored object and the new one are known. The HTTP layer opens a [`WriteRequest`] around each
//! write (under the cluster lock, so the request's changes are its own) and closes it with the
//! outcome: the changes of a failed request are dropped. Changes made with no request open, or
//! to objects the request does not name (garbage collection, the workload simulation, the
//! kubelet), are kube-sim's own: empty User-Agent. Off until a resource is journaled: without a
//! journal the store and the write path pay one branch each.

use crate::registry::StorageKey;
use crate::store::{Event, EventType, ObjKey, Stored};
use std::collections::{BTreeMap, HashSet};

/// One object's labels.
pub type Labels = BTreeMap<String, String>;

/// One successful write of one journaled object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectWrite {
    /// Global order of the journaled writes, from 0 (not restarted by a clear).
    pub seq: u64,
    /// `create`, `update`, `patch` or `delete` (a deletecollection's items and an eviction are
    /// deletes); kube-sim's own writes are named by what they did to the object.
    pub verb: String,
    /// The request's subresource (`status`, `scale`, `eviction`), or "".
    pub subresource: String,
    /// `None` for a cluster-scoped object.
    pub namespace: Option<String>,
    pub name: String,
    /// The request's full User-Agent header ("" without one, and for kube-sim's own writes).
    pub user_agent: String,
    /// The stored object's labels before the write; `None` when the write created it.
    pub labels_before: Option<Labels>,
    /// The labels after the write; `None` when the write removed the object (a delete that only
    /// set `deletionTimestamp`, as finalizers remain, keeps them).
    pub labels_after: Option<Labels>,
}

/// A write request as the journal records it: opened by the HTTP layer around one write.
#[derive(Debug, Clone)]
pub struct WriteRequest {
    pub verb: &'static str,
    pub subresource: String,
    pub user_agent: String,
    /// The object the request writes (a collection's items are named in turn: [`Journal::target`]).
    pub target: Option<(StorageKey, ObjKey)>,
}

/// A request being served, and what it changed so far.
#[derive(Debug)]
struct Open {
    request: WriteRequest,
    /// Changes to commit if the request succeeds; `true` marks those of the request's target.
    changes: Vec<(bool, ObjectWrite)>,
}

/// The journal of one server (held by its store).
#[derive(Debug, Default)]
pub struct Journal {
    resources: HashSet<StorageKey>,
    writes: Vec<ObjectWrite>,
    next_seq: u64,
    open: Option<Open>,
}

impl Journal {
    /// Records the later writes of this resource too.
    pub fn journal(&mut self, resource: StorageKey) {
        self.resources.insert(resource);
    }

    /// Everything recorded since the last clear, in `seq` order.
    pub fn writes(&self) -> &[ObjectWrite] {
        &self.writes
    }

    /// Forgets the recorded writes; the journaled resources stay, and `seq` goes on.
    pub fn clear(&mut self) {
        self.writes.clear();
    }

    /// A request starts writing: its changes wait for [`end`](Self::end).
    pub fn begin(&mut self, request: WriteRequest) {
        self.open = Some(Open {
            request,
            changes: Vec::new(),
        });
    }

    /// The object the open request writes next, where only the cluster knows it: a create's
    /// (its name may be generated), each item of a deletecollection.
    pub fn target(&mut self, resource: &StorageKey, object: &ObjKey) {
        if let Some(open) = &mut self.open {
            open.request.target = Some((resource.clone(), object.clone()));
        }
    }

    /// The open request is answered: its changes are recorded when it succeeded, else dropped.
    pub fn end(&mut self, succeeded: bool) {
        let Some(open) = self.open.take() else {
            return;
        };
        if succeeded {
            for (_, write) in open.changes {
                self.commit(write);
            }
        }
    }

    fn commit(&mut self, mut write: ObjectWrite) {
        write.seq = self.next_seq;
        self.next_seq += 1;
        self.writes.push(write);
    }

    /// One change the store applied.
    pub(crate) fn observe(&mut self, event: &Event) {
        if !self.resources.contains(&*event.key) {
            return;
        }
        let (namespace, name) = (event.object_key.namespace(), event.object_key.name());
        let labels_after = match event.type_ {
            EventType::Deleted => None,
            EventType::Added | EventType::Modified => Some(event.object.labels()),
        };
        let own = self.open.as_ref().is_some_and(|open| {
            open.request
                .target
                .as_ref()
                .is_some_and(|(resource, object)| {
                    *resource == *event.key && object.0 == namespace && object.1 == name
                })
        });
        if let Some(open) = &mut self.open
            && own
        {
            // One request may change its object twice (the last finalizer removed, then the
            // object): one write, from the first state to the last.
            if let Some((_, earlier)) = open.changes.iter_mut().find(|(is_own, w)| {
                *is_own && w.name == name && w.namespace.as_deref().unwrap_or("") == namespace
            }) {
                earlier.labels_after = labels_after;
                return;
            }
        }
        let (verb, subresource, user_agent) = match &self.open {
            Some(open) if own => (
                open.request.verb,
                open.request.subresource.clone(),
                open.request.user_agent.clone(),
            ),
            _ => (own_verb(event.type_), String::new(), String::new()),
        };
        let write = ObjectWrite {
            seq: 0,
            verb: verb.to_string(),
            subresource,
            namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
            name: name.to_string(),
            user_agent,
            labels_before: event.prev.as_ref().map(Stored::labels),
            labels_after,
        };
        match &mut self.open {
            Some(open) => open.changes.push((own, write)),
            None => self.commit(write),
        }
    }
}

/// The verb of a change kube-sim made on its own.
fn own_verb(type_: EventType) -> &'static str {
    match type_ {
        EventType::Added => "create",
        EventType::Modified => "update",
        EventType::Deleted => "delete",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use serde_json::json;

    fn cms() -> StorageKey {
        (String::new(), "configmaps".into())
    }

    fn cm(name: &str, shard: &str) -> serde_json::Value {
        json!({"metadata": {"namespace": "a", "name": name, "labels": {"shard": shard}}})
    }

    fn shard(s: &str) -> Option<Labels> {
        Some(Labels::from([("shard".to_string(), s.to_string())]))
    }

    fn request(name: &str) -> WriteRequest {
        WriteRequest {
            verb: "patch",
            subresource: String::new(),
            user_agent: "ctl/1 (ctl-0)".into(),
            target: Some((cms(), ("a".into(), name.into()))),
        }
    }

    fn journal(store: &mut Store) -> &mut Journal {
        store.journal_mut().expect("journaling")
    }

    #[test]
    fn a_request_owns_its_target_and_kube_sim_the_rest() {
        let mut store = Store::new(10);
        store.put(&cms(), cm("before", "0"));
        assert!(store.journal().is_none(), "nothing journaled yet");
        store.start_journal().journal(cms());
        store.put(&(String::new(), "secrets".into()), cm("secret", "0"));
        store.put(&cms(), cm("x", "0"));

        journal(&mut store).begin(request("x"));
        store.put(&cms(), cm("x", "1"));
        store.put(&cms(), cm("x", "2"));
        store.put(&cms(), cm("other", "1"));
        journal(&mut store).end(true);

        journal(&mut store).begin(request("x"));
        store.put(&cms(), cm("x", "3"));
        journal(&mut store).end(false);

        let writes = store.journal().expect("journaling").writes().to_vec();
        let summary: Vec<_> = writes
            .iter()
            .map(|w| {
                (
                    w.seq,
                    w.verb.as_str(),
                    w.name.as_str(),
                    w.user_agent.as_str(),
                    w.labels_before.clone(),
                    w.labels_after.clone(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (0, "create", "x", "", None, shard("0")),
                (1, "patch", "x", "ctl/1 (ctl-0)", shard("0"), shard("2")),
                (2, "create", "other", "", None, shard("1")),
            ],
            "two changes of the target are one write; a failed request's are dropped"
        );
        assert_eq!(writes[0].namespace.as_deref(), Some("a"));

        journal(&mut store).clear();
        store.remove(&cms(), &("a".into(), "x".into()));
        let writes = store.journal().expect("journaling").writes().to_vec();
        assert_eq!(writes.len(), 1);
        assert_eq!(
            (
                writes[0].seq,
                writes[0].verb.as_str(),
                &writes[0].labels_after
            ),
            (3, "delete", &None),
            "seq goes on after a clear"
        );
    }
}
