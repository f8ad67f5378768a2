//! Properties of the recycler decisions over arbitrary observed facts (any state, request and
//! response string, any deployment and route observation, any clock): they never panic, the
//! server only ever moves `spec.state` along the FSM table (so it alone writes state/request) and
//! the client only ever answers the current request with a response further on (so it alone
//! writes the response, never backwards, never after the end).

use std::time::Duration;

use gw_recycler_core::decide::{
    ClientAction, ClientFacts, DeploymentFacts, PodFacts, RouteProbe, ServerAction, ServerFacts,
    SideFacts, Timing, Work, decide_client, decide_server,
};
use gw_recycler_core::fsm::transition;
use gw_recycler_core::{Request, Response, State, Timestamp};
use proptest::prelude::*;

fn wire(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(known).prop_map(str::to_owned),
        1 => "[a-z_]{0,12}",
    ]
}

fn state() -> impl Strategy<Value = State> {
    wire(&[
        "init",
        "new_deployment_created_state",
        "slicerouter_updated_state",
        "old_deployment_deleted_state",
        "error_state",
        "end",
    ])
    .prop_map(|s| State::from(s.as_str()))
}

fn request() -> impl Strategy<Value = Option<Request>> {
    proptest::option::of(
        wire(&[
            "none",
            "create_new_deployment",
            "update_routing_table",
            "delete_old_gw_deployment",
        ])
        .prop_map(|s| Request::from(s.as_str())),
    )
}

fn response() -> impl Strategy<Value = Option<Response>> {
    proptest::option::of(
        wire(&[
            "none",
            "new_deployment_created",
            "routing_table_updated",
            "old_gw_deployment_deleted",
        ])
        .prop_map(|s| Response::from(s.as_str())),
    )
}

fn route() -> impl Strategy<Value = RouteProbe> {
    prop_oneof![
        Just(RouteProbe::Present),
        Just(RouteProbe::Absent),
        Just(RouteProbe::Unreachable),
        Just(RouteProbe::Failed)
    ]
}

fn deployment() -> impl Strategy<Value = DeploymentFacts> {
    let pod = (
        any::<bool>(),
        proptest::option::of("10\\.[0-9]\\.[0-9]\\.[0-9]"),
    )
        .prop_map(|(excluded, nsm_ip)| PodFacts { excluded, nsm_ip });
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(pod),
    )
        .prop_map(
            |(present, intermediate, marked_for_deletion, pod)| DeploymentFacts {
                present,
                intermediate,
                marked_for_deletion,
                pod,
            },
        )
}

fn side() -> impl Strategy<Value = SideFacts> {
    ("[a-z-]{0,8}", deployment(), deployment(), route(), route()).prop_map(
        |(old_deployment, old, new, route_via_new, route_via_old)| SideFacts {
            new_deployment: gw_recycler_core::naming::next_deployment_name(&old_deployment),
            old_deployment,
            old,
            new,
            route_via_new,
            route_via_old,
        },
    )
}

fn secs(max: u64) -> impl Strategy<Value = Duration> {
    (0..max).prop_map(Duration::from_secs)
}

/// Only the helper operations of the reference, on this side's own deployments.
fn work_is_on_own_deployments(work: &Work, side: &SideFacts) -> bool {
    match work {
        Work::CreateNewDeployment { deployment } => *deployment == side.new_deployment,
        Work::MarkGwRouteForDeletion { deployment, .. } => *deployment == side.old_deployment,
        Work::TriggerGwDeploymentDeletion { old, new } => {
            *old == side.old_deployment && *new == side.new_deployment
        }
    }
}

proptest! {
    #[test]
    fn the_server_moves_state_only_along_the_fsm_table(
        state in state(),
        response in response(),
        side in side(),
        since in proptest::option::of(0i64..10_000),
        now in 0i64..20_000,
        step_timeout in secs(600),
        drain_delay in secs(60),
        retention in secs(7200),
    ) {
        let base = Timestamp::from_second(1_700_000_000).expect("valid");
        let at = |s: i64| base.checked_add(jiff_secs(s)).expect("in range");
        let facts = ServerFacts {
            state: state.clone(),
            response,
            state_since: since.map(at),
            side: side.clone(),
        };
        let timing = Timing { step_timeout, drain_delay, retention };
        match decide_server(&facts, &timing, at(now)) {
            ServerAction::Advance { event, to, request, .. } => {
                prop_assert_eq!(transition(&state, &event), Ok(to.clone()));
                prop_assert!(!state.is_terminal());
                prop_assert_eq!(to == State::End, request == Request::None);
            }
            ServerAction::Fail { step, .. } => {
                prop_assert_eq!(&step, &state);
                prop_assert!(state.is_known() && !state.is_terminal());
            }
            ServerAction::Work(work) => {
                prop_assert!(!state.is_terminal());
                prop_assert!(work_is_on_own_deployments(&work, &side));
            }
            ServerAction::DeleteFinished => prop_assert_eq!(state, State::End),
            ServerAction::Wait { .. } | ServerAction::Nothing => {}
        }
    }

    #[test]
    fn the_client_only_answers_the_current_request_forwards(
        state in state(),
        request in request(),
        response in response(),
        side in side(),
    ) {
        let facts = ClientFacts {
            state: state.clone(),
            request: request.clone(),
            response: response.clone(),
            side: side.clone(),
        };
        match decide_client(&facts) {
            ClientAction::Respond(answer) => {
                prop_assert!(!state.is_terminal());
                let expected = request.as_ref().and_then(Request::expected_response);
                prop_assert_eq!(Some(&answer), expected.as_ref());
                prop_assert!(response.as_ref().is_none_or(|r| *r < answer), "{:?} -> {:?}", response, answer);
            }
            ClientAction::Work(work) => {
                prop_assert!(!state.is_terminal());
                prop_assert!(request.is_some());
                prop_assert!(work_is_on_own_deployments(&work, &side));
            }
            ClientAction::Wait(_) => prop_assert!(!state.is_terminal()),
            ClientAction::Nothing => {}
        }
    }
}

fn jiff_secs(s: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(s)
}
