//! The recycler state machine: states and events are capstan-apis' wire enums (exact strings),
//! and [`transition`] is the one table. The position is read back from the CR's `spec.state`, so a
//! restarted server resumes where the last one stopped.

use crate::{Event, State};

/// An event the current state does not take (the caller writes nothing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event {event} is not accepted in state {state}")]
pub struct RejectedEvent {
    pub state: State,
    pub event: Event,
}

impl RejectedEvent {
    pub fn metric_label(&self) -> &'static str {
        "rejected_event"
    }
}

/// The state `event` leads to from `state`; any pair not in the reference table is rejected.
pub fn transition(state: &State, event: &Event) -> Result<State, RejectedEvent> {
    let next = match (state, event) {
        (State::Init, Event::VerifyNewDeploymentCreated) => State::NewDeploymentCreated,
        (State::NewDeploymentCreated, Event::UpdateRoutingTable) => State::SliceRouterUpdated,
        (State::SliceRouterUpdated, Event::DeleteOldGwDeployment) => State::OldDeploymentDeleted,
        (State::OldDeploymentDeleted, Event::End) => State::End,
        (from, Event::OnError) if from.is_known() && !from.is_terminal() => State::Error,
        _ => {
            return Err(RejectedEvent {
                state: state.clone(),
                event: event.clone(),
            });
        }
    };
    Ok(next)
}

/// The event that leaves `state` on the happy path (`None` for terminal or unknown states).
pub fn forward_event(state: &State) -> Option<Event> {
    Some(match state {
        State::Init => Event::VerifyNewDeploymentCreated,
        State::NewDeploymentCreated => Event::UpdateRoutingTable,
        State::SliceRouterUpdated => Event::DeleteOldGwDeployment,
        State::OldDeploymentDeleted => Event::End,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> State {
        State::from(x)
    }
    fn e(x: &str) -> Event {
        Event::from(x)
    }

    #[test]
    fn reference_transitions_by_their_strings() {
        let table = [
            (
                "init",
                "verify_new_deployment_created",
                "new_deployment_created_state",
            ),
            (
                "new_deployment_created_state",
                "update_routing_table",
                "slicerouter_updated_state",
            ),
            (
                "slicerouter_updated_state",
                "delete_old_gw_deployment",
                "old_deployment_deleted_state",
            ),
            ("old_deployment_deleted_state", "end", "end"),
        ];
        for (from, event, to) in table {
            assert_eq!(
                transition(&s(from), &e(event)),
                Ok(s(to)),
                "{from} --{event}->"
            );
            assert_eq!(forward_event(&s(from)), Some(e(event)));
        }
    }

    #[test]
    fn on_error_from_every_non_terminal_state() {
        for from in [
            "init",
            "new_deployment_created_state",
            "slicerouter_updated_state",
            "old_deployment_deleted_state",
        ] {
            assert_eq!(transition(&s(from), &e("on_error")), Ok(s("error_state")));
        }
        for terminal in ["end", "error_state", "bogus"] {
            assert!(
                transition(&s(terminal), &e("on_error")).is_err(),
                "{terminal}"
            );
        }
    }

    #[test]
    fn every_other_pair_is_rejected() {
        let accepted = [
            ("init", "verify_new_deployment_created"),
            ("new_deployment_created_state", "update_routing_table"),
            ("slicerouter_updated_state", "delete_old_gw_deployment"),
            ("old_deployment_deleted_state", "end"),
        ];
        let mut rejected = 0;
        for state in State::KNOWN {
            for event in Event::KNOWN {
                let on_error = *event == Event::OnError && !state.is_terminal();
                let listed = accepted
                    .iter()
                    .any(|(f, ev)| state.as_str() == *f && event.as_str() == *ev);
                let result = transition(state, event);
                if listed || on_error {
                    assert!(result.is_ok(), "{state} --{event}");
                } else {
                    assert_eq!(
                        result,
                        Err(RejectedEvent {
                            state: state.clone(),
                            event: event.clone()
                        })
                    );
                    rejected += 1;
                }
            }
        }
        // 6 states x 5 events, minus 4 forward edges and 4 on_error edges.
        assert_eq!(rejected, 22);
        assert_eq!(
            transition(&s("init"), &e("end")).map_err(|r| r.to_string()),
            Err("event end is not accepted in state init".to_owned())
        );
    }
}
