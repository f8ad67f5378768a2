//! Pure logic of the slice gateway recycler (KubeSlice's `workerslicegwrecycler`): the state
//! machine ([`fsm`]), the server and client decisions from observed facts ([`decide`]), gateway
//! deployment naming ([`naming`]), rebalancing ([`rebalance`]), role detection ([`role`]) and router next hops ([`nexthop`]).
//! No client and no clock: the edge crate observes, calls these functions, and performs the result.

pub mod decide;
pub mod fsm;
pub mod naming;
pub mod nexthop;
pub mod rebalance;
pub mod role;

pub use capstan_apis::worker::{Event, Request, Response, State};
/// Wall-clock instants as the edge reads them (`now` is always a parameter).
pub use k8s_openapi::jiff::Timestamp;
