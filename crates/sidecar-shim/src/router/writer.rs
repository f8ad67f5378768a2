//! The one writer of routes. Changes that arrive while another is being written are applied
//! together: per destination, one read and at most one write for the whole batch, each request
//! planned in arrival order against the state the ones before it left. The outcome is the one
//! serial execution gives; only intermediate routes that a later request in the same batch
//! replaces never reach the kernel.
//!
//! Why: a kernel route change is a netlink round trip, serialized, and each one invalidates the
//! cached route table (a dump before the next read). Taken one at a time, 16 concurrent
//! `UpdateSliceGwConnectionContext` streams ran at a third of an empty handler's rate.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::{NextHops, RouteChange, RouterBackend, apply, plan_next_hops};
use crate::net::Cidr;

/// What a request wants done, given the route's next hops at its turn.
pub type Plan = Box<dyn FnOnce(Option<&NextHops>) -> RouteChange + Send>;

/// A batch stops growing here, so a flood of changes still answers its first callers.
const MAX_BATCH: usize = 256;

struct Change {
    dst: Cidr,
    plan: Plan,
    reply: oneshot::Sender<Result<RouteChange, Status>>,
}

/// Hands route changes to the writer task (spawned on first use, so the service can be built
/// outside a runtime).
#[derive(Clone)]
pub struct RouteWriter {
    backend: Arc<dyn RouterBackend>,
    tx: Arc<std::sync::OnceLock<mpsc::UnboundedSender<Change>>>,
}

impl RouteWriter {
    pub fn new(backend: Arc<dyn RouterBackend>) -> Self {
        Self {
            backend,
            tx: Arc::default(),
        }
    }

    /// Applies `plan` to the route to `dst`; answers with the change it planned. A change that
    /// has been handed over completes even if the caller goes away, so a route is never
    /// half-updated.
    pub async fn change(&self, dst: Cidr, plan: Plan) -> Result<RouteChange, Status> {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run(self.backend.clone(), rx));
            tx
        });
        let (reply, answer) = oneshot::channel();
        tx.send(Change { dst, plan, reply })
            .map_err(|_| Status::unavailable("the route writer has stopped"))?;
        answer
            .await
            .map_err(|_| Status::internal("the route writer dropped the change"))?
    }
}

async fn run(backend: Arc<dyn RouterBackend>, mut rx: mpsc::UnboundedReceiver<Change>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH
            && let Ok(next) = rx.try_recv()
        {
            batch.push(next);
        }
        write_batch(backend.as_ref(), batch).await;
    }
}

/// Applies a batch: per destination (in order of first appearance) one read, the plans folded in
/// arrival order, one write of the final route if it differs, and every caller answered.
async fn write_batch(backend: &dyn RouterBackend, batch: Vec<Change>) {
    let mut by_dst: Vec<(Cidr, Vec<Change>)> = Vec::new();
    for change in batch {
        match by_dst.iter_mut().find(|(dst, _)| *dst == change.dst) {
            Some((_, changes)) => changes.push(change),
            None => by_dst.push((change.dst, vec![change])),
        }
    }
    for (dst, changes) in by_dst {
        let (plans, replies): (Vec<Plan>, Vec<_>) =
            changes.into_iter().map(|c| (c.plan, c.reply)).unzip();
        let outcome = async {
            let current = backend.next_hops(dst).await?;
            let folded = fold(current.as_ref(), plans);
            apply(backend, dst, folded.write).await?;
            Ok::<_, super::BackendError>(folded.changes)
        }
        .await;
        match outcome {
            Ok(changes) => {
                for (reply, change) in replies.into_iter().zip(changes) {
                    let _ = reply.send(Ok(change));
                }
            }
            Err(error) => {
                let status = Status::from(error);
                for reply in replies {
                    let _ = reply.send(Err(status.clone()));
                }
            }
        }
    }
}

/// The plans of one destination folded in order.
#[derive(Debug, PartialEq, Eq)]
pub struct Folded {
    /// What each request planned, against the state the ones before it left.
    pub changes: Vec<RouteChange>,
    /// The one change that takes the route from where it was to where the last plan left it.
    pub write: RouteChange,
}

/// Plans each request in turn against the state the ones before it left (pure).
pub fn fold(current: Option<&NextHops>, plans: Vec<Plan>) -> Folded {
    let mut state = current.cloned();
    let changes = plans
        .into_iter()
        .map(|plan| {
            let change = plan(state.as_ref());
            match &change {
                RouteChange::Keep => {}
                RouteChange::Replace(hops) => state = Some(hops.clone()),
                RouteChange::Remove => state = None,
            }
            change
        })
        .collect();
    let write = plan_next_hops(current, &state.unwrap_or_default());
    Folded { changes, write }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::plan_removal;

    fn hops(ips: &[&str]) -> NextHops {
        ips.iter().map(|ip| ip.parse().expect("ip")).collect()
    }

    fn set(to: NextHops) -> Plan {
        Box::new(move |current| plan_next_hops(current, &to))
    }

    fn remove(ip: &str) -> Plan {
        let ip = ip.parse().expect("ip");
        Box::new(move |current| plan_removal(current, ip))
    }

    #[test]
    fn each_request_is_planned_against_what_the_ones_before_it_left() {
        let (a, ab) = (hops(&["10.1.1.2"]), hops(&["10.1.1.2", "10.1.1.3"]));
        let folded = fold(
            Some(&a),
            vec![set(ab.clone()), set(ab.clone()), remove("10.1.1.2")],
        );
        assert_eq!(
            folded.changes,
            vec![
                RouteChange::Replace(ab.clone()),
                RouteChange::Keep,
                RouteChange::Replace(hops(&["10.1.1.3"])),
            ]
        );
        assert_eq!(folded.write, RouteChange::Replace(hops(&["10.1.1.3"])));
    }

    #[test]
    fn a_batch_that_ends_where_it_began_writes_nothing() {
        let (a, ab) = (hops(&["10.1.1.2"]), hops(&["10.1.1.2", "10.1.1.3"]));
        let folded = fold(Some(&a), vec![set(ab), set(a.clone())]);
        assert_eq!(folded.write, RouteChange::Keep);
        let removed_then_back = fold(Some(&a), vec![remove("10.1.1.2"), set(a.clone())]);
        assert_eq!(removed_then_back.changes[0], RouteChange::Remove);
        assert_eq!(removed_then_back.write, RouteChange::Keep);
    }

    /// The memory backend, counting reads and writes.
    #[derive(Default)]
    struct Counting {
        routes: crate::router::memory::MemoryRouter,
        reads: std::sync::atomic::AtomicUsize,
        writes: std::sync::atomic::AtomicUsize,
    }

    #[tonic::async_trait]
    impl RouterBackend for Counting {
        async fn next_hops(
            &self,
            dst: Cidr,
        ) -> Result<Option<NextHops>, crate::backend::BackendError> {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.routes.next_hops(dst).await
        }
        async fn replace_route(
            &self,
            dst: Cidr,
            hops: &NextHops,
        ) -> Result<(), crate::backend::BackendError> {
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.routes.replace_route(dst, hops).await
        }
        async fn delete_route(&self, dst: Cidr) -> Result<(), crate::backend::BackendError> {
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.routes.delete_route(dst).await
        }
        async fn connections(
            &self,
        ) -> Result<Vec<capstan_proto::router::ConnectionInfo>, crate::backend::BackendError>
        {
            self.routes.connections().await
        }
    }

    #[tokio::test]
    async fn a_batch_reads_and_writes_each_destination_once_and_answers_everyone() {
        let backend = Counting::default();
        let (x, y): (Cidr, Cidr) = (
            "10.2.0.0/16".parse().expect("cidr"),
            "10.3.0.0/16".parse().expect("cidr"),
        );
        let (a, ab) = (hops(&["10.1.1.2"]), hops(&["10.1.1.2", "10.1.1.3"]));
        let mut answers = Vec::new();
        let mut batch = Vec::new();
        for i in 0..10 {
            let (reply, answer) = oneshot::channel();
            let (dst, to) = if i % 2 == 0 {
                (x, ab.clone())
            } else {
                (y, a.clone())
            };
            batch.push(Change {
                dst,
                plan: set(to),
                reply,
            });
            answers.push(answer);
        }
        write_batch(&backend, batch).await;

        use std::sync::atomic::Ordering::Relaxed;
        assert_eq!(
            (backend.reads.load(Relaxed), backend.writes.load(Relaxed)),
            (2, 2)
        );
        assert_eq!(
            backend.routes.next_hops(x).await.expect("read"),
            Some(ab.clone())
        );
        assert_eq!(
            backend.routes.next_hops(y).await.expect("read"),
            Some(a.clone())
        );
        let mut planned = Vec::new();
        for answer in answers {
            planned.push(answer.await.expect("answered").expect("ok"));
        }
        // The first request of each destination installed it; the rest found it done.
        assert_eq!(planned[0], RouteChange::Replace(ab));
        assert_eq!(planned[1], RouteChange::Replace(a));
        assert!(planned[2..].iter().all(|c| *c == RouteChange::Keep));
    }

    #[test]
    fn the_last_hop_removed_takes_the_route() {
        let a = hops(&["10.1.1.2"]);
        let folded = fold(Some(&a), vec![remove("10.1.1.2")]);
        assert_eq!(folded.write, RouteChange::Remove);
        assert_eq!(fold(None, vec![]).write, RouteChange::Keep);
    }
}
