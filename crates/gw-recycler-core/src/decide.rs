//! The level-triggered recycle decisions: from what is observed of one side of a gateway pair
//! (its old and new deployments, their pods, the slice router) and the CR, the ONE thing to do
//! next. [`decide_server`] drives the state machine; [`decide_client`] answers the current request.
//! The edge reads caches and sidecars, calls these, and performs the action.

use std::time::Duration;

use capstan_apis::worker::{
    EVENT_FSM_DELETE_OLD_GW, EVENT_FSM_NEW_GW_SPAWNED, EVENT_FSM_ROUTING_TABLE_UPDATED,
};

use crate::fsm::{forward_event, transition};
use crate::{Event, Request, Response, State, Timestamp};

/// Whether the slice router routes the remote subnet via an NSM IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouteProbe {
    Present,
    #[default]
    Absent,
    /// No Running router pod, or its sidecar did not answer.
    Unreachable,
    /// The router sidecar answered the route check with an error (it is there, but cannot say).
    Failed,
}

/// What the decisions read of one gateway deployment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeploymentFacts {
    /// The Deployment exists.
    pub present: bool,
    /// Listed in the SliceGateway's `sliceGatewayIntermediateDeployments`.
    pub intermediate: bool,
    /// Labelled `kubeslice.io/marked-for-deletion=true`.
    pub marked_for_deletion: bool,
    /// Its Running pod, if any.
    pub pod: Option<PodFacts>,
}

/// What the decisions read of a deployment's Running pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    /// Labelled `kubeslice.io/exclude-gw-route=true`.
    pub excluded: bool,
    /// The NSM IP the SliceGateway's `gatewayPodStatus` publishes for this pod: its gateway
    /// sidecar's answer, or the last good one while the sidecar is away (`None`: not published).
    pub nsm_ip: Option<String>,
}

/// One side of the pair (server or client cluster): the old deployment, its replacement, and the
/// local router's routes via each.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SideFacts {
    pub old_deployment: String,
    pub new_deployment: String,
    pub old: DeploymentFacts,
    pub new: DeploymentFacts,
    pub route_via_new: RouteProbe,
    pub route_via_old: RouteProbe,
}

/// The server's view: the CR's position plus its own side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFacts {
    pub state: State,
    pub response: Option<Response>,
    /// When the CR entered `state` (`None`: unknown, counted as just now).
    pub state_since: Option<Timestamp>,
    pub side: SideFacts,
}

/// The client's view: the current request, its own last response, and its side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFacts {
    pub state: State,
    pub request: Option<Request>,
    pub response: Option<Response>,
    pub side: SideFacts,
}

/// Durations the server decision applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// A waiting step older than this fails (`on_error`).
    pub step_timeout: Duration,
    /// Pause after the routes moved, before the old deployment is removed.
    pub drain_delay: Duration,
    /// How long a finished (`end`) CR is kept.
    pub retention: Duration,
}

/// A condition a step waits for; [`Missing::describe`] is what the Warning Event and the status
/// condition say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    OldDeploymentPresent,
    NewDeploymentPresent,
    NewNsmIp,
    RouterReachable,
    RouteCheckAnswered,
    RouteViaNew,
    OldNsmIp,
    RouteViaOldGone,
    OldDeploymentGone,
    ClientResponse(Response),
    DrainDelay,
    Retention,
}

impl Missing {
    pub fn describe(&self) -> String {
        match self {
            Missing::OldDeploymentPresent => {
                "the gateway deployment to recycle (gwPair) exists: name its current generation"
                    .into()
            }
            Missing::NewDeploymentPresent => "the new gateway deployment exists".into(),
            Missing::NewNsmIp => {
                "the new gateway pod's NSM IP in gatewayPodStatus (its sidecar answers GetStatus)"
                    .into()
            }
            Missing::RouterReachable => "the slice router sidecar answers".into(),
            Missing::RouteCheckAnswered => {
                "the slice router sidecar answers GetRouteInKernel without an error (see its log)"
                    .into()
            }
            Missing::RouteViaNew => "the slice router routes via the new gateway".into(),
            Missing::OldNsmIp => {
                "the old gateway pod's NSM IP in gatewayPodStatus (its sidecar answered GetStatus once)"
                    .into()
            }
            Missing::RouteViaOldGone => "the route via the old gateway is withdrawn".into(),
            Missing::OldDeploymentGone => "the old gateway deployment is deleted".into(),
            Missing::ClientResponse(r) => format!("the client responds {r}"),
            Missing::DrainDelay => "the drain delay has passed".into(),
            Missing::Retention => "the retention of the finished recycle has passed".into(),
        }
    }

    /// Whether only a gRPC probe notices this condition change: a route in the router, the router
    /// answering. Every other condition is announced by a watch event (a Deployment or Pod, the
    /// CR, an NSM IP the SliceGateway publishes in `gatewayPodStatus`) or is a time, so a wait on
    /// it is not re-probed.
    pub fn needs_probe(&self) -> bool {
        matches!(
            self,
            Missing::RouterReachable
                | Missing::RouteCheckAnswered
                | Missing::RouteViaNew
                | Missing::RouteViaOldGone
        )
    }

    /// Short stable label (metrics, the condition reason).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Missing::OldDeploymentPresent => "old_deployment_present",
            Missing::NewDeploymentPresent => "new_deployment_present",
            Missing::NewNsmIp => "new_nsm_ip",
            Missing::RouterReachable => "router_reachable",
            Missing::RouteCheckAnswered => "route_check_answered",
            Missing::RouteViaNew => "route_via_new",
            Missing::OldNsmIp => "old_nsm_ip",
            Missing::RouteViaOldGone => "route_via_old_gone",
            Missing::OldDeploymentGone => "old_deployment_gone",
            Missing::ClientResponse(_) => "client_response",
            Missing::DrainDelay => "drain_delay",
            Missing::Retention => "retention",
        }
    }
}

/// A helper operation of the reference, on this side's cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// CreateNewDeployment: append to the intermediate list (once).
    CreateNewDeployment { deployment: String },
    /// MarkGwRouteForDeletion: label the pod, withdraw the route via `nsm_ip` when known.
    MarkGwRouteForDeletion {
        deployment: String,
        nsm_ip: Option<String>,
    },
    /// TriggerGwDeploymentDeletion: mark `old`, make `new` a regular gateway.
    TriggerGwDeploymentDeletion { old: String, new: String },
}

/// What the server does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerAction {
    Nothing,
    Work(Work),
    /// Write `spec.state = to`, `spec.request = request`; announce `reason`.
    Advance {
        event: Event,
        to: State,
        request: Request,
        /// Event reason announcing the step (the reference announces three of the four).
        reason: Option<&'static str>,
    },
    /// Re-check after `recheck_after`: the time a time-based wait ends, or, for a condition a
    /// watch event announces (see [`Missing::needs_probe`]), the step timeout, so it fires though
    /// no event comes. `None`: a condition only a probe notices (the edge re-probes on a ladder).
    /// A watch event re-checks at once in every case.
    Wait {
        missing: Missing,
        recheck_after: Option<Duration>,
    },
    /// `on_error`: the step `step` timed out waiting for `missing`.
    Fail {
        step: State,
        missing: Missing,
    },
    /// The finished CR outlived its retention.
    DeleteFinished,
}

/// What the client does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAction {
    Nothing,
    Work(Work),
    /// Write `status.client.response`.
    Respond(Response),
    Wait(Missing),
}

/// How far one side is with a sub-step.
enum Step {
    Done,
    Act(Work),
    Wait(Missing),
}

/// The new deployment exists, its pod has an NSM IP and the router routes via it.
fn new_gateway_routed(side: &SideFacts) -> Step {
    if !side.new.present {
        if side.new.intermediate {
            return Step::Wait(Missing::NewDeploymentPresent);
        }
        return Step::Act(Work::CreateNewDeployment {
            deployment: side.new_deployment.clone(),
        });
    }
    if side
        .new
        .pod
        .as_ref()
        .and_then(|p| p.nsm_ip.as_ref())
        .is_none()
    {
        return Step::Wait(Missing::NewNsmIp);
    }
    match side.route_via_new {
        RouteProbe::Present => Step::Done,
        RouteProbe::Absent => Step::Wait(Missing::RouteViaNew),
        RouteProbe::Unreachable => Step::Wait(Missing::RouterReachable),
        RouteProbe::Failed => Step::Wait(Missing::RouteCheckAnswered),
    }
}

/// The old gateway is out of the router (a deployment without a pod has no route: Decision).
fn old_route_withdrawn(side: &SideFacts) -> Step {
    let Some(pod) = &side.old.pod else {
        return Step::Done;
    };
    let mark = || {
        Step::Act(Work::MarkGwRouteForDeletion {
            deployment: side.old_deployment.clone(),
            nsm_ip: pod.nsm_ip.clone(),
        })
    };
    if !pod.excluded {
        return mark();
    }
    if pod.nsm_ip.is_none() {
        return Step::Wait(Missing::OldNsmIp);
    }
    match side.route_via_old {
        RouteProbe::Absent => Step::Done,
        // Withdraw again: a next-hop push computed before the label may have restored it.
        RouteProbe::Present => mark(),
        RouteProbe::Unreachable => Step::Wait(Missing::RouterReachable),
        RouteProbe::Failed => Step::Wait(Missing::RouteCheckAnswered),
    }
}

/// The old deployment is gone and the new one is a regular gateway.
fn old_deployment_removed(side: &SideFacts) -> Step {
    if side.new.intermediate || (side.old.present && !side.old.marked_for_deletion) {
        return Step::Act(Work::TriggerGwDeploymentDeletion {
            old: side.old_deployment.clone(),
            new: side.new_deployment.clone(),
        });
    }
    if side.old.present {
        return Step::Wait(Missing::OldDeploymentGone);
    }
    Step::Done
}

fn elapsed(since: Option<Timestamp>, now: Timestamp) -> Duration {
    since
        .and_then(|since| Duration::try_from(now.duration_since(since)).ok())
        .unwrap_or_default()
}

fn response_reached(response: Option<&Response>, at_least: &Response) -> bool {
    response.is_some_and(|r| r >= at_least)
}

/// The request the server posts on entering `to`, and the Event reason announcing it.
fn on_entering(to: &State) -> (Request, Option<&'static str>) {
    match to {
        State::NewDeploymentCreated => {
            (Request::CreateNewDeployment, Some(EVENT_FSM_NEW_GW_SPAWNED))
        }
        State::SliceRouterUpdated => (Request::UpdateRoutingTable, None),
        State::OldDeploymentDeleted => (
            Request::DeleteOldGwDeployment,
            Some(EVENT_FSM_ROUTING_TABLE_UPDATED),
        ),
        _ => (Request::None, Some(EVENT_FSM_DELETE_OLD_GW)),
    }
}

fn advance(state: &State) -> ServerAction {
    let Some(event) = forward_event(state) else {
        return ServerAction::Nothing;
    };
    match transition(state, &event) {
        Ok(to) => {
            let (request, reason) = on_entering(&to);
            ServerAction::Advance {
                event,
                to,
                request,
                reason,
            }
        }
        Err(_) => ServerAction::Nothing,
    }
}

/// Which sidecar facts a decision reads, so a pass makes only the gRPC calls its step needs: the
/// new gateway's (its pod's NSM IP, the route via it) and the old gateway's. Deployments and pod
/// labels come from the caches and are always observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Probes {
    pub new_gateway: bool,
    pub old_gateway: bool,
}

impl Probes {
    const NEW: Probes = Probes {
        new_gateway: true,
        old_gateway: false,
    };
    const OLD: Probes = Probes {
        new_gateway: false,
        old_gateway: true,
    };

    /// What [`decide_server`] reads at `state`.
    pub fn for_server(state: &State) -> Probes {
        match state {
            State::NewDeploymentCreated => Self::NEW,
            State::SliceRouterUpdated => Self::OLD,
            _ => Probes::default(),
        }
    }

    /// What [`decide_client`] reads for `request`.
    pub fn for_client(request: Option<&Request>) -> Probes {
        match request {
            Some(Request::CreateNewDeployment) => Self::NEW,
            Some(Request::UpdateRoutingTable) => Self::OLD,
            _ => Probes::default(),
        }
    }
}

/// The server's action right after `work` succeeded, when its step waits for nothing observable:
/// init's CreateNewDeployment (the reference moves on at once, the next state waits for the
/// deployment). `None` for every other work, whose effect only the next observation shows.
pub fn after_work(
    facts: &ServerFacts,
    work: &Work,
    timing: &Timing,
    now: Timestamp,
) -> Option<ServerAction> {
    if facts.state != State::Init {
        return None;
    }
    let Work::CreateNewDeployment { .. } = work else {
        return None;
    };
    let mut listed = facts.clone();
    listed.side.new.intermediate = true;
    match decide_server(&listed, timing, now) {
        advance @ ServerAction::Advance { .. } => Some(advance),
        _ => None,
    }
}

/// The server's next action for the CR at `facts.state`.
pub fn decide_server(facts: &ServerFacts, timing: &Timing, now: Timestamp) -> ServerAction {
    let side = &facts.side;
    let in_state = elapsed(facts.state_since, now);
    let (step, needed) = match &facts.state {
        State::Init => {
            // The deployment to recycle must exist: S is deleted only after
            // old_deployment_deleted_state, so at init a missing S is a wrong name (a generation
            // already recycled, whose flip is the current one) or a gateway not created yet.
            // Going on would "recycle" nothing and end as if it had.
            // (The response is not read: a wait's step is never done.)
            if !side.old.present {
                (
                    Step::Wait(Missing::OldDeploymentPresent),
                    Response::NewDeploymentCreated,
                )
            } else if !side.new.present && !side.new.intermediate {
                return ServerAction::Work(Work::CreateNewDeployment {
                    deployment: side.new_deployment.clone(),
                });
            } else {
                return advance(&facts.state);
            }
        }
        State::NewDeploymentCreated => (new_gateway_routed(side), Response::NewDeploymentCreated),
        State::SliceRouterUpdated => (old_route_withdrawn(side), Response::RoutingTableUpdated),
        State::OldDeploymentDeleted => {
            if in_state < timing.drain_delay {
                return ServerAction::Wait {
                    missing: Missing::DrainDelay,
                    recheck_after: Some(timing.drain_delay - in_state),
                };
            }
            (
                old_deployment_removed(side),
                Response::OldGwDeploymentDeleted,
            )
        }
        State::End => {
            if in_state >= timing.retention {
                return ServerAction::DeleteFinished;
            }
            return ServerAction::Wait {
                missing: Missing::Retention,
                recheck_after: Some(timing.retention - in_state),
            };
        }
        State::Error | State::Other(_) => return ServerAction::Nothing,
    };
    let pending = match step {
        Step::Done if response_reached(facts.response.as_ref(), &needed) => {
            return advance(&facts.state);
        }
        Step::Done => Missing::ClientResponse(needed),
        Step::Act(work) if in_state < timing.step_timeout => return ServerAction::Work(work),
        Step::Act(work) => match work {
            Work::CreateNewDeployment { .. } => Missing::NewDeploymentPresent,
            Work::MarkGwRouteForDeletion { .. } => Missing::RouteViaOldGone,
            Work::TriggerGwDeploymentDeletion { .. } => Missing::OldDeploymentGone,
        },
        Step::Wait(missing) => missing,
    };
    if in_state >= timing.step_timeout {
        return ServerAction::Fail {
            step: facts.state.clone(),
            missing: pending,
        };
    }
    let recheck_after = (!pending.needs_probe()).then(|| timing.step_timeout - in_state);
    ServerAction::Wait {
        missing: pending,
        recheck_after,
    }
}

/// The client's next action for the current request (nothing once answered or finished).
pub fn decide_client(facts: &ClientFacts) -> ClientAction {
    if facts.state.is_terminal() {
        return ClientAction::Nothing;
    }
    let Some(request) = &facts.request else {
        return ClientAction::Nothing;
    };
    let Some(answer) = request.expected_response() else {
        return ClientAction::Nothing;
    };
    if *request == Request::None || response_reached(facts.response.as_ref(), &answer) {
        return ClientAction::Nothing;
    }
    let side = &facts.side;
    let step = match request {
        // As at the server's init: the deployment the CR names must exist until this side
        // created its successor. A wrong name (a generation already recycled) would otherwise
        // find its flip, the gateway serving now, and answer "created" having replaced nothing.
        Request::CreateNewDeployment if !side.old.present && !side.new.intermediate => {
            Step::Wait(Missing::OldDeploymentPresent)
        }
        Request::CreateNewDeployment => new_gateway_routed(side),
        Request::UpdateRoutingTable => old_route_withdrawn(side),
        Request::DeleteOldGwDeployment => old_deployment_removed(side),
        Request::None | Request::Other(_) => return ClientAction::Nothing,
    };
    match step {
        Step::Done => ClientAction::Respond(answer),
        Step::Act(work) => ClientAction::Work(work),
        Step::Wait(missing) => ClientAction::Wait(missing),
    }
}

#[cfg(test)]
mod tests;
