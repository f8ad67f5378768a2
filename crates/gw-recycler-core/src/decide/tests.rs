//! The spec's acceptance examples for the server and client decisions, each guard removed in turn.

use super::*;

const S: &str = "red-a-b-0-0";
const NEW_S: &str = "red-a-b-0-1";

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).expect("valid")
}

fn timing() -> Timing {
    Timing {
        step_timeout: Duration::from_secs(300),
        drain_delay: Duration::from_secs(5),
        retention: Duration::from_secs(3600),
    }
}

fn pod(ip: &str, excluded: bool) -> Option<PodFacts> {
    Some(PodFacts {
        excluded,
        nsm_ip: Some(ip.into()),
    })
}

/// A side as it looks before a recycle: the old gateway serving, nothing new.
fn before() -> SideFacts {
    SideFacts {
        old_deployment: S.into(),
        new_deployment: NEW_S.into(),
        old: DeploymentFacts {
            present: true,
            pod: pod("10.1.0.1", false),
            ..DeploymentFacts::default()
        },
        new: DeploymentFacts::default(),
        route_via_new: RouteProbe::Absent,
        route_via_old: RouteProbe::Present,
    }
}

/// The new gateway up and routed (what `new_deployment_created_state` waits for).
fn new_routed() -> SideFacts {
    SideFacts {
        new: DeploymentFacts {
            present: true,
            intermediate: true,
            pod: pod("10.1.0.2", false),
            ..DeploymentFacts::default()
        },
        route_via_new: RouteProbe::Present,
        ..before()
    }
}

/// The old route withdrawn (what `slicerouter_updated_state` waits for).
fn old_withdrawn() -> SideFacts {
    let mut side = new_routed();
    side.old.pod = pod("10.1.0.1", true);
    side.route_via_old = RouteProbe::Absent;
    side
}

/// The old deployment gone, the new one regular (what `old_deployment_deleted_state` waits for).
fn old_gone() -> SideFacts {
    let mut side = old_withdrawn();
    side.old = DeploymentFacts::default();
    side.new.intermediate = false;
    side
}

fn server(state: &str, response: &str, side: SideFacts) -> ServerFacts {
    ServerFacts {
        state: State::from(state),
        response: (!response.is_empty()).then(|| Response::from(response)),
        state_since: Some(at(1000)),
        side,
    }
}

fn client(request: &str, response: &str, side: SideFacts) -> ClientFacts {
    ClientFacts {
        state: State::from("new_deployment_created_state"),
        request: Some(Request::from(request)),
        response: (!response.is_empty()).then(|| Response::from(response)),
        side,
    }
}

const NOW: i64 = 1010;

fn decide(facts: &ServerFacts) -> ServerAction {
    decide_server(facts, &timing(), at(NOW))
}

fn advanced(action: &ServerAction) -> (String, String, Option<&'static str>) {
    match action {
        ServerAction::Advance {
            to,
            request,
            reason,
            ..
        } => (to.to_string(), request.to_string(), *reason),
        other => panic!("expected an advance, got {other:?}"),
    }
}

fn waiting(action: &ServerAction) -> &Missing {
    match action {
        ServerAction::Wait { missing, .. } => missing,
        other => panic!("expected a wait, got {other:?}"),
    }
}

// ---- server: init ----

#[test]
fn init_first_asks_for_the_new_deployment() {
    assert_eq!(
        decide(&server("init", "", before())),
        ServerAction::Work(Work::CreateNewDeployment {
            deployment: "red-a-b-0-1".into()
        })
    );
}

/// A gwPair naming a generation already recycled: S is gone and its flip is the current
/// gateway. Going on would "recycle" nothing and end; the server waits, then fails, naming it.
#[test]
fn init_without_the_deployment_to_recycle_waits_then_fails_naming_it() {
    let mut side = before();
    side.old = DeploymentFacts::default();
    side.new = new_routed().new;
    side.new.intermediate = false;
    let facts = server("init", "", side);
    assert_eq!(waiting(&decide(&facts)), &Missing::OldDeploymentPresent);
    let late = at(1000 + timing().step_timeout.as_secs() as i64);
    assert_eq!(
        decide_server(&facts, &timing(), late),
        ServerAction::Fail {
            step: State::Init,
            missing: Missing::OldDeploymentPresent,
        }
    );
    assert!(
        Missing::OldDeploymentPresent
            .describe()
            .contains("current generation")
    );
}

#[test]
fn init_reconciled_twice_lists_the_new_deployment_once() {
    // After the first reconcile appended newS, the second one advances instead of appending again.
    let mut side = before();
    side.new.intermediate = true;
    let action = decide(&server("init", "", side));
    assert_eq!(
        advanced(&action),
        (
            "new_deployment_created_state".into(),
            "create_new_deployment".into(),
            Some("FSMNewGWSpawned")
        )
    );
    // An unset state is init (the reference starts there).
    let mut side = before();
    side.new.present = true;
    let mut facts = server("init", "", side);
    facts.state = State::Init;
    assert!(matches!(decide(&facts), ServerAction::Advance { .. }));
}

// ---- server: new_deployment_created_state ----

#[test]
fn new_deployment_created_advances_when_every_guard_holds() {
    let action = decide(&server(
        "new_deployment_created_state",
        "new_deployment_created",
        new_routed(),
    ));
    assert_eq!(
        advanced(&action),
        (
            "slicerouter_updated_state".into(),
            "update_routing_table".into(),
            None
        )
    );
    // A response already further along also satisfies the guard.
    let later = decide(&server(
        "new_deployment_created_state",
        "routing_table_updated",
        new_routed(),
    ));
    assert!(matches!(later, ServerAction::Advance { .. }));
}

#[test]
fn new_deployment_created_waits_while_any_guard_is_missing() {
    let state = "new_deployment_created_state";
    let ok = "new_deployment_created";
    // newS missing (still intermediate: asked for, not yet created).
    let mut side = new_routed();
    side.new.present = false;
    side.new.pod = None;
    assert_eq!(
        waiting(&decide(&server(state, ok, side))),
        &Missing::NewDeploymentPresent
    );
    // Response below new_deployment_created.
    for below in ["", "none", "bogus"] {
        assert_eq!(
            waiting(&decide(&server(state, below, new_routed()))),
            &Missing::ClientResponse(Response::from("new_deployment_created")),
            "response {below:?}"
        );
    }
    // NSM IP empty (no pod yet, or the sidecar reports none).
    let mut side = new_routed();
    side.new.pod = None;
    assert_eq!(
        waiting(&decide(&server(state, ok, side))),
        &Missing::NewNsmIp
    );
    let mut side = new_routed();
    side.new.pod = Some(PodFacts::default());
    assert_eq!(
        waiting(&decide(&server(state, ok, side))),
        &Missing::NewNsmIp
    );
    // Route absent.
    let mut side = new_routed();
    side.route_via_new = RouteProbe::Absent;
    assert_eq!(
        waiting(&decide(&server(state, ok, side))),
        &Missing::RouteViaNew
    );
    // Router unreachable.
    let mut side = new_routed();
    side.route_via_new = RouteProbe::Unreachable;
    assert_eq!(
        waiting(&decide(&server(state, ok, side))),
        &Missing::RouterReachable
    );
    // The router answered the check with an error: there, but it cannot say (not unreachable).
    let mut side = new_routed();
    side.route_via_new = RouteProbe::Failed;
    assert_eq!(
        waiting(&decide(&server(state, ok, side))),
        &Missing::RouteCheckAnswered
    );
}

/// A wait a watch event ends is looked at again only at the step timeout (so it still fires when
/// no event comes); a wait only a gRPC probe notices (a route, the router) is left to the probes.
#[test]
fn only_conditions_no_watch_event_announces_are_probed() {
    let state = "new_deployment_created_state";
    let mut facts = server(state, "new_deployment_created", new_routed());
    facts.state_since = Some(at(NOW - 10));
    let left = Some(Duration::from_secs(290));
    let mut no_pod = facts.clone();
    no_pod.side.new.pod = None;
    let mut no_answer = facts.clone();
    no_answer.response = None;
    for watched in [no_pod, no_answer] {
        let action = decide(&watched);
        assert!(!waiting(&action).needs_probe(), "{action:?}");
        assert!(
            matches!(action, ServerAction::Wait { recheck_after, .. } if recheck_after == left),
            "{action:?}"
        );
    }
    for route in [
        RouteProbe::Absent,
        RouteProbe::Unreachable,
        RouteProbe::Failed,
    ] {
        let mut probed = facts.clone();
        probed.side.route_via_new = route;
        let action = decide(&probed);
        assert!(waiting(&action).needs_probe(), "{action:?}");
        assert!(
            matches!(
                action,
                ServerAction::Wait {
                    recheck_after: None,
                    ..
                }
            ),
            "{action:?}"
        );
    }
    // The published NSM IPs, Deployments and the CR come with watch events; routes do not.
    for missing in [
        Missing::NewNsmIp,
        Missing::OldNsmIp,
        Missing::NewDeploymentPresent,
        Missing::OldDeploymentGone,
        Missing::ClientResponse(Response::from("routing_table_updated")),
    ] {
        assert!(!missing.needs_probe(), "{missing:?}");
    }
    assert!(Missing::RouteViaOldGone.needs_probe());
}

#[test]
fn new_deployment_lost_from_the_list_is_asked_for_again() {
    let mut side = new_routed();
    side.new = DeploymentFacts::default();
    assert_eq!(
        decide(&server(
            "new_deployment_created_state",
            "new_deployment_created",
            side
        )),
        ServerAction::Work(Work::CreateNewDeployment {
            deployment: NEW_S.into()
        })
    );
}

// ---- server: slicerouter_updated_state ----

#[test]
fn slicerouter_updated_marks_the_old_route_then_advances() {
    let state = "slicerouter_updated_state";
    assert_eq!(
        decide(&server(state, "routing_table_updated", new_routed())),
        ServerAction::Work(Work::MarkGwRouteForDeletion {
            deployment: S.into(),
            nsm_ip: Some("10.1.0.1".into())
        })
    );
    let action = decide(&server(state, "routing_table_updated", old_withdrawn()));
    assert_eq!(
        advanced(&action),
        (
            "old_deployment_deleted_state".into(),
            "delete_old_gw_deployment".into(),
            Some("FSMRoutingTableUpdated")
        )
    );
}

#[test]
fn slicerouter_updated_waits_while_any_guard_is_missing() {
    let state = "slicerouter_updated_state";
    // Labelled, but the route via S is still there: withdraw again.
    let mut side = old_withdrawn();
    side.route_via_old = RouteProbe::Present;
    assert!(matches!(
        decide(&server(state, "routing_table_updated", side)),
        ServerAction::Work(Work::MarkGwRouteForDeletion { .. })
    ));
    // Router unreachable: cannot tell.
    let mut side = old_withdrawn();
    side.route_via_old = RouteProbe::Unreachable;
    assert_eq!(
        waiting(&decide(&server(state, "routing_table_updated", side))),
        &Missing::RouterReachable
    );
    let mut side = old_withdrawn();
    side.route_via_old = RouteProbe::Failed;
    assert_eq!(
        waiting(&decide(&server(state, "routing_table_updated", side))),
        &Missing::RouteCheckAnswered
    );
    // Client not done.
    assert_eq!(
        waiting(&decide(&server(
            state,
            "new_deployment_created",
            old_withdrawn()
        ))),
        &Missing::ClientResponse(Response::from("routing_table_updated"))
    );
}

#[test]
fn old_deployment_without_a_pod_has_no_route_to_withdraw() {
    let mut side = new_routed();
    side.old.pod = None;
    assert!(matches!(
        decide(&server(
            "slicerouter_updated_state",
            "routing_table_updated",
            side
        )),
        ServerAction::Advance { .. }
    ));
}

// ---- server: old_deployment_deleted_state ----

#[test]
fn old_deployment_deleted_drains_then_triggers_deletion_then_ends() {
    let state = "old_deployment_deleted_state";
    let mut facts = server(state, "", old_withdrawn());
    facts.state_since = Some(at(NOW - 2));
    assert_eq!(
        decide(&facts),
        ServerAction::Wait {
            missing: Missing::DrainDelay,
            recheck_after: Some(Duration::from_secs(3))
        }
    );
    facts.state_since = Some(at(NOW - 5));
    assert_eq!(
        decide(&facts),
        ServerAction::Work(Work::TriggerGwDeploymentDeletion {
            old: S.into(),
            new: NEW_S.into()
        })
    );
    // Marked and the new one regular: wait for the reconciler to delete it.
    let mut side = old_withdrawn();
    side.old.marked_for_deletion = true;
    side.new.intermediate = false;
    assert_eq!(
        waiting(&decide(&server(state, "old_gw_deployment_deleted", side))),
        &Missing::OldDeploymentGone
    );
    // Old gone, client not done.
    assert_eq!(
        waiting(&decide(&server(state, "routing_table_updated", old_gone()))),
        &Missing::ClientResponse(Response::from("old_gw_deployment_deleted"))
    );
    let action = decide(&server(state, "old_gw_deployment_deleted", old_gone()));
    assert_eq!(
        advanced(&action),
        ("end".into(), "none".into(), Some("FSMDeleteOldGW"))
    );
}

// ---- server: terminal states, restart, timeouts ----

#[test]
fn end_is_kept_for_the_retention_then_deleted() {
    let mut facts = server("end", "old_gw_deployment_deleted", old_gone());
    assert_eq!(
        decide(&facts),
        ServerAction::Wait {
            missing: Missing::Retention,
            recheck_after: Some(Duration::from_secs(3590))
        }
    );
    facts.state_since = Some(at(NOW - 3600));
    assert_eq!(decide(&facts), ServerAction::DeleteFinished);
}

#[test]
fn error_and_unknown_states_do_nothing() {
    assert_eq!(
        decide(&server("error_state", "", before())),
        ServerAction::Nothing
    );
    assert_eq!(
        decide(&server("somewhere_else", "", before())),
        ServerAction::Nothing
    );
}

#[test]
fn a_restarted_server_in_slicerouter_updated_creates_nothing_new() {
    // Everything the earlier states did is visible; the decision continues the current step.
    let facts = server(
        "slicerouter_updated_state",
        "new_deployment_created",
        new_routed(),
    );
    let action = decide(&facts);
    assert!(
        !matches!(action, ServerAction::Work(Work::CreateNewDeployment { .. })),
        "{action:?}"
    );
    assert!(matches!(
        action,
        ServerAction::Work(Work::MarkGwRouteForDeletion { .. })
    ));
}

#[test]
fn a_step_past_its_timeout_fails_naming_the_step_and_the_missing_condition() {
    let mut side = new_routed();
    side.route_via_new = RouteProbe::Absent;
    let mut facts = server(
        "new_deployment_created_state",
        "new_deployment_created",
        side,
    );
    facts.state_since = Some(at(NOW - 299));
    assert_eq!(waiting(&decide(&facts)), &Missing::RouteViaNew);
    facts.state_since = Some(at(NOW - 300));
    let action = decide(&facts);
    assert_eq!(
        action,
        ServerAction::Fail {
            step: State::from("new_deployment_created_state"),
            missing: Missing::RouteViaNew
        }
    );
    if let ServerAction::Fail { missing, .. } = action {
        assert_eq!(
            missing.describe(),
            "the slice router routes via the new gateway"
        );
    }
    // A waiting client fails the step too.
    let mut facts = server("slicerouter_updated_state", "", old_withdrawn());
    facts.state_since = Some(at(0));
    assert_eq!(
        decide(&facts),
        ServerAction::Fail {
            step: State::from("slicerouter_updated_state"),
            missing: Missing::ClientResponse(Response::RoutingTableUpdated)
        }
    );
    // Init does not wait, so it never times out.
    let mut facts = server("init", "", before());
    facts.state_since = Some(at(0));
    assert!(matches!(decide(&facts), ServerAction::Work(_)));
}

#[test]
fn advancing_writes_only_transitions_of_the_table() {
    for (state, response, side) in [
        ("init", "", new_routed()),
        (
            "new_deployment_created_state",
            "new_deployment_created",
            new_routed(),
        ),
        (
            "slicerouter_updated_state",
            "routing_table_updated",
            old_withdrawn(),
        ),
    ] {
        let mut facts = server(state, response, side);
        facts.state_since = Some(at(0));
        if let ServerAction::Advance { event, to, .. } = decide(&facts) {
            assert_eq!(transition(&facts.state, &event), Ok(to));
        } else {
            panic!("{state} should advance");
        }
    }
}

// ---- client ----

#[test]
fn client_creates_waits_and_responds_new_deployment_created() {
    let req = "create_new_deployment";
    assert_eq!(
        decide_client(&client(req, "", before())),
        ClientAction::Work(Work::CreateNewDeployment {
            deployment: NEW_S.into()
        })
    );
    let mut side = new_routed();
    side.route_via_new = RouteProbe::Absent;
    assert_eq!(
        decide_client(&client(req, "", side)),
        ClientAction::Wait(Missing::RouteViaNew)
    );
    let mut side = new_routed();
    side.new.pod = None;
    assert_eq!(
        decide_client(&client(req, "none", side)),
        ClientAction::Wait(Missing::NewNsmIp)
    );
    assert_eq!(
        decide_client(&client(req, "none", new_routed())),
        ClientAction::Respond(Response::from("new_deployment_created"))
    );
}

#[test]
fn client_asked_to_recycle_a_deployment_it_does_not_have_waits_instead_of_answering() {
    let req = "create_new_deployment";
    // The CR names a generation already recycled: its flip is the gateway serving now, present,
    // regular and routed. Answering would end a recycle that replaced nothing on this side.
    let mut wrong_generation = old_gone();
    wrong_generation.old_deployment = NEW_S.into();
    wrong_generation.new_deployment = S.into();
    assert_eq!(
        decide_client(&client(req, "", wrong_generation)),
        ClientAction::Wait(Missing::OldDeploymentPresent)
    );
    // No gateway at all yet.
    let mut nothing = before();
    nothing.old = DeploymentFacts::default();
    assert_eq!(
        decide_client(&client(req, "", nothing)),
        ClientAction::Wait(Missing::OldDeploymentPresent)
    );
    // The successor this side created stands: a vanished old deployment does not stop it.
    let mut created = new_routed();
    created.old = DeploymentFacts::default();
    assert_eq!(
        decide_client(&client(req, "", created)),
        ClientAction::Respond(Response::from("new_deployment_created"))
    );
}

#[test]
fn client_withdraws_then_responds_routing_table_updated() {
    let req = "update_routing_table";
    let r = "new_deployment_created";
    assert_eq!(
        decide_client(&client(req, r, new_routed())),
        ClientAction::Work(Work::MarkGwRouteForDeletion {
            deployment: S.into(),
            nsm_ip: Some("10.1.0.1".into())
        })
    );
    assert_eq!(
        decide_client(&client(req, r, old_withdrawn())),
        ClientAction::Respond(Response::from("routing_table_updated"))
    );
}

#[test]
fn client_deletes_then_responds_old_gw_deployment_deleted() {
    let req = "delete_old_gw_deployment";
    let r = "routing_table_updated";
    assert_eq!(
        decide_client(&client(req, r, old_withdrawn())),
        ClientAction::Work(Work::TriggerGwDeploymentDeletion {
            old: S.into(),
            new: NEW_S.into()
        })
    );
    let mut side = old_withdrawn();
    side.old.marked_for_deletion = true;
    side.new.intermediate = false;
    assert_eq!(
        decide_client(&client(req, r, side)),
        ClientAction::Wait(Missing::OldDeploymentGone)
    );
    assert_eq!(
        decide_client(&client(req, r, old_gone())),
        ClientAction::Respond(Response::from("old_gw_deployment_deleted"))
    );
}

#[test]
fn client_already_past_a_request_does_nothing() {
    for (request, response) in [
        ("create_new_deployment", "new_deployment_created"),
        ("create_new_deployment", "old_gw_deployment_deleted"),
        ("update_routing_table", "routing_table_updated"),
        ("delete_old_gw_deployment", "old_gw_deployment_deleted"),
    ] {
        assert_eq!(
            decide_client(&client(request, response, before())),
            ClientAction::Nothing,
            "{request} answered by {response}"
        );
    }
}

#[test]
fn client_ignores_none_unknown_missing_requests_and_finished_recycles() {
    assert_eq!(
        decide_client(&client("none", "", before())),
        ClientAction::Nothing
    );
    assert_eq!(
        decide_client(&client("reboot", "", before())),
        ClientAction::Nothing
    );
    let mut facts = client("create_new_deployment", "", before());
    facts.request = None;
    assert_eq!(decide_client(&facts), ClientAction::Nothing);
    for terminal in ["end", "error_state"] {
        let mut facts = client("create_new_deployment", "", before());
        facts.state = State::from(terminal);
        assert_eq!(decide_client(&facts), ClientAction::Nothing);
    }
}

// ---- what a pass must probe ----

/// `side` with what `skipped` leaves unprobed replaced by each combination of values a probe
/// could have returned.
fn unprobed_variants(side: &SideFacts, skipped: Probes) -> Vec<SideFacts> {
    let ips = [None, Some("10.9.9.9".to_string())];
    let routes = [
        RouteProbe::Present,
        RouteProbe::Absent,
        RouteProbe::Unreachable,
        RouteProbe::Failed,
    ];
    let mut out = vec![];
    for ip in &ips {
        for route in routes {
            let mut v = side.clone();
            if !skipped.new_gateway {
                if let Some(pod) = v.new.pod.as_mut() {
                    pod.nsm_ip = ip.clone();
                }
                v.route_via_new = route;
            }
            if !skipped.old_gateway {
                if let Some(pod) = v.old.pod.as_mut() {
                    pod.nsm_ip = ip.clone();
                }
                v.route_via_old = route;
            }
            out.push(v);
        }
    }
    out
}

fn every_side() -> [SideFacts; 4] {
    [before(), new_routed(), old_withdrawn(), old_gone()]
}

#[test]
fn the_server_reads_only_what_its_state_probes() {
    let states = [
        "init",
        "new_deployment_created_state",
        "slicerouter_updated_state",
        "old_deployment_deleted_state",
        "end",
        "error_state",
    ];
    let responses = [
        "",
        "new_deployment_created",
        "routing_table_updated",
        "old_gw_deployment_deleted",
    ];
    for state in states {
        let probes = Probes::for_server(&State::from(state));
        for response in responses {
            for side in every_side() {
                let expected = decide(&server(state, response, side.clone()));
                for variant in unprobed_variants(&side, probes) {
                    assert_eq!(
                        decide(&server(state, response, variant.clone())),
                        expected,
                        "{state}/{response}: an unprobed fact changed the decision ({variant:?})"
                    );
                }
            }
        }
    }
    // And the probed ones do matter where they are probed.
    assert!(Probes::for_server(&State::NewDeploymentCreated).new_gateway);
    assert!(Probes::for_server(&State::SliceRouterUpdated).old_gateway);
}

#[test]
fn the_client_reads_only_what_its_request_probes() {
    let requests = [
        "none",
        "create_new_deployment",
        "update_routing_table",
        "delete_old_gw_deployment",
    ];
    for request in requests {
        let probes = Probes::for_client(Some(&Request::from(request)));
        for side in every_side() {
            let expected = decide_client(&client(request, "", side.clone()));
            for variant in unprobed_variants(&side, probes) {
                assert_eq!(
                    decide_client(&client(request, "", variant.clone())),
                    expected,
                    "{request}: an unprobed fact changed the decision ({variant:?})"
                );
            }
        }
    }
    assert_eq!(Probes::for_client(None), Probes::default());
}

#[test]
fn init_advances_in_the_same_pass_once_the_new_deployment_is_listed() {
    let facts = server("init", "", before());
    let ServerAction::Work(work) = decide(&facts) else {
        panic!("init first asks for the new deployment");
    };
    let next = after_work(&facts, &work, &timing(), at(NOW)).expect("advances at once");
    assert_eq!(
        advanced(&next),
        (
            "new_deployment_created_state".into(),
            "create_new_deployment".into(),
            Some("FSMNewGWSpawned")
        )
    );
}

#[test]
fn other_work_waits_for_the_next_observation() {
    // The new deployment lost from the list later on: asked for again, then the state waits.
    let facts = server("new_deployment_created_state", "", before());
    let ServerAction::Work(work) = decide(&facts) else {
        panic!("the lost deployment is asked for again");
    };
    assert_eq!(after_work(&facts, &work, &timing(), at(NOW)), None);
    let facts = server(
        "slicerouter_updated_state",
        "new_deployment_created",
        new_routed(),
    );
    let ServerAction::Work(work) = decide(&facts) else {
        panic!("the old route is marked");
    };
    assert_eq!(after_work(&facts, &work, &timing(), at(NOW)), None);
}
